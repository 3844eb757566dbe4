//! [`ControlPlane`] over the `createos-api` client: every call this package makes to CreateOS.
//!
//! The client is built with its own retries switched off: the lifecycle decides what may be
//! repeated (only what happens before the program is dispatched) and under which deadline.

use std::time::Duration;

use bytes::Bytes;
use createos_api::{
    Client, CreateSandboxRequest, DownloadOptions, Error as ApiError, ErrorKind as ApiKind,
    ExecEvent, ExecOptions, GetTemplateOptions, ListSandboxesOptions, ManagedProcessCreateRequest,
    RequestOptions, RetryOptions, RunCommandRequest, SandboxInfo, Template, TemplateCreateRequest,
    TemplateLogsOptions,
};
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use secrecy::{ExposeSecret, SecretString};

use sandbox_core::control::Shape;
use sandbox_core::control::{
    AgedGuest, CallError, CallFailure, ControlPlane, CreateGuest, Download, ExecFrame, ExecRequest,
    ExecStream, GuestInfo, GuestStatus, ProcessSpec, TemplateInfo, TemplateLogLine,
    TemplateLogStream, TemplateStatus, parse_rfc3339,
};
use sandbox_core::error::{Redactor, SandboxError};

use sandbox_core::provider::createos::{DEFAULT_BASE_URL, ENV_BASE_URL};

/// Default timeout of one control call (not exec, which gets the host deadline); sandbox-core's,
/// which every surface's options default to.
pub use sandbox_core::control::DEFAULT_REQUEST_TIMEOUT;

/// The longest server-requested wait [`map_error`] passes on in
/// [`CallError::retry_after`] (30 s).
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(30);

/// How many request timeouts a whole `find_by_name` walk may take (3): each page is bounded
/// by the request timeout, and the walk as a whole by this many of them, so a control plane
/// serving slow pages one after another cannot hold a lookup (and the cleanup waiting on
/// it) for long.
pub const FIND_BY_NAME_TIMEOUT_FACTOR: u32 = 3;

/// The CreateOS control plane.
pub struct CreateOsControlPlane {
    client: Client,
    redactor: Redactor,
    request_timeout: Duration,
}

impl std::fmt::Debug for CreateOsControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CreateOsControlPlane")
            .field(
                "base_url",
                &createos_api::redact_url(self.client.base_url()),
            )
            .field("proxy", &self.client.proxy())
            .finish_non_exhaustive()
    }
}

/// The proxy a control plane for `base_url` goes through, credentials hidden, or `None` for
/// a direct connection: plain `http` is never proxied; `https` honours `HTTPS_PROXY`,
/// `ALL_PROXY` and `NO_PROXY` of the process environment (see [`createos_api::proxy_for`]).
pub fn proxy_for(base_url: &str) -> Option<String> {
    createos_api::proxy_for(base_url)
}

/// `url` as logs, errors and `doctor` show it: without userinfo, query or fragment (see
/// [`createos_api::redact_url`]).
pub fn shown_url(url: &str) -> String {
    createos_api::redact_url(url)
}

/// Maps a client error to a [`CallError`], redacting the key.
pub fn map_error(e: &ApiError, redactor: &Redactor) -> CallError {
    let failure = match e.kind() {
        ApiKind::Transport | ApiKind::Io => CallFailure::Transport,
        ApiKind::Timeout => CallFailure::Timeout,
        ApiKind::TooLarge => CallFailure::TooLarge,
        ApiKind::Config | ApiKind::Auth if e.status().is_none() => CallFailure::Config,
        _ => {
            if let Some(s) = e.status() {
                CallFailure::Status(s.as_u16())
            } else if e.is_redirect() {
                CallFailure::Redirect
            } else {
                CallFailure::Protocol
            }
        }
    };
    // createos-api already parsed `Retry-After` (seconds or an HTTP date; negative and past
    // values are zero, garbage is `None`). A zero comes through as `Some(0)`: the retry loops
    // wait max(backoff, retry_after), so it can lengthen a wait, never shorten it.
    let retry_after = e
        .as_api()
        .and_then(|a| a.retry_after)
        .map(|d| d.min(MAX_RETRY_AFTER));
    CallError {
        failure,
        message: redactor.apply(&e.to_string()),
        retry_after,
        not_created: false,
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
        let shown = createos_api::redact_url(base_url);
        if createos_api::sends_key_in_clear(base_url) {
            // The client would refuse too, naming its own builder option; an operator gets
            // the fix they can make.
            return Err(SandboxError::refused(format!(
                "{ENV_BASE_URL}={shown} is plain http to another machine, which would send \
                 the API key unencrypted; set it to an https URL (the public control plane is \
                 {DEFAULT_BASE_URL}), or use http only for a control plane on this machine \
                 (localhost, 127.0.0.1 or [::1])"
            )));
        }
        let client = Client::builder()
            .api_key(SecretString::from(api_key.expose_secret().to_owned()))
            .base_url(base_url)
            .timeout(request_timeout)
            .retry(RetryOptions::none())
            .build()
            .map_err(|e| {
                SandboxError::refused(format!(
                    "cannot use the CreateOS control plane at {shown}: {}. Check \
                     CREATEOS_SANDBOX_BASE_URL and CREATEOS_SANDBOX_API_KEY",
                    redactor.apply(&e.to_string())
                ))
            })?;
        Ok(Self {
            client,
            redactor,
            request_timeout,
        })
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

fn template(t: Template) -> TemplateInfo {
    let status = match t.status {
        createos_api::TemplateStatus::Ready => TemplateStatus::Ready,
        createos_api::TemplateStatus::Failed => TemplateStatus::Failed,
        createos_api::TemplateStatus::Pending | createos_api::TemplateStatus::Building => {
            TemplateStatus::Building
        }
        other => TemplateStatus::Other(other.to_string()),
    };
    TemplateInfo {
        id: t.id,
        name: t.name,
        status,
    }
}

fn guest(info: &SandboxInfo) -> GuestInfo {
    GuestInfo {
        id: info.id.clone(),
        name: info.name.clone(),
        status: GuestStatus::from(info.status.as_str()),
        egress: info.egress.clone(),
        envs: Some(info.envs.clone()),
        auto_pause_after_seconds: info
            .auto_pause_after_seconds
            .map(|s| u32::try_from(s).unwrap_or(u32::MAX)),
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
        let deadline = self.request_timeout * FIND_BY_NAME_TIMEOUT_FACTOR;
        let walk = async move {
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
        };
        async move {
            tokio::time::timeout(deadline, walk)
                .await
                .unwrap_or_else(|_| {
                    Err(CallError::new(
                        CallFailure::Timeout,
                        format!(
                            "GET /v1/sandboxes: looking up a sandbox by name did not finish within \
                         {deadline:?}"
                        ),
                    ))
                })
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
        req: ExecRequest,
    ) -> BoxFuture<'_, Result<ExecStream, CallError>> {
        async move {
            let mut opts = ExecOptions::timeout(req.timeout);
            opts.disable_retry = true;
            let mut command = RunCommandRequest::new(req.cmd).args(req.args);
            command.env = req.env;
            command.stdin = req.stdin;
            let stream = self
                .client
                .sandbox_handle(id)
                .stream_command(command, opts)
                .await
                .map_err(|e| self.err(&e))?;
            let redactor = self.redactor.clone();
            let mapped = stream.filter_map(move |ev| {
                let out = match ev {
                    Ok(ExecEvent::Stdout { data }) => Some(Ok(ExecFrame::Stdout(data))),
                    Ok(ExecEvent::Stderr { data }) => Some(Ok(ExecFrame::Stderr(data))),
                    Ok(ExecEvent::Exit { exit_code }) => Some(Ok(ExecFrame::Exit(exit_code))),
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

    fn spawn_process(
        &self,
        id: String,
        spec: ProcessSpec,
    ) -> BoxFuture<'_, Result<String, CallError>> {
        async move {
            let request = ManagedProcessCreateRequest::command(spec.cmd, spec.args).cwd(spec.cwd);
            let process = self
                .client
                .sandbox_handle(id)
                .processes()
                .with_options(no_retry())
                .create(&request)
                .await
                .map_err(|e| self.err(&e))?;
            if process.process_id.is_empty() {
                return Err(CallError::new(
                    CallFailure::Protocol,
                    "CreateOS started a process but answered without its process_id",
                ));
            }
            Ok(process.process_id)
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
                    // says the same: confirm before forgetting the guest. When the read says
                    // 404 too, ask DELETE once more: a guest is forgotten only after three
                    // answers agree (a single route that lies cannot leak it).
                    match self.client.get_sandbox(&id).await {
                        Err(e2) if e2.kind() == ApiKind::NotFound => {
                            match self
                                .client
                                .sandbox_handle(id.clone())
                                .destroy_with(&no_retry())
                                .await
                            {
                                Ok(_) => Ok(()),
                                Err(e3) if e3.kind() == ApiKind::NotFound => Ok(()),
                                Err(e3) => Err(self.err(&e3)),
                            }
                        }
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

    fn get(&self, id: String) -> BoxFuture<'_, Result<GuestInfo, CallError>> {
        async move {
            let info = self
                .client
                .sandbox_handle(id)
                .refresh_with(&no_retry())
                .await
                .map_err(|e| self.err(&e))?;
            Ok(guest(&info))
        }
        .boxed()
    }

    fn resume(&self, id: String) -> BoxFuture<'_, Result<GuestInfo, CallError>> {
        async move {
            let info = self
                .client
                .sandbox_handle(id)
                .resume()
                .await
                .map_err(|e| self.err(&e))?;
            Ok(guest(&info))
        }
        .boxed()
    }

    fn set_auto_pause(
        &self,
        id: String,
        seconds: u32,
    ) -> BoxFuture<'_, Result<GuestInfo, CallError>> {
        async move {
            let info = self
                .client
                .sandbox_handle(id)
                .set_auto_pause(Some(Duration::from_secs(u64::from(seconds))))
                .await
                .map_err(|e| self.err(&e))?;
            Ok(guest(&info))
        }
        .boxed()
    }

    fn download(
        &self,
        id: String,
        path: String,
        max_bytes: Option<u64>,
    ) -> BoxFuture<'_, Result<Download, CallError>> {
        async move {
            let opts = DownloadOptions {
                max_bytes,
                request: no_retry(),
            };
            let dl = self
                .client
                .sandbox_handle(id)
                .files()
                .download(&path, opts)
                .await
                .map_err(|e| self.err(&e))?;
            let redactor = self.redactor.clone();
            Ok(Download {
                content_length: dl.content_length(),
                body: dl
                    .map(move |c| c.map_err(|e| map_error(&e, &redactor)))
                    .boxed(),
            })
        }
        .boxed()
    }

    fn create_template(
        &self,
        name: String,
        dockerfile: String,
    ) -> BoxFuture<'_, Result<TemplateInfo, CallError>> {
        async move {
            let t = self
                .client
                .templates()
                .with_options(no_retry())
                .create(&TemplateCreateRequest::new(name, dockerfile))
                .await
                .map_err(|e| self.err(&e))?;
            Ok(template(t))
        }
        .boxed()
    }

    fn get_template(&self, id_or_name: String) -> BoxFuture<'_, Result<TemplateInfo, CallError>> {
        async move {
            let t = self
                .client
                .templates()
                .with_options(no_retry())
                .get(&id_or_name, GetTemplateOptions::default())
                .await
                .map_err(|e| self.err(&e))?;
            Ok(template(t))
        }
        .boxed()
    }

    fn follow_template_log(
        &self,
        id: String,
    ) -> BoxFuture<'_, Result<TemplateLogStream, CallError>> {
        async move {
            let events = self
                .client
                .templates()
                .with_options(no_retry())
                .follow_logs(&id, TemplateLogsOptions::default())
                .await
                .map_err(|e| self.err(&e))?;
            let redactor = self.redactor.clone();
            Ok(events
                .map(move |ev| {
                    ev.map(|ev| TemplateLogLine {
                        line: ev.line,
                        is_final: ev.is_final,
                    })
                    .map_err(|e| map_error(&e, &redactor))
                })
                .boxed())
        }
        .boxed()
    }

    fn list_guests(&self, prefix: String) -> BoxFuture<'_, Result<Vec<GuestInfo>, CallError>> {
        async move {
            let rows = self.walk(&prefix).await?;
            Ok(rows.iter().map(guest).collect())
        }
        .boxed()
    }

    fn list_guests_aged(&self, prefix: String) -> BoxFuture<'_, Result<Vec<AgedGuest>, CallError>> {
        async move {
            let rows = self.walk(&prefix).await?;
            Ok(rows
                .iter()
                .map(|info| AgedGuest {
                    info: guest(info),
                    created_at: info.created_at.as_deref().and_then(parse_rfc3339),
                })
                .collect())
        }
        .boxed()
    }
}

impl CreateOsControlPlane {
    /// Every sandbox whose name starts with `prefix`, walking the listing page by page within
    /// [`LIST_MAX_ROWS`] and [`LIST_DEADLINE`].
    async fn walk(&self, prefix: &str) -> Result<Vec<SandboxInfo>, CallError> {
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
                    .is_some_and(|name| name.starts_with(prefix))
                {
                    found.push(info);
                }
                if seen >= LIST_MAX_ROWS {
                    tracing::warn!(
                        target: sandbox_core::LOG_TARGET,
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
}

/// Page size of a guest listing (the contract's maximum).
const LIST_PAGE: u32 = 500;
/// Rows a listing walks at most (twenty full pages).
const LIST_MAX_ROWS: usize = 10_000;
/// Time a whole listing may take, every page included.
const LIST_DEADLINE: Duration = Duration::from_secs(60);

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Instant;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    const KEY: &str = "sk-core-test-0123456789abcdef";

    /// What the test server does with a request line: answer after a delay, or never.
    type Script = Arc<dyn Fn(&str) -> Option<(Duration, String)> + Send + Sync>;

    /// A keep-alive HTTP/1.1 server on 127.0.0.1 that answers every request per `script`.
    async fn serve(script: Script) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                let script = script.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    let mut seen = Vec::new();
                    loop {
                        let end = loop {
                            if let Some(i) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                                break i + 4;
                            }
                            match sock.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => seen.extend_from_slice(&buf[..n]),
                            }
                        };
                        let head = String::from_utf8_lossy(&seen[..end]).into_owned();
                        seen.drain(..end);
                        let line = head.lines().next().unwrap_or_default().to_owned();
                        let Some((delay, reply)) = script(&line) else {
                            std::future::pending::<()>().await;
                            return;
                        };
                        tokio::time::sleep(delay).await;
                        if sock.write_all(reply.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        format!("http://{addr}")
    }

    fn reply(status: u16, extra_headers: &str, body: &str) -> String {
        format!(
            "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{extra_headers}\r\n{body}",
            body.len()
        )
    }

    /// A full page of 500 sandboxes none of which is called `wanted`, with a huge total.
    fn full_page(line: &str) -> String {
        let offset: u64 = line
            .split("offset=")
            .nth(1)
            .and_then(|v| v.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let rows: Vec<String> = (offset..offset + 500)
            .map(|i| format!(r#"{{"id":"sb-{i}","status":"running","name":"other-{i}"}}"#))
            .collect();
        let body = format!(
            r#"{{"status":"success","data":{{"data":[{}],"pagination":{{"total":1000000000}}}}}}"#,
            rows.join(",")
        );
        reply(200, "", &body)
    }

    #[test]
    fn plain_http_to_another_machine_is_refused_with_the_operators_fix() {
        let Err(e) = CreateOsControlPlane::new(
            &SecretString::from(KEY),
            "http://cp.example.test:8080",
            Duration::from_secs(1),
        ) else {
            panic!("plain http to another machine was accepted");
        };
        let m = e.message();
        assert!(
            m.starts_with("CREATEOS_SANDBOX_BASE_URL=http://cp.example.test:8080 "),
            "{m}"
        );
        assert!(m.contains("https") && m.contains("127.0.0.1"), "{m}");
        // The fix is a setting, not the client library's builder option.
        assert!(!m.contains("ClientBuilder") && !m.contains(KEY), "{m}");
        // Plain http to this machine stays allowed (the fake, a local proxy): no panic here.
        plane("http://127.0.0.1:9", Duration::from_secs(1));
        plane("http://localhost:9", Duration::from_secs(1));
    }

    fn plane(url: &str, timeout: Duration) -> CreateOsControlPlane {
        CreateOsControlPlane::new(&SecretString::from(KEY), url, timeout).unwrap()
    }

    #[tokio::test]
    async fn find_by_name_over_slow_endless_pages_hits_its_deadline() {
        let url = serve(Arc::new(|line: &str| {
            Some((Duration::from_millis(600), full_page(line)))
        }))
        .await;
        let cp = plane(&url, Duration::from_secs(1));
        let started = Instant::now();
        let e = tokio::time::timeout(Duration::from_secs(30), cp.find_by_name("wanted".into()))
            .await
            .expect("find_by_name has an overall deadline")
            .unwrap_err();
        assert_eq!(e.failure, CallFailure::Timeout, "{e:?}");
        assert!(
            started.elapsed() >= Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
    }

    #[tokio::test]
    async fn find_by_name_with_a_stalling_second_page_times_out() {
        let url = serve(Arc::new(|line: &str| {
            if line.contains("offset=0") {
                Some((Duration::ZERO, full_page(line)))
            } else {
                None
            }
        }))
        .await;
        let cp = plane(&url, Duration::from_millis(500));
        let e = tokio::time::timeout(Duration::from_secs(30), cp.find_by_name("wanted".into()))
            .await
            .expect("a stalled page is bounded")
            .unwrap_err();
        assert_eq!(e.failure, CallFailure::Timeout, "{e:?}");
    }

    #[tokio::test]
    async fn map_error_passes_the_parsed_retry_after_and_types_redirects() {
        let url = serve(Arc::new(|line: &str| {
            let busy = r#"{"status":"error","message":"busy"}"#;
            Some((
                Duration::ZERO,
                if line.contains("/v1/whoami") {
                    reply(429, "retry-after: 0\r\n", busy)
                } else if line.contains("/v1/sandboxes/ra2") {
                    reply(503, "retry-after: 2\r\n", busy)
                } else if line.contains("/v1/sandboxes/garbage") {
                    reply(503, "retry-after: soon\r\n", busy)
                } else if line.contains("/v1/sandboxes/long") {
                    reply(429, "retry-after: 86400\r\n", busy)
                } else if line.contains("/v1/sandboxes/redir") {
                    reply(302, "location: https://elsewhere.test/x\r\n", "")
                } else {
                    // A protocol error that merely mentions a redirect.
                    reply(200, "", r#"{"status":"odd","message":"redirect me"}"#)
                },
            ))
        }))
        .await;
        let cp = plane(&url, Duration::from_secs(5));
        let e = cp.check_credential().await.unwrap_err();
        assert_eq!(e.failure, CallFailure::Status(429));
        assert_eq!(e.retry_after, Some(Duration::ZERO));
        let e = map_error(
            &cp.client.get_sandbox("ra2").await.unwrap_err(),
            &cp.redactor,
        );
        assert_eq!(e.retry_after, Some(Duration::from_secs(2)));
        let e = map_error(
            &cp.client.get_sandbox("garbage").await.unwrap_err(),
            &cp.redactor,
        );
        assert_eq!(e.retry_after, None);
        let e = map_error(
            &cp.client.get_sandbox("long").await.unwrap_err(),
            &cp.redactor,
        );
        assert_eq!(e.retry_after, Some(MAX_RETRY_AFTER));
        let e = map_error(
            &cp.client.get_sandbox("redir").await.unwrap_err(),
            &cp.redactor,
        );
        assert_eq!(e.failure, CallFailure::Redirect);
        let e = map_error(
            &cp.client.get_sandbox("worded").await.unwrap_err(),
            &cp.redactor,
        );
        assert_eq!(e.failure, CallFailure::Protocol, "{e:?}");
    }

    #[test]
    fn hostile_base_urls_are_refused_without_their_secrets() {
        for url in [
            "https://user:pw-secret@/x",
            "https://user:pw-secret@host.test:99999",
            "https://host.test/api?token=tok-secret",
            "http://evil.localhost:1",
        ] {
            let e =
                CreateOsControlPlane::new(&SecretString::from(KEY), url, Duration::from_secs(1))
                    .unwrap_err();
            let text = format!("{e} {e:?}");
            assert!(!text.contains("secret"), "{url}: {text}");
            assert!(!text.contains(KEY), "{url}: {text}");
        }
        let cp = plane("http://127.0.0.1:1", Duration::from_secs(1));
        assert!(format!("{cp:?}").contains("127.0.0.1:1"));
    }
}
