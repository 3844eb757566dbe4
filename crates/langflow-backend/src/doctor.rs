//! `doctor`: what a run would get, and every refusal that would apply, without creating a guest.

use std::fmt;

use sandbox_core::ErrorKind;
use sandbox_core::egress::EgressPolicy;
use sandbox_core::gateway::{self, GatewaySetting};
use sandbox_core::settings::{
    ENV_API_KEY, ENV_API_KEY_FALLBACK, ENV_CONTROL_PLANE_RETRY, ENV_WARM_POOL,
};
use sandbox_core::shapes::select_shape;

use crate::{
    Backend, ENV_ACCEPT_EGRESS_EXCEPTIONS, ENV_LF_ALLOW_NETWORK, ENV_LF_ALLOWED_DOMAINS,
    ENV_LF_MEMORY, LfxPolicy, describe_egress, describe_shape,
};

/// How a doctor line should be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DoctorLevel {
    /// A check that passed.
    Ok,
    /// Works, but worth knowing.
    Warn,
    /// A run would be refused for this reason.
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
    /// What was found (never the key).
    pub text: String,
}

/// The findings of [`Backend::doctor`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DoctorReport {
    /// True when no line is a refusal: a run would be attempted.
    pub ok: bool,
    /// Findings, in check order.
    pub lines: Vec<DoctorLine>,
}

impl fmt::Display for DoctorReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "CreateOS sandbox backend: doctor")?;
        for l in &self.lines {
            writeln!(f, "  [{:<7}] {}", l.level.as_str(), l.text)?;
        }
        if self.ok {
            write!(
                f,
                "Result: a run would be attempted with the settings above."
            )
        } else {
            let n = self
                .lines
                .iter()
                .filter(|l| l.level == DoctorLevel::Refused)
                .count();
            write!(f, "Result: runs would be refused ({n} problem(s) above).")
        }
    }
}

/// The lfx entry-point name this backend is registered under, which lfx must be told to trust
/// and to select.
const PLUGIN_NAME: &str = "createos";
/// lfx's trust gate: a comma-separated list of the sandbox plugins lfx may import.
const ENV_LF_PLUGINS: &str = "LANGFLOW_SANDBOX_BACKEND_PLUGINS";
/// lfx's selection of the sandbox backend to use.
const ENV_LF_SELECTED: &str = "LANGFLOW_SANDBOX_BACKEND";

impl DoctorReport {
    /// Puts lfx's own two switches at the top of the report and recomputes [`ok`](Self::ok).
    ///
    /// `env` reads an environment variable (`|name| std::env::var(name).ok()` in production).
    /// Without `createos` in `LANGFLOW_SANDBOX_BACKEND_PLUGINS` (a comma-separated list,
    /// compared case-insensitively) lfx never imports this backend, and refuses to start when
    /// it is selected, so that is a refusal. Without `LANGFLOW_SANDBOX_BACKEND=createos` lfx
    /// simply uses another backend: a warning, since a run through this backend would work.
    pub fn add_trust_gate(&mut self, env: &dyn Fn(&str) -> Option<String>) {
        let trusted = env(ENV_LF_PLUGINS)
            .unwrap_or_default()
            .split(',')
            .any(|name| name.trim().eq_ignore_ascii_case(PLUGIN_NAME));
        let selected = env(ENV_LF_SELECTED).map(|v| v.trim().to_ascii_lowercase());
        let gate = if trusted {
            DoctorLine {
                level: DoctorLevel::Ok,
                text: format!("lfx trusts the plugin ({ENV_LF_PLUGINS} lists {PLUGIN_NAME})"),
            }
        } else {
            DoctorLine {
                level: DoctorLevel::Refused,
                text: format!(
                    "{ENV_LF_PLUGINS} does not list {PLUGIN_NAME}: lfx will not load this \
                     backend (and refuses to start if {ENV_LF_SELECTED}={PLUGIN_NAME}); set \
                     {ENV_LF_PLUGINS}={PLUGIN_NAME}"
                ),
            }
        };
        let selection = match selected.as_deref() {
            Some(PLUGIN_NAME) => DoctorLine {
                level: DoctorLevel::Ok,
                text: format!("lfx selects this backend ({ENV_LF_SELECTED}={PLUGIN_NAME})"),
            },
            other => DoctorLine {
                level: DoctorLevel::Warn,
                text: format!(
                    "{ENV_LF_SELECTED} is {:?}, so lfx will not use this backend; set \
                     {ENV_LF_SELECTED}={PLUGIN_NAME}",
                    other.unwrap_or("none")
                ),
            },
        };
        self.lines.splice(0..0, [gate, selection]);
        self.ok = !self
            .lines
            .iter()
            .any(|line| line.level == DoctorLevel::Refused);
    }
}

struct Lines(Vec<DoctorLine>);

impl Lines {
    fn push(&mut self, level: DoctorLevel, text: impl Into<String>) {
        self.0.push(DoctorLine {
            level,
            text: text.into(),
        });
    }
}

pub(crate) async fn run(backend: &Backend, policy: &LfxPolicy) -> DoctorReport {
    let mut out = Lines(Vec::new());
    let (settings, accept) = match backend
        .settings_for_doctor()
        .and_then(|s| Ok((s, backend.accepts_egress_exceptions()?)))
    {
        Ok(read) => read,
        Err(e) => {
            out.push(DoctorLevel::Refused, e.message());
            return finish(out);
        }
    };
    out.push(
        DoctorLevel::Info,
        format!("control plane: {}", settings.base_url),
    );
    out.push(
        DoctorLevel::Info,
        match sandbox_core::createos::proxy_for(&settings.base_url) {
            Some(p) => format!(
                "proxy: {p} (from HTTPS_PROXY or ALL_PROXY; the key travels inside a CONNECT \
                 tunnel; exclude the host with NO_PROXY)"
            ),
            None => "proxy: no proxy (plain http is never proxied; https honours HTTPS_PROXY, \
                     ALL_PROXY and NO_PROXY)"
                .to_owned(),
        },
    );
    out.push(DoctorLevel::Info, format!("rootfs: {}", settings.rootfs));
    out.push(
        DoctorLevel::Info,
        format!(
            "output cap: {} bytes per stream (CREATEOS_SANDBOX_MAX_OUTPUT_BYTES)",
            settings.max_output_bytes
        ),
    );
    out.push(
        DoctorLevel::Info,
        format!(
            "control-plane retry: a failing control plane is retried for {} s per call \
             before the run gives up ({ENV_CONTROL_PLANE_RETRY}{})",
            backend.surface.backoff(&settings).budget.as_secs_f64(),
            if settings.control_plane_retry.is_some() {
                ""
            } else {
                " unset"
            }
        ),
    );
    let pool = backend.warm_pool();
    out.push(
        DoctorLevel::Info,
        if settings.warm_pool == 0 {
            format!("warm pool: off ({ENV_WARM_POOL} unset or 0)")
        } else if !backend.pool_allowed() {
            format!(
                "warm pool: off in this forked worker process ({ENV_WARM_POOL}={} applies to \
                 the process that imported the package): a forked worker often ends with \
                 os._exit and could not destroy idle guests",
                settings.warm_pool
            )
        } else {
            format!(
                "warm pool: {} guest(s) kept ready for the policy runs ask for \
                 ({ENV_WARM_POOL}={}); in this process: {} ready, {} hit(s), {} miss(es), {} \
                 retired unused, {} refill failure(s)",
                settings.warm_pool,
                settings.warm_pool,
                pool.ready,
                pool.hits,
                pool.misses,
                pool.discarded,
                pool.refill_failures
            )
        },
    );
    let limits = backend.limits_for_doctor(policy);
    out.push(
        DoctorLevel::Info,
        format!(
            "timeout: {} s in the guest (TERM, then KILL after {} s); the host waits {} s; \
             auto-pause backstop {} s",
            policy.timeout_seconds,
            limits.kill_after.as_secs_f64(),
            limits.host_deadline().as_secs_f64(),
            limits.auto_pause_seconds()
        ),
    );
    if let Err(e) = policy.validate() {
        out.push(DoctorLevel::Refused, e.message());
    }
    gateway_lines(&mut out, &settings.gateway).await;
    match policy.egress(accept, &settings, limits.host_deadline()) {
        Ok((e, Some(grant))) => out.push(
            DoctorLevel::Ok,
            format!(
                "egress: only the egress gateway ({e}); through it, the program's proxy \
                 variables reach {ENV_LF_ALLOWED_DOMAINS} = {}; a program that ignores them \
                 reaches nothing",
                grant.domains()
            ),
        ),
        Ok((e, None)) => {
            let level = if e == EgressPolicy::AllowAll {
                DoctorLevel::Warn
            } else {
                DoctorLevel::Ok
            };
            out.push(level, describe_egress(&e));
            if !policy.allowed_domains.is_empty() {
                out.push(
                    DoctorLevel::Info,
                    format!(
                        "{ENV_LF_ALLOWED_DOMAINS} is not used while \
                         {ENV_LF_ALLOW_NETWORK}=false: nothing is reachable"
                    ),
                );
            }
        }
        Err(e) => out.push(DoctorLevel::Refused, e.message()),
    }
    if !policy.allow_network && !accept {
        out.push(
            DoctorLevel::Info,
            format!(
                "to run with egress off, set {ENV_ACCEPT_EGRESS_EXCEPTIONS}=true, or \
                 {ENV_LF_ALLOW_NETWORK}=true for unrestricted egress"
            ),
        );
    }
    let Some(source) = settings.api_key_source else {
        out.push(
            DoctorLevel::Refused,
            format!(
                "no CreateOS API key: set {ENV_API_KEY} (or {ENV_API_KEY_FALLBACK}); get one at \
                 https://createos.nodeops.network/profile"
            ),
        );
        return finish(out);
    };
    out.push(DoctorLevel::Info, format!("API key: set via {source}"));
    let (cred, shapes) = backend.preflight_for_doctor(&settings).await;
    match cred {
        Ok(user) => out.push(
            DoctorLevel::Ok,
            format!("credential accepted (account {user})"),
        ),
        Err(e) => out.push(level_of(e.kind()), e.message()),
    }
    match shapes {
        Ok(catalog) => {
            match select_shape(
                &catalog,
                policy.memory_mb,
                sandbox_core::shapes::pin_of(&settings),
                ENV_LF_MEMORY,
            ) {
                Ok(c) => out.push(DoctorLevel::Ok, describe_shape(&c)),
                Err(e) => out.push(DoctorLevel::Refused, e.message()),
            }
        }
        Err(e) => out.push(level_of(e.kind()), e.message()),
    }
    finish(out)
}

/// The egress gateway: configured or not, its settings, and whether this host connects to it.
async fn gateway_lines(out: &mut Lines, setting: &GatewaySetting) {
    let level = match setting {
        GatewaySetting::Off => DoctorLevel::Info,
        GatewaySetting::Ready(_) => DoctorLevel::Ok,
        // Refuses the runs that ask for domains (the egress line says so when this one does).
        GatewaySetting::Invalid(_) => DoctorLevel::Warn,
    };
    out.push(level, gateway::describe(setting));
    if let GatewaySetting::Ready(g) = setting {
        out.push(
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
        );
    }
}

/// How long `doctor` waits for a TCP connection to the gateway.
const GATEWAY_PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

fn level_of(kind: ErrorKind) -> DoctorLevel {
    if kind.is_unavailable() {
        DoctorLevel::Refused
    } else {
        // Could not check (transient); a run might still work.
        DoctorLevel::Warn
    }
}

fn finish(out: Lines) -> DoctorReport {
    let ok = !out.0.iter().any(|l| l.level == DoctorLevel::Refused);
    DoctorReport { ok, lines: out.0 }
}

#[cfg(test)]
mod trust_gate_tests {
    use super::*;

    fn accepted() -> DoctorReport {
        DoctorReport {
            ok: true,
            lines: vec![DoctorLine {
                level: DoctorLevel::Ok,
                text: "credential accepted".into(),
            }],
        }
    }

    fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            pairs
                .iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| (*value).to_owned())
        }
    }

    #[test]
    fn untrusted_plugin_is_a_refusal_even_when_selected() {
        let mut report = accepted();
        report.add_trust_gate(&env_of(&[(ENV_LF_SELECTED, "createos")]));
        assert!(!report.ok);
        assert_eq!(report.lines.len(), 3);
        assert_eq!(report.lines[0].level, DoctorLevel::Refused);
        assert!(report.lines[0].text.contains(ENV_LF_PLUGINS));
        assert_eq!(report.lines[1].level, DoctorLevel::Ok);
        // The checks that were already there stay, after lfx's switches.
        assert_eq!(report.lines[2].text, "credential accepted");
    }

    #[test]
    fn listed_among_others_and_selected_passes_whatever_the_case_and_spaces() {
        let mut report = accepted();
        report.add_trust_gate(&env_of(&[
            (ENV_LF_PLUGINS, "other, CreateOS "),
            (ENV_LF_SELECTED, " createos"),
        ]));
        assert!(report.ok);
        assert!(report.lines.iter().all(|l| l.level == DoctorLevel::Ok));
    }

    #[test]
    fn a_name_that_only_contains_createos_is_not_trusted() {
        let mut report = accepted();
        report.add_trust_gate(&env_of(&[
            (ENV_LF_PLUGINS, "createos2,my-createos"),
            (ENV_LF_SELECTED, "createos"),
        ]));
        assert!(!report.ok);
    }

    #[test]
    fn trusted_but_not_selected_only_warns() {
        let mut report = accepted();
        report.add_trust_gate(&env_of(&[(ENV_LF_PLUGINS, "createos")]));
        assert!(report.ok);
        assert_eq!(report.lines[1].level, DoctorLevel::Warn);
        assert!(
            report.lines[1].text.contains("\"none\""),
            "{}",
            report.lines[1].text
        );
    }

    #[test]
    fn an_earlier_refusal_still_fails_a_trusted_selected_report() {
        let mut report = DoctorReport {
            ok: false,
            lines: vec![DoctorLine {
                level: DoctorLevel::Refused,
                text: "no CreateOS API key".into(),
            }],
        };
        report.add_trust_gate(&env_of(&[
            (ENV_LF_PLUGINS, "createos"),
            (ENV_LF_SELECTED, "createos"),
        ]));
        assert!(!report.ok);
        assert!(report.to_string().contains("1 problem(s)"));
    }
}
