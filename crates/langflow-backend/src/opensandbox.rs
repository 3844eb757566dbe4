//! `LANGFLOW_SANDBOX_BACKEND=opensandbox`: lfx's sandbox backend on a self-hosted OpenSandbox
//! server, one fresh sandbox per run, through sandbox-core's OpenSandbox provider.
//!
//! lfx decides from [`capabilities_with`]: `hardware-virtualized` only when the operator
//! attests it (`OPEN_SANDBOX_ATTEST_ISOLATION`), else `container`, which lfx's dispatcher
//! refuses. Every run then creates a sandbox that passes the provider's checks (egress
//! read-back, RuntimeClass, host-network canary, isolation probe) before the program is sent,
//! runs it under lfx's timeout with the per-stream output cap, and deletes it.
//!
//! Every run is admitted, counted, attributed and released where the CreateOS backend's are:
//! the process's [`Session`] (its admission and its observation). It takes a slot under
//! `CREATEOS_MAX_LIVE_GUESTS` (and the deployment's store, when one is set) before its
//! create, waits in the same fair line and is refused at the cap by the same message; its
//! sandbox is counted created and destroyed with a usage record (worker, host, and
//! `provider: opensandbox`), and its run finished, all under the OpenSandbox provider's tag
//! ([`Observation::for_provider`]), so CreateOS's own totals are unchanged. The slot is given
//! back only once the sandbox is deleted, also when the run is cancelled.
//!
//! The backend knows its runs' sandboxes while they live: [`OpenSandboxBackend::shutdown`]
//! (lfx's `shutdown_sandbox`, and SIGTERM's cleanup in the Python extension) deletes every
//! one and refuses runs from then on, and [`OpenSandboxBackend::settled`] waits for the
//! deletes a cancelled run left in the background.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use sandbox_core::admission::{Caps, GuestSlot, Ticket};
use sandbox_core::observe::{Event, Observation, RunOutcome, RunUsage, Tracked};
use sandbox_core::plan::SurfaceError;
use sandbox_core::provider::ProviderKind;
use sandbox_core::session::Session;
use sandbox_core::settings::DEFAULT_MAX_OUTPUT_BYTES;
use sandbox_core::surface::{PoolUse, SurfaceKind};
use sandbox_core::timings::Timings;
use sandbox_core::withheld::Withheld;
use sandbox_opensandbox::{Egress, OpenSandboxProvider, OpenSandboxSettings, Sandbox, SandboxSpec};

use crate::{Capabilities, DoctorLevel, DoctorLine, LfxPolicy, RunOutput};

/// The backend's name in lfx's `lfx.sandbox_backends` entry points, its trust list
/// (`LANGFLOW_SANDBOX_BACKEND_PLUGINS`) and its selection (`LANGFLOW_SANDBOX_BACKEND`).
pub const ENTRY_POINT: &str = "opensandbox";

/// How long `doctor` waits for the OpenSandbox server (one listing, retries included).
pub const SERVER_CHECK: Duration = Duration::from_secs(5);

/// `doctor`'s findings about the OpenSandbox settings that read (`settings`): the server, the
/// key (present or not, never its value), the CA file and the plain-HTTP opt-in
/// ([`transport_lines`]). No I/O.
pub fn settings_lines(settings: &OpenSandboxSettings) -> Vec<DoctorLine> {
    use sandbox_opensandbox::settings::{ENV_API_KEY, ENV_DOMAIN};
    let mut lines = Vec::new();
    lines.push(match &settings.domain {
        Some(d) => DoctorLine::about(
            DoctorLevel::Info,
            ENV_DOMAIN,
            format!("server: {ENV_DOMAIN}={}", outside_text::snippet(d, 120)),
        ),
        None => DoctorLine::about(
            DoctorLevel::Warn,
            ENV_DOMAIN,
            format!(
                "{ENV_DOMAIN} is unset: the SDK's default {} is used; set it to the server's \
                 host[:port] or URL",
                opensandbox_api::DEFAULT_DOMAIN
            ),
        ),
    });
    lines.push(if settings.api_key.is_some() {
        DoctorLine::about(
            DoctorLevel::Ok,
            ENV_API_KEY,
            format!("{ENV_API_KEY} is set"),
        )
    } else {
        DoctorLine::about(
            DoctorLevel::Refused,
            ENV_API_KEY,
            format!("{ENV_API_KEY} is not set; set it to the server's [server] api_key"),
        )
    });
    lines.extend(transport_lines(settings));
    lines.push(unrestricted_egress_line(settings));
    lines
}

/// What unrestricted egress (a surface's open network) means on this server: a rule denying
/// the server, which needs the egress sidecar; nothing, on the operator's word that no sandbox
/// can route to the server (a warning: nothing checks it); or a refusal, for a server reached
/// over loopback without that word. No I/O.
pub fn unrestricted_egress_line(settings: &OpenSandboxSettings) -> DoctorLine {
    use sandbox_core::egress::EgressPolicy;
    use sandbox_opensandbox::gates::policy_of;
    use sandbox_opensandbox::settings::ENV_SERVER_UNREACHABLE;
    match policy_of(&EgressPolicy::AllowAll, &settings.server_guard()) {
        Ok(None) => DoctorLine::about(
            DoctorLevel::Warn,
            ENV_SERVER_UNREACHABLE,
            format!(
                "{ENV_SERVER_UNREACHABLE}=true: a run with unrestricted egress sends no policy,                  on your word that no sandbox can route to the server's API or execd proxy                  (nothing checks it; docs/opensandbox.md, \"Egress\")"
            ),
        ),
        Ok(Some(policy)) => DoctorLine::about(
            DoctorLevel::Info,
            ENV_SERVER_UNREACHABLE,
            format!(
                "a run with unrestricted egress sends allow-by-default with a rule denying {}                  (the server), and is refused unless the egress sidecar reads it back",
                policy
                    .egress
                    .first()
                    .map(|r| outside_text::snippet(&r.target, 120))
                    .unwrap_or_default()
            ),
        ),
        Err(e) => DoctorLine::about(
            DoctorLevel::Info,
            ENV_SERVER_UNREACHABLE,
            format!("a run with unrestricted egress is refused: {}", e.message()),
        ),
    }
}

/// `doctor`'s findings about how the server is reached: the CA file in use (a file that does
/// not read never gets here: the settings refuse it, naming `OPEN_SANDBOX_CA_FILE`), and
/// `OPEN_SANDBOX_ALLOW_PLAIN_HTTP`, a warning whenever it lets the key and programs cross the
/// network in clear. No I/O.
pub fn transport_lines(settings: &OpenSandboxSettings) -> Vec<DoctorLine> {
    use sandbox_opensandbox::settings::{ENV_ALLOW_PLAIN_HTTP, ENV_CA_FILE, ENV_DOMAIN};
    let mut lines = Vec::new();
    let https = settings
        .domain
        .as_deref()
        .is_some_and(|d| d.trim().to_ascii_lowercase().starts_with("https://"));
    if let Some(path) = &settings.ca_file {
        let shown = outside_text::snippet(&path.display().to_string(), 200);
        lines.push(if https {
            DoctorLine::about(
                DoctorLevel::Ok,
                ENV_CA_FILE,
                format!(
                    "{ENV_CA_FILE}={shown}: its CA certificates are trusted for the server, \
                     besides the system's roots"
                ),
            )
        } else {
            DoctorLine::about(
                DoctorLevel::Warn,
                ENV_CA_FILE,
                format!(
                    "{ENV_CA_FILE}={shown} is set but {ENV_DOMAIN} is not an https:// URL, so \
                     it is not used; set {ENV_DOMAIN}=https://<host>[:port] of the server's TLS \
                     proxy"
                ),
            )
        });
    }
    if settings.plain_http_in_use() {
        lines.push(DoctorLine::about(
            DoctorLevel::Warn,
            ENV_ALLOW_PLAIN_HTTP,
            format!(
                "{ENV_ALLOW_PLAIN_HTTP}=true: the API key and every program cross the network \
                 to {} in clear, readable and changeable by anyone on the path; put TLS in \
                 front of the server (docs/opensandbox.md, \"A server on another host\") and \
                 unset it",
                outside_text::snippet(settings.domain.as_deref().unwrap_or_default(), 120)
            ),
        ));
    } else if settings.allow_plain_http {
        lines.push(DoctorLine::about(
            DoctorLevel::Info,
            ENV_ALLOW_PLAIN_HTTP,
            format!(
                "{ENV_ALLOW_PLAIN_HTTP}=true has no effect: the server is reached over https \
                 or on this machine"
            ),
        ));
    }
    lines
}

/// `doctor`'s findings about the isolation lfx will see, and what `doctor` cannot know without
/// creating a sandbox. No I/O.
pub fn isolation_lines(settings: &OpenSandboxSettings) -> Vec<DoctorLine> {
    use sandbox_opensandbox::settings::{ENV_ATTEST_ISOLATION, ENV_RUNTIME_CLASS};
    let mut lines = Vec::new();
    lines.push(match settings.attestation {
        sandbox_opensandbox::settings::Attestation::HardwareVirtualized => {
            DoctorLine::about(
                DoctorLevel::Ok,
                ENV_ATTEST_ISOLATION,
                format!(
                    "isolation: hardware-virtualized, attested by \
                     {ENV_ATTEST_ISOLATION}; {}, and every sandbox runs the in-guest probe \
                     (gVisor and a named host kernel are refused) before any code",
                    settings.runtime_class.as_deref().map_or_else(
                        || format!("no {ENV_RUNTIME_CLASS} to cross-check (Kubernetes only)"),
                        |rc| format!("every sandbox's RuntimeClass must be {rc}")
                    )
                ),
            )
        }
        sandbox_opensandbox::settings::Attestation::None => DoctorLine::about(
            DoctorLevel::Refused,
            ENV_ATTEST_ISOLATION,
            format!(
                "isolation: not attested, so the backend declares container and lfx's \
                 dispatcher refuses it (no code runs); set \
                 {ENV_ATTEST_ISOLATION}=hardware-virtualized only if the server's [secure_runtime] is Kata or \
                 Firecracker"
            ),
        ),
    });
    lines.extend(host_kernel_line(settings));
    lines.push(DoctorLine::new(
        DoctorLevel::Info,
        "not known without creating a sandbox (doctor creates none): the server's runtime \
         (runc, gVisor, Kata, Firecracker), its egress sidecar's mode (dns+nft is required) \
         and its Docker network mode (host is refused); every run checks them on its own \
         sandbox before any code and refuses, naming the server setting",
    ));
    lines
}

/// `doctor`'s warning when the isolation is attested but `OPEN_SANDBOX_HOST_KERNEL` is unset:
/// the in-guest probe then cannot tell a runc container (which shares its host's kernel) from
/// a VM, so a false attestation would run code on a shared kernel. `None` otherwise. No I/O.
pub fn host_kernel_line(settings: &OpenSandboxSettings) -> Option<DoctorLine> {
    use sandbox_opensandbox::settings::{Attestation, ENV_ATTEST_ISOLATION, ENV_HOST_KERNEL};
    (settings.attestation == Attestation::HardwareVirtualized && settings.host_kernels.is_empty())
        .then(|| {
            DoctorLine::about(
                DoctorLevel::Warn,
                ENV_HOST_KERNEL,
                format!(
                    "{ENV_HOST_KERNEL} is unset: with {ENV_ATTEST_ISOLATION}=hardware-virtualized \
                     the in-guest probe refuses gVisor but cannot tell a runc container (the \
                     host's kernel) from a VM, so a wrong attestation would run code on a shared \
                     kernel; set it to `uname -r` of every server host or node \
                     (comma-separated)"
                ),
            )
        })
}

/// `doctor`'s check of the server: one listing of this deployment's sandboxes (by
/// `created-by`), bounded by [`SERVER_CHECK`]: reachable, the key accepted, and how many
/// are live. A problem names `OPEN_SANDBOX_DOMAIN` or `OPEN_SANDBOX_API_KEY`, or
/// `OPEN_SANDBOX_CA_FILE` when the server's certificate was not accepted.
pub async fn server_lines(settings: &OpenSandboxSettings) -> Vec<DoctorLine> {
    use opensandbox_api::{ErrorKind as ApiKind, SandboxFilter};
    use sandbox_opensandbox::lifecycle::META_CREATED_BY;
    use sandbox_opensandbox::settings::{ENV_API_KEY, ENV_DOMAIN};
    let client = match settings.client() {
        Ok(c) => c,
        Err(e) => return vec![DoctorLine::new(DoctorLevel::Refused, e.message())],
    };
    let shown = outside_text::snippet(client.base_url(), 120);
    let filter = SandboxFilter::metadata(META_CREATED_BY, &settings.created_by);
    match tokio::time::timeout(SERVER_CHECK, client.list_sandboxes(&filter, 1)).await {
        Ok(Ok(page)) => vec![DoctorLine::about(
            DoctorLevel::Ok,
            ENV_API_KEY,
            format!(
                "server: {shown} answered and accepted {ENV_API_KEY}; {} sandbox(es) of this \
                 deployment (created-by={}) on the first page",
                page.items.len(),
                settings.created_by
            ),
        )],
        Ok(Err(e)) if e.is_tls_failure() => vec![DoctorLine::about(
            DoctorLevel::Refused,
            sandbox_opensandbox::settings::ENV_CA_FILE,
            format!(
                "server: {shown}: {} ({})",
                sandbox_opensandbox::settings::TLS_FAILURE_HINT,
                outside_text::snippet(&e.to_string(), 200)
            ),
        )],
        Ok(Err(e)) if e.kind() == ApiKind::Auth => vec![DoctorLine::about(
            DoctorLevel::Refused,
            ENV_API_KEY,
            format!(
                "server: {shown} refused {ENV_API_KEY} ({}); set it to the server's [server] \
                 api_key",
                outside_text::snippet(&e.to_string(), 200)
            ),
        )],
        Ok(Err(e)) => vec![DoctorLine::about(
            DoctorLevel::Refused,
            ENV_DOMAIN,
            format!(
                "server: {shown} cannot be used ({}); check {ENV_DOMAIN} and that the server \
                 runs",
                outside_text::snippet(&e.to_string(), 200)
            ),
        )],
        Err(_) => vec![DoctorLine::about(
            DoctorLevel::Refused,
            ENV_DOMAIN,
            format!(
                "server: {shown} did not answer within {} s; check {ENV_DOMAIN} and that the \
                 server runs",
                SERVER_CHECK.as_secs()
            ),
        )],
    }
}

/// The smallest memory limit a sandbox gets, in MiB (lfx's floor of 128 is too little for
/// `python3` plus the image's own processes).
pub const MIN_MEMORY_MIB: u32 = 256;

/// What the OpenSandbox backend declares to lfx's policy gate, under the settings `lookup`
/// reads. No I/O. A setting that does not parse declares `none`, which lfx refuses (the run
/// would refuse with the setting's name anyway).
pub fn capabilities_with(
    lookup: impl Fn(&str) -> Option<String> + Send + Sync + 'static,
) -> Capabilities {
    let isolation =
        OpenSandboxSettings::from_lookup(lookup).map_or("none", |s| s.declared_isolation());
    Capabilities {
        isolation,
        supports_deny_all_egress: true,
        supports_domain_allowlist: true,
        max_timeout_seconds: None,
    }
}

/// The OpenSandbox backend of one process: the provider, built on the first run from the
/// process environment, and the session its runs are admitted and counted in.
#[derive(Debug, Default)]
pub struct OpenSandboxBackend {
    provider: Mutex<Option<OpenSandboxProvider>>,
    session: Session,
    live: Arc<Live>,
}

/// The sandboxes of this backend's runs that are not deleted yet.
#[derive(Debug, Default)]
struct Live {
    ids: Mutex<BTreeSet<String>>,
    /// Deletes of cancelled runs' sandboxes still under way in the background.
    deleting: AtomicUsize,
    /// [`OpenSandboxBackend::shutdown`] ran: no new run starts.
    closed: AtomicBool,
}

impl Live {
    fn ids(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        // A panic while holding this lock cannot leave the set inconsistent.
        self.ids.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }
}

/// The egress label of a usage record (`none`, `allowlist`, `open`), as CreateOS's.
fn egress_label(e: &Egress) -> &'static str {
    match e {
        Egress::DenyAll => "none",
        Egress::Domains { .. } => "allowlist",
        Egress::Unrestricted => "open",
    }
}

/// A run's sandbox with its account and its slot: deleted, reported and given back together.
/// Dropped undone (the run was cancelled), it deletes the sandbox in the background and only
/// then gives the slot back and reports the sandbox destroyed.
struct Held {
    sandbox: Option<Sandbox>,
    tracked: Option<Tracked>,
    slot: Option<GuestSlot>,
    live: Arc<Live>,
}

impl Held {
    /// Holds `sandbox`, known to the backend's [`Live`] set until it is deleted.
    fn hold(&mut self, sandbox: Sandbox) {
        self.live.ids().insert(sandbox.id().to_owned());
        self.sandbox = Some(sandbox);
    }

    async fn release(mut self) -> Duration {
        let started = Instant::now();
        if let Some(sb) = self.sandbox.take() {
            let id = sb.id().to_owned();
            sb.destroy().await;
            self.live.ids().remove(&id);
        }
        if let Some(t) = self.tracked.take() {
            t.finish();
        }
        drop(self.slot.take());
        started.elapsed()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let (sandbox, tracked, slot) = (self.sandbox.take(), self.tracked.take(), self.slot.take());
        if sandbox.is_none() {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let live = Arc::clone(&self.live);
            live.deleting.fetch_add(1, Ordering::SeqCst);
            rt.spawn(async move {
                if let Some(sb) = sandbox {
                    let id = sb.id().to_owned();
                    sb.destroy().await;
                    live.ids().remove(&id);
                }
                drop((tracked, slot));
                live.deleting.fetch_sub(1, Ordering::SeqCst);
            });
        }
        // Without a runtime the sandbox's own drop cannot delete it either: the server-side
        // timeout and the orphan sweep do; the slot and the record go now.
    }
}

/// The refusal of a run that starts after [`OpenSandboxBackend::shutdown`].
fn shut_down() -> sandbox_core::SandboxError {
    sandbox_core::SandboxError::new(
        sandbox_core::ErrorKind::Refused,
        "the OpenSandbox backend of this process is shut down (lfx's shutdown_sandbox or \
         SIGTERM); a new process gets a new one",
    )
}

fn unavailable(e: &sandbox_core::SandboxError) -> SurfaceError {
    SurfaceError::from(e.clone())
}

/// The egress lfx's settings ask for: deny-all unless the network is allowed; with domains, a
/// deny-all policy with those FQDN rules.
pub fn egress_of(policy: &LfxPolicy) -> Egress {
    match (policy.allow_network, policy.allowed_domains.is_empty()) {
        (false, _) => Egress::DenyAll,
        (true, true) => Egress::Unrestricted,
        (true, false) => Egress::Domains {
            setting: crate::ENV_LF_ALLOWED_DOMAINS,
            domains: policy.allowed_domains.clone(),
        },
    }
}

impl OpenSandboxBackend {
    /// A backend that reads nothing and builds nothing until its first run, on a session of
    /// its own.
    pub fn new() -> Self {
        Self::default()
    }

    /// A backend whose runs are admitted and counted in `session` (the process's: the one
    /// every surface of the process shares, so the caps hold for all of them).
    pub fn with_session(session: Session) -> Self {
        Self {
            provider: Mutex::new(None),
            session,
            live: Arc::default(),
        }
    }

    /// The session its runs are admitted and counted in.
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// Where its events are counted: the session's observation, tagged as OpenSandbox's.
    pub fn observation(&self) -> Observation {
        self.session
            .observation()
            .for_provider(ProviderKind::OpenSandbox)
    }

    /// Counts a run that ended without a result and returns its error.
    fn failed(obs: &Observation, e: SurfaceError, admitted: Instant) -> SurfaceError {
        obs.emit(&Event::RunFinished {
            surface: SurfaceKind::Backend,
            outcome: match &e {
                SurfaceError::Unavailable(_) => RunOutcome::Unavailable,
                SurfaceError::Execution(_) => RunOutcome::MayHaveRun,
            },
            seconds: admitted.elapsed().as_secs_f64(),
        });
        e
    }

    fn provider(
        &self,
        lookup: impl Fn(&str) -> Option<String> + Send + Sync + 'static,
    ) -> Result<OpenSandboxProvider, SurfaceError> {
        let mut held = self
            .provider
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(p) = held.as_ref() {
            return Ok(p.clone());
        }
        let settings = OpenSandboxSettings::from_lookup(lookup).map_err(|e| unavailable(&e))?;
        let p = OpenSandboxProvider::new(settings).map_err(|e| unavailable(&e))?;
        *held = Some(p.clone());
        Ok(p)
    }

    /// Runs `code` under `policy` in a fresh sandbox (settings from the process environment).
    pub async fn run(
        &self,
        code: &str,
        env: Option<BTreeMap<String, String>>,
        policy: &LfxPolicy,
    ) -> Result<RunOutput, SurfaceError> {
        self.run_with(code, env, policy, sandbox_core::vars::process_env)
            .await
    }

    /// [`OpenSandboxBackend::run`] with the settings `lookup` reads (read on the first run).
    pub async fn run_with(
        &self,
        code: &str,
        env: Option<BTreeMap<String, String>>,
        policy: &LfxPolicy,
        lookup: impl Fn(&str) -> Option<String> + Send + Sync + 'static,
    ) -> Result<RunOutput, SurfaceError> {
        let started = Instant::now();
        let obs = self.observation();
        let refused = |e: &sandbox_core::SandboxError| {
            obs.emit(&Event::RunFinished {
                surface: SurfaceKind::Backend,
                outcome: sandbox_core::observe::outcome_of(e),
                seconds: started.elapsed().as_secs_f64(),
            });
            unavailable(e)
        };
        policy.validate().map_err(|e| refused(&e))?;
        if self.live.closed() {
            return Err(refused(&shut_down()));
        }
        // The same withheld check as every other surface and provider (issue 45): nothing of a
        // plugin secret is uploaded or run.
        Withheld::from_lookup(&lookup)
            .check_code_and_env(code, env.iter().flatten())
            .map_err(|e| refused(&e))?;
        let caps = Caps::from_lookup(&lookup).map_err(|e| refused(&e))?;
        let provider = self
            .provider(lookup)
            .map_err(|e| Self::failed(&obs, e, started))?;
        let timeout = Duration::from_secs(u64::from(policy.timeout_seconds));
        let spec = SandboxSpec {
            egress: egress_of(policy),
            memory_mb: policy.memory_mb.max(MIN_MEMORY_MIB),
            surface: "backend",
            run_budget: timeout + Duration::from_secs(30),
        };
        // Admission: the process's cap (and the deployment's), the same line as CreateOS's
        // runs; the backend has no flow id. The wait never exceeds the run's own budget.
        let ticket = Ticket::new(
            self.session.admission().clone(),
            caps,
            tokio::time::Instant::now() + caps.wait.min(timeout),
        );
        let slot = match ticket.guest_slot(None).await {
            Ok(slot) => slot,
            Err(e) => {
                if e.kind() == sandbox_core::ErrorKind::AtCapacity {
                    obs.emit(&Event::AdmissionRefused {
                        surface: SurfaceKind::Backend,
                    });
                }
                return Err(refused(&e));
            }
        };
        if let Some(waited) = ticket.queued() {
            obs.emit(&Event::AdmissionWait {
                surface: SurfaceKind::Backend,
                seconds: waited.as_secs_f64(),
            });
        }
        let mut held = Held {
            sandbox: None,
            tracked: None,
            slot: Some(slot),
            live: Arc::clone(&self.live),
        };
        let sandbox = provider.create(&spec).await.map_err(|e| refused(&e))?;
        let guest_id = sandbox.id().to_owned();
        held.hold(sandbox);
        if self.live.closed() {
            // Shut down while the sandbox was being created: it goes now, unused.
            held.release().await;
            return Err(refused(&shut_down()));
        }
        held.tracked = Some(Tracked::created(
            obs.clone(),
            SurfaceKind::Backend,
            &guest_id,
            &format!("{}Mi", spec.memory_mb),
            &provider.settings().image,
            egress_label(&spec.egress),
        ));
        let acquired = started.elapsed();
        let exec_started = Instant::now();
        let ran = match held.sandbox.as_mut() {
            Some(sandbox) => {
                sandbox
                    .run_python(
                        code,
                        &env.unwrap_or_default(),
                        timeout,
                        DEFAULT_MAX_OUTPUT_BYTES,
                    )
                    .await
            }
            // Held just above; only a shutdown takes it.
            None => Err(shut_down()),
        };
        let exec = exec_started.elapsed();
        let outcome = match &ran {
            Ok(out) => match out.exit_code {
                0 => RunOutcome::Ok,
                sandbox_opensandbox::lifecycle::EXIT_TIMED_OUT => RunOutcome::TimedOut,
                _ => RunOutcome::ProgramFailed,
            },
            Err(e) => sandbox_core::observe::outcome_of(e),
        };
        if let Some(t) = held.tracked.as_mut() {
            let bytes = ran.as_ref().map_or(0, |o| o.stdout.len() + o.stderr.len());
            t.served(&RunUsage {
                outcome,
                bytes_returned: u64::try_from(bytes).unwrap_or(u64::MAX),
                flow_id: None,
                node_id: None,
                session_hash: None,
            });
            t.reason(outcome.destroy_reason());
        }
        obs.emit(&Event::RunFinished {
            surface: SurfaceKind::Backend,
            outcome,
            seconds: started.elapsed().as_secs_f64(),
        });
        let destroyed = held.release().await;
        let out = ran.map_err(SurfaceError::from)?;
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let timings = Timings {
            acquire_ms: Some(ms(acquired)),
            exec_ms: Some(ms(exec)),
            destroy_ms: Some(ms(destroyed)),
            total_ms: Some(ms(started.elapsed())),
            ..Timings::default()
        };
        tracing::info!(
            target: sandbox_core::LOG_TARGET,
            provider = "opensandbox",
            guest = %guest_id,
            outcome = outcome.as_str(),
            exit_code = out.exit_code,
            acquire_ms = timings.acquire_ms,
            exec_ms = timings.exec_ms,
            destroy_ms = timings.destroy_ms,
            "sandbox run finished"
        );
        Ok(RunOutput {
            stdout: out.stdout.into(),
            stderr: out.stderr.into(),
            stdout_truncated: out.stdout_truncated,
            stderr_truncated: out.stderr_truncated,
            exit_code: out.exit_code,
            raw_exit_code: Some(out.exit_code),
            host_timed_out: false,
            execution_time_ms: ms(out.elapsed),
            timings,
            guest: guest_id.clone(),
            guest_id,
            pool: PoolUse::Off,
            outcome,
        })
    }

    /// Deletes every sandbox of this backend's runs that is not deleted yet, concurrently
    /// (their runs then fail), and refuses every later run. Idempotent. A sandbox being
    /// created when this runs is deleted as soon as its create returns.
    pub async fn shutdown(&self) {
        self.live.closed.store(true, Ordering::SeqCst);
        let ids: Vec<String> = self.live.ids().iter().cloned().collect();
        if ids.is_empty() {
            return;
        }
        let Some(provider) = self
            .provider
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
        else {
            return;
        };
        let deletes = ids.iter().map(|id| {
            let provider = &provider;
            async move {
                match provider.destroy(id).await {
                    Ok(_) => {
                        self.live.ids().remove(id);
                    }
                    Err(e) => tracing::warn!(target: sandbox_core::LOG_TARGET, "{}", e.message()),
                }
            }
        });
        futures::future::join_all(deletes).await;
    }

    /// Sandboxes of this backend's runs not deleted yet (live runs, and cancelled runs' whose
    /// delete is under way).
    pub fn live_sandboxes(&self) -> usize {
        self.live.ids().len()
    }

    /// Waits until the deletes that cancelled runs left in the background are done.
    pub async fn settled(&self) {
        while self.live.deleting.load(Ordering::SeqCst) > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Deletes (or with `dry_run` only lists) this deployment's sandboxes (by `created-by`)
    /// older than `older_than`: the orphan sweep for what a dead process left before the
    /// server-side timeout removes it. Settings from the process environment.
    pub async fn sweep(
        &self,
        older_than: Duration,
        dry_run: bool,
    ) -> Result<Vec<String>, SurfaceError> {
        let provider = self.provider(sandbox_core::vars::process_env)?;
        let swept = provider
            .sweep(older_than, dry_run)
            .await
            .map_err(SurfaceError::from)?;
        if !dry_run && !swept.is_empty() {
            self.observation().emit(&Event::OrphansReaped {
                count: swept.len() as u64,
            });
        }
        Ok(swept)
    }
}
