//! How one setting is read and named, below every module that reads settings: a value that
//! is set and not blank, booleans as pydantic and shells spell them, and the names a surface's
//! refusals use for its own settings ([`SettingNames`]). [`crate::settings`] builds the typed
//! settings on these and re-exports them.

use crate::error::SandboxError;

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
