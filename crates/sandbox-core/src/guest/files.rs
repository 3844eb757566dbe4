//! Files in and out of a guest: upload, and download under a cap.

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use tokio::time::Instant;

use super::Guest;
use crate::classify;
use crate::control::{CallError, CallFailure};
use crate::error::SandboxError;

impl Guest {
    /// Writes `data` to `path` in the guest, retrying transient failures until `deadline`.
    pub async fn upload(
        &self,
        path: &str,
        data: Bytes,
        deadline: Instant,
    ) -> Result<(), SandboxError> {
        let cx = &self.cx;
        cx.retried("upload", deadline, || {
            cx.provider
                .upload(self.id.clone(), path.to_owned(), data.clone())
        })
        .await
        .map_err(|e| cx.before_dispatch("upload", &e))
    }

    /// Downloads the file at `path`, refusing more than `max_bytes`: before reading anything
    /// when the declared length is larger, and the moment the bytes that arrived pass the cap
    /// otherwise. Opening the download is retried on transient failures, and the whole
    /// transfer ends, by `deadline`.
    pub async fn download(
        &self,
        path: &str,
        max_bytes: u64,
        deadline: Instant,
    ) -> Result<Bytes, SandboxError> {
        let cx = &self.cx;
        let op = format!("download of {path}");
        let too_large = |seen: String| {
            SandboxError::refused(format!(
                "{path} in guest {} is larger than the {max_bytes}-byte cap ({seen}); the \
                 transfer was stopped",
                self.name
            ))
        };
        let dl = cx
            .retried(&op, deadline, || {
                cx.provider
                    .download(self.id.clone(), path.to_owned(), Some(max_bytes))
            })
            .await
            .map_err(|e| match e.failure {
                CallFailure::TooLarge => too_large("declared by the server".to_owned()),
                _ => classify::call_failed(cx.provider.kind(), &op, &e, cx.closed(), &cx.redactor),
            })?;
        if let Some(len) = dl.content_length
            && len > max_bytes
        {
            return Err(too_large(format!("{len} bytes declared")));
        }
        let mut body = dl.body;
        let mut buf = BytesMut::new();
        loop {
            let Ok(next) = tokio::time::timeout_at(deadline, body.next()).await else {
                let e = CallError::new(
                    CallFailure::Timeout,
                    format!(
                        "the transfer did not finish within its budget ({} bytes had arrived)",
                        buf.len()
                    ),
                );
                return Err(classify::call_failed(
                    cx.provider.kind(),
                    &op,
                    &e,
                    cx.closed(),
                    &cx.redactor,
                ));
            };
            let Some(chunk) = next else {
                break;
            };
            match chunk {
                Ok(c) => {
                    if (buf.len() + c.len()) as u64 > max_bytes {
                        return Err(too_large(format!("more than {max_bytes} bytes arrived")));
                    }
                    buf.extend_from_slice(&c);
                }
                Err(e) if e.failure == CallFailure::TooLarge => {
                    return Err(too_large(format!("more than {max_bytes} bytes arrived")));
                }
                Err(e) => {
                    return Err(classify::call_failed(
                        cx.provider.kind(),
                        &op,
                        &e,
                        cx.closed(),
                        &cx.redactor,
                    ));
                }
            }
        }
        Ok(buf.freeze())
    }
}
