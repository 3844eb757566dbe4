//! The lfx sandbox backend's semantics, as plain Rust over `sandbox-core`.
//!
//! lfx's `SandboxBackend` protocol is `capabilities()`, `run(code, env)`, `shutdown()` and
//! `reset_after_fork()`. This crate implements what those mean for CreateOS: which settings are
//! read, what is refused before any guest exists, what one run sends, and what it returns.
//! The Python glue (in `py-bindings`) passes lfx's `_sandbox_settings()` values in as an
//! [`LfxPolicy`] and maps [`BackendError`] to lfx's exceptions.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use sandbox_core::SandboxError;
use sandbox_core::admission::Caps;
use sandbox_core::egress::EgressPolicy;
use sandbox_core::exec::{ExecLimits, is_valid_env_name};
use sandbox_core::gateway::{Domains, GatewaySetting, Grant};
use sandbox_core::plan::{self, Base, NetworkAsk, SurfaceError};
use sandbox_core::provider::createos::LINK_LOCAL_HOLE;
use sandbox_core::provider::{Isolation, Provider};
use sandbox_core::session::Account;
use sandbox_core::settings::{SettingNames, Settings, non_blank, parse_bool, read_flag};
use sandbox_core::shapes::{ShapeChoice, select_shape};
use sandbox_core::surface::{Surface, SurfaceKind};
use sandbox_core::withheld::Withheld;

mod doctor;
pub mod lifecycle;
pub mod opensandbox;
mod orphans;

pub use doctor::{
    CONTROL_PLANE_CHECK, ControlPlaneCheck, DoctorLevel, DoctorLine, DoctorReport, ENV_LF_PLUGINS,
    ENV_LF_SELECTED, GATEWAY_PROBE_TIMEOUT, PLUGIN_NAME, check_control_plane, control_plane_lines,
    gateway_lines, key_line, named_setting, selected, trust_gate, trusted,
};
/// Per-phase timings of one run, in milliseconds (`destroy_ms` is `None` when the destroy was
/// handed to the reaper: off the critical path, still guaranteed, and logged when done).
pub use lifecycle::{RunOutput, Timings};
use lifecycle::{RunSpec, run_on};
pub use orphans::{Orphan, SweepReport};
/// How a run got its guest from the warm pool (sandbox-core's, the same for every surface).
pub use sandbox_core::observe::RunOutcome;
/// The captured text of a stream and its pieces (re-exported so callers need not depend on
/// sandbox-core).
pub use sandbox_core::output::{Piece, Text};
/// The warm pool's counters (re-exported).
pub use sandbox_core::pool::PoolStats;
/// Builds a control plane from settings (re-exported from sandbox-core's session layer).
pub use sandbox_core::session::Connector;
pub use sandbox_core::surface::PoolUse;
/// The options every surface shares, embedded in [`BackendOptions`] (re-exported).
pub use sandbox_core::surface::{EnvLookup, SurfaceOptions};

/// What this backend declares to lfx's policy gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// The isolation the provider vouches for ([`Provider::isolation`]): on CreateOS always
    /// `"hardware-virtualized"` (a Firecracker microVM per run).
    pub isolation: &'static str,
    /// Deny-all egress is supported (with the link-local opt-in).
    pub supports_deny_all_egress: bool,
    /// Only with an egress gateway configured (`CREATEOS_GATEWAY_URL` and
    /// `CREATEOS_GATEWAY_SECRET` valid): CreateOS itself does not enforce hostname rules.
    pub supports_domain_allowlist: bool,
    /// No cap beyond lfx's own 300 s.
    pub max_timeout_seconds: Option<u32>,
}

/// The backend's capabilities under the process environment (a secret given as a file, such as
/// `CREATEOS_GATEWAY_SECRET_FILE`, is read from it: [`sandbox_core::vars::process_env`]). No
/// network I/O.
pub fn capabilities() -> Capabilities {
    capabilities_with(&sandbox_core::vars::process_env)
}

/// The backend's capabilities on CreateOS under the settings `lookup` reads. No I/O.
pub fn capabilities_with(lookup: &dyn Fn(&str) -> Option<String>) -> Capabilities {
    capabilities_isolated(sandbox_core::createos::ISOLATION, lookup)
}

/// The backend's capabilities on `provider` under the settings `lookup` reads: the isolation
/// is the provider's own ([`Provider::isolation`]). No I/O.
pub fn capabilities_for(
    provider: &dyn Provider,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Capabilities {
    capabilities_isolated(provider.isolation(), lookup)
}

fn capabilities_isolated(
    isolation: Isolation,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Capabilities {
    Capabilities {
        isolation: isolation.as_str(),
        supports_deny_all_egress: true,
        supports_domain_allowlist: GatewaySetting::from_lookup(lookup).is_ready(),
        max_timeout_seconds: None,
    }
}

/// lfx's `LANGFLOW_SANDBOX_TIMEOUT_SECONDS`.
pub const ENV_LF_TIMEOUT: &str = "LANGFLOW_SANDBOX_TIMEOUT_SECONDS";
/// lfx's `LANGFLOW_SANDBOX_MEMORY_MB`.
pub const ENV_LF_MEMORY: &str = "LANGFLOW_SANDBOX_MEMORY_MB";
/// lfx's `LANGFLOW_SANDBOX_ALLOW_NETWORK`.
pub const ENV_LF_ALLOW_NETWORK: &str = "LANGFLOW_SANDBOX_ALLOW_NETWORK";
/// lfx's `LANGFLOW_SANDBOX_ALLOWED_DOMAINS`.
pub const ENV_LF_ALLOWED_DOMAINS: &str = "LANGFLOW_SANDBOX_ALLOWED_DOMAINS";
/// `LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS`: the operator accepts that deny-all
/// egress still reaches `169.254.0.0/16` (the backend's and the component's opt-in).
pub const ENV_ACCEPT_EGRESS_EXCEPTIONS: &str = "LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS";

/// lfx's default timeout, in seconds.
pub const LF_DEFAULT_TIMEOUT_SECONDS: u32 = 30;
/// lfx's default memory, in MB.
pub const LF_DEFAULT_MEMORY_MB: u32 = 192;
/// lfx's largest accepted timeout.
pub const LF_MAX_TIMEOUT_SECONDS: u32 = 300;
/// lfx's smallest accepted memory.
pub const LF_MIN_MEMORY_MB: u32 = 128;

/// The settings this surface's refusals name.
pub const SETTING_NAMES: SettingNames = SettingNames {
    restrict_egress: "LANGFLOW_SANDBOX_ALLOW_NETWORK=false",
    allow_egress: "LANGFLOW_SANDBOX_ALLOW_NETWORK=true",
    accept_egress_exceptions: ENV_ACCEPT_EGRESS_EXCEPTIONS,
    memory: ENV_LF_MEMORY,
};

/// The settings a domains run's refusals name.
pub const DOMAIN_SETTING_NAMES: SettingNames = SettingNames {
    restrict_egress: ENV_LF_ALLOWED_DOMAINS,
    allow_egress: "unsetting LANGFLOW_SANDBOX_ALLOWED_DOMAINS (with \
                   LANGFLOW_SANDBOX_ALLOW_NETWORK=true)",
    accept_egress_exceptions: ENV_ACCEPT_EGRESS_EXCEPTIONS,
    memory: ENV_LF_MEMORY,
};

/// lfx's sandbox settings (`_sandbox_settings()`), passed in by the caller; validated again
/// here because a backend must fail closed on its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LfxPolicy {
    /// `LANGFLOW_SANDBOX_TIMEOUT_SECONDS` (default 30, 1..=300).
    pub timeout_seconds: u32,
    /// `LANGFLOW_SANDBOX_MEMORY_MB` (default 192, >= 128): a floor, not the VM size.
    pub memory_mb: u32,
    /// `LANGFLOW_SANDBOX_ALLOW_NETWORK` (default false).
    pub allow_network: bool,
    /// `LANGFLOW_SANDBOX_ALLOWED_DOMAINS`: with `allow_network`, the only names the program
    /// reaches, through the egress gateway (lfx's meaning: the domains a networked run may
    /// reach); without it, nothing is reachable and the list is not used.
    pub allowed_domains: Vec<String>,
}

impl Default for LfxPolicy {
    fn default() -> Self {
        Self {
            timeout_seconds: LF_DEFAULT_TIMEOUT_SECONDS,
            memory_mb: LF_DEFAULT_MEMORY_MB,
            allow_network: false,
            allowed_domains: Vec::new(),
        }
    }
}

impl LfxPolicy {
    /// Reads lfx's `LANGFLOW_SANDBOX_*` variables from the process environment, with lfx's
    /// defaults (for `doctor` run outside Langflow).
    pub fn from_env() -> Result<Self, BackendError> {
        Self::from_lookup(&|k| std::env::var(k).ok()).map_err(BackendError::from)
    }

    /// Reads lfx's variables through `lookup` the way lfx's settings do, and validates them.
    pub fn from_lookup(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Self, SandboxError> {
        let num = |name: &str, default: u32| -> Result<u32, SandboxError> {
            match non_blank(lookup, name) {
                None => Ok(default),
                Some(raw) => raw.parse::<u32>().map_err(|_| {
                    SandboxError::refused(format!("{name}={raw:?} is not a whole number"))
                }),
            }
        };
        let p = Self {
            timeout_seconds: num(ENV_LF_TIMEOUT, LF_DEFAULT_TIMEOUT_SECONDS)?,
            memory_mb: num(ENV_LF_MEMORY, LF_DEFAULT_MEMORY_MB)?,
            allow_network: match lookup(ENV_LF_ALLOW_NETWORK) {
                Some(raw) => parse_bool(ENV_LF_ALLOW_NETWORK, &raw)?,
                None => false,
            },
            allowed_domains: non_blank(lookup, ENV_LF_ALLOWED_DOMAINS)
                .map(|raw| {
                    raw.split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default(),
        };
        p.validate()?;
        Ok(p)
    }

    /// Checks the ranges lfx documents.
    pub fn validate(&self) -> Result<(), SandboxError> {
        if !(1..=LF_MAX_TIMEOUT_SECONDS).contains(&self.timeout_seconds) {
            return Err(SandboxError::refused(format!(
                "{ENV_LF_TIMEOUT}={} is outside 1..={LF_MAX_TIMEOUT_SECONDS}",
                self.timeout_seconds
            )));
        }
        if self.memory_mb < LF_MIN_MEMORY_MB {
            return Err(SandboxError::refused(format!(
                "{ENV_LF_MEMORY}={} is below {LF_MIN_MEMORY_MB}",
                self.memory_mb
            )));
        }
        Ok(())
    }

    /// The egress this policy gets under `settings` (the link-local opt-in and the egress
    /// gateway), and the domain grant of a domains run, refusing what cannot be honoured: a
    /// bad domain entry, domains without a configured gateway, or restricted egress without
    /// the opt-in.
    pub fn egress(
        &self,
        accept: bool,
        settings: &Settings,
        budget: Duration,
    ) -> Result<(EgressPolicy, Option<Grant>), SandboxError> {
        // A bad entry is refused even with the network off, where the list is not used.
        let domains = Domains::parse(ENV_LF_ALLOWED_DOMAINS, &self.allowed_domains)?;
        let unused = Domains::default();
        let ask = NetworkAsk {
            base: if self.allow_network {
                Base::Open
            } else {
                Base::Off
            },
            domains: if self.allow_network {
                &domains
            } else {
                &unused
            },
            domains_setting: ENV_LF_ALLOWED_DOMAINS,
            accept_exceptions: accept,
            names: &SETTING_NAMES,
            domain_names: &DOMAIN_SETTING_NAMES,
        };
        let net = plan::network(&settings.gateway, &ask)?;
        Ok((net.egress.clone(), net.grant(budget)))
    }
}

/// Why a run could not produce a result: sandbox-core's one mapping of a core error onto lfx's
/// two classes ([`SurfaceError`]: `Unavailable`, nothing ran; `Execution`, saying whether the
/// code may have run). `Display` is the message, which names the setting involved and the fix;
/// it never contains the API key.
pub type BackendError = SurfaceError;

/// Knobs for tests, benchmarks and embedders; [`Backend::new`] uses the defaults. The backend
/// has no knob of its own: every one is the surface kit's ([`SurfaceOptions`]: the clocks, the
/// backoff, the reaper, the session, the warm pool and the fork rule).
#[derive(Debug, Clone, Default)]
pub struct BackendOptions {
    /// What every surface shares.
    pub surface: SurfaceOptions,
}

/// The CreateOS sandbox backend. Cheap to construct (no I/O), `Send + Sync`, and meant to be
/// shared by every concurrent run of a process. Build a fresh one in a child after `fork()`.
#[derive(Debug)]
pub struct Backend {
    surface: Surface,
}

impl Default for Backend {
    fn default() -> Self {
        Self::new()
    }
}

/// Everything a run or `doctor` decides before creating a guest.
pub(crate) struct Plan {
    pub settings: Settings,
    pub egress: EgressPolicy,
    pub grant: Option<Grant>,
    pub limits: ExecLimits,
}

impl Backend {
    /// A backend with default options. Reads nothing yet.
    pub fn new() -> Self {
        Self::with_options(BackendOptions::default())
    }

    /// A backend with explicit options (CreateOS's HTTP client installed as the default
    /// connector, `sandbox_createos::install`).
    pub fn with_options(opts: BackendOptions) -> Self {
        sandbox_createos::install();
        Self {
            surface: Surface::new(SurfaceKind::Backend, opts.surface),
        }
    }

    /// The surface kit this backend runs on.
    pub fn surface(&self) -> &Surface {
        &self.surface
    }

    /// Guests currently registered with this backend (live runs plus pending destroys).
    pub fn registered_guests(&self) -> usize {
        self.surface.registered_guests()
    }

    /// Guests registered with this backend that no run owns and the warm pool does not hold
    /// (pending destroys), plus those of runs in flight: what a caller waiting for a run's
    /// guest to be gone compares with its runs in flight.
    pub fn unpooled_guests(&self) -> usize {
        self.surface.unpooled_guests()
    }

    /// The warm pool's counters (size 0 when `CREATEOS_SANDBOX_WARM_POOL` is unset or 0).
    pub fn warm_pool(&self) -> PoolStats {
        self.surface.pool_stats()
    }

    pub(crate) fn pool_allowed(&self) -> bool {
        self.surface.pool_allowed()
    }

    fn settings(&self) -> Result<Settings, SandboxError> {
        self.surface.settings()
    }

    /// The operator's link-local opt-in ([`ENV_ACCEPT_EGRESS_EXCEPTIONS`]).
    pub(crate) fn accepts_egress_exceptions(&self) -> Result<bool, SandboxError> {
        read_flag(&|k| self.surface.lookup(k), ENV_ACCEPT_EGRESS_EXCEPTIONS)
    }

    fn limits(&self, policy: &LfxPolicy) -> ExecLimits {
        self.surface
            .limits(Duration::from_secs(u64::from(policy.timeout_seconds)))
    }

    /// The refusals that need no I/O, in the order an operator would fix them.
    pub(crate) fn plan(&self, policy: &LfxPolicy) -> Result<Plan, SandboxError> {
        let settings = self.settings()?;
        let accept = self.accepts_egress_exceptions()?;
        policy.validate()?;
        let limits = self.limits(policy);
        let (egress, grant) = policy.egress(accept, &settings, limits.host_deadline())?;
        settings.require_key()?;
        Ok(Plan {
            settings,
            egress,
            grant,
            limits,
        })
    }

    fn account(&self, settings: &Settings) -> Result<Arc<Account>, SandboxError> {
        self.surface.session().account(settings)
    }

    /// Runs `code` as a Python program in a fresh CreateOS guest, under `policy`.
    ///
    /// Reads the `CREATEOS_*` settings at call time. Every refusal happens before a guest
    /// exists. Dropping the returned future (Ctrl-C) still destroys the guest.
    pub async fn run(
        &self,
        code: &str,
        env: Option<BTreeMap<String, String>>,
        policy: &LfxPolicy,
    ) -> Result<RunOutput, BackendError> {
        let plan = self.plan(policy)?;
        let envs = env.unwrap_or_default();
        if let Some(bad) = envs.keys().find(|k| !is_valid_env_name(k)) {
            return Err(BackendError::Unavailable(format!(
                "env key {bad:?} is not a valid environment variable name ([A-Za-z_][A-Za-z0-9_]*)"
            )));
        }
        Withheld::from_lookup(&|k| self.surface.lookup(k)).check_code_and_env(code, &envs)?;
        let opened = self.surface.open(&plan.settings).await?;
        let choice = select_shape(
            &opened.catalog,
            policy.memory_mb,
            sandbox_core::shapes::pin_of(&plan.settings),
            ENV_LF_MEMORY,
        )?;
        let spec = RunSpec {
            shape: choice.shape.id.clone(),
            rootfs: plan.settings.rootfs.clone(),
            envs,
            egress: plan.egress,
            limits: plan.limits,
            max_output_bytes: plan.settings.max_output_bytes,
            backoff: opened.backoff,
            background_destroy: self.surface.options().background_destroy,
            grant: plan.grant,
        };
        let cx = self.surface.context(&opened);
        run_on(
            &self.surface,
            &cx,
            &spec,
            plan.settings.warm_pool,
            Caps::of(&plan.settings),
            Bytes::copy_from_slice(code.as_bytes()),
        )
        .await
        .map_err(Into::into)
    }

    /// Destroys every guest still registered (runs in flight, pending destroys and the warm
    /// pool) within a bounded time, stops background retries and refills, and refuses new
    /// runs. Idempotent.
    pub async fn shutdown(&self) {
        self.surface.shutdown().await;
    }

    pub(crate) fn limits_for_doctor(&self, policy: &LfxPolicy) -> ExecLimits {
        self.limits(policy)
    }
}

/// A one-line description of a shape choice.
pub(crate) fn describe_shape(c: &ShapeChoice) -> String {
    let how = if c.pinned {
        "pinned by CREATEOS_SANDBOX_SHAPE".to_owned()
    } else {
        format!("smallest with at least {} MiB", c.required_mib)
    };
    format!(
        "shape {} ({} vCPU, {} MiB; {how})",
        c.shape.id, c.shape.vcpu, c.shape.mem_mib
    )
}

/// A one-line description of the egress decision.
pub(crate) fn describe_egress(e: &EgressPolicy) -> String {
    match e {
        EgressPolicy::AllowAll => {
            "egress: unrestricted ([\"*\"]), because LANGFLOW_SANDBOX_ALLOW_NETWORK=true".to_owned()
        }
        EgressPolicy::DenyAll => format!(
            "egress: deny-all ([\"240.0.0.0/4\"]); {LINK_LOCAL_HOLE} (the VM metadata service) \
             stays reachable, accepted by LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS"
        ),
        EgressPolicy::Rules(_) | EgressPolicy::Domains(_) => format!("egress: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capabilities_are_honest() {
        let c = capabilities_with(&|_| None);
        assert_eq!(c.isolation, "hardware-virtualized");
        assert!(c.supports_deny_all_egress);
        assert!(!c.supports_domain_allowlist);
        assert_eq!(c.max_timeout_seconds, None);
    }

    const GW_SECRET: &str = "0123456789abcdef0123456789abcdef-gw";

    fn lookup(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |k| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
    }

    #[test]
    fn domain_allowlist_is_declared_only_with_a_usable_gateway() {
        use sandbox_core::gateway::{ENV_GATEWAY_SECRET, ENV_GATEWAY_URL};
        let url = (ENV_GATEWAY_URL, "http://10.0.0.5:3128");
        let secret = (ENV_GATEWAY_SECRET, GW_SECRET);
        assert!(capabilities_with(&lookup(&[url, secret])).supports_domain_allowlist);
        for pairs in [
            vec![url],
            vec![secret],
            vec![(ENV_GATEWAY_URL, "http://gw.internal:3128"), secret],
            vec![url, (ENV_GATEWAY_SECRET, "too-short")],
        ] {
            assert!(!capabilities_with(&lookup(&pairs)).supports_domain_allowlist);
        }
    }

    #[test]
    fn default_policy_is_lfx_default() {
        let p = LfxPolicy::default();
        assert_eq!(p.timeout_seconds, 30);
        assert_eq!(p.memory_mb, 192);
        assert!(!p.allow_network);
        assert!(p.allowed_domains.is_empty());
    }

    #[test]
    fn backend_is_send_sync_and_cheap() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Backend>();
        let b = Backend::new();
        assert_eq!(b.registered_guests(), 0);
    }

    #[test]
    fn lfx_policy_from_lookup() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        let p = LfxPolicy::from_lookup(&env(&[])).unwrap();
        assert_eq!(p, LfxPolicy::default());
        let p = LfxPolicy::from_lookup(&env(&[
            (ENV_LF_TIMEOUT, "5"),
            (ENV_LF_MEMORY, "8192"),
            (ENV_LF_ALLOW_NETWORK, "true"),
            (
                ENV_LF_ALLOWED_DOMAINS,
                " pypi.org, ,files.pythonhosted.org ",
            ),
        ]))
        .unwrap();
        assert_eq!(p.timeout_seconds, 5);
        assert_eq!(p.memory_mb, 8192);
        assert!(p.allow_network);
        assert_eq!(
            p.allowed_domains,
            vec!["pypi.org", "files.pythonhosted.org"]
        );
        for pair in [
            &[(ENV_LF_TIMEOUT, "0")],
            &[(ENV_LF_TIMEOUT, "301")],
            &[(ENV_LF_MEMORY, "64")],
            &[(ENV_LF_TIMEOUT, "x")],
        ] {
            let e = LfxPolicy::from_lookup(&env(pair)).unwrap_err();
            assert!(e.to_string().contains(pair[0].0), "{e}");
        }
    }

    fn settings(pairs: &[(&str, &str)]) -> Settings {
        Settings::from_lookup(&lookup(pairs)).unwrap()
    }

    const BUDGET: Duration = Duration::from_secs(30);

    /// `p.egress` under the settings `pairs`, whose link-local opt-in is the backend's.
    fn egress_of(
        p: &LfxPolicy,
        pairs: &[(&str, &str)],
    ) -> Result<(EgressPolicy, Option<Grant>), SandboxError> {
        let accept = pairs.contains(&(ENV_ACCEPT_EGRESS_EXCEPTIONS, "true"));
        p.egress(accept, &settings(pairs), BUDGET)
    }

    #[test]
    fn egress_refusals_name_langflow_settings() {
        use sandbox_core::gateway::{ENV_GATEWAY_SECRET, ENV_GATEWAY_URL};
        let accept = (ENV_ACCEPT_EGRESS_EXCEPTIONS, "true");
        let mut p = LfxPolicy {
            allowed_domains: vec!["pypi.org".into()],
            allow_network: true,
            ..LfxPolicy::default()
        };
        // Domains without a gateway: refused, naming the setting and the gateway's.
        let e = egress_of(&p, &[accept]).unwrap_err();
        assert!(e.kind().is_unavailable());
        assert!(e.to_string().contains(ENV_LF_ALLOWED_DOMAINS), "{e}");
        assert!(e.to_string().contains(ENV_GATEWAY_URL), "{e}");
        // With one: the gateway's address is the only rule, and a grant for the domains.
        let gw = [
            accept,
            (ENV_GATEWAY_URL, "http://10.0.0.5:3128"),
            (ENV_GATEWAY_SECRET, GW_SECRET),
        ];
        let (egress, grant) = egress_of(&p, &gw).unwrap();
        assert_eq!(egress.rules(), ["10.0.0.5:3128"]);
        assert_eq!(grant.unwrap().domains().entries(), ["pypi.org"]);
        // ... still under the link-local opt-in, named for the domains setting.
        let e = egress_of(&p, &gw[1..]).unwrap_err();
        assert!(e.to_string().contains(ENV_ACCEPT_EGRESS_EXCEPTIONS), "{e}");
        assert!(e.to_string().contains(ENV_LF_ALLOWED_DOMAINS), "{e}");
        // A bad entry is refused by name, gateway or not.
        p.allowed_domains = vec!["pypi.org".into(), "*".into()];
        let e = egress_of(&p, &gw).unwrap_err();
        assert!(e.to_string().contains(ENV_LF_ALLOWED_DOMAINS), "{e}");
        assert!(e.to_string().contains("\"*\""), "{e}");
        // Network off: nothing reachable, the list unused (lfx's meaning).
        p.allowed_domains = vec!["pypi.org".into()];
        p.allow_network = false;
        let (egress, grant) = egress_of(&p, &gw).unwrap();
        assert_eq!(egress, EgressPolicy::DenyAll);
        assert!(grant.is_none());
        let p = LfxPolicy::default();
        let e = egress_of(&p, &[]).unwrap_err();
        assert!(e.to_string().contains("169.254.0.0/16"), "{e}");
        assert!(e.to_string().contains(ENV_ACCEPT_EGRESS_EXCEPTIONS), "{e}");
        assert!(e.to_string().contains(ENV_LF_ALLOW_NETWORK), "{e}");
        assert_eq!(egress_of(&p, &[accept]).unwrap().0, EgressPolicy::DenyAll);
        let open = LfxPolicy {
            allow_network: true,
            ..LfxPolicy::default()
        };
        assert_eq!(egress_of(&open, &[]).unwrap().0, EgressPolicy::AllowAll);
    }

    #[test]
    fn errors_map_by_kind() {
        let e: BackendError = SandboxError::refused("no").into();
        assert!(matches!(e, BackendError::Unavailable(_)));
        let e: BackendError =
            SandboxError::new(sandbox_core::ErrorKind::OutcomeUnknown, "may have run").into();
        assert!(matches!(e, BackendError::Execution(ref m) if m == "may have run"));
        assert_eq!(e.to_string(), "may have run");
    }
}

#[cfg(test)]
mod send_tests {
    use super::*;

    /// The bindings spawn `run` as a tokio task, so its future must be `Send + 'static`-able.
    #[test]
    fn run_future_is_send() {
        fn assert_send<T: Send>(_: &T) {}
        let b = Arc::new(Backend::new());
        let fut = async move {
            let p = LfxPolicy::default();
            let _ = b.run("print(1)", None, &p).await;
            b.shutdown().await;
            let _ = b.doctor(&p).await;
        };
        assert_send(&fut);
    }
}
