//! [`OpenSandbox`]: the OpenSandbox provider behind sandbox-core's [`Provider`] seam.
//!
//! sandbox-core decides the policy ([`GuestSpec`]); this module spells it for an OpenSandbox
//! server and reports back what the server did. What it adds on its own: the name nonce in
//! metadata (`lf-name`, found again by [`Provider::find`]), `Running` then `/ping` then the
//! guest checks in [`Provider::wait_ready`], the `dns+nft` read-back in
//! [`Provider::verify_egress`], an idle deadline on every exec stream, delete that counts 404
//! as gone, and renewals clamped to `OPEN_SANDBOX_MAX_RENEW_SECONDS`.
//!
//! Kept guests (the component's Guest Reuse): the name is a metadata label, not unique, so a
//! lookup keeps the oldest live holder and destroys newer duplicates, and a create that finds
//! an older holder gives its own sandbox up (409, adopted by sandbox-core); the declared
//! environment's names are a label too (`lf-env`); every adoption renews the server-side
//! expiry (never shortening it); a kept guest whose policy drifted is destroyed and created
//! again ([`Provider::replaces_drifted_kept_guests`]).

use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{StreamExt, TryStreamExt};
use opensandbox_api::{
    CreateSandbox, DownloadOptions, ErrorKind as ApiKind, ExecEvent, Lifetime, NewDirectory,
    RunCommand, SandboxInfo, SandboxState, StreamOptions, UploadFile,
};
use tokio::time::Instant;

use crate::gates;
use crate::lifecycle::{META_NONCE, OpenSandboxProvider};
use crate::settings::{Attestation, OpenSandboxSettings};
use sandbox_core::control::parse_rfc3339;
use sandbox_core::egress::EgressPolicy;
use sandbox_core::error::SandboxError;
use sandbox_core::provider::{
    AgedGuest, CallError, CallFailure, Download, EgressCheck, ExecFrame, ExecRequest, ExecStream,
    GuestInfo, GuestSpec, GuestStatus, Isolation, Labels, ProcessSpec, Provider, ProviderKind,
    Readiness, Size, left,
};

/// The metadata key holding [`GuestSpec::name`] (OpenSandbox has no unique name).
pub const META_NAME: &str = "lf-name";
/// The metadata key holding the names (never the values) of the environment declared at
/// create, joined by `.`, so that an adopted kept sandbox's keys can be compared with the
/// run's (the server reports no environment). Absent when none was declared.
pub const META_ENV: &str = "lf-env";
/// Longest metadata value the server accepts (Kubernetes label rules).
const LABEL_VALUE_MAX: usize = 63;
/// How long execd may take to answer a background command's start (its id, at once).
const SPAWN_ANSWER: Duration = Duration::from_secs(30);

/// The memory sizes offered (MiB): the server takes any `resourceLimits`, so the catalog is
/// ours; sandbox-core picks the smallest that fits.
pub const SIZES_MIB: [u32; 6] = [512, 1024, 2048, 4096, 8192, 16_384];

/// The OpenSandbox provider as a [`Provider`].
#[derive(Debug, Clone)]
pub struct OpenSandbox {
    inner: OpenSandboxProvider,
}

impl OpenSandbox {
    /// The provider over `settings`; refused without a key or with an unusable domain.
    pub fn new(settings: OpenSandboxSettings) -> Result<Self, SandboxError> {
        Ok(Self {
            inner: OpenSandboxProvider::new(settings)?,
        })
    }

    /// The provider's own API (create with every gate, run, sweep).
    pub fn inner(&self) -> &OpenSandboxProvider {
        &self.inner
    }
}

fn call_error(what: &str, e: &opensandbox_api::Error) -> CallError {
    let failure = match e {
        _ if e.is_redirect() => CallFailure::Redirect,
        // A failed TLS handshake fails again until a setting changes.
        _ if e.is_tls_failure() => CallFailure::Config,
        _ if e.status().is_some() => CallFailure::Status(e.status().map_or(0, |s| s.as_u16())),
        _ => match e.kind() {
            ApiKind::Transport => CallFailure::Transport,
            ApiKind::Timeout | ApiKind::Idle | ApiKind::Wait => CallFailure::Timeout,
            ApiKind::TooLarge => CallFailure::TooLarge,
            ApiKind::Config => CallFailure::Config,
            _ => CallFailure::Protocol,
        },
    };
    let hint = if e.is_tls_failure() {
        format!(" ({})", crate::settings::TLS_FAILURE_HINT)
    } else {
        String::new()
    };
    let mut err = CallError::new(
        failure,
        format!(
            "OpenSandbox: {what}: {}{hint}",
            outside_text::snippet(&e.to_string(), 600)
        ),
    );
    err.retry_after = e.as_api().and_then(|a| a.retry_after);
    err
}

fn refused(e: &SandboxError) -> CallError {
    CallError::new(CallFailure::Config, e.message().to_owned())
}

fn status_of(state: &SandboxState) -> GuestStatus {
    match state {
        SandboxState::Pending => GuestStatus::Creating,
        SandboxState::Running => GuestStatus::Running,
        SandboxState::Pausing => GuestStatus::Pausing,
        SandboxState::Paused => GuestStatus::Paused,
        SandboxState::Resuming => GuestStatus::Resuming,
        SandboxState::Stopping => GuestStatus::Destroying,
        SandboxState::Terminated => GuestStatus::Destroyed,
        SandboxState::Failed => GuestStatus::Failed,
        other => GuestStatus::Other(other.to_string()),
    }
}

fn info_of(sb: &SandboxInfo) -> GuestInfo {
    GuestInfo {
        id: sb.id.clone(),
        name: sb.metadata.get(META_NAME).cloned(),
        status: status_of(sb.state()),
        egress: None,
        envs: Some(env_names_of(sb.metadata.get(META_ENV).map(String::as_str))),
        auto_pause_after_seconds: None,
    }
}

/// [`META_ENV`]'s value for `names`: `None` when there are none, and when they do not fit a
/// metadata value (then an adopted sandbox reports no keys, differs from the run's, and is
/// replaced).
fn env_label<'a>(names: impl IntoIterator<Item = &'a String>) -> Option<String> {
    let names: Vec<&str> = names.into_iter().map(String::as_str).collect();
    let fits = names.iter().all(|n| {
        n.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
            && n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
    });
    let joined = names.join(".");
    (fits && !joined.is_empty() && joined.len() <= LABEL_VALUE_MAX && !joined.ends_with('_'))
        .then_some(joined)
}

/// The names [`env_label`] stored (none when absent).
fn env_names_of(label: Option<&str>) -> Vec<String> {
    label
        .map(|l| {
            l.split('.')
                .filter(|n| !n.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// The order in which sandboxes holding one name are kept: the oldest first (by creation
/// time; one without a readable time last), then by id, so every caller keeps the same one.
fn holder_order(sb: &SandboxInfo) -> (bool, Option<opensandbox_api::OffsetDateTime>, String) {
    let created = sb.created();
    (created.is_none(), created, sb.id.clone())
}

/// The memory limit (MiB) of `size`: its own, or, when the surfaces passed only the id (as
/// `guest::GuestSpec::for_provider` does), the id's (`<MiB>Mi`, as [`Provider::sizes`] names
/// them). Anything else is refused before create.
fn mem_of(size: &Size) -> Result<u32, SandboxError> {
    if size.mem_mib > 0 {
        return Ok(size.mem_mib);
    }
    size.id
        .strip_suffix("Mi")
        .and_then(|m| m.parse::<u32>().ok())
        .filter(|m| SIZES_MIB.contains(m))
        .ok_or_else(|| {
            SandboxError::refused(format!(
                "{:?} is not an OpenSandbox size; use one of {}",
                outside_text::snippet(&size.id, 40),
                SIZES_MIB.map(|m| format!("{m}Mi")).join(", ")
            ))
        })
}

fn boxed<T: Send + 'static>(
    f: impl Future<Output = Result<T, CallError>> + Send + 'static,
) -> BoxFuture<'static, Result<T, CallError>> {
    Box::pin(f)
}

/// Turns execd events into seam frames: one line per `stdout`/`stderr` event gets its line end
/// back; an `error` with a numeric value is the exit code, `execution_complete` without one is
/// exit 0; pings are heartbeats.
fn frames_of(stream: opensandbox_api::CommandStream) -> ExecStream {
    stream
        .map_err(|e| call_error("the command's stream", &e))
        .scan(false, |exited, ev| {
            let frame = match ev {
                Ok(ExecEvent::Stdout { text, .. }) => Some(Ok(ExecFrame::Stdout(line(text)))),
                Ok(ExecEvent::Stderr { text, .. }) => Some(Ok(ExecFrame::Stderr(line(text)))),
                Ok(ExecEvent::Ping) => Some(Ok(ExecFrame::Heartbeat)),
                Ok(ExecEvent::Error(e)) if !*exited => {
                    *exited = true;
                    Some(Ok(match e.value.trim().parse::<i64>() {
                        Ok(code) => ExecFrame::Exit(code),
                        Err(_) => ExecFrame::Error(format!(
                            "{}: {}",
                            outside_text::snippet(&e.name, 80),
                            outside_text::snippet(&e.value, 400)
                        )),
                    }))
                }
                Ok(ExecEvent::Complete { .. }) if !*exited => {
                    *exited = true;
                    Some(Ok(ExecFrame::Exit(0)))
                }
                Ok(_) => None,
                Err(e) => Some(Err(e)),
            };
            futures::future::ready(Some(frame))
        })
        .filter_map(futures::future::ready)
        .boxed()
}

fn line(mut text: String) -> String {
    if !text.ends_with('\n') {
        text.push('\n');
    }
    text
}

impl Provider for OpenSandbox {
    fn kind(&self) -> ProviderKind {
        ProviderKind::OpenSandbox
    }

    fn isolation(&self) -> Isolation {
        match self.inner.settings().attestation {
            Attestation::HardwareVirtualized => Isolation::HardwareVirtualized,
            Attestation::None => Isolation::Container,
        }
    }

    fn readiness(&self) -> Option<Readiness> {
        Some(Readiness {
            budget: self.inner.settings().ready,
            setting: crate::settings::ENV_READY,
        })
    }

    fn check(&self) -> BoxFuture<'_, Result<String, CallError>> {
        let client = self.inner.client().clone();
        boxed(async move {
            let filter =
                opensandbox_api::SandboxFilter::metadata(Labels::CREATED_BY, Labels::CREATED_BY_US);
            client
                .list_sandboxes(&filter, 1)
                .await
                .map_err(|e| call_error("listing sandboxes", &e))?;
            Ok(format!("opensandbox at {}", client.base_url()))
        })
    }

    fn sizes(&self) -> BoxFuture<'_, Result<Vec<Size>, CallError>> {
        let cpu = self.inner.settings().cpu.clone();
        let vcpu = cpu
            .strip_suffix('m')
            .and_then(|m| m.parse::<u32>().ok())
            .map_or_else(|| cpu.parse::<u32>().unwrap_or(1), |m| m.div_ceil(1000))
            .max(1);
        let sizes = SIZES_MIB
            .iter()
            .map(|&mem_mib| Size {
                id: format!("{mem_mib}Mi"),
                vcpu,
                mem_mib,
            })
            .collect();
        boxed(async move { Ok(sizes) })
    }

    fn create(&self, spec: GuestSpec) -> BoxFuture<'_, Result<GuestInfo, CallError>> {
        let p = self.inner.clone();
        boxed(async move {
            let guard = p.server_guard();
            let policy = gates::policy_of(&spec.egress, &guard).map_err(|e| refused(&e))?;
            gates::refuse_server_in_allowlist(policy.as_ref(), &guard).map_err(|e| refused(&e))?;
            let mem_mib = mem_of(&spec.size).map_err(|e| refused(&e))?;
            let s = p.settings();
            let image = if spec.image.is_empty() {
                s.image.clone()
            } else {
                spec.image.clone()
            };
            let lifetime = s
                .sandbox_timeout
                .max(spec.lifetime.budget + spec.lifetime.idle_backstop);
            let mut request = CreateSandbox::from_image(image.clone(), s.entrypoint.clone())
                .lifetime(Lifetime::After(lifetime))
                .resource("cpu", s.cpu.clone())
                .resource("memory", format!("{mem_mib}Mi"))
                .metadata(META_NAME, spec.name.clone())
                .metadata(META_NONCE, spec.name.clone());
            for (k, v) in &spec.labels.0 {
                request = request.metadata(k.clone(), v.clone());
            }
            // The deployment's own marker (`OPEN_SANDBOX_CREATED_BY`) wins: the sweep looks
            // for it.
            request = request.metadata(Labels::CREATED_BY, s.created_by.clone());
            for (k, v) in &spec.envs {
                request = request.secret_env(k.clone(), v.clone());
            }
            if let Some(names) = env_label(spec.envs.keys()) {
                request = request.metadata(META_ENV, names);
            }
            let has_policy = policy.is_some();
            if let Some(policy) = policy {
                request = request.network_policy(policy);
            }
            let sb = match p.client().create_sandbox(&request).await {
                Ok(sb) => sb,
                Err(e) => {
                    // An image the server cannot pull, or a server that cannot apply the
                    // policy (host network mode, gVisor, no egress sidecar), is refused with
                    // the setting to change.
                    let refusal = p.create_refusal(&e, &image, lifetime, has_policy);
                    if refusal.kind() == sandbox_core::error::ErrorKind::Refused {
                        return Err(refused(&refusal));
                    }
                    let err = call_error("creating a sandbox", &e);
                    // The server answered with its own error (a 5xx with its code): the
                    // request ended there, and nothing lands later. Whatever it made is found
                    // by the nonce now, once, and deleted, so the lifecycle need not keep
                    // looking for it (a lost answer, without the server's code, still is).
                    if e.is_retryable()
                        && e.code().is_some()
                        && p.destroy_by_nonce(&spec.name).await
                    {
                        return Err(err.with_nothing_created());
                    }
                    return Err(err);
                }
            };
            if spec.labels.0.contains_key(Labels::KEPT) {
                // No unique names: a kept guest's name may have been taken meanwhile by
                // another worker. The oldest holder keeps it; a newer one is given up.
                p.yield_to_older_holder(&spec.name, &sb).await?;
            }
            let mut info = info_of(&sb);
            info.name = Some(spec.name);
            info.envs = Some(spec.envs.keys().cloned().collect());
            Ok(info)
        })
    }

    fn find(&self, name: String) -> BoxFuture<'_, Result<Option<GuestInfo>, CallError>> {
        let p = self.inner.clone();
        boxed(async move {
            let found = p
                .named_ours(&name)
                .await
                .map_err(|e| call_error("finding a sandbox by name", &e))?;
            Ok(p.one_holder(&name, found).await)
        })
    }

    fn get(&self, id: String) -> BoxFuture<'_, Result<GuestInfo, CallError>> {
        let client = self.inner.client().clone();
        boxed(async move {
            client
                .get_sandbox(&id)
                .await
                .map(|sb| info_of(&sb))
                .map_err(|e| call_error(&format!("reading sandbox {id}"), &e))
        })
    }

    fn wait_ready(
        &self,
        id: String,
        deadline: Instant,
    ) -> BoxFuture<'_, Result<GuestInfo, CallError>> {
        let p = self.inner.clone();
        boxed(async move {
            let budget = left(deadline).max(Duration::from_secs(1));
            let checked = async {
                p.wait_running_and_execd(&id, budget).await?;
                p.check_guest(&id).await
            };
            match checked.await {
                Ok(_) => {}
                Err(e) if e.kind() == sandbox_core::error::ErrorKind::Refused => {
                    return Err(refused(&e));
                }
                Err(e) => {
                    return Err(CallError::new(CallFailure::Timeout, e.message().to_owned()));
                }
            }
            p.client()
                .get_sandbox(&id)
                .await
                .map(|sb| info_of(&sb))
                .map_err(|e| call_error(&format!("reading sandbox {id}"), &e))
        })
    }

    fn verify_egress(
        &self,
        id: String,
        policy: EgressPolicy,
    ) -> BoxFuture<'_, Result<EgressCheck, CallError>> {
        let p = self.inner.clone();
        boxed(async move {
            let sent = match gates::policy_of(&policy, &p.server_guard()) {
                Ok(Some(sent)) => sent,
                Ok(None) => return Ok(EgressCheck::Matches),
                Err(e) => return Ok(EgressCheck::Differs(e.message().to_owned())),
            };
            match p.check_egress(&id, &sent).await {
                Ok(()) => Ok(EgressCheck::Matches),
                Err(e) if e.kind() == sandbox_core::error::ErrorKind::Refused => {
                    Ok(EgressCheck::Differs(e.message().to_owned()))
                }
                Err(e) => Err(CallError::new(
                    CallFailure::Transport,
                    e.message().to_owned(),
                )),
            }
        })
    }

    fn exec_stream(
        &self,
        id: String,
        req: ExecRequest,
    ) -> BoxFuture<'_, Result<ExecStream, CallError>> {
        let p = self.inner.clone();
        boxed(async move {
            let execd = p.client().execd(&id);
            let mut argv = vec![req.cmd.clone()];
            argv.extend(req.args.iter().cloned());
            if !req.stdin.is_empty() {
                // execd has no stdin: the input goes to a file the command reads.
                let path = format!("/tmp/lf-stdin-{}", crate::lifecycle::nonce());
                execd
                    .upload(&[
                        UploadFile::new(path.clone(), req.stdin.clone().into_bytes()).mode(0o600),
                    ])
                    .await
                    .map_err(|e| call_error("uploading the command's input", &e))?;
                let mut wrapped = vec![
                    "sh".to_owned(),
                    "-c".to_owned(),
                    "f=\"$1\"; shift; exec \"$@\" < \"$f\"".to_owned(),
                    "sh".to_owned(),
                    path,
                ];
                wrapped.extend(argv);
                argv = wrapped;
            }
            let mut cmd = RunCommand::argv(argv).timeout(req.timeout);
            for (k, v) in &req.env {
                cmd = cmd.secret_env(k.clone(), v.clone());
            }
            let stream = execd
                .run(
                    &cmd,
                    StreamOptions {
                        idle_timeout: p.settings().idle,
                        deadline: Some(req.timeout),
                        ..StreamOptions::default()
                    },
                )
                .await
                .map_err(|e| call_error("starting a command", &e))?;
            Ok(frames_of(stream))
        })
    }

    fn upload(
        &self,
        id: String,
        path: String,
        data: Bytes,
    ) -> BoxFuture<'_, Result<(), CallError>> {
        let p = self.inner.clone();
        boxed(async move {
            let execd = p.client().execd(&id);
            if let Some((parent, _)) = path.rsplit_once('/').filter(|(d, _)| !d.is_empty()) {
                execd
                    .make_dirs(&[NewDirectory::new(parent, 0o755)])
                    .await
                    .map_err(|e| call_error("creating a directory", &e))?;
            }
            execd
                .upload(&[UploadFile::new(path, data).mode(0o644)])
                .await
                .map_err(|e| call_error("uploading a file", &e))
        })
    }

    fn download(
        &self,
        id: String,
        path: String,
        max_bytes: Option<u64>,
    ) -> BoxFuture<'_, Result<Download, CallError>> {
        let p = self.inner.clone();
        boxed(async move {
            let d = p
                .client()
                .execd(&id)
                .download(
                    &path,
                    DownloadOptions::capped(max_bytes.unwrap_or(u64::MAX)),
                )
                .await
                .map_err(|e| call_error("downloading a file", &e))?;
            let content_length = d.content_length();
            Ok(Download {
                content_length,
                body: d.map_err(|e| call_error("downloading a file", &e)).boxed(),
            })
        })
    }

    fn destroy(&self, id: String) -> BoxFuture<'_, Result<(), CallError>> {
        let p = self.inner.clone();
        boxed(async move {
            p.destroy(&id)
                .await
                .map(|_| ())
                .map_err(|e| CallError::new(CallFailure::Transport, e.message().to_owned()))
        })
    }

    fn list_ours(&self, prefix: String) -> BoxFuture<'_, Result<Vec<AgedGuest>, CallError>> {
        let client = self.inner.client().clone();
        let created_by = self.inner.settings().created_by.clone();
        boxed(async move {
            let found = client
                .find_by_metadata(Labels::CREATED_BY, &created_by)
                .await
                .map_err(|e| call_error("listing our sandboxes", &e))?;
            Ok(found
                .iter()
                .filter(|sb| {
                    sb.metadata
                        .get(META_NAME)
                        .is_some_and(|n| n.starts_with(&prefix))
                })
                .map(|sb| AgedGuest {
                    info: info_of(sb),
                    created_at: sb.created_at.as_deref().and_then(parse_rfc3339),
                })
                .collect())
        })
    }

    fn keep_alive(
        &self,
        id: String,
        idle: Duration,
    ) -> BoxFuture<'_, Result<GuestInfo, CallError>> {
        let p = self.inner.clone();
        boxed(async move {
            // As long as a create would have made it live (`OPEN_SANDBOX_SANDBOX_TIMEOUT_SECONDS`
            // at least), from now; an expiry already further away is left as it is.
            let s = p.settings();
            let wanted = idle
                .max(s.sandbox_timeout)
                .max(opensandbox_api::MIN_TIMEOUT);
            let sb = p
                .client()
                .get_sandbox(&id)
                .await
                .map_err(|e| call_error(&format!("reading sandbox {id}"), &e))?;
            let far_enough = sb.expires().is_some_and(|at| {
                time_left(at).is_some_and(|left| left >= wanted.min(s.max_renew))
            });
            if !far_enough {
                let renewal = p
                    .client()
                    .renew_expiration(&id, wanted, s.max_renew)
                    .await
                    .map_err(|e| call_error(&format!("renewing sandbox {id}"), &e))?;
                if renewal.clamped {
                    tracing::warn!(
                        target: sandbox_core::LOG_TARGET,
                        sandbox = %id,
                        "a kept sandbox's expiry was renewed by {}s, not the {}s asked for; \
                         raise OPEN_SANDBOX_MAX_RENEW_SECONDS above twice the node's timeout \
                         plus 240 s so a long run is not cut by the server",
                        s.max_renew.as_secs(),
                        wanted.as_secs()
                    );
                }
                tracing::debug!(
                    target: sandbox_core::LOG_TARGET,
                    sandbox = %id,
                    expires_at = %outside_text::snippet(&renewal.expires_at, 40),
                    clamped = renewal.clamped,
                    "renewed a kept sandbox's expiry"
                );
            }
            Ok(info_of(&sb))
        })
    }

    fn replaces_drifted_kept_guests(&self) -> bool {
        true
    }

    /// A background command of execd (`"background": true`): execd answers its id at once and
    /// the process lives on until it ends, its timeout fires or the sandbox is deleted (the
    /// executor's warm runner). Never repeated.
    fn spawn_process(
        &self,
        id: String,
        spec: ProcessSpec,
    ) -> BoxFuture<'_, Result<String, CallError>> {
        let p = self.inner.clone();
        boxed(async move {
            let mut argv = vec![spec.cmd.clone()];
            argv.extend(spec.args.iter().cloned());
            let mut cmd = RunCommand::argv(argv).background(true);
            if !spec.cwd.is_empty() {
                cmd = cmd.cwd(spec.cwd.clone());
            }
            let mut stream = p
                .client()
                .execd(&id)
                .run(
                    &cmd,
                    StreamOptions {
                        idle_timeout: p.settings().idle,
                        deadline: Some(SPAWN_ANSWER),
                        ..StreamOptions::default()
                    },
                )
                .await
                .map_err(|e| call_error("starting a background process", &e))?;
            // The answer is `init` (the id) then `execution_complete`, at once; an `error`
            // frame is a process that could not start.
            while let Some(ev) = stream.next().await {
                match ev.map_err(|e| call_error("starting a background process", &e))? {
                    ExecEvent::Error(e) => {
                        return Err(CallError::new(
                            CallFailure::Protocol,
                            format!(
                                "OpenSandbox: the background process did not start: {}: {}",
                                outside_text::snippet(&e.name, 80),
                                outside_text::snippet(&e.value, 400)
                            ),
                        ));
                    }
                    _ if stream.command_id().is_some() => break,
                    _ => {}
                }
            }
            stream.command_id().map(str::to_owned).ok_or_else(|| {
                CallError::new(
                    CallFailure::Protocol,
                    "OpenSandbox: execd answered a background command without its id",
                )
            })
        })
    }
}

/// Time from now until `at`; `None` once it passed.
fn time_left(at: opensandbox_api::OffsetDateTime) -> Option<Duration> {
    Duration::try_from(at - opensandbox_api::OffsetDateTime::now_utc()).ok()
}

impl OpenSandboxProvider {
    /// Of the sandboxes `found` under one name, the one that holds it: the oldest live one
    /// ([`holder_order`]). Newer live duplicates (two workers that created the same kept
    /// guest at once) are destroyed, and so are failed ones. When only terminal ones remain
    /// the name is free: one is reported destroyed (`None` when there is none).
    async fn one_holder(&self, name: &str, mut found: Vec<SandboxInfo>) -> Option<GuestInfo> {
        found.sort_by_key(holder_order);
        let (live, dead): (Vec<SandboxInfo>, Vec<SandboxInfo>) =
            found.into_iter().partition(|sb| !info_of(sb).is_terminal());
        for extra in live.iter().skip(1) {
            tracing::warn!(
                target: sandbox_core::LOG_TARGET,
                guest = %name,
                sandbox = %extra.id,
                "two sandboxes hold one kept guest's name; destroying the newer one"
            );
            if let Err(e) = self.destroy(&extra.id).await {
                tracing::warn!(target: sandbox_core::LOG_TARGET, "{}", e.message());
            }
        }
        for failed in dead.iter().filter(|sb| *sb.state() == SandboxState::Failed) {
            if let Err(e) = self.destroy(&failed.id).await {
                tracing::warn!(target: sandbox_core::LOG_TARGET, "{}", e.message());
            }
        }
        if let Some(holder) = live.first() {
            return Some(info_of(holder));
        }
        dead.first().map(|sb| GuestInfo {
            status: GuestStatus::Destroyed,
            ..info_of(sb)
        })
    }

    /// The sandboxes (in any state) of this deployment that carry the kept name `name`: both
    /// the name and this deployment's `created-by` marker, so that two deployments sharing a
    /// server never adopt or delete each other's kept sandboxes (issue 45).
    async fn named_ours(&self, name: &str) -> opensandbox_api::Result<Vec<SandboxInfo>> {
        let filter = opensandbox_api::SandboxFilter::metadata(META_NAME, name)
            .and_metadata(Labels::CREATED_BY, self.settings().created_by.clone());
        self.client().list_all_sandboxes(&filter).await
    }

    /// After creating `ours` under the kept name `name`: when an older live sandbox holds the
    /// name, destroys `ours` and answers 409, so sandbox-core adopts the older one. A listing
    /// that fails keeps `ours` (the next lookup settles it).
    async fn yield_to_older_holder(&self, name: &str, ours: &SandboxInfo) -> Result<(), CallError> {
        let Ok(mut found) = self.named_ours(name).await else {
            return Ok(());
        };
        found.retain(|sb| !info_of(sb).is_terminal());
        found.sort_by_key(holder_order);
        let Some(holder) = found.first() else {
            return Ok(());
        };
        if holder.id == ours.id || !found.iter().any(|sb| sb.id == ours.id) {
            return Ok(());
        }
        tracing::info!(
            target: sandbox_core::LOG_TARGET,
            guest = %name,
            "another worker created this kept guest first; giving up ours and adopting that one"
        );
        if let Err(e) = self.destroy(&ours.id).await {
            tracing::warn!(target: sandbox_core::LOG_TARGET, "{}", e.message());
        }
        Err(CallError::new(
            CallFailure::Status(409),
            format!("OpenSandbox: the kept guest {name} was created meanwhile by another caller"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn size(id: &str, mem_mib: u32) -> Size {
        Size {
            id: id.to_owned(),
            vcpu: 0,
            mem_mib,
        }
    }

    #[test]
    fn env_names_travel_in_one_label_value_when_they_fit() {
        let names = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let two = names(&["HTTPS_PROXY", "LF_TOKEN"]);
        let label = env_label(&two).unwrap();
        assert_eq!(label, "HTTPS_PROXY.LF_TOKEN");
        assert_eq!(env_names_of(Some(&label)), two);
        assert_eq!(env_label(&names(&[])), None);
        assert!(env_names_of(None).is_empty());
        // Not a label value: too long, or a name a label cannot start, end or hold.
        assert_eq!(env_label(&names(&[&"A".repeat(64)])), None);
        for bad in ["_LEADING", "TRAILING_", "HAS-DASH", "ÉTÉ"] {
            assert_eq!(env_label(&names(&[bad])), None, "{bad}");
        }
    }

    #[test]
    fn a_size_passed_by_id_gets_the_id_s_memory_limit() {
        assert_eq!(mem_of(&size("8192Mi", 0)).unwrap(), 8192);
        assert_eq!(mem_of(&size("anything", 2048)).unwrap(), 2048);
        let e = mem_of(&size("s-4vcpu-8gb", 0)).unwrap_err();
        assert!(e.message().contains("512Mi"), "{e}");
        assert!(mem_of(&size("3000Mi", 0)).is_err());
    }
}
