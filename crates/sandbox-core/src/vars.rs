//! How one setting is read and named, below every module that reads settings: a value that
//! is set and not blank, booleans as pydantic and shells spell them, and the names a surface's
//! refusals use for its own settings ([`SettingNames`]), and the few settings read below
//! [`crate::settings`] itself: this host's name ([`host_name`], for leases and usage records)
//! and the live-guest cap ([`parse_cap`], for the admission store). [`crate::settings`] builds
//! the typed settings on these and re-exports them.

use crate::error::SandboxError;

/// `CREATEOS_HOST_ID`: the host name this process reports in its leases and usage records
/// (default: the machine's host name).
pub const ENV_HOST_ID: &str = "CREATEOS_HOST_ID";

/// `CREATEOS_MAX_LIVE_GUESTS`: the most guests a process keeps live at once, all surfaces and
/// warm pools included (unset: unlimited). See [`crate::admission`].
pub const ENV_MAX_LIVE_GUESTS: &str = "CREATEOS_MAX_LIVE_GUESTS";

/// The largest cap accepted.
const MAX_CAP: usize = 100_000;

/// Parses the cap `raw` of the setting `var`: a whole number from 1 to 100000 (unset, not 0,
/// means unlimited); the refusal names `var`.
pub fn parse_cap(var: &str, raw: &str) -> Result<usize, SandboxError> {
    match raw.trim().parse::<usize>() {
        Ok(n) if (1..=MAX_CAP).contains(&n) => Ok(n),
        _ => Err(SandboxError::refused(format!(
            "{var}={raw:?} is not a number of guests from 1 to {MAX_CAP}; set it to the most \
             this process may keep live at once (e.g. 16), or unset it for no cap"
        ))),
    }
}

/// This host's name: [`ENV_HOST_ID`] when set, else the kernel's host name, else `unknown`.
/// Only letters, digits and `-_.` are kept. Read once per process.
pub fn host_name() -> String {
    static HOST: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HOST.get_or_init(read_host_name).clone()
}

fn read_host_name() -> String {
    let raw = std::env::var(ENV_HOST_ID)
        .ok()
        .filter(|v| !v.trim().is_empty())
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .unwrap_or_default();
    let clean: String = raw
        .trim()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || "-_.".contains(*c))
        .take(64)
        .collect();
    if clean.is_empty() {
        "unknown".to_owned()
    } else {
        clean
    }
}

/// The settings a calling surface reads, named in refusals so that a user is told to change
/// a setting of the surface they use (the executor must not point at the backend's
/// `LANGFLOW_SANDBOX_MEMORY_MB`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SettingNames {
    /// How the user asked for restricted egress, as they would write it (e.g.
    /// `LANGFLOW_SANDBOX_ALLOW_NETWORK=false`).
    pub restrict_egress: &'static str,
    /// How they would ask for unrestricted egress instead (e.g.
    /// `LANGFLOW_SANDBOX_ALLOW_NETWORK=true`).
    pub allow_egress: &'static str,
    /// The variable of the link-local opt-in the surface reads (see [`read_flag`]).
    pub accept_egress_exceptions: &'static str,
    /// The memory floor (e.g. `LANGFLOW_SANDBOX_MEMORY_MB`).
    pub memory: &'static str,
}

/// The value of `name` through `lookup` when it is set and not blank, trimmed.
pub fn non_blank(lookup: &dyn Fn(&str) -> Option<String>, name: &str) -> Option<String> {
    lookup(name)
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

/// The boolean setting `name` through `lookup`: unset is false, a bad value a refusal naming
/// `name` (see [`parse_bool`]).
pub fn read_flag(
    lookup: &dyn Fn(&str) -> Option<String>,
    name: &str,
) -> Result<bool, SandboxError> {
    lookup(name).map_or(Ok(false), |raw| parse_bool(name, &raw))
}

/// Parses a boolean the way pydantic and most shells spell it.
pub fn parse_bool(name: &str, raw: &str) -> Result<bool, SandboxError> {
    match raw.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" | "y" | "t" => Ok(true),
        "0" | "false" | "no" | "off" | "n" | "f" | "" => Ok(false),
        _ => Err(SandboxError::refused(format!(
            "{name}={raw:?} is not a boolean; set it to true or false"
        ))),
    }
}
