//! [`ControlPlane`] over the `createos-api` client.
//!
//! The client is built with its own retries switched off: the lifecycle decides what may be
//! repeated (only what happens before the program is dispatched) and under which deadline.

use std::time::Duration;

use bytes::Bytes;
use createos_api::{
    Client, CreateSandboxRequest, Error as ApiError, ErrorKind as ApiKind, ExecEvent, ExecOptions,
    ListSandboxesOptions, RequestOptions, RetryOptions, RunCommandRequest, SandboxInfo,
};
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use secrecy::{ExposeSecret, SecretString};

use crate::control::{
    CallError, CallFailure, ControlPlane, CreateGuest, ExecFrame, ExecStream, GuestInfo,
};
use crate::error::{Redactor, SandboxError};
use crate::shapes::Shape;

/// Default timeout of one control call (not exec, which gets the host deadline).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The CreateOS control plane.
pub struct CreateOsControlPlane {
    client: Client,
    redactor: Redactor,
}

impl std::fmt::Debug for CreateOsControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CreateOsControlPlane")
            .field("base_url", &self.client.base_url())
            .finish_non_exhaustive()
    }
}

/// Maps a client error to a [`CallError`], redacting the key.
pub fn map_error(e: &ApiError, redactor: &Redactor) -> CallError {
    let failure = match e.kind() {
        ApiKind::Transport | ApiKind::Io => CallFailure::Transport,
        ApiKind::Timeout => CallFailure::Timeout,
        ApiKind::Config | ApiKind::Auth if e.status().is_none() => CallFailure::Config,
        _ => {
            if let Some(s) = e.status() {
                CallFailure::Status(s.as_u16())
            } else if e.to_string().contains("redirect") {
                CallFailure::Redirect
            } else {
                CallFailure::Protocol
            }
        }
    };
    let retry_after = e
        .as_api()
        .and_then(|a| a.headers.get("retry-after"))
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(|s| Duration::from_secs_f64(s.min(30.0)));
    CallError {
        failure,
        message: redactor.apply(&e.to_string()),
        retry_after,
    }
}

impl CreateOsControlPlane {
    /// A control plane for `base_url` with `api_key`; `request_timeout` bounds each control call.
    pub fn new(
        api_key: &SecretString,
        base_url: &str,
        request_timeout: Duration,
    ) -> Result<Self, SandboxError> {
        let redactor = Redactor::new(api_key.expose_secret());
        let client = Client::builder()
            .api_key(SecretString::from(api_key.expose_secret().to_owned()))
            .base_url(base_url)
            .timeout(request_timeout)
            .retry(RetryOptions::none())
            .build()
            .map_err(|e| {
                SandboxError::refused(format!(
                    "cannot use the CreateOS control plane at {base_url}: {}. Check \
                     CREATEOS_SANDBOX_BASE_URL and CREATEOS_SANDBOX_API_KEY",
                    redactor.apply(&e.to_string())
                ))
            })?;
        Ok(Self { client, redactor })
    }

    fn err(&self, e: &ApiError) -> CallError {
        map_error(e, &self.redactor)
    }
}

fn no_retry() -> RequestOptions {
    RequestOptions {
        disable_retry: true,
        ..RequestOptions::default()
    }
}

fn guest(info: &SandboxInfo) -> GuestInfo {
    GuestInfo {
        id: info.id.clone(),
        name: info.name.clone(),
        status: info.status.as_str().to_owned(),
        egress: info.egress.clone(),
    }
}

impl ControlPlane for CreateOsControlPlane {
    fn check_credential(&self) -> BoxFuture<'_, Result<String, CallError>> {
        async move {
            let who = self.client.whoami().await.map_err(|e| self.err(&e))?;
            Ok(who.user_id)
        }
        .boxed()
    }

    fn list_shapes(&self) -> BoxFuture<'_, Result<Vec<Shape>, CallError>> {
        async move {
            let shapes = self.client.list_shapes().await.map_err(|e| self.err(&e))?;
            Ok(shapes
                .into_iter()
                .map(|s| Shape {
                    id: s.id,
                    vcpu: s.vcpu,
                    mem_mib: u32::try_from(s.mem_mib).unwrap_or(u32::MAX),
                })
                .collect())
        }
        .boxed()
    }

    fn create(&self, req: CreateGuest) -> BoxFuture<'_, Result<GuestInfo, CallError>> {
        async move {
            let mut r = CreateSandboxRequest::new(req.shape)
                .rootfs(req.rootfs)
                .name(req.name);
            r.egress = req.egress;
            r.envs = req.envs;
            r.auto_pause_after_seconds = u64::from(req.auto_pause_after_seconds);
            let sb = self
                .client
                .create_sandbox_with(r, &no_retry())
                .await
                .map_err(|e| self.err(&e))?;
            Ok(guest(&sb.info()))
        }
        .boxed()
    }

    fn find_by_name(&self, name: String) -> BoxFuture<'_, Result<Option<GuestInfo>, CallError>> {
        async move {
            let opts = ListSandboxesOptions {
                limit: Some(500),
                request: no_retry(),
                ..ListSandboxesOptions::default()
            };
            let mut rows = self.client.list_sandboxes(opts);
            let mut terminal = None;
            while let Some(row) = rows.next().await {
                let sb = row.map_err(|e| self.err(&e))?;
                let info = sb.info();
                if info.name.as_deref() == Some(name.as_str()) {
                    let g = guest(&info);
                    if !g.is_terminal() {
                        return Ok(Some(g));
                    }
                    terminal = Some(g);
                }
            }
            Ok(terminal)
        }
        .boxed()
    }

    fn egress(&self, id: String) -> BoxFuture<'_, Result<Option<Vec<String>>, CallError>> {
        async move {
            let rules = self
                .client
                .sandbox_handle(id)
                .egress()
                .await
                .map_err(|e| self.err(&e))?;
            Ok(Some(rules))
        }
        .boxed()
    }

    fn upload(
        &self,
        id: String,
        path: String,
        data: Bytes,
    ) -> BoxFuture<'_, Result<(), CallError>> {
        async move {
            self.client
                .sandbox_handle(id)
                .files()
                .upload_with(&path, data, &no_retry())
                .await
                .map_err(|e| self.err(&e))?;
            Ok(())
        }
        .boxed()
    }

    fn exec_stream(
        &self,
        id: String,
        cmd: String,
        args: Vec<String>,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<ExecStream, CallError>> {
        async move {
            let mut opts = ExecOptions::timeout(timeout);
            opts.disable_retry = true;
            let stream = self
                .client
                .sandbox_handle(id)
                .stream_command(RunCommandRequest::new(cmd).args(args), opts)
                .await
                .map_err(|e| self.err(&e))?;
            let redactor = self.redactor.clone();
            let mapped = stream.filter_map(move |ev| {
                let out = match ev {
                    Ok(ExecEvent::Stdout { data }) => Some(Ok(ExecFrame::Stdout(data))),
                    Ok(ExecEvent::Stderr { data }) => Some(Ok(ExecFrame::Stderr(data))),
                    Ok(ExecEvent::Exit { exit_code }) => Some(Ok(ExecFrame::Exit(
                        i32::try_from(exit_code).unwrap_or(i32::MAX),
                    ))),
                    Ok(ExecEvent::Error { message }) => Some(Ok(ExecFrame::Error(message))),
                    Ok(ExecEvent::Heartbeat) => Some(Ok(ExecFrame::Heartbeat)),
                    Ok(_) => None,
                    Err(e) => Some(Err(map_error(&e, &redactor))),
                };
                futures::future::ready(out)
            });
            Ok(mapped.boxed())
        }
        .boxed()
    }

    fn destroy(&self, id: String) -> BoxFuture<'_, Result<(), CallError>> {
        async move {
            match self
                .client
                .sandbox_handle(id.clone())
                .destroy_with(&no_retry())
                .await
            {
                Ok(_) => Ok(()),
                Err(e) if e.kind() == ApiKind::NotFound => {
                    // A 404 should mean "already gone", but a misrouted or intercepted request
                    // says the same: confirm before forgetting the guest.
                    match self.client.get_sandbox(&id).await {
                        Err(e2) if e2.kind() == ApiKind::NotFound => Ok(()),
                        Ok(sb) if guest(&sb.info()).is_terminal() => Ok(()),
                        Ok(_) => Err(CallError::new(
                            CallFailure::Transport,
                            format!(
                                "DELETE answered 404 but sandbox {id} still exists: {}",
                                self.redactor.apply(&e.to_string())
                            ),
                        )),
                        Err(e2) => Err(self.err(&e2)),
                    }
                }
                Err(e) => Err(self.err(&e)),
            }
        }
        .boxed()
    }

    fn list_guests(&self, prefix: String) -> BoxFuture<'_, Result<Vec<GuestInfo>, CallError>> {
        async move {
            let opts = ListSandboxesOptions {
                limit: Some(LIST_PAGE),
                request: no_retry(),
                ..ListSandboxesOptions::default()
            };
            let mut rows = self.client.list_sandboxes(opts);
            let mut found = Vec::new();
            let mut seen = 0usize;
            let walk = async {
                while let Some(row) = rows.next().await {
                    let info = row.map_err(|e| self.err(&e))?.info();
                    seen += 1;
                    if info
                        .name
                        .as_deref()
                        .is_some_and(|name| name.starts_with(prefix.as_str()))
                    {
                        found.push(guest(&info));
                    }
                    if seen >= LIST_MAX_ROWS {
                        tracing::warn!(
                            target: crate::LOG_TARGET,
                            rows = seen,
                            "the guest list is longer than the walk allows; the rest is not examined"
                        );
                        break;
                    }
                }
                Ok::<(), CallError>(())
            };
            match tokio::time::timeout(LIST_DEADLINE, walk).await {
                Ok(Ok(())) => Ok(found),
                Ok(Err(e)) => Err(e),
                Err(_) => Err(CallError::new(
                    CallFailure::Timeout,
                    format!(
                        "listing sandboxes did not finish within {}s",
                        LIST_DEADLINE.as_secs()
                    ),
                )),
            }
        }
        .boxed()
    }
}

/// Page size of a guest listing (the contract's maximum).
const LIST_PAGE: u32 = 500;
/// Rows a listing walks at most (twenty full pages).
const LIST_MAX_ROWS: usize = 10_000;
/// Time a whole listing may take, every page included.
const LIST_DEADLINE: Duration = Duration::from_secs(60);
