//! The CreateOS Sandbox component's semantics, as plain Rust over `sandbox-core`.
//!
//! A "CreateOS Sandbox" node on the Langflow canvas runs a Python program or a shell command
//! in a CreateOS microVM, optionally in a guest that survives between runs of the flow
//! ([`Reuse::Flow`], or one per Langflow session with [`Reuse::Session`]), and optionally
//! hands back the files the run wrote to its own artifacts directory
//! ([`ComponentInputs::return_files`], [`ARTIFACTS_DIR`]). This crate decides everything:
//! which settings apply, what is refused before any guest exists, which guest a run uses,
//! what it sends, and what it returns. The Python component (in `py-bindings`) only gathers
//! the node's inputs and builds lfx's `Data`/`DataFrame` from a [`ComponentOutput`].
//!
//! Egress, timeouts, output caps, retries, error classes and key redaction are the backend's:
//! the same `sandbox-core` primitives, with refusals that name this node's own inputs
//! ([`SETTING_NAMES`]).

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use rand::Rng;
use sandbox_core::admission::Caps;
use sandbox_core::classify::{self, Stage};
use sandbox_core::egress::{EgressPolicy, LINK_LOCAL_HOLE};
use sandbox_core::exec::{Command, ExecLimits};
use sandbox_core::gateway::{Domains, GatewaySetting, Grant};
use sandbox_core::guest::{ExecInput, ExecOutcome, Guest, GuestSpec};
use sandbox_core::names::{REUSED_PREFIX, derived_name};
use sandbox_core::observe::RunOutcome;
use sandbox_core::plan::{self, Base, NetworkAsk};
use sandbox_core::pool::PoolStats;
use sandbox_core::settings::{SettingNames, Settings, parse_bool, read_flag};
use sandbox_core::shapes::{Pin, Shape, select_shape};
use sandbox_core::surface::{Acquire, End, StartError, Surface, SurfaceKind, Want};
use sandbox_core::{ErrorKind, LOG_TARGET, SandboxError};
use tokio::time::Instant;

pub mod archive;
mod artifacts;
pub mod identity;
mod reap;

pub use archive::{ArchiveLimits, Extracted, ReturnedFile, read_archive};
pub use reap::{ReapReport, ReusedGuest, parse_age};

/// Where the program writes the files it returns: with Return Files on, a link to this run's
/// own directory while no other run shares the guest ([`ARTIFACTS_ENV`] always names it).
pub const ARTIFACTS_DIR: &str = "/workspace/artifacts";
/// The environment variable that names this run's own artifacts directory (Return Files on).
pub const ARTIFACTS_ENV: &str = "ARTIFACTS_DIR";
/// Where each run with Return Files on keeps its own directory (`<run id>/artifacts`) while it
/// runs; the run's end removes it.
pub const RUNS_DIR: &str = "/workspace/.lf-runs";
/// Where [`ARTIFACTS_DIR`] points while two runs share a kept guest: returned to neither.
pub const SHARED_DIR: &str = "/workspace/.lf-runs-shared";
/// The largest archive of returned files downloaded (5 MiB), enforced during the transfer.
pub const MAX_ARCHIVE_BYTES: u64 = 5 * 1024 * 1024;
/// The default of Timeout (seconds).
pub const DEFAULT_TIMEOUT_SECONDS: u32 = 60;
/// The largest Timeout (seconds) accepted.
pub const MAX_TIMEOUT_SECONDS: u32 = 3600;
/// The in-guest budget of the archiving command.
const ARCHIVE_BUDGET_SECONDS: u32 = 30;
/// The longest Command accepted, in bytes (64 KiB). The command travels as one argument of
/// the exec request (`sh -c <command>`), and Linux refuses any single argument of 128 KiB or
/// more (`MAX_ARG_STRLEN`, 131072 bytes with its terminating NUL); half of that leaves room
/// for what is added to it (Return Files' preparation) and for the rest of the request (the
/// other arguments and the environment share the kernel's `ARG_MAX`). A longer script belongs
/// in Python Code, which is uploaded as a file.
pub const MAX_COMMAND_BYTES: usize = 64 * 1024;

/// The node's inputs, as the user set them (display names in parentheses below).
pub mod input {
    /// Python Code.
    pub const PYTHON_CODE: &str = "Python Code (python_code)";
    /// Command.
    pub const COMMAND: &str = "Command (command)";
    /// Guest Reuse.
    pub const REUSE: &str = "Guest Reuse (session_mode)";
    /// Allow Network.
    pub const ALLOW_NETWORK: &str = "Allow Network (allow_network)";
    /// Allowed Domains.
    pub const ALLOWED_DOMAINS: &str = "Allowed Domains (allowed_domains)";
    /// Timeout (seconds).
    pub const TIMEOUT: &str = "Timeout (seconds) (timeout_seconds)";
    /// Shape.
    pub const SHAPE: &str = "Shape (shape)";
}

/// `LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS`: the operator accepts that deny-all
/// egress still reaches `169.254.0.0/16` (the sandbox backend's opt-in, which this node
/// honours too).
pub const ENV_ACCEPT_EGRESS_EXCEPTIONS: &str = "LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS";

/// The settings this surface's refusals name: the node's own inputs, and the operator's
/// link-local opt-in.
pub const SETTING_NAMES: SettingNames = SettingNames {
    restrict_egress: "Allow Network off (allow_network=false)",
    allow_egress: "Allow Network on (allow_network=true)",
    accept_egress_exceptions: ENV_ACCEPT_EGRESS_EXCEPTIONS,
    memory: input::SHAPE,
};

/// The settings a domains run's refusals name.
pub const DOMAIN_SETTING_NAMES: SettingNames = SettingNames {
    restrict_egress: input::ALLOWED_DOMAINS,
    allow_egress: "an empty Allowed Domains (with Allow Network on)",
    accept_egress_exceptions: ENV_ACCEPT_EGRESS_EXCEPTIONS,
    memory: input::SHAPE,
};

/// Guest Reuse: whether a run gets a fresh guest, the flow's kept one or its session's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reuse {
    /// A fresh guest per run, always destroyed before the run returns.
    #[default]
    Off,
    /// One guest per (flow, node, policy), kept between runs and found again by name: every
    /// user of the flow shares it.
    Flow,
    /// One guest per (flow, node, Langflow session, policy), kept between the session's runs:
    /// two sessions (two chats, two API callers with their own session ids) never share one.
    Session,
}

impl Reuse {
    /// Parses the dropdown value (`off`, `flow` or `session`; blank means `off`).
    pub fn parse(raw: &str) -> Result<Self, SandboxError> {
        match raw.trim().to_ascii_lowercase().as_str() {
            "" | "off" => Ok(Reuse::Off),
            "flow" => Ok(Reuse::Flow),
            "session" => Ok(Reuse::Session),
            other => Err(SandboxError::refused(format!(
                "{} is {other:?}; choose off, flow or session",
                input::REUSE
            ))),
        }
    }

    /// The dropdown value.
    pub fn as_str(self) -> &'static str {
        match self {
            Reuse::Off => "off",
            Reuse::Flow => "flow",
            Reuse::Session => "session",
        }
    }

    /// Whether the guest is kept between runs.
    pub fn keeps(self) -> bool {
        self != Reuse::Off
    }
}

/// One execution's inputs, gathered by the Python component.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ComponentInputs {
    /// The flow's id as the graph carries it (`graph.flow_id`; empty for an unsaved flow and
    /// under `lfx run` of a JSON file, whose exported id [`identity::resolve`] then reads).
    /// Guest Reuse needs an id: the node's id alone is copied by templates and exports and
    /// would let two flows share a guest.
    pub flow_id: String,
    /// The process's command line (Python's `sys.argv`), read only to find the exported flow
    /// `lfx run` was given when the graph carries no flow id ([`identity`]).
    pub invocation: Vec<String>,
    /// The Langflow session id (`graph.session_id`; user-controlled text, of which only a
    /// digest enters a guest's name). Used by [`Reuse::Session`] only.
    pub session_id: String,
    /// The node's id in the flow.
    pub component_id: String,
    /// Python Code: run with `python3 -u` unless a command is given. A whole-text markdown
    /// fence (as agents write) is removed.
    pub python_code: String,
    /// Command: when not blank, run with `sh -c` instead of the code. It travels as one
    /// argument of the exec request: at most [`MAX_COMMAND_BYTES`], no NUL byte.
    pub command: String,
    /// Guest Reuse.
    pub reuse: Reuse,
    /// Return Files: give the run its own empty artifacts directory (`$ARTIFACTS_DIR`, and
    /// [`ARTIFACTS_DIR`] while no other run shares the guest) and hand back its files.
    pub return_files: bool,
    /// Allow Network: unrestricted egress; off is deny-all (with the link-local opt-in).
    pub allow_network: bool,
    /// Allowed Domains: with Allow Network on, a comma-separated list of names (`pypi.org`,
    /// `*.pythonhosted.org`) that are then the only ones reachable, through the operator's
    /// egress gateway; blank keeps Allow Network's meaning. Part of a kept guest's identity.
    pub allowed_domains: String,
    /// Timeout (seconds): the program's wall clock, enforced in the guest (1..=3600).
    pub timeout_seconds: u32,
    /// Shape: pins a shape id; blank falls back to `CREATEOS_SANDBOX_SHAPE`, then to the
    /// smallest shape with at least 4 GiB.
    pub shape: String,
}

impl fmt::Debug for ComponentInputs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The code may carry secrets: sizes only.
        f.debug_struct("ComponentInputs")
            .field("flow_id", &self.flow_id)
            .field("component_id", &self.component_id)
            .field("has_session_id", &!self.session_id.is_empty())
            .field("invocation_args", &self.invocation.len())
            .field("python_code_bytes", &self.python_code.len())
            .field("command_bytes", &self.command.len())
            .field("reuse", &self.reuse)
            .field("return_files", &self.return_files)
            .field("allow_network", &self.allow_network)
            .field("allowed_domains", &self.allowed_domains)
            .field("timeout_seconds", &self.timeout_seconds)
            .field("shape", &self.shape)
            .finish()
    }
}

/// Per-phase timings of one execution, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Timings {
    /// Acquiring the guest: create, or find + resume + read-back for a kept one.
    pub acquire_ms: u64,
    /// Uploading the program (with the egress read-back of a fresh guest).
    pub upload_ms: u64,
    /// The program's exec, dispatch to exit.
    pub exec_ms: u64,
    /// Archiving, downloading and reading the returned files (0 when off).
    pub files_ms: u64,
    /// Destroying a fresh guest (0 for a kept one, which is released).
    pub destroy_ms: u64,
    /// The whole execution.
    pub total_ms: u64,
    /// Control-plane requests made (every attempt counts).
    pub requests: u32,
}

/// The outcome of one execution whose program ran. A failing program is an outcome, not an
/// error.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(clippy::struct_excessive_bools)] // independent facts of one outcome, not a state
pub struct ComponentOutput {
    /// Standard output, trimmed (its tail, with a marker, if over the cap).
    pub result: String,
    /// Standard error, trimmed (likewise).
    pub stderr: String,
    /// Exit code: `-1` when the run hit its timeout, else the program's status.
    pub exit_code: i32,
    /// The run hit its timeout.
    pub timed_out: bool,
    /// What went wrong, when the program failed (`None` on exit 0).
    pub error: Option<String>,
    /// Standard output was cut to the cap.
    pub stdout_truncated: bool,
    /// Standard error was cut to the cap.
    pub stderr_truncated: bool,
    /// The guest's sandbox id.
    pub sandbox_id: String,
    /// The guest's name (`lf-c-…` for a kept guest).
    pub sandbox_name: String,
    /// The guest was kept from an earlier run (found by name), not created by this one.
    pub reused_guest: bool,
    /// The guest is kept for the next run (Guest Reuse: flow or session).
    pub kept: bool,
    /// The files returned (empty when Return Files is off).
    pub files: Vec<ReturnedFile>,
    /// What was skipped or went wrong while returning files.
    pub notes: Vec<String>,
    /// Where the time went.
    pub timings: Timings,
    /// How the run went (ok, program failed, timed out), as the metrics count it.
    pub outcome: RunOutcome,
}

/// Why an execution produced no outcome: sandbox-core's error, whose kind says which lfx
/// exception it is (`kind().is_unavailable()`: `SandboxUnavailableError`, nothing ran;
/// otherwise `SandboxExecutionError`, and the message says whether the code may have run).
/// `Display` is the message; it names the input or setting involved and never contains the
/// API key.
pub type ComponentError = SandboxError;

/// Reads one environment variable (sandbox-core's, shared by every surface).
pub use sandbox_core::surface::EnvLookup;
/// The options every surface shares, embedded in [`ComponentOptions`] (re-exported).
pub use sandbox_core::surface::SurfaceOptions;

/// Knobs for tests and embedders; `ComponentOptions::default()` is the process environment and a
/// fresh session.
#[derive(Clone)]
pub struct ComponentOptions {
    /// What every surface shares (the environment lookup, the clocks, the backoff, the reaper,
    /// the session, the warm pool for reuse-off runs, the fork rule). The component always
    /// destroys a fresh guest before a run returns, whatever `background_destroy` says.
    pub surface: SurfaceOptions,
    /// Bounds on the archive of returned files.
    pub archive: ArchiveLimits,
    /// The largest archive downloaded.
    pub max_archive_bytes: u64,
}

impl fmt::Debug for ComponentOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ComponentOptions")
            .field("surface", &self.surface)
            .field("archive", &self.archive)
            .field("max_archive_bytes", &self.max_archive_bytes)
            .finish()
    }
}

impl Default for ComponentOptions {
    fn default() -> Self {
        Self {
            surface: SurfaceOptions::default(),
            archive: ArchiveLimits::default(),
            max_archive_bytes: MAX_ARCHIVE_BYTES,
        }
    }
}

/// What a run executes.
enum Program {
    /// Python source, uploaded and run with `python3 -u`.
    Python(String),
    /// A shell script run with `sh -c`.
    Shell(String),
}

/// Everything an execution decides before any I/O.
struct Plan {
    settings: Settings,
    egress: EgressPolicy,
    grant: Option<Grant>,
    limits: ExecLimits,
    program: Program,
    pinned_shape: Option<(String, &'static str)>,
}

/// The CreateOS Sandbox component of one process: cheap to build, `Send + Sync`, shared by
/// every concurrent execution. Fresh guests are registered with its reaper (destroyed on
/// every path, and at [`SandboxComponent::shutdown`]); kept guests are never destroyed by
/// it. With `CREATEOS_SANDBOX_WARM_POOL=N`, reuse-off runs take their fresh guest from a warm
/// pool of its own (sandbox-core's [`sandbox_core::pool::WarmPool`], the backend's rules: one run per guest,
/// destroyed after it and at shutdown).
#[derive(Debug)]
pub struct SandboxComponent {
    opts: ComponentOptions,
    surface: Surface,
}

/// Removes one markdown fence around the whole text (```` ```python … ``` ````), as agents
/// write code; anything else is left as it is.
pub fn strip_fence(code: &str) -> &str {
    let t = code.trim();
    let Some(rest) = t.strip_prefix("```") else {
        return code;
    };
    let Some(body) = rest.strip_suffix("```") else {
        return code;
    };
    match body.split_once('\n') {
        Some((lang, inner)) if lang.trim().chars().all(|c| c.is_ascii_alphanumeric()) => inner,
        _ => code,
    }
}

/// The node's description for a user or an agent: the effective network policy and the
/// reuse mode, as a run with these inputs would get them under `env`'s settings.
pub fn describe(allow_network: bool, reuse: Reuse, env: &dyn Fn(&str) -> Option<String>) -> String {
    let network = if allow_network {
        if GatewaySetting::from_lookup(env).is_ready() {
            "Network: on, unrestricted egress; with Allowed Domains, only those names, through \
             the operator's egress gateway (a program that ignores the proxy settings reaches \
             nothing)."
                .to_owned()
        } else {
            "Network: on, unrestricted egress (CreateOS cannot restrict by domain, and no \
             egress gateway is configured, so Allowed Domains is refused)."
                .to_owned()
        }
    } else {
        let accepted = env(ENV_ACCEPT_EGRESS_EXCEPTIONS)
            .and_then(|raw| parse_bool(ENV_ACCEPT_EGRESS_EXCEPTIONS, &raw).ok())
            .unwrap_or(false);
        if accepted {
            format!(
                "Network: off, deny-all egress; only {LINK_LOCAL_HOLE} (the VM metadata \
                 service) stays reachable."
            )
        } else {
            format!(
                "Network: off, deny-all egress, which CreateOS cannot make complete \
                 ({LINK_LOCAL_HOLE} stays reachable), so runs are refused until the operator \
                 sets {ENV_ACCEPT_EGRESS_EXCEPTIONS}=true."
            )
        }
    };
    let reuse = match reuse {
        Reuse::Off => "Guest reuse: off, a fresh microVM per run, destroyed afterwards.",
        Reuse::Flow => {
            "Guest reuse: flow, one microVM per flow and node kept between runs (installed \
             packages and files carry over; every user and concurrent run of the flow shares \
             it)."
        }
        Reuse::Session => {
            "Guest reuse: session, one microVM per flow, node and Langflow session kept \
             between that session's runs (installed packages and files carry over; other \
             sessions get their own)."
        }
    };
    format!(
        "Runs Python code (or a shell command) in a CreateOS Firecracker microVM. {network} \
         {reuse} Files a run writes to {ARTIFACTS_DIR} (${ARTIFACTS_ENV}) can be returned, only \
         that run's."
    )
}

impl SandboxComponent {
    /// A component with explicit options.
    pub fn with_options(opts: ComponentOptions) -> Self {
        Self {
            surface: Surface::new(SurfaceKind::Component, opts.surface.clone()),
            opts,
        }
    }

    /// The surface kit this component runs on.
    pub fn surface(&self) -> &Surface {
        &self.surface
    }

    /// Fresh guests still registered (runs in flight and destroys being retried), not
    /// counting the warm pool's idle guests, which belong to no run.
    pub fn registered_guests(&self) -> usize {
        self.surface.unpooled_guests()
    }

    /// The warm pool's counters (size 0 while `CREATEOS_SANDBOX_WARM_POOL` is unset or 0).
    pub fn pool_stats(&self) -> PoolStats {
        self.surface.pool_stats()
    }

    /// The refusals that need no I/O, in the order a user would fix them.
    fn plan(&self, inputs: &ComponentInputs) -> Result<Plan, SandboxError> {
        let settings = self.surface.settings()?;
        let accept_exceptions =
            read_flag(&|k| self.surface.lookup(k), ENV_ACCEPT_EGRESS_EXCEPTIONS)?;
        if !(1..=MAX_TIMEOUT_SECONDS).contains(&inputs.timeout_seconds) {
            return Err(SandboxError::refused(format!(
                "{} is {}; set it between 1 and {MAX_TIMEOUT_SECONDS}",
                input::TIMEOUT,
                inputs.timeout_seconds
            )));
        }
        let program = if inputs.command.trim().is_empty() {
            let code = strip_fence(&inputs.python_code);
            if code.trim().is_empty() {
                return Err(SandboxError::refused(format!(
                    "nothing to run: {} and {} are both empty",
                    input::PYTHON_CODE,
                    input::COMMAND
                )));
            }
            Program::Python(code.to_owned())
        } else {
            check_command(&inputs.command)?;
            Program::Shell(inputs.command.clone())
        };
        let shape = inputs.shape.trim();
        let pinned_shape = if shape.is_empty() || shape.eq_ignore_ascii_case("auto") {
            settings
                .pinned_shape
                .clone()
                .map(|s| (s, sandbox_core::settings::ENV_SHAPE))
        } else if shape
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            Some((shape.to_owned(), input::SHAPE))
        } else {
            return Err(SandboxError::refused(format!(
                "{} is {shape:?}, which is not a shape id (e.g. s-2vcpu-4gb)",
                input::SHAPE
            )));
        };
        let limits = self
            .surface
            .limits(Duration::from_secs(u64::from(inputs.timeout_seconds)));
        // A bad entry is refused even with Allow Network off, where the list is not used.
        let domains = Domains::parse_list(input::ALLOWED_DOMAINS, &inputs.allowed_domains)?;
        let unused = Domains::default();
        let on = inputs.allow_network;
        let ask = NetworkAsk {
            base: if on { Base::Open } else { Base::Off },
            domains: if on { &domains } else { &unused },
            domains_setting: input::ALLOWED_DOMAINS,
            accept_exceptions,
            names: &SETTING_NAMES,
            domain_names: &DOMAIN_SETTING_NAMES,
        };
        let net = plan::network(&settings.gateway, &ask)?;
        let (egress, grant) = (net.egress.clone(), net.grant(limits.host_deadline()));
        settings.require_key()?;
        Ok(Plan {
            settings,
            egress,
            grant,
            limits,
            program,
            pinned_shape,
        })
    }

    /// The kept guest's name. It depends on the flow, the node, the image, the shape and the
    /// network policy (Allowed Domains included), and under [`Reuse::Session`] on the session id
    /// too, so a change of any of them addresses a different guest (and a restarted worker finds
    /// the same one). Every part is hashed: the name is the prefix and a digest, whatever the
    /// text of the ids. Guest Reuse: flow without domains keeps the names of earlier versions, so
    /// their kept guests are found again.
    pub fn reused_name(
        inputs: &ComponentInputs,
        rootfs: &str,
        shape: &str,
        egress: &EgressPolicy,
    ) -> String {
        let mut policy = egress.fingerprint();
        // Domains narrow a network that is on; unchanged identity otherwise.
        let domains = Domains::parse_list(input::ALLOWED_DOMAINS, &inputs.allowed_domains)
            .map(|d| d.fingerprint())
            .unwrap_or_default();
        if inputs.allow_network && !domains.is_empty() {
            policy = format!("{policy}|{domains}");
        }
        let flow = [
            inputs.flow_id.as_str(),
            inputs.component_id.as_str(),
            rootfs,
            shape,
        ];
        let parts: Vec<&str> = match inputs.reuse {
            Reuse::Session => flow
                .into_iter()
                .chain(["session", inputs.session_id.as_str()])
                .collect(),
            Reuse::Off | Reuse::Flow => flow.to_vec(),
        };
        derived_name(REUSED_PREFIX, &parts, &policy)
    }

    /// Runs one execution of the node.
    ///
    /// Every refusal happens before a guest exists. A fresh guest is destroyed before this
    /// returns on every path (and, if the future is dropped, by the reaper); a kept guest is
    /// released alive, except when its program's end was not observed (a host timeout, with
    /// or without output, or an exec whose outcome is unknown), when it is destroyed because
    /// that is what stops runaway code, and the error or result says so.
    pub async fn run(&self, inputs: &ComponentInputs) -> Result<ComponentOutput, ComponentError> {
        let t0 = Instant::now();
        let plan = self.plan(inputs)?;
        let inputs = &*identity::resolve(inputs).await?;
        let opened = self.surface.open(&plan.settings).await?;
        let redactor = opened.redactor.clone();
        let shape = choose_shape(&opened.catalog, plan.pinned_shape.as_ref())?;
        let spec = GuestSpec {
            shape: shape.id.clone(),
            rootfs: plan.settings.rootfs.clone(),
            envs: plan
                .grant
                .as_ref()
                .map(Grant::declared_env)
                .unwrap_or_default(),
            egress: plan.egress.clone(),
            auto_pause_after_seconds: plan.limits.auto_pause_seconds(),
        };
        let cx = self.surface.context(&opened);
        let name = match inputs.reuse {
            Reuse::Off => None,
            Reuse::Flow | Reuse::Session => Some(Self::reused_name(
                inputs,
                &spec.rootfs,
                &spec.shape,
                &plan.egress,
            )),
        };
        let req = Acquire {
            cx: &cx,
            spec: &spec,
            want: name.as_deref().map_or(Want::OneShot, Want::Kept),
            pool_size: plan.settings.warm_pool,
            caps: Caps::of(&plan.settings),
            flow: Some(&inputs.flow_id),
            run_budget: plan.limits.budget,
            node: Some(&inputs.component_id),
            session: Some(&inputs.session_id),
        };
        // Refused before the program was dispatched (paused behind the pool's back, a refused
        // upload or exec): nothing ran on a pooled guest, so the kit gives the run a fresh one.
        let started = self
            .surface
            .acquire(&req, |guest, begin| {
                let plan = &plan;
                async move {
                    let ran = self.in_guest(&guest, plan, inputs, begin.deadline).await;
                    (guest, ran.map_err(StartError::classify))
                }
            })
            .await?;
        let (mut lease, ran) = (started.lease, started.result);
        match &ran {
            Ok(r) => lease.set_outcome(r.outcome.run_outcome(), r.outcome.bytes_returned()),
            Err(e) => lease.set_outcome(RunOutcome::of_error(e), 0),
        }
        let acquire_ms = ms(lease.acquired_at().saturating_duration_since(t0));
        let pool_use = lease.pool_use().as_str();
        // A kept guest this run did not create was found by name: reused.
        let reused_guest = lease.guest().is_kept() && !lease.guest().was_created();

        // A kept guest is released alive unless the end of its program was not observed: a
        // host timeout (with or without output), or an exec whose outcome is unknown (no answer,
        // a broken stream, no exit status). Whatever still runs there is stopped only by
        // destroying the guest; a shutdown's own "may have run" leaves it for the next process.
        let unobserved = match &ran {
            Ok(r) => r.outcome.host_timed_out,
            Err(e) => e.kind() == ErrorKind::OutcomeUnknown && !self.surface.reaper().is_closed(),
        };
        let was_kept = lease.guest().is_kept();
        let kept = was_kept && !unobserved;
        let t_end = Instant::now();
        let ended = lease
            .end(if kept { End::Release } else { End::Destroy })
            .await;
        let (sandbox_id, sandbox_name) = (ended.id, ended.name);
        let destroyed = ended.destroy_error.map_or(Ok(()), Err);
        let destroy_ms = if kept { 0 } else { ms(t_end.elapsed()) };
        let ran = ran.map_err(|e| {
            if !was_kept || kept {
                return e;
            }
            let fate = match &destroyed {
                Ok(()) => format!(
                    "Guest Reuse: the kept guest {sandbox_name} was destroyed, since that stops \
                     whatever the program left running; the next run creates it again"
                ),
                Err(d) => format!(
                    "Guest Reuse: destroying the kept guest {sandbox_name} failed ({}), so it \
                     may still be running until its auto-pause backstop pauses it; delete it \
                     with reap",
                    redactor.cap(&d.message)
                ),
            };
            // sandbox-core's wording of a silent exec speaks for a one-shot guest; this
            // sentence is the kept guest's own account.
            let said = e.message();
            let said = said
                .strip_suffix(". The guest was destroyed")
                .unwrap_or(said);
            SandboxError::new(e.kind(), format!("{said}. {fate}"))
        })?;
        let out = ran.outcome;
        let stdout = out.stdout.text.to_string();
        let stderr = out.stderr.text.to_string();
        let timed_out = out.exit_code == sandbox_core::exec::EXIT_TIMED_OUT;
        let error = if timed_out {
            Some(format!(
                "timed out after {}s (see {})",
                inputs.timeout_seconds,
                input::TIMEOUT
            ))
        } else if out.exit_code != 0 {
            Some(if stderr.trim().is_empty() {
                format!("exited with code {}", out.exit_code)
            } else {
                stderr.trim().to_owned()
            })
        } else {
            None
        };
        let timings = Timings {
            acquire_ms,
            upload_ms: ran.upload_ms,
            exec_ms: out.exec_ms,
            files_ms: ran.files_ms,
            destroy_ms,
            total_ms: ms(t0.elapsed()),
            requests: cx.requests(),
        };
        tracing::info!(
            target: LOG_TARGET,
            guest = %sandbox_name,
            reuse = inputs.reuse.as_str(),
            reused_guest,
            kept,
            exit_code = out.exit_code,
            files = ran.files.len(),
            acquire_ms = timings.acquire_ms,
            upload_ms = timings.upload_ms,
            exec_ms = timings.exec_ms,
            files_ms = timings.files_ms,
            destroy_ms = timings.destroy_ms,
            total_ms = timings.total_ms,
            requests = timings.requests,
            pool = pool_use,
            "sandbox component run finished"
        );
        Ok(ComponentOutput {
            result: stdout.trim().to_owned(),
            stderr: stderr.trim().to_owned(),
            exit_code: out.exit_code,
            timed_out,
            error,
            stdout_truncated: out.stdout.truncated,
            stderr_truncated: out.stderr.truncated,
            sandbox_id,
            sandbox_name,
            reused_guest,
            kept,
            files: ran.files,
            notes: ran.notes,
            timings,
            outcome: out.run_outcome(),
        })
    }

    /// Upload (with the read-back of a fresh guest), exec, capture, and the files. The caller
    /// owns the guest's end.
    async fn in_guest(
        &self,
        guest: &Guest,
        plan: &Plan,
        inputs: &ComponentInputs,
        deadline: Instant,
    ) -> Result<Ran, SandboxError> {
        if guest.context().reaper.is_closed() {
            return Err(classify::shut_down(Stage::BeforeDispatch));
        }
        let t1 = Instant::now();
        let run_id = format!("{:012x}", random48());
        let prepare = if inputs.return_files {
            artifacts::prepare(&run_id)
        } else {
            String::new()
        };
        let script = match &plan.program {
            Program::Shell(script) => format!("{prepare}{script}"),
            Program::Python(code) => {
                let path = format!("/tmp/lf-main-{:012x}.py", random48());
                let upload = guest.upload(&path, Bytes::copy_from_slice(code.as_bytes()), deadline);
                if guest.is_kept() {
                    // Acquire already read the egress back.
                    upload.await?;
                } else {
                    let (up, eg) =
                        tokio::join!(upload, guest.verify_egress(&plan.egress, deadline));
                    eg?;
                    up?;
                }
                // The program file is removed afterwards, so a kept guest does not collect
                // them; the exit status is the program's.
                format!("{prepare}python3 -u {path}; s=$?; rm -f {path}; exit $s")
            }
        };
        if matches!(plan.program, Program::Shell(_)) && !guest.is_kept() {
            guest.verify_egress(&plan.egress, deadline).await?;
        }
        let upload_ms = ms(t1.elapsed());
        // A domains run's token is minted per run, for this guest, and sent with the exec.
        let input = ExecInput {
            env: match &plan.grant {
                Some(grant) => grant.env_for(guest.name())?,
                None => std::collections::BTreeMap::new(),
            },
            stdin: String::new(),
        };
        let run = guest
            .exec(&Command::shell(script), &plan.limits, &input, deadline)
            .await?;
        let outcome = guest
            .capture(run, &plan.limits, plan.settings.max_output_bytes)
            .await?;
        let t2 = Instant::now();
        let (files, notes) = if inputs.return_files && !outcome.host_timed_out {
            self.collect_files(guest, plan, &run_id).await
        } else if inputs.return_files {
            (
                Vec::new(),
                vec!["no files were returned: the control plane stopped answering".to_owned()],
            )
        } else {
            (Vec::new(), Vec::new())
        };
        let files_ms = if inputs.return_files {
            ms(t2.elapsed())
        } else {
            0
        };
        Ok(Ran {
            outcome,
            upload_ms,
            files,
            notes,
            files_ms,
        })
    }

    /// Archives this run's own artifacts directory in the guest (and removes it), downloads
    /// the archive under the cap and reads it in memory. Every failure is a note: the program
    /// already ran.
    async fn collect_files(
        &self,
        guest: &Guest,
        plan: &Plan,
        run_id: &str,
    ) -> (Vec<ReturnedFile>, Vec<String>) {
        let archive = format!("/tmp/lf-artifacts-{run_id}.tgz");
        // Archives of earlier runs that a kept guest still holds (a run that failed between
        // archiving and downloading) are removed once they are a few minutes old.
        let script = artifacts::archive(run_id, &archive);
        let limits = ExecLimits {
            budget: Duration::from_secs(u64::from(ARCHIVE_BUDGET_SECONDS)),
            ..plan.limits
        };
        let deadline = Instant::now() + guest.context().backoff.budget;
        let archived = match guest
            .exec(
                &Command::shell(script),
                &limits,
                &ExecInput::default(),
                deadline,
            )
            .await
        {
            Ok(run) => guest.capture(run, &limits, 64 * 1024).await,
            Err(e) => Err(e),
        };
        let mut notes = Vec::new();
        match archived {
            Ok(o) if o.exit_code == 0 => {
                if o.stdout.text.to_string().contains(artifacts::SHARED_MARK) {
                    notes.push(format!(
                        "another run used this guest at the same time: while both ran, \
                         {ARTIFACTS_DIR} pointed at neither run's directory, and files written \
                         through it then were returned to neither; write to \
                         ${ARTIFACTS_ENV}, this run's own directory"
                    ));
                }
            }
            Ok(o) if o.exit_code == artifacts::EXIT_GONE => {
                return (
                    Vec::new(),
                    vec![format!(
                        "no files: this run's directory (${ARTIFACTS_ENV}) was removed before \
                         it was archived"
                    )],
                );
            }
            Ok(o) => {
                let why = o.stderr.text.to_string();
                let why = guest.context().redactor.cap(why.trim());
                return (
                    Vec::new(),
                    vec![format!(
                        "no files: archiving {ARTIFACTS_DIR} failed (exit {}): {why}",
                        o.exit_code
                    )],
                );
            }
            Err(e) => return (Vec::new(), vec![format!("no files: {e}")]),
        }
        // The download has a budget of its own: the archiving above may have used most of
        // the first one, and the whole transfer must end by its deadline.
        let deadline = Instant::now() + guest.context().backoff.budget;
        let bytes = match guest
            .download(&archive, self.opts.max_archive_bytes, deadline)
            .await
        {
            Ok(b) => b,
            Err(e) => {
                return (
                    Vec::new(),
                    vec![format!(
                        "no files: {}",
                        e.redacted(&guest.context().redactor)
                    )],
                );
            }
        };
        let limits = self.opts.archive;
        // Decompressing is CPU work bounded by the limits; it stays off the async threads.
        let read = tokio::task::spawn_blocking(move || read_archive(&bytes, &limits)).await;
        match read {
            Ok(x) => {
                notes.extend(x.notes);
                (x.files, notes)
            }
            Err(_) => (
                Vec::new(),
                vec!["no files: reading the archive failed".to_owned()],
            ),
        }
    }

    /// Destroys every fresh guest still registered (runs in flight, destroys being retried)
    /// within a bounded time and refuses new runs. Kept guests are left for the next
    /// process. Idempotent.
    pub async fn shutdown(&self) {
        self.surface.shutdown().await;
    }
}

/// What ran in the guest.
struct Ran {
    outcome: ExecOutcome,
    upload_ms: u64,
    files: Vec<ReturnedFile>,
    notes: Vec<String>,
    files_ms: u64,
}

/// Refuses a Command that cannot travel as one argument of the exec request: one with a NUL
/// byte (no argument can carry it) or longer than [`MAX_COMMAND_BYTES`]. Either would cost a
/// guest and then fail in it.
fn check_command(command: &str) -> Result<(), SandboxError> {
    let why = if let Some(at) = command.bytes().position(|b| b == 0) {
        format!("contains a NUL byte (at byte {at}), which no command argument can carry")
    } else if command.len() > MAX_COMMAND_BYTES {
        format!("is {} bytes long", command.len())
    } else {
        return Ok(());
    };
    Err(SandboxError::refused(format!(
        "{} {why}; a command is sent as one argument of the exec request, at most \
         {MAX_COMMAND_BYTES} bytes and with no NUL byte. Put a long script in {} instead: it \
         is uploaded as a file (a shell script can run from there with subprocess)",
        input::COMMAND,
        input::PYTHON_CODE
    )))
}

fn choose_shape(
    catalog: &[Shape],
    pinned: Option<&(String, &'static str)>,
) -> Result<Shape, SandboxError> {
    // A pinned shape is the user's choice, whatever its memory; otherwise at least 4 GiB.
    let pin = pinned.map(|(id, setting)| Pin {
        id,
        setting,
        otherwise: "leave it blank",
    });
    Ok(select_shape(catalog, 0, pin, input::SHAPE)?.shape)
}

fn random48() -> u64 {
    rand::rng().random::<u64>() & 0xffff_ffff_ffff
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuse_parses_the_dropdown() {
        assert_eq!(Reuse::parse("off").unwrap(), Reuse::Off);
        assert_eq!(Reuse::parse(" Flow ").unwrap(), Reuse::Flow);
        assert_eq!(Reuse::parse("").unwrap(), Reuse::Off);
        assert_eq!(Reuse::parse("session").unwrap(), Reuse::Session);
        let e = Reuse::parse("user").unwrap_err();
        assert!(e.to_string().contains("session_mode"), "{e}");
        for r in [Reuse::Off, Reuse::Flow, Reuse::Session] {
            assert_eq!(Reuse::parse(r.as_str()).unwrap(), r);
        }
    }

    #[test]
    fn fences_are_removed_only_around_the_whole_text() {
        assert_eq!(strip_fence("```python\nprint(1)\n```"), "print(1)\n");
        assert_eq!(strip_fence("```\nprint(1)\n```"), "print(1)\n");
        assert_eq!(strip_fence("print('```')"), "print('```')");
        assert_eq!(strip_fence("x = 1"), "x = 1");
    }

    #[test]
    fn descriptions_state_policy_and_reuse() {
        let none = |_: &str| None;
        let accepted = |k: &str| (k == ENV_ACCEPT_EGRESS_EXCEPTIONS).then(|| "true".to_owned());
        let d = describe(false, Reuse::Off, &none);
        assert!(d.contains("deny-all") && d.contains("refused"), "{d}");
        assert!(d.contains("fresh microVM per run"), "{d}");
        let d = describe(false, Reuse::Flow, &accepted);
        assert!(d.contains("deny-all") && !d.contains("refused"), "{d}");
        assert!(d.contains("kept between runs"), "{d}");
        let d = describe(true, Reuse::Off, &none);
        assert!(d.contains("unrestricted"), "{d}");
        let d = describe(true, Reuse::Session, &none);
        assert!(
            d.contains("Langflow session") && d.contains("only that run's"),
            "{d}"
        );
        assert!(d.contains("Allowed Domains is refused"), "{d}");
        let gateway = |k: &str| match k {
            "CREATEOS_GATEWAY_URL" => Some("http://10.0.0.5:3128".to_owned()),
            "CREATEOS_GATEWAY_SECRET" => Some("0123456789abcdef0123456789abcdef".to_owned()),
            _ => None,
        };
        let d = describe(true, Reuse::Off, &gateway);
        assert!(d.contains("with Allowed Domains, only those names"), "{d}");
        assert!(!d.contains("0123456789abcdef"), "{d}");
    }

    #[test]
    fn reused_names_follow_flow_node_and_policy() {
        let inputs = ComponentInputs {
            flow_id: "flow-1".into(),
            component_id: "CreateOSSandbox-abcde".into(),
            ..ComponentInputs::default()
        };
        let a = SandboxComponent::reused_name(
            &inputs,
            "devbox:1",
            "s-2vcpu-4gb",
            &EgressPolicy::DenyAll,
        );
        let b = SandboxComponent::reused_name(
            &inputs,
            "devbox:1",
            "s-2vcpu-4gb",
            &EgressPolicy::AllowAll,
        );
        assert!(a.starts_with("lf-c-") && a.len() <= 22, "{a}");
        assert_ne!(a, b);
        assert_eq!(
            a,
            SandboxComponent::reused_name(
                &inputs,
                "devbox:1",
                "s-2vcpu-4gb",
                &EgressPolicy::DenyAll
            )
        );
        let other = ComponentInputs {
            component_id: "CreateOSSandbox-fghij".into(),
            ..inputs.clone()
        };
        assert_ne!(
            a,
            SandboxComponent::reused_name(
                &other,
                "devbox:1",
                "s-2vcpu-4gb",
                &EgressPolicy::DenyAll
            )
        );
    }

    #[test]
    fn session_names_follow_the_session_and_only_its_digest_enters() {
        let name = |reuse, session: &str| {
            let inputs = ComponentInputs {
                flow_id: "flow-1".into(),
                component_id: "CreateOSSandbox-abcde".into(),
                session_id: session.into(),
                reuse,
                ..ComponentInputs::default()
            };
            SandboxComponent::reused_name(
                &inputs,
                "devbox:1",
                "s-2vcpu-4gb",
                &EgressPolicy::DenyAll,
            )
        };
        let a = name(Reuse::Session, "chat-a");
        assert_eq!(a, name(Reuse::Session, "chat-a"));
        assert_ne!(a, name(Reuse::Session, "chat-b"));
        // The flow's guest is not any session's, and flow names ignore the session id.
        assert_ne!(a, name(Reuse::Flow, "chat-a"));
        assert_eq!(name(Reuse::Flow, "chat-a"), name(Reuse::Flow, "chat-b"));
        let hostile = name(Reuse::Session, &"A/../..;$(rm -rf /)\n\u{0}é".repeat(100));
        assert!(sandbox_core::names::is_valid_name(&hostile), "{hostile}");
        assert!(
            hostile.starts_with("lf-c-") && hostile.len() == 22,
            "{hostile}"
        );
    }

    #[test]
    fn flow_names_are_those_of_earlier_versions() {
        // Kept guests of flows saved with `flow` are found again after an upgrade: the name
        // is still the digest of flow, node, image and shape, with the policy.
        let inputs = ComponentInputs {
            flow_id: "flow-1".into(),
            component_id: "CreateOSSandbox-abcde".into(),
            session_id: "ignored".into(),
            reuse: Reuse::Flow,
            ..ComponentInputs::default()
        };
        let egress = EgressPolicy::DenyAll;
        assert_eq!(
            SandboxComponent::reused_name(&inputs, "devbox:1", "s-2vcpu-4gb", &egress),
            derived_name(
                REUSED_PREFIX,
                &["flow-1", "CreateOSSandbox-abcde", "devbox:1", "s-2vcpu-4gb"],
                &egress.fingerprint()
            )
        );
    }

    #[test]
    fn debug_shows_no_session_id() {
        let inputs = ComponentInputs {
            session_id: "private-session-7".into(),
            ..ComponentInputs::default()
        };
        let shown = format!("{inputs:?}");
        assert!(!shown.contains("private-session-7") && shown.contains("has_session_id: true"));
    }

    #[test]
    fn component_is_send_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<SandboxComponent>();
    }
}
