//! File transfer: streamed uploads and capped, streamed downloads.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use reqwest::Method;
use reqwest::header::HeaderMap;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use crate::error::{Error, Result};
use crate::options::RequestOptions;
use crate::sandbox::Sandbox;
use crate::transport::{RawBody, RawMeta, Transport, body_chunks};
use crate::wire_enum::nullable;

/// An upload source: bytes in memory, or any `AsyncRead` streamed without buffering it all.
pub struct UploadBody(Inner);

enum Inner {
    Bytes(Bytes),
    Stream(BoxStream<'static, std::io::Result<Bytes>>),
}

impl fmt::Debug for UploadBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Inner::Bytes(b) => write!(f, "UploadBody::Bytes({} bytes)", b.len()),
            Inner::Stream(_) => f.write_str("UploadBody::Stream"),
        }
    }
}

impl UploadBody {
    /// Stream from a reader (a file, a pipe, a decompressor ...) in 64 KiB chunks, read
    /// only as fast as the connection takes them. There is no total deadline on a streamed
    /// upload: it fails only when no chunk moves for the request's timeout.
    pub fn reader<R: AsyncRead + Send + 'static>(reader: R) -> Self {
        let stream = tokio_util::io::ReaderStream::with_capacity(reader, 64 * 1024);
        UploadBody(Inner::Stream(stream.boxed()))
    }

    /// Stream from any `Stream` of byte chunks (same timeout rule as [`UploadBody::reader`]).
    pub fn stream<S>(stream: S) -> Self
    where
        S: Stream<Item = std::result::Result<Bytes, std::io::Error>> + Send + 'static,
    {
        UploadBody(Inner::Stream(stream.boxed()))
    }
}

impl From<Bytes> for UploadBody {
    fn from(b: Bytes) -> Self {
        UploadBody(Inner::Bytes(b))
    }
}
impl From<Vec<u8>> for UploadBody {
    fn from(b: Vec<u8>) -> Self {
        UploadBody(Inner::Bytes(b.into()))
    }
}
impl From<&'static [u8]> for UploadBody {
    fn from(b: &'static [u8]) -> Self {
        UploadBody(Inner::Bytes(Bytes::from_static(b)))
    }
}
impl From<String> for UploadBody {
    fn from(s: String) -> Self {
        UploadBody(Inner::Bytes(s.into()))
    }
}
impl From<&'static str> for UploadBody {
    fn from(s: &'static str) -> Self {
        UploadBody(Inner::Bytes(Bytes::from_static(s.as_bytes())))
    }
}

/// `PUT …/files` answer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct UploadResult {
    /// Bytes written.
    #[serde(deserialize_with = "nullable")]
    pub bytes: u64,
    /// The path written.
    #[serde(deserialize_with = "nullable")]
    pub path: String,
}

/// Options of [`Files::download`].
#[derive(Debug, Clone, Default)]
pub struct DownloadOptions {
    /// Refuse more than this many bytes: early when `Content-Length` is larger, and
    /// during the transfer the moment the cap would be exceeded.
    pub max_bytes: Option<u64>,
    /// Per-request options (the timeout bounds the wait for headers and each idle gap).
    pub request: RequestOptions,
}

impl DownloadOptions {
    /// Options with a byte cap.
    pub fn max_bytes(max: u64) -> Self {
        Self {
            max_bytes: Some(max),
            ..Self::default()
        }
    }
}

/// A streamed binary body (a file download or a screenshot) with its response headers.
/// Implements `Stream<Item = Result<Bytes>>`; dropping it closes the connection.
pub struct Download {
    headers: HeaderMap,
    content_length: Option<u64>,
    max_bytes: Option<u64>,
    inner: BoxStream<'static, Result<Bytes>>,
}

impl fmt::Debug for Download {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Download")
            .field("content_length", &self.content_length)
            .field("max_bytes", &self.max_bytes)
            .finish_non_exhaustive()
    }
}

impl Download {
    /// The declared `Content-Length`, when the server sent one.
    pub fn content_length(&self) -> Option<u64> {
        self.content_length
    }

    /// The response headers.
    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    /// Collect everything in memory (the cap still applies).
    pub async fn bytes(mut self) -> Result<Bytes> {
        let cap = self
            .content_length
            .unwrap_or(0)
            .min(self.max_bytes.unwrap_or(u64::MAX))
            .min(64 << 20);
        let mut buf = BytesMut::with_capacity(usize::try_from(cap).unwrap_or(0));
        while let Some(chunk) = self.inner.next().await {
            buf.extend_from_slice(&chunk?);
        }
        Ok(buf.freeze())
    }

    /// The remaining body as an `AsyncRead` (e.g. for `tokio::io::copy` or a decompressor).
    /// Errors, including a cap violation, surface as `std::io::Error` wrapping this crate's
    /// [`Error`] (`io_error.get_ref()` downcasts to it).
    pub fn into_reader(self) -> impl AsyncRead + Send + Unpin + 'static {
        tokio_util::io::StreamReader::new(self.inner.map(|r| r.map_err(std::io::Error::other)))
    }

    /// Copy everything into `writer`; returns the number of bytes written.
    pub async fn write_to<W: AsyncWrite + Unpin + ?Sized>(mut self, writer: &mut W) -> Result<u64> {
        let mut n = 0u64;
        while let Some(chunk) = self.inner.next().await {
            let chunk = chunk?;
            writer.write_all(&chunk).await?;
            n += chunk.len() as u64;
        }
        writer.flush().await?;
        Ok(n)
    }
}

impl Stream for Download {
    type Item = Result<Bytes>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.poll_next_unpin(cx)
    }
}

/// File operations of one sandbox (`sandbox.files()`).
#[derive(Clone)]
pub struct Files {
    t: Arc<Transport>,
    base: String,
}

impl fmt::Debug for Files {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Files")
            .field("endpoint", &self.base)
            .finish_non_exhaustive()
    }
}

fn check_path(path: &str) -> Result<()> {
    if path.is_empty() {
        return Err(Error::InvalidArgument("file path is empty".into()));
    }
    Ok(())
}

impl Files {
    /// `PUT …/files?path=`: write `body` (bytes or a reader) to `path`; parent directories
    /// are created. Never retried.
    pub async fn upload(&self, path: &str, body: impl Into<UploadBody>) -> Result<UploadResult> {
        self.upload_with(path, body, &RequestOptions::default())
            .await
    }

    /// [`Files::upload`] with per-request options. For a reader or stream body the timeout
    /// only bounds stalls while the body is sent (each gap between two chunks), so a big file
    /// needs no longer timeout; the whole answer (headers and body) must then arrive within
    /// the timeout of the body's end, however slowly it trickles.
    pub async fn upload_with(
        &self,
        path: &str,
        body: impl Into<UploadBody>,
        opts: &RequestOptions,
    ) -> Result<UploadResult> {
        check_path(path)?;
        let raw = match body.into().0 {
            Inner::Bytes(b) => RawBody::Bytes(b, "application/octet-stream"),
            Inner::Stream(s) => RawBody::Stream(s),
        };
        let resp = self
            .t
            .raw(
                Method::PUT,
                &self.base,
                &[("path", path.to_owned())],
                raw,
                opts,
            )
            .await?;
        let endpoint = self.base.clone();
        // The body phase had no total deadline; the answer has one: headers and body within
        // the timeout of the body's end, however slowly the bytes trickle in.
        let (deadline, after) = match resp.extensions().get::<RawMeta>() {
            Some(m) => (m.answer_deadline, m.idle_timeout),
            None => (tokio::time::Instant::now(), Duration::ZERO),
        };
        let read = async {
            let mut body = BytesMut::new();
            let mut chunks = body_chunks(resp);
            while let Some(c) = chunks.next().await {
                body.extend_from_slice(&c?);
                if body.len() > crate::error::MAX_ERROR_BODY {
                    return Err(Error::protocol("upload response is too large"));
                }
            }
            Ok(body)
        };
        let body = tokio::time::timeout_at(deadline, read)
            .await
            .map_err(|_| Error::Timeout {
                method: Method::PUT,
                endpoint: endpoint.clone(),
                after,
            })??;
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(UploadResult {
                bytes: 0,
                path: path.to_owned(),
            });
        }
        let env: serde_json::Value = serde_json::from_slice(&body)
            .map_err(|e| Error::protocol(format!("invalid JSend envelope from {endpoint}: {e}")))?;
        match env.get("status").and_then(serde_json::Value::as_str) {
            Some("success") => {
                let data = env.get("data").cloned().unwrap_or(serde_json::Value::Null);
                Ok(serde_json::from_value::<Option<UploadResult>>(data)
                    .ok()
                    .flatten()
                    .unwrap_or_default())
            }
            _ => Err(Error::protocol(format!(
                "invalid JSend envelope from {endpoint}"
            ))),
        }
    }

    /// `GET …/files?path=`: a streamed download. Never retried.
    pub async fn download(&self, path: &str, opts: DownloadOptions) -> Result<Download> {
        check_path(path)?;
        let resp = self
            .t
            .raw(
                Method::GET,
                &self.base,
                &[("path", path.to_owned())],
                RawBody::None,
                &opts.request,
            )
            .await?;
        Download::from_response(resp, opts.max_bytes, &format!("download of {path}"))
    }
}

impl Download {
    /// Wrap a raw 2xx response: refuse early when `Content-Length` exceeds `max_bytes`,
    /// then enforce the cap while the body streams. `what` names the transfer in errors.
    pub(crate) fn from_response(
        resp: reqwest::Response,
        max_bytes: Option<u64>,
        what: &str,
    ) -> Result<Download> {
        let content_length = resp.content_length();
        if let (Some(len), Some(max)) = (content_length, max_bytes)
            && len > max
        {
            return Err(Error::TooLarge {
                what: format!("{what} (Content-Length {len})"),
                limit: max,
            });
        }
        let headers = resp.headers().clone();
        let chunks = body_chunks(resp);
        let inner = match max_bytes {
            None => chunks,
            Some(max) => {
                let what = what.to_owned();
                chunks
                    .scan((0u64, false), move |(seen, stop), item| {
                        if *stop {
                            return futures::future::ready(None);
                        }
                        let out = match item {
                            Ok(b) => {
                                *seen += b.len() as u64;
                                if *seen > max {
                                    *stop = true;
                                    Err(Error::TooLarge {
                                        what: what.clone(),
                                        limit: max,
                                    })
                                } else {
                                    Ok(b)
                                }
                            }
                            Err(e) => {
                                *stop = true;
                                Err(e)
                            }
                        };
                        futures::future::ready(Some(out))
                    })
                    .boxed()
            }
        };
        Ok(Download {
            headers,
            content_length,
            max_bytes,
            inner,
        })
    }
}

impl Sandbox {
    /// File operations on this sandbox.
    pub fn files(&self) -> Files {
        Files {
            t: Arc::clone(self.transport()),
            base: self.path("/files"),
        }
    }
}
