//! `doctor`: what a run would get, and every problem that would stop it, without creating a
//! guest.
//!
//! The pieces are shared with the package's whole-deployment doctor (in `py-bindings`), which
//! checks every enabled surface once: [`control_plane_lines`] and [`check_control_plane`]
//! (where runs go and whether the control plane answers, within [`CONTROL_PLANE_CHECK`]),
//! [`gateway_lines`], [`trust_gate`] (lfx's two switches for this backend) and
//! [`Backend::doctor_lines`] (what only this backend decides). [`Backend::doctor`] puts them
//! together for this backend alone.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use sandbox_core::control::{CallError, CallFailure, ControlPlane};
use sandbox_core::egress::EgressPolicy;
use sandbox_core::gateway::{self, GatewaySetting};
use sandbox_core::provider::ProviderKind;
use sandbox_core::retry::{Backoff, retry_until};
use sandbox_core::session::Session;
use sandbox_core::settings::{
    ENV_API_KEY, ENV_API_KEY_FALLBACK, ENV_BASE_URL, ENV_CONTROL_PLANE_RETRY, ENV_MAX_OUTPUT_BYTES,
    ENV_ROOTFS, ENV_WARM_POOL, Settings,
};
use sandbox_core::shapes::{Shape, select_shape};
use sandbox_core::{ErrorKind, classify};

use crate::{
    Backend, ENV_LF_ALLOW_NETWORK, ENV_LF_ALLOWED_DOMAINS, ENV_LF_MEMORY, LfxPolicy,
    describe_egress, describe_shape,
};

/// How a doctor line should be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DoctorLevel {
    /// A check that passed.
    Ok,
    /// Works, but worth knowing.
    Warn,
    /// A problem: runs would be refused, or would fail, for this reason.
    Refused,
    /// Plain information.
    Info,
}

impl DoctorLevel {
    /// `"ok"`, `"warn"`, `"refused"` or `"info"`.
    pub fn as_str(self) -> &'static str {
        match self {
            DoctorLevel::Ok => "ok",
            DoctorLevel::Warn => "warn",
            DoctorLevel::Refused => "refused",
            DoctorLevel::Info => "info",
        }
    }
}

impl fmt::Display for DoctorLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One finding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DoctorLine {
    /// Its level.
    pub level: DoctorLevel,
    /// The setting it is about, as an operator sets it (`CREATEOS_EXECUTOR_SHAPE`), when it
    /// is about one.
    pub setting: Option<String>,
    /// What was found (never the key).
    pub text: String,
}

impl DoctorLine {
    /// A finding about the first setting `text` names ([`named_setting`]), if any.
    pub fn new(level: DoctorLevel, text: impl Into<String>) -> Self {
        let text = text.into();
        Self {
            level,
            setting: named_setting(&text).map(str::to_owned),
            text,
        }
    }

    /// A finding about `setting`.
    pub fn about(level: DoctorLevel, setting: &str, text: impl Into<String>) -> Self {
        Self {
            level,
            setting: Some(setting.to_owned()),
            text: text.into(),
        }
    }

    /// Whether this finding is a problem (a run would be refused or fail).
    pub fn is_problem(&self) -> bool {
        self.level == DoctorLevel::Refused
    }
}

/// The first setting `text` names: a `CREATEOS_…` or `LANGFLOW_…` variable name (upper-case
/// letters, digits and `_`), not a pattern such as `CREATEOS_SANDBOX_*`. A refusal names the
/// setting to fix first, so this is the setting a finding is about.
pub fn named_setting(text: &str) -> Option<&str> {
    let bytes = text.as_bytes();
    let word = |b: u8| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_';
    let mut at = 0;
    while at < bytes.len() {
        let starts_word = at == 0 || !(word(bytes[at - 1]) || bytes[at - 1].is_ascii_lowercase());
        if starts_word
            && (bytes[at..].starts_with(b"CREATEOS_")
                || bytes[at..].starts_with(b"LANGFLOW_")
                || bytes[at..].starts_with(b"OPEN_SANDBOX_"))
        {
            let end = bytes[at..]
                .iter()
                .position(|&b| !word(b))
                .map_or(bytes.len(), |n| at + n);
            let name = text[at..end].trim_end_matches('_');
            let pattern = bytes.get(end) == Some(&b'*') || text[at..end].ends_with('_');
            if !pattern && name.len() > "LANGFLOW_".len() {
                return Some(name);
            }
            at = end;
        } else {
            at += 1;
        }
    }
    None
}

/// The findings of [`Backend::doctor`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DoctorReport {
    /// True when no line is a problem: a run would be attempted.
    pub ok: bool,
    /// Findings, in check order.
    pub lines: Vec<DoctorLine>,
}

impl DoctorReport {
    /// A report of `lines`.
    pub fn new(lines: Vec<DoctorLine>) -> Self {
        Self {
            ok: !lines.iter().any(DoctorLine::is_problem),
            lines,
        }
    }

    /// How many lines are problems.
    pub fn problems(&self) -> usize {
        self.lines.iter().filter(|l| l.is_problem()).count()
    }
}

impl fmt::Display for DoctorReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "CreateOS sandbox backend: doctor")?;
        for l in &self.lines {
            writeln!(f, "  [{:<7}] {}", l.level.as_str(), l.text)?;
        }
        match self.problems() {
            0 => write!(f, "Result: no problems; a run would be attempted."),
            1 => write!(f, "Result: 1 problem; runs would not go ahead."),
            n => write!(f, "Result: {n} problems; runs would not go ahead."),
        }
    }
}

/// The lfx entry-point name this backend is registered under, which lfx must be told to trust
/// and to select.
pub const PLUGIN_NAME: &str = "createos";
/// lfx's trust gate: a comma-separated list of the sandbox plugins lfx may import.
pub const ENV_LF_PLUGINS: &str = "LANGFLOW_SANDBOX_BACKEND_PLUGINS";
/// lfx's selection of the sandbox backend to use.
pub const ENV_LF_SELECTED: &str = "LANGFLOW_SANDBOX_BACKEND";

/// Whether lfx's trust gate ([`ENV_LF_PLUGINS`], read through `env`) lists this backend
/// (comma-separated, compared case-insensitively, whole names only).
pub fn trusted(env: &dyn Fn(&str) -> Option<String>) -> bool {
    env(ENV_LF_PLUGINS)
        .unwrap_or_default()
        .split(',')
        .any(|name| name.trim().eq_ignore_ascii_case(PLUGIN_NAME))
}

/// lfx's selection ([`ENV_LF_SELECTED`], read through `env`), trimmed and lower-cased, or
/// `None` when unset or blank.
pub fn selected(env: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    env(ENV_LF_SELECTED)
        .map(|v| v.trim().to_ascii_lowercase())
        .filter(|v| !v.is_empty())
}

/// lfx's two switches for this backend, as a checked backend needs them: without `createos`
/// in [`ENV_LF_PLUGINS`] lfx never imports it (and refuses to start when it is selected);
/// without [`ENV_LF_SELECTED`]`=createos` lfx runs the Python Interpreter's code with another
/// backend. Either is a problem for an operator who means to use this one.
pub fn trust_gate(env: &dyn Fn(&str) -> Option<String>) -> Vec<DoctorLine> {
    let gate = if trusted(env) {
        DoctorLine::about(
            DoctorLevel::Ok,
            ENV_LF_PLUGINS,
            format!("lfx trusts the plugin ({ENV_LF_PLUGINS} lists {PLUGIN_NAME})"),
        )
    } else {
        DoctorLine::about(
            DoctorLevel::Refused,
            ENV_LF_PLUGINS,
            format!(
                "{ENV_LF_PLUGINS} does not list {PLUGIN_NAME}: lfx will not load this backend \
                 (and refuses to start if {ENV_LF_SELECTED}={PLUGIN_NAME}); set \
                 {ENV_LF_PLUGINS}={PLUGIN_NAME}"
            ),
        )
    };
    let selection = match selected(env).as_deref() {
        Some(PLUGIN_NAME) => DoctorLine::about(
            DoctorLevel::Ok,
            ENV_LF_SELECTED,
            format!("lfx selects this backend ({ENV_LF_SELECTED}={PLUGIN_NAME})"),
        ),
        other => DoctorLine::about(
            DoctorLevel::Refused,
            ENV_LF_SELECTED,
            format!(
                "{ENV_LF_SELECTED} is {:?}, so lfx runs the Python Interpreter's code without \
                 this backend; set {ENV_LF_SELECTED}={PLUGIN_NAME}",
                other.unwrap_or("unset")
            ),
        ),
    };
    vec![gate, selection]
}

/// How long `doctor` waits for the control plane (both calls, retries included): a check
/// that fails fast, where a run retries for [`ENV_CONTROL_PLANE_RETRY`].
pub const CONTROL_PLANE_CHECK: Duration = Duration::from_secs(5);

/// Where runs go: the control plane's URL and the proxy used to reach it. No I/O.
pub fn control_plane_lines(settings: &Settings) -> Vec<DoctorLine> {
    let proxy = sandbox_createos::proxy_for(&settings.base_url);
    vec![
        DoctorLine::about(
            DoctorLevel::Info,
            ENV_BASE_URL,
            format!(
                "control plane: {} ({ENV_BASE_URL})",
                createos_url(&settings.base_url)
            ),
        ),
        DoctorLine::new(
            DoctorLevel::Info,
            match proxy {
                Some(p) => format!(
                    "proxy: {p} (from HTTPS_PROXY or ALL_PROXY; the key travels inside a \
                     CONNECT tunnel; exclude the host with NO_PROXY)"
                ),
                None => "proxy: no proxy (plain http is never proxied; https honours \
                         HTTPS_PROXY, ALL_PROXY and NO_PROXY)"
                    .to_owned(),
            },
        ),
    ]
}

/// A URL as doctor shows it: no userinfo, query or fragment.
fn createos_url(url: &str) -> String {
    sandbox_createos::shown_url(url)
}

/// What [`check_control_plane`] found.
#[derive(Debug, Clone)]
pub struct ControlPlaneCheck {
    /// Its findings: one line when the control plane answered both calls or could not be
    /// reached at all, one per call otherwise.
    pub lines: Vec<DoctorLine>,
    /// The shape catalog, when it was read.
    pub catalog: Option<Vec<Shape>>,
}

/// The API key: where it is set, or the refusal without one. No I/O.
pub fn key_line(settings: &Settings) -> DoctorLine {
    match settings.api_key_source {
        Some(source) => DoctorLine::about(
            DoctorLevel::Info,
            source,
            format!("API key: set via {source}"),
        ),
        None => DoctorLine::about(
            DoctorLevel::Refused,
            ENV_API_KEY,
            format!(
                "no CreateOS API key: set {ENV_API_KEY} (or {ENV_API_KEY_FALLBACK}); get one at \
                 https://createos.nodeops.network/profile"
            ),
        ),
    }
}

/// Asks the control plane of `settings` (on `session`'s account for them) for the credential
/// check and the shape catalog, concurrently, retrying what is transient, and gives up after
/// [`CONTROL_PLANE_CHECK`]. A control plane that does not answer, answers as something else,
/// rejects the key or redirects is a problem; one that answers with a failure now (5xx, 429)
/// is a warning. `run_retry` is how long a run would retry ([`ENV_CONTROL_PLANE_RETRY`]), for
/// the message. Needs a key (see [`key_line`]).
pub async fn check_control_plane(
    session: &Session,
    settings: &Settings,
    run_retry: Duration,
) -> ControlPlaneCheck {
    let account = match session.account(settings) {
        Ok(a) => a,
        Err(e) => {
            return ControlPlaneCheck {
                lines: vec![DoctorLine::new(DoctorLevel::Refused, e.message())],
                catalog: None,
            };
        }
    };
    let cp: Arc<dyn ControlPlane> = account.control_plane().clone();
    let backoff = Backoff {
        base: Duration::from_millis(200),
        max: Duration::from_secs(1),
        budget: CONTROL_PLANE_CHECK,
    };
    let started = tokio::time::Instant::now();
    let deadline = started + backoff.budget;
    let (cred, shapes) = tokio::join!(
        retry_until(
            &backoff,
            deadline,
            "credential check",
            CallError::is_transient,
            |_| cp.check_credential()
        ),
        retry_until(
            &backoff,
            deadline,
            "shape catalog",
            CallError::is_transient,
            |_| cp.list_shapes()
        ),
    );
    let took = started.elapsed();
    let (cred, shapes) = (cred.0, shapes.0);
    let redactor = settings.redactor();
    let shown = createos_url(&settings.base_url);
    // Not reached at all, or not a CreateOS control plane: one line, whichever call saw it.
    let unreachable = [cred.as_ref().err(), shapes.as_ref().err()]
        .into_iter()
        .flatten()
        .find(|e| {
            matches!(
                e.failure,
                CallFailure::Transport | CallFailure::Timeout | CallFailure::Protocol
            )
        });
    if let Some(e) = unreachable {
        let how = if e.failure == CallFailure::Protocol {
            "did not answer as a CreateOS control plane"
        } else {
            "could not be reached"
        };
        return ControlPlaneCheck {
            lines: vec![DoctorLine::about(
                DoctorLevel::Refused,
                ENV_BASE_URL,
                format!(
                    "the control plane at {shown} {how} within {} s ({}): check {ENV_BASE_URL} \
                     and this host's network and proxy; a run would retry for {} s \
                     ({ENV_CONTROL_PLANE_RETRY}) and then fail",
                    CONTROL_PLANE_CHECK.as_secs(),
                    redactor.cap(&e.message),
                    run_retry.as_secs_f64()
                ),
            )],
            catalog: None,
        };
    }
    let failed = |what: &str, e: &CallError| {
        let err = classify::before_dispatch(ProviderKind::CreateOs, what, e, false, &redactor);
        let level = if err.kind() == ErrorKind::Transient {
            // It answered, with a failure now: a run retries, and may well succeed.
            DoctorLevel::Warn
        } else {
            DoctorLevel::Refused
        };
        DoctorLine::new(level, err.message())
    };
    match (cred, shapes) {
        (Ok(user), Ok(catalog)) => ControlPlaneCheck {
            lines: vec![DoctorLine::about(
                DoctorLevel::Ok,
                ENV_BASE_URL,
                format!(
                    "the control plane at {shown} answered in {} ms: credential accepted \
                     (account {user}), {} shape(s) in the catalog",
                    took.as_millis(),
                    catalog.len()
                ),
            )],
            catalog: Some(catalog),
        },
        (cred, shapes) => {
            let mut lines = Vec::new();
            match cred {
                Ok(user) => lines.push(DoctorLine::new(
                    DoctorLevel::Ok,
                    format!("credential accepted (account {user})"),
                )),
                Err(e) => lines.push(failed("credential check", &e)),
            }
            let catalog = match shapes {
                Ok(c) => Some(c),
                Err(e) => {
                    lines.push(failed("shape catalog", &e));
                    None
                }
            };
            ControlPlaneCheck { lines, catalog }
        }
    }
}

/// The egress gateway: configured or not, its settings, and whether this host connects to it
/// (within [`GATEWAY_PROBE_TIMEOUT`]).
pub async fn gateway_lines(setting: &GatewaySetting) -> Vec<DoctorLine> {
    let level = match setting {
        GatewaySetting::Off => DoctorLevel::Info,
        GatewaySetting::Ready(_) => DoctorLevel::Ok,
        // Refuses the runs that ask for domains (each surface's egress line says so).
        GatewaySetting::Invalid(_) => DoctorLevel::Warn,
    };
    let mut out = vec![DoctorLine::new(level, gateway::describe(setting))];
    if let GatewaySetting::Ready(g) = setting {
        out.push(DoctorLine::new(
            DoctorLevel::Info,
            match gateway::probe(g.addr(), GATEWAY_PROBE_TIMEOUT).await {
                Ok(took) => format!(
                    "egress gateway: this host connects to {} in {} ms (the host's view: \
                     whether a guest reaches it depends on the guests' network)",
                    g.addr(),
                    took.as_millis()
                ),
                Err(why) => format!(
                    "egress gateway: this host cannot connect to {} ({why}); the host's view \
                     only, a guest's network may still reach it",
                    g.addr()
                ),
            },
        ));
    }
    out
}

/// How long `doctor` waits for a TCP connection to the gateway.
pub const GATEWAY_PROBE_TIMEOUT: Duration = Duration::from_secs(3);

impl Backend {
    /// Checks the configuration and the credential and reports the shape and egress a run
    /// would get and every problem that would stop it, for this backend alone. Creates no
    /// guest; the control plane is given [`CONTROL_PLANE_CHECK`] to answer.
    pub async fn doctor(&self, policy: &LfxPolicy) -> DoctorReport {
        let settings = match self.settings() {
            Ok(s) => s,
            Err(e) => {
                return DoctorReport::new(vec![DoctorLine::new(DoctorLevel::Refused, e.message())]);
            }
        };
        let retry = self.surface().backoff(&settings).budget;
        let mut lines = control_plane_lines(&settings);
        lines.push(DoctorLine::about(
            DoctorLevel::Info,
            ENV_CONTROL_PLANE_RETRY,
            format!(
                "control-plane retry: a failing control plane is retried for {} s per call \
                 before the run gives up ({ENV_CONTROL_PLANE_RETRY}{})",
                retry.as_secs_f64(),
                if settings.control_plane_retry.is_some() {
                    ""
                } else {
                    " unset"
                }
            ),
        ));
        lines.extend(gateway_lines(&settings.gateway).await);
        let key = key_line(&settings);
        let has_key = !key.is_problem();
        lines.push(key);
        let catalog = if has_key {
            let check = check_control_plane(self.surface().session(), &settings, retry).await;
            lines.extend(check.lines);
            check.catalog
        } else {
            None
        };
        lines.extend(self.doctor_lines(&settings, policy, catalog.as_deref()));
        DoctorReport::new(lines)
    }

    /// What only this backend decides, under `settings` and lfx's `policy`: its rootfs,
    /// output cap, warm pool, clocks, egress and (with the account's `catalog`) shape, each a
    /// line, and every problem among them. No I/O.
    pub fn doctor_lines(
        &self,
        settings: &Settings,
        policy: &LfxPolicy,
        catalog: Option<&[Shape]>,
    ) -> Vec<DoctorLine> {
        let mut out = vec![
            DoctorLine::about(
                DoctorLevel::Info,
                ENV_ROOTFS,
                format!("rootfs: {} ({ENV_ROOTFS})", settings.rootfs),
            ),
            DoctorLine::about(
                DoctorLevel::Info,
                ENV_MAX_OUTPUT_BYTES,
                format!(
                    "output cap: {} bytes per stream ({ENV_MAX_OUTPUT_BYTES})",
                    settings.max_output_bytes
                ),
            ),
        ];
        let pool = self.warm_pool();
        out.push(DoctorLine::about(
            DoctorLevel::Info,
            ENV_WARM_POOL,
            if settings.warm_pool == 0 {
                format!("warm pool: off ({ENV_WARM_POOL} unset or 0)")
            } else if !self.pool_allowed() {
                format!(
                    "warm pool: off in this forked worker process ({ENV_WARM_POOL}={} applies \
                     to the process that imported the package): a forked worker often ends \
                     with os._exit and could not destroy idle guests",
                    settings.warm_pool
                )
            } else {
                format!(
                    "warm pool: {} guest(s) kept ready for the policy runs ask for \
                     ({ENV_WARM_POOL}={}); in this process: {} ready, {} hit(s), {} miss(es), \
                     {} retired unused, {} refill failure(s)",
                    settings.warm_pool,
                    settings.warm_pool,
                    pool.ready,
                    pool.hits,
                    pool.misses,
                    pool.discarded,
                    pool.refill_failures
                )
            },
        ));
        let limits = self.limits_for_doctor(policy);
        out.push(DoctorLine::new(
            DoctorLevel::Info,
            format!(
                "timeout: {} s in the guest (TERM, then KILL after {} s); the host waits {} s; \
                 auto-pause backstop {} s",
                policy.timeout_seconds,
                limits.kill_after.as_secs_f64(),
                limits.host_deadline().as_secs_f64(),
                limits.auto_pause_seconds()
            ),
        ));
        if let Err(e) = policy.validate() {
            out.push(DoctorLine::new(DoctorLevel::Refused, e.message()));
        }
        let accept = match self.accepts_egress_exceptions() {
            Ok(accept) => accept,
            Err(e) => {
                out.push(DoctorLine::new(DoctorLevel::Refused, e.message()));
                false
            }
        };
        match policy.egress(accept, settings, limits.host_deadline()) {
            Ok((e, Some(grant))) => out.push(DoctorLine::about(
                DoctorLevel::Ok,
                ENV_LF_ALLOWED_DOMAINS,
                format!(
                    "egress: only the egress gateway ({e}); through it, the program's proxy \
                     variables reach {ENV_LF_ALLOWED_DOMAINS} = {}; a program that ignores them \
                     reaches nothing",
                    grant.domains()
                ),
            )),
            Ok((e, None)) => {
                let level = if e == EgressPolicy::AllowAll {
                    DoctorLevel::Warn
                } else {
                    DoctorLevel::Ok
                };
                out.push(DoctorLine::new(level, describe_egress(&e)));
                if !policy.allowed_domains.is_empty() {
                    out.push(DoctorLine::about(
                        DoctorLevel::Info,
                        ENV_LF_ALLOWED_DOMAINS,
                        format!(
                            "{ENV_LF_ALLOWED_DOMAINS} is not used while \
                             {ENV_LF_ALLOW_NETWORK}=false: nothing is reachable"
                        ),
                    ));
                }
            }
            Err(e) => out.push(DoctorLine::new(DoctorLevel::Refused, e.message())),
        }
        match catalog {
            Some(catalog) => match select_shape(
                catalog,
                policy.memory_mb,
                sandbox_core::shapes::pin_of(settings),
                ENV_LF_MEMORY,
            ) {
                Ok(c) => out.push(DoctorLine::new(DoctorLevel::Ok, describe_shape(&c))),
                Err(e) => out.push(DoctorLine::new(DoctorLevel::Refused, e.message())),
            },
            None => out.push(DoctorLine::new(
                DoctorLevel::Info,
                "shape: not checked (the account's shape catalog could not be read; see the \
                 control plane above)",
            )),
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            pairs
                .iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| (*value).to_owned())
        }
    }

    fn levels(lines: &[DoctorLine]) -> Vec<DoctorLevel> {
        lines.iter().map(|l| l.level).collect()
    }

    #[test]
    fn untrusted_plugin_is_a_problem_even_when_selected() {
        let lines = trust_gate(&env_of(&[(ENV_LF_SELECTED, "createos")]));
        assert_eq!(levels(&lines), [DoctorLevel::Refused, DoctorLevel::Ok]);
        assert_eq!(lines[0].setting.as_deref(), Some(ENV_LF_PLUGINS));
        assert!(lines[0].text.contains(ENV_LF_PLUGINS), "{}", lines[0].text);
    }

    #[test]
    fn listed_among_others_and_selected_passes_whatever_the_case_and_spaces() {
        let lines = trust_gate(&env_of(&[
            (ENV_LF_PLUGINS, "other, CreateOS "),
            (ENV_LF_SELECTED, " createos"),
        ]));
        assert_eq!(levels(&lines), [DoctorLevel::Ok, DoctorLevel::Ok]);
    }

    #[test]
    fn a_name_that_only_contains_createos_is_not_trusted() {
        let env = env_of(&[
            (ENV_LF_PLUGINS, "createos2,my-createos"),
            (ENV_LF_SELECTED, "createos"),
        ]);
        assert!(!trusted(&env));
        assert!(trust_gate(&env)[0].is_problem());
    }

    #[test]
    fn trusted_but_not_selected_is_a_problem_that_names_the_selection() {
        let lines = trust_gate(&env_of(&[(ENV_LF_PLUGINS, "createos")]));
        assert_eq!(levels(&lines), [DoctorLevel::Ok, DoctorLevel::Refused]);
        assert!(lines[1].text.contains("\"unset\""), "{}", lines[1].text);
        assert_eq!(lines[1].setting.as_deref(), Some(ENV_LF_SELECTED));
        let other = trust_gate(&env_of(&[
            (ENV_LF_PLUGINS, "createos"),
            (ENV_LF_SELECTED, "none"),
        ]));
        assert!(other[1].text.contains("\"none\""), "{}", other[1].text);
    }

    #[test]
    fn a_report_counts_its_problems_in_its_last_line() {
        let report = DoctorReport::new(vec![
            DoctorLine::new(DoctorLevel::Refused, "no CreateOS API key"),
            DoctorLine::new(DoctorLevel::Warn, "egress: unrestricted"),
        ]);
        assert!(!report.ok);
        assert_eq!(report.problems(), 1);
        let text = report.to_string();
        assert!(
            text.ends_with("Result: 1 problem; runs would not go ahead."),
            "{text}"
        );
        assert!(DoctorReport::new(Vec::new()).ok);
    }

    #[test]
    fn the_setting_a_line_is_about_is_the_first_one_it_names() {
        let cases = [
            (
                "CREATEOS_MAX_LIVE_GUESTS=\"-1\" is not a number of guests; see LANGFLOW_SANDBOX_BACKEND",
                Some("CREATEOS_MAX_LIVE_GUESTS"),
            ),
            (
                "shape: s-4vcpu-8gb (CREATEOS_EXECUTOR_SHAPE)",
                Some("CREATEOS_EXECUTOR_SHAPE"),
            ),
            ("the CREATEOS_SANDBOX_* values apply", None),
            (
                "set LANGFLOW_SANDBOX_BACKEND=createos",
                Some("LANGFLOW_SANDBOX_BACKEND"),
            ),
            ("MY_CREATEOS_THING and xLANGFLOW_Y are not settings", None),
            ("nothing here", None),
        ];
        for (text, want) in cases {
            assert_eq!(named_setting(text), want, "{text}");
        }
    }
}
