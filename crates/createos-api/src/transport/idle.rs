//! The idle timer: how long a raw exchange may go without progress. While a streamed upload
//! is sent, every chunk handed to the connection resets it; once the answer arrives, every
//! chunk of its body does.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::stream::{self, BoxStream, StreamExt};
use reqwest::Method;

use super::secrets::Redactor;
use super::send::transport_error;
use crate::error::{Error, Result};

/// Stored in a raw response's extensions so stream readers can map errors and time out.
#[derive(Clone)]
pub(crate) struct RawMeta {
    pub(super) method: Method,
    pub(super) endpoint: String,
    pub(crate) idle_timeout: Duration,
    pub(super) secrets: Redactor,
    /// When a buffered answer to this request must be complete: the request's timeout
    /// after its last progress (the end of a streamed body, else the start). Uploads read
    /// their answer under it, so a trickling answer cannot hold them forever.
    pub(crate) answer_deadline: tokio::time::Instant,
}

/// When a raw request last made progress: its start, then every chunk of a streamed body
/// handed to the connection and the end of that body.
#[derive(Clone)]
pub(super) struct Progress(Arc<std::sync::Mutex<tokio::time::Instant>>);

impl Progress {
    pub(super) fn new() -> Self {
        Self(Arc::new(std::sync::Mutex::new(tokio::time::Instant::now())))
    }

    pub(super) fn touch(&self) {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = tokio::time::Instant::now();
    }

    pub(super) fn last(&self) -> tokio::time::Instant {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `body`, recording progress on every chunk it yields and when it ends.
    pub(super) fn track(
        &self,
        body: BoxStream<'static, std::io::Result<Bytes>>,
    ) -> BoxStream<'static, std::io::Result<Bytes>> {
        let on_chunk = self.clone();
        let on_end = self.clone();
        body.inspect(move |_| on_chunk.touch())
            .chain(stream::poll_fn(move |_| {
                on_end.touch();
                std::task::Poll::Ready(None)
            }))
            .boxed()
    }

    /// Drive `fut` until it completes (`Some`) or `timeout` passes without progress (`None`).
    pub(super) async fn run<F: Future>(&self, fut: F, timeout: Duration) -> Option<F::Output> {
        tokio::pin!(fut);
        loop {
            let deadline = self.last() + timeout;
            tokio::select! {
                out = &mut fut => return Some(out),
                () = tokio::time::sleep_until(deadline) => {
                    if self.last() + timeout <= tokio::time::Instant::now() {
                        return None;
                    }
                }
            }
        }
    }
}

/// The response body as a stream of chunks, each awaited under the idle timeout.
pub(crate) fn body_chunks(resp: reqwest::Response) -> BoxStream<'static, Result<Bytes>> {
    let meta = resp
        .extensions()
        .get::<RawMeta>()
        .cloned()
        .unwrap_or_else(|| RawMeta {
            method: Method::GET,
            endpoint: resp.url().path().to_owned(),
            idle_timeout: Duration::from_secs(60),
            secrets: Redactor::default(),
            answer_deadline: tokio::time::Instant::now() + Duration::from_secs(60),
        });
    let inner = resp.bytes_stream();
    stream::unfold(Some((inner, meta)), |state| async move {
        let (mut inner, meta) = state?;
        match tokio::time::timeout(meta.idle_timeout, inner.next()).await {
            Err(_) => Some((
                Err(Error::Timeout {
                    method: meta.method.clone(),
                    endpoint: meta.endpoint.clone(),
                    after: meta.idle_timeout,
                }),
                None,
            )),
            Ok(None) => None,
            Ok(Some(Ok(b))) => Some((Ok(b), Some((inner, meta)))),
            Ok(Some(Err(e))) => {
                let err = transport_error(
                    &meta.method,
                    &meta.endpoint,
                    e,
                    meta.idle_timeout,
                    &meta.secrets,
                );
                Some((Err(err), None))
            }
        }
    })
    .boxed()
}
