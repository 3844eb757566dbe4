//! `doctor`: what a run would get, and every refusal that would apply, without creating a guest.

use std::fmt;

use sandbox_core::ErrorKind;
use sandbox_core::egress::EgressPolicy;
use sandbox_core::settings::{ENV_ACCEPT_EGRESS_EXCEPTIONS, ENV_API_KEY, ENV_API_KEY_FALLBACK};
use sandbox_core::shapes::select_shape;

use crate::{
    Backend, ENV_LF_ALLOW_NETWORK, ENV_LF_MEMORY, LfxPolicy, describe_egress, describe_shape,
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
    let settings = match backend.settings_for_doctor() {
        Ok(s) => s,
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
    match policy.egress(settings.accept_egress_exceptions) {
        Ok(e) => {
            let level = if e == EgressPolicy::AllowAll {
                DoctorLevel::Warn
            } else {
                DoctorLevel::Ok
            };
            out.push(level, describe_egress(&e));
        }
        Err(e) => out.push(DoctorLevel::Refused, e.message()),
    }
    if !policy.allow_network && !settings.accept_egress_exceptions {
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
                settings.pinned_shape.as_deref(),
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
