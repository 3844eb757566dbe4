//! A sandbox's life on an OpenSandbox server: create with a nonce (a lost answer is found and
//! destroyed), wait for `Running` and for execd's `/ping`, check the egress read-back, the
//! RuntimeClass, the endpoint and the in-guest probe before any user code, run a program
//! under two clocks and an idle deadline, and destroy (404 is gone, a 500 is tried again).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use opensandbox_api::{
    Client, CreateSandbox, Deletion, ErrorKind as ApiKind, ExecEvent, ExitStatus, Lifetime,
    NetworkPolicy, RunCommand, StreamOptions, UploadFile,
};

use crate::gates::{self, Egress, Probe};
use crate::settings::{
    Attestation, ENV_IMAGE, ENV_READY, ENV_SANDBOX_TIMEOUT, OpenSandboxSettings,
};
use sandbox_core::error::{ErrorKind, SandboxError};
use sandbox_core::output::TailBuffer;
use sandbox_core::withheld;

/// The metadata key every sandbox of this plugin carries (value: the `created-by` setting).
pub const META_CREATED_BY: &str = sandbox_core::provider::Labels::CREATED_BY;
/// The metadata key of the create nonce.
pub const META_NONCE: &str = "lf-nonce";
/// The metadata key of the surface that made the sandbox.
pub const META_SURFACE: &str = sandbox_core::provider::Labels::SURFACE;
/// How long a first delete that failed waits before its one more try.
const DELETE_RETRY_PAUSE: Duration = Duration::from_millis(500);
/// Where the program is uploaded.
const PROGRAM_PATH: &str = "/tmp/lf-run/main.py";
/// After `timeout(1)`'s TERM, how long before its KILL.
const KILL_AFTER: Duration = Duration::from_secs(2);
/// How much longer the host waits for the stream before it gives up and destroys.
const HOST_GRACE: Duration = Duration::from_secs(5);
/// The exit code lfx reads as "timed out".
pub const EXIT_TIMED_OUT: i32 = -1;

/// A guest exit as lfx reads it: `timeout(1)`'s 124 (TERM) and 137 (KILL) are a timeout only
/// when the run reached its budget; earlier, a 137 is an out-of-memory kill and a program's
/// own 124 stays its code.
fn classify_exit(code: i32, elapsed: Duration, budget: Duration) -> i32 {
    match code {
        124 | 137 if elapsed >= budget => EXIT_TIMED_OUT,
        other => other,
    }
}

/// What one sandbox is created for.
#[derive(Debug, Clone)]
pub struct SandboxSpec {
    /// The egress the run gets.
    pub egress: Egress,
    /// Memory limit in MiB.
    pub memory_mb: u32,
    /// The surface asking (`backend`, `component`, `executor`), recorded in metadata.
    pub surface: &'static str,
    /// The longest one run may take: the server-side lifetime is kept above it.
    pub run_budget: Duration,
}

/// One program run's result, as lfx reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunOutcome {
    /// Standard output kept (the tail, after a marker when truncated).
    pub stdout: String,
    /// Standard error kept.
    pub stderr: String,
    /// The exit code; -1 for a timeout.
    pub exit_code: i32,
    /// Whether standard output was cut to the cap (its tail kept, after a marker).
    pub stdout_truncated: bool,
    /// Whether standard error was cut.
    pub stderr_truncated: bool,
    /// Wall time of the command.
    pub elapsed: Duration,
}

/// The OpenSandbox provider: a client and the settings it was built from.
#[derive(Debug, Clone)]
pub struct OpenSandboxProvider {
    client: Client,
    settings: OpenSandboxSettings,
}

pub(crate) fn api_error(what: &str, e: &opensandbox_api::Error) -> SandboxError {
    if e.is_tls_failure() {
        // The same handshake fails the same way until a setting changes: not transient.
        return SandboxError::refused(format!(
            "OpenSandbox: {what} failed: {} ({})",
            crate::settings::TLS_FAILURE_HINT,
            outside_text::snippet(&e.to_string(), 400)
        ));
    }
    let kind = match e.kind() {
        ApiKind::Auth | ApiKind::InvalidRequest | ApiKind::NotFound | ApiKind::Conflict => {
            ErrorKind::Rejected
        }
        ApiKind::Config => ErrorKind::Refused,
        _ => ErrorKind::Transient,
    };
    let hint = if e.kind() == ApiKind::Auth {
        " (check OPEN_SANDBOX_API_KEY against the server's [server] api_key)"
    } else {
        ""
    };
    SandboxError::new(
        kind,
        format!(
            "OpenSandbox: {what} failed: {}{hint}",
            outside_text::snippet(&e.to_string(), 600)
        ),
    )
}

pub(crate) fn nonce() -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    use rand::RngCore;
    let mut b = [0u8; 12];
    rand::rng().fill_bytes(&mut b);
    b.iter()
        .flat_map(|x| [HEX[usize::from(x >> 4)], HEX[usize::from(x & 15)]])
        .map(char::from)
        .collect()
}

/// Appends one execd output frame: execd sends a line per frame without its line end (and a
/// blank line as `"\n"`); a frame that already ends a line is kept as it is.
pub(crate) fn push_line(buf: &mut TailBuffer, text: &str) {
    buf.push(text.as_bytes());
    if !text.ends_with('\n') {
        buf.push(b"\n");
    }
}

impl OpenSandboxProvider {
    /// A provider over `settings`; refused without a key or with an unusable domain.
    pub fn new(settings: OpenSandboxSettings) -> Result<Self, SandboxError> {
        let client = settings.client()?;
        Ok(Self { client, settings })
    }

    /// The settings.
    pub fn settings(&self) -> &OpenSandboxSettings {
        &self.settings
    }

    /// The client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// What every egress policy must keep guests from: this client's server, unless the
    /// operator says no sandbox can route to it (`OPEN_SANDBOX_SERVER_UNREACHABLE`).
    pub fn server_guard(&self) -> gates::ServerGuard {
        gates::ServerGuard::new(self.client.base_url(), self.settings.server_unreachable)
    }

    /// Deletes sandbox `id`: a 404 is gone; a failure is tried once more (the client already
    /// repeats transport errors and 5xx within its policy).
    pub async fn destroy(&self, id: &str) -> Result<Deletion, SandboxError> {
        match self.client.delete_sandbox(id).await {
            Ok(d) => Ok(d),
            Err(first) if first.kind() != ApiKind::Auth => {
                tokio::time::sleep(DELETE_RETRY_PAUSE).await;
                self.client
                    .delete_sandbox(id)
                    .await
                    .map_err(|e| api_error(&format!("deleting sandbox {id}"), &e))
            }
            Err(e) => Err(api_error(&format!("deleting sandbox {id}"), &e)),
        }
    }

    /// Pushes sandbox `id`'s expiry `extend_by` ahead, never more than
    /// `OPEN_SANDBOX_MAX_RENEW_SECONDS` (the server accepts any time).
    pub async fn renew(
        &self,
        id: &str,
        extend_by: Duration,
    ) -> Result<opensandbox_api::Renewal, SandboxError> {
        self.client
            .renew_expiration(id, extend_by, self.settings.max_renew)
            .await
            .map_err(|e| api_error(&format!("renewing sandbox {id}"), &e))
    }

    /// Creates a sandbox for `spec` and checks it before any user code; on any refusal or
    /// failure after the create, the sandbox is destroyed and nothing is left.
    pub async fn create(&self, spec: &SandboxSpec) -> Result<Sandbox, SandboxError> {
        let guard = self.server_guard();
        let policy = gates::policy_for(&spec.egress, &guard)?;
        gates::refuse_server_in_allowlist(policy.as_ref(), &guard)?;
        let s = &self.settings;
        // The server-side lifetime must outlive one run, whatever the setting says.
        let lifetime = s
            .sandbox_timeout
            .max(spec.run_budget + s.ready + Duration::from_secs(120));
        let nonce = nonce();
        let mut request = CreateSandbox::from_image(s.image.clone(), s.entrypoint.clone())
            .lifetime(Lifetime::After(lifetime))
            .resource("cpu", s.cpu.clone())
            .resource("memory", format!("{}Mi", spec.memory_mb))
            .metadata(META_CREATED_BY, s.created_by.clone())
            .metadata(META_NONCE, nonce.clone())
            .metadata(META_SURFACE, spec.surface);
        if let Some(p) = &policy {
            request = request.network_policy(p.clone());
        }
        let info = match self.client.create_sandbox(&request).await {
            Ok(info) => info,
            Err(e) if e.is_retryable() => {
                // The answer may be lost with the sandbox made: find it by nonce and destroy.
                let _ = self.destroy_by_nonce(&nonce).await;
                return Err(api_error(
                    "creating a sandbox (any sandbox it made was deleted)",
                    &e,
                ));
            }
            Err(e) => return Err(self.create_refusal(&e, &s.image, lifetime, policy.is_some())),
        };
        let sandbox = Sandbox {
            id: info.id.clone(),
            provider: Some(self.clone()),
        };
        match self.check_new(&sandbox, policy.as_ref()).await {
            Ok(()) => Ok(sandbox),
            Err(e) => {
                sandbox.destroy().await;
                Err(e)
            }
        }
    }

    /// Finds what a failed create under `nonce` made and deletes it. `true` when the lookup
    /// answered and every sandbox it found was deleted: the create then left nothing.
    pub(crate) async fn destroy_by_nonce(&self, nonce: &str) -> bool {
        for _ in 0..2 {
            if let Ok(found) = self.client.find_by_metadata(META_NONCE, nonce).await {
                let mut all = true;
                for sb in found {
                    all &= self.destroy(&sb.id).await.is_ok();
                }
                return all;
            }
            tokio::time::sleep(DELETE_RETRY_PAUSE).await;
        }
        tracing::warn!(
            target: sandbox_core::LOG_TARGET,
            "OpenSandbox: a create whose answer was lost could not be looked up; the orphan \
             sweep or the server-side timeout will remove what it made"
        );
        false
    }

    /// The refusal for an image the server cannot pull (Docker's pull failure, or a
    /// Kubernetes pod in `ErrImagePull`/`ImagePullBackOff`), with the server's own words.
    /// `left` says what became of the sandbox.
    fn image_pull_refusal(image: &str, said: &str, left: &str) -> SandboxError {
        SandboxError::refused(format!(
            "the OpenSandbox server cannot pull the image {:?} ({ENV_IMAGE}); {left}. Set {ENV_IMAGE} to an image the server holds or can pull (mirror it \
             into a registry the server reaches, or pull it on the server's host). The \
             server said: {}",
            outside_text::snippet(image, 120),
            outside_text::snippet(said, 300)
        ))
    }

    /// What a create the server answered with `e` means, for a request from `image` living
    /// `lifetime` (with an egress policy or not): an image the server cannot pull, a lifetime
    /// above its maximum, or a policy it cannot apply, is a refusal naming the setting to
    /// change; anything else keeps its API kind.
    pub(crate) fn create_refusal(
        &self,
        e: &opensandbox_api::Error,
        image: &str,
        lifetime: Duration,
        with_policy: bool,
    ) -> SandboxError {
        if e.is_image_pull_failure() {
            return Self::image_pull_refusal(
                image,
                e.as_api().map_or("", |a| a.message.as_str()),
                "nothing was created",
            );
        }
        let msg = e.to_string().to_ascii_lowercase();
        if e.status().is_some_and(|s| s.as_u16() == 400)
            && msg.contains("exceeds configured maximum")
        {
            let setting = self.settings.sandbox_timeout.as_secs();
            let why = if lifetime.as_secs() > setting {
                format!(
                    "longer than {ENV_SANDBOX_TIMEOUT}={setting}s because the run's own timeout \
                     needs it; shorten the run's timeout, or raise the server's limit"
                )
            } else {
                format!(
                    "{ENV_SANDBOX_TIMEOUT}={setting}s; set {ENV_SANDBOX_TIMEOUT} to at most the \
                     server's [server] max_sandbox_timeout_seconds, or raise that"
                )
            };
            return SandboxError::refused(format!(
                "the OpenSandbox server refuses a sandbox lifetime of {}s, above its \
                 max_sandbox_timeout_seconds ({}); the lifetime asked for is {why}; nothing was \
                 created",
                lifetime.as_secs(),
                outside_text::snippet(e.as_api().map_or("", |a| a.message.as_str()), 200)
            ));
        }
        if with_policy && e.status().is_some_and(|s| s.as_u16() == 400) {
            if msg.contains("host") {
                return SandboxError::refused(format!(
                    "the OpenSandbox server refuses an egress policy in Docker host network \
                     mode ({}); set [docker] network_mode = \"bridge\" with publish_host = \
                     \"127.0.0.1\", or use Kubernetes",
                    outside_text::snippet(&e.to_string(), 300)
                ));
            }
            if msg.contains("gvisor") {
                return SandboxError::refused(format!(
                    "the OpenSandbox server runs gVisor, which cannot enforce egress ({}); set \
                     [secure_runtime] type = \"kata\" or \"firecracker\", or allow unrestricted \
                     egress",
                    outside_text::snippet(&e.to_string(), 300)
                ));
            }
            if msg.contains("egress") || msg.contains("networkpolicy") {
                return SandboxError::refused(format!(
                    "the OpenSandbox server cannot apply an egress policy ({}); configure an \
                     [egress] image with mode = \"dns+nft\" on the server",
                    outside_text::snippet(&e.to_string(), 300)
                ));
            }
        }
        api_error("creating a sandbox", e)
    }

    async fn check_new(
        &self,
        sandbox: &Sandbox,
        policy: Option<&NetworkPolicy>,
    ) -> Result<(), SandboxError> {
        let id = sandbox.id.as_str();
        self.wait_running_and_execd(id, self.settings.ready).await?;
        if let Some(sent) = policy {
            self.check_egress(id, sent).await?;
        }
        let probe = self.check_guest(id).await?;
        if self.settings.attestation == Attestation::None && policy.is_some() && probe.is_gvisor() {
            return Err(SandboxError::refused(
                "the OpenSandbox guest runs under gVisor, which cannot enforce egress; set \
                 [secure_runtime] type = \"kata\" or \"firecracker\" on the server",
            ));
        }
        Ok(())
    }

    /// Waits for `Running` (a Kubernetes server answers `Pending` first), then for execd's
    /// `/ping` (`Running` is not ready), within `budget`.
    pub(crate) async fn wait_running_and_execd(
        &self,
        id: &str,
        budget: Duration,
    ) -> Result<(), SandboxError> {
        let started = Instant::now();
        let late = |what: &str, e: &opensandbox_api::Error| {
            if matches!(e, opensandbox_api::Error::WaitExpired { .. })
                || e.kind() == ApiKind::Timeout
            {
                SandboxError::new(
                    ErrorKind::Transient,
                    format!(
                        "OpenSandbox: sandbox {id} {what} within {ENV_READY}={}s ({}); it was \
                         deleted and nothing was started. Raise {ENV_READY} if the server \
                         needs longer (a Kubernetes pod pulling its image, a slow execd start)",
                        budget.as_secs(),
                        outside_text::snippet(&e.to_string(), 300)
                    ),
                )
            } else {
                api_error(&format!("waiting for sandbox {id}: {what}"), e)
            }
        };
        if let Err(e) = self
            .client
            .wait_until_running(id, budget, Duration::from_millis(200))
            .await
        {
            // A Kubernetes pod that cannot get its image: OpenSandbox's controller marks the
            // sandbox Failed with the kubelet's reason in the status message. The same image
            // fails the same way, so it is the create's image-pull refusal, not a late start.
            if matches!(&e, opensandbox_api::Error::UnexpectedState { state, .. } if state == "Failed")
                && let Ok(info) = self.client.get_sandbox(id).await
            {
                let said = [&info.status.reason, &info.status.message]
                    .into_iter()
                    .flatten()
                    .map(String::as_str)
                    .collect::<Vec<_>>()
                    .join(": ");
                if opensandbox_api::is_image_pull_message(&said) {
                    return Err(Self::image_pull_refusal(
                        &self.settings.image,
                        &said,
                        "its sandbox is deleted and nothing ran",
                    ));
                }
            }
            return Err(late("was not Running", &e));
        }
        let left = budget
            .saturating_sub(started.elapsed())
            .max(Duration::from_secs(1));
        self.client
            .execd(id)
            .wait_until_ready(left, Duration::from_millis(200))
            .await
            .map_err(|e| late("had no execd answering /ping", &e))
    }

    /// Reads the egress policy back: `dns+nft`, the default action sent, exactly the rules
    /// sent; 502 or 404 (no sidecar) is a refusal.
    pub(crate) async fn check_egress(
        &self,
        id: &str,
        sent: &NetworkPolicy,
    ) -> Result<(), SandboxError> {
        match self.client.get_network_policy(id).await {
            Ok(got) => gates::check_policy_readback(sent, &got),
            Err(e) if e.status().is_some_and(|c| matches!(c.as_u16(), 404 | 502)) => {
                Err(gates::no_sidecar(sent, &e.to_string()))
            }
            Err(e) => Err(api_error("reading the egress policy back", &e)),
        }
    }

    /// The checks before any user code: the RuntimeClass (when attested and expected), the
    /// shared endpoint of host network mode (unless the settings are the single-sandbox
    /// harness's), then the first command: the identity canary and (when attested) the
    /// isolation probe.
    pub(crate) async fn check_guest(&self, id: &str) -> Result<Probe, SandboxError> {
        let s = &self.settings;
        if let (Attestation::HardwareVirtualized, Some(expected)) =
            (s.attestation, &s.runtime_class)
        {
            let rc = self
                .client
                .runtime_class(id)
                .await
                .map_err(|e| api_error("reading the inspect diagnostics", &e))?;
            gates::check_runtime_class(expected, &rc)?;
        }
        if !s.host_network_accepted() {
            let endpoint = self
                .client
                .get_endpoint(id, 44772, false)
                .await
                .map_err(|e| api_error("reading execd's endpoint", &e))?;
            gates::check_endpoint(&endpoint.endpoint)?;
        }
        let mut events = self
            .client
            .execd(id)
            .run(
                &RunCommand::shell(gates::PROBE_COMMAND).timeout(Duration::from_secs(20)),
                StreamOptions {
                    idle_timeout: s.idle,
                    deadline: Some(Duration::from_secs(30)),
                    ..StreamOptions::default()
                },
            )
            .await
            .map_err(|e| api_error("the first command (identity and isolation probe)", &e))?;
        let mut stdout = TailBuffer::new(16 * 1024);
        while let Some(ev) = events.next().await {
            if let ExecEvent::Stdout { text, .. } =
                ev.map_err(|e| api_error("the identity and isolation probe", &e))?
            {
                push_line(&mut stdout, &text);
            }
        }
        let probe = Probe::parse(&stdout.finish().text.to_string());
        gates::check_identity(id, &probe)?;
        if s.attestation == Attestation::HardwareVirtualized {
            gates::check_attested_probe(&probe, &s.host_kernels)?;
        }
        Ok(probe)
    }

    /// The orphan sweep: this deployment's sandboxes (by `created-by` metadata) older than
    /// `older_than`, deleted unless `dry_run`, except the component's kept guests (labelled
    /// `lf-kept`, named `lf-c-…`: `reap --older-than` deletes old ones through
    /// [`sandbox_core::orphans::sweep_reused_provider`]). Returns the ids found (deleted, or that
    /// would be); a delete that fails is left out and logged.
    pub async fn sweep(
        &self,
        older_than: Duration,
        dry_run: bool,
    ) -> Result<Vec<String>, SandboxError> {
        let found = self
            .client
            .find_by_metadata(META_CREATED_BY, &self.settings.created_by)
            .await
            .map_err(|e| api_error("listing sandboxes for the orphan sweep", &e))?;
        let now = opensandbox_api::OffsetDateTime::now_utc();
        let limit = i128::try_from(older_than.as_millis()).unwrap_or(i128::MAX);
        let mut swept = Vec::new();
        for sb in found {
            if sb
                .metadata
                .contains_key(sandbox_core::provider::Labels::KEPT)
            {
                continue;
            }
            // A sandbox without a readable creation time counts as old: it is ours.
            let old = sb
                .created()
                .is_none_or(|c| (now - c).whole_milliseconds() >= limit);
            if !old {
                continue;
            }
            if dry_run {
                swept.push(sb.id);
                continue;
            }
            match self.destroy(&sb.id).await {
                Ok(_) => swept.push(sb.id),
                Err(e) => tracing::warn!(target: sandbox_core::LOG_TARGET, "{}", e.message()),
            }
        }
        Ok(swept)
    }
}

/// A created, checked sandbox. [`Sandbox::destroy`] ends it; dropping it unended deletes it
/// in the background.
#[derive(Debug)]
pub struct Sandbox {
    id: String,
    provider: Option<OpenSandboxProvider>,
}

impl Sandbox {
    /// The sandbox id.
    pub fn id(&self) -> &str {
        &self.id
    }

    fn provider(&self) -> Result<&OpenSandboxProvider, SandboxError> {
        self.provider.as_ref().ok_or_else(|| {
            SandboxError::new(
                ErrorKind::Rejected,
                format!(
                    "OpenSandbox: sandbox {} was destroyed after an earlier failure; a new \
                     run needs a new sandbox",
                    self.id
                ),
            )
        })
    }

    /// Runs the Python program `code` under the budget `timeout`, with `env` (a withheld
    /// name is refused), keeping at most `cap` bytes per stream. A stream that stalls (no
    /// frame, not even a ping, for `OPEN_SANDBOX_IDLE_SECONDS`) destroys the sandbox and is an
    /// error; the host deadline reports a timeout (-1) with the output that arrived.
    pub async fn run_python(
        &mut self,
        code: &str,
        env: &BTreeMap<String, String>,
        timeout: Duration,
        cap: usize,
    ) -> Result<RunOutcome, SandboxError> {
        for name in env.keys() {
            if withheld::is_withheld_name(name) {
                return Err(withheld::refuse_name("the run's environment", name));
            }
        }
        let id = self.id.clone();
        let p = self.provider()?.clone();
        let execd = p.client.execd(&id);
        // A paused sandbox never answers: bound the upload by the idle deadline (plus time
        // for the bytes), then destroy.
        let upload_budget = p.settings.idle + Duration::from_secs(2 * (code.len() as u64 >> 20));
        let file = UploadFile::new(PROGRAM_PATH, code.as_bytes().to_vec()).mode(0o644);
        match tokio::time::timeout(upload_budget, execd.upload(&[file])).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(self.failed(&p, "uploading the program", &e).await),
            Err(_) => {
                self.end(&p).await;
                return Err(SandboxError::new(
                    ErrorKind::Transient,
                    format!(
                        "OpenSandbox: uploading the program to sandbox {id} got no answer within \
                         {}s (a paused or stalled sandbox; see OPEN_SANDBOX_IDLE_SECONDS); the \
                         sandbox was destroyed",
                        upload_budget.as_secs()
                    ),
                ));
            }
        }
        // Two clocks, as on every provider: `timeout(1)` in the guest (TERM, then KILL after
        // KILL_AFTER), and execd's own kill and the host deadline just past it.
        let budget_arg = format!("{}.{:03}s", timeout.as_secs(), timeout.subsec_millis());
        let mut cmd = RunCommand::argv([
            "timeout",
            "--signal=TERM",
            "--kill-after=2s",
            budget_arg.as_str(),
            "python3",
            "-u",
            PROGRAM_PATH,
        ])
        .timeout(timeout + KILL_AFTER + Duration::from_secs(1));
        for (k, v) in env {
            cmd = cmd.env(k.clone(), v.clone());
        }
        let started = Instant::now();
        let mut out = TailBuffer::new(cap);
        let mut err = TailBuffer::new(cap);
        let opts = StreamOptions {
            idle_timeout: p.settings.idle,
            deadline: Some(timeout + KILL_AFTER + HOST_GRACE),
            ..StreamOptions::default()
        };
        let mut stream = match execd.run(&cmd, opts).await {
            Ok(s) => s,
            Err(e) => return Err(self.failed(&p, "starting the program", &e).await),
        };
        let mut host_timeout = false;
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(ExecEvent::Stdout { text, .. }) => push_line(&mut out, &text),
                Ok(ExecEvent::Stderr { text, .. }) => push_line(&mut err, &text),
                Ok(_) => {}
                Err(e) if e.kind() == ApiKind::Timeout => {
                    host_timeout = true;
                    break;
                }
                Err(e) => return Err(self.failed(&p, "the program's output stream", &e).await),
            }
        }
        let elapsed = started.elapsed();
        let status = stream.exit_status();
        drop(stream);
        let exit_code = if host_timeout {
            self.end(&p).await;
            EXIT_TIMED_OUT
        } else {
            match status {
                ExitStatus::Code(c) => classify_exit(c, elapsed, timeout),
                ExitStatus::Unknown => {
                    self.end(&p).await;
                    return Err(SandboxError::new(
                        ErrorKind::OutcomeUnknown,
                        format!(
                            "OpenSandbox: the program's stream in sandbox {id} ended without an \
                             exit status; the sandbox was destroyed and the program may have run"
                        ),
                    ));
                }
            }
        };
        let (o, e) = (out.finish(), err.finish());
        Ok(RunOutcome {
            stdout_truncated: o.truncated,
            stderr_truncated: e.truncated,
            stdout: o.text.to_string(),
            stderr: e.text.to_string(),
            exit_code,
            elapsed,
        })
    }

    async fn failed(
        &mut self,
        p: &OpenSandboxProvider,
        what: &str,
        e: &opensandbox_api::Error,
    ) -> SandboxError {
        self.end(p).await;
        let kind = if e.kind() == ApiKind::Idle {
            ErrorKind::OutcomeUnknown
        } else {
            api_error(what, e).kind()
        };
        SandboxError::new(
            kind,
            format!(
                "OpenSandbox: {what} in sandbox {} failed: {}; the sandbox was destroyed{}",
                self.id,
                outside_text::snippet(&e.to_string(), 600),
                if e.kind() == ApiKind::Idle {
                    " (a paused or stalled sandbox sends nothing; see OPEN_SANDBOX_IDLE_SECONDS)"
                } else {
                    ""
                }
            ),
        )
    }

    async fn end(&mut self, p: &OpenSandboxProvider) {
        if let Err(e) = p.destroy(&self.id).await {
            tracing::warn!(target: sandbox_core::LOG_TARGET, "{}", e.message());
        }
        self.provider = None;
    }

    /// Deletes the sandbox (404 counts as deleted); a failure is logged, and the orphan sweep
    /// and the server-side timeout remain.
    pub async fn destroy(mut self) {
        if let Some(p) = self.provider.take()
            && let Err(e) = p.destroy(&self.id).await
        {
            tracing::warn!(target: sandbox_core::LOG_TARGET, "{}", e.message());
        }
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        if let Some(p) = self.provider.take() {
            let id = std::mem::take(&mut self.id);
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    let _ = p.destroy(&id).await;
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeout_exits_count_only_at_the_budget() {
        let budget = Duration::from_secs(5);
        assert_eq!(classify_exit(124, Duration::from_secs(5), budget), -1);
        assert_eq!(classify_exit(137, Duration::from_secs(6), budget), -1);
        assert_eq!(classify_exit(137, Duration::from_secs(1), budget), 137);
        assert_eq!(classify_exit(124, Duration::from_secs(1), budget), 124);
        assert_eq!(classify_exit(3, Duration::from_secs(9), budget), 3);
    }

    #[test]
    fn execd_lines_get_their_line_end_back() {
        let mut b = TailBuffer::new(1024);
        for frame in ["a", "\n", "b\n", "c"] {
            push_line(&mut b, frame);
        }
        assert_eq!(b.finish().text.to_string(), "a\n\nb\nc\n");
    }
}
