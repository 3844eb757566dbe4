//! The node's inputs: their display names ([`input`]), Guest Reuse ([`Reuse`]), one execution's
//! inputs as the Python component gathers them ([`ComponentInputs`], whose `Debug` shows sizes
//! rather than code), the bounds on Timeout and Command, and the names this node's refusals give
//! its settings ([`SETTING_NAMES`], [`DOMAIN_SETTING_NAMES`]).

use std::fmt;

use sandbox_core::SandboxError;
use sandbox_core::settings::SettingNames;

/// The default of Timeout (seconds).
pub const DEFAULT_TIMEOUT_SECONDS: u32 = 60;
/// The largest Timeout (seconds) accepted.
pub const MAX_TIMEOUT_SECONDS: u32 = 3600;
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
    /// Accept Link-Local Egress.
    pub const ACCEPT_EGRESS: &str = "Accept Link-Local Egress (accept_egress_exceptions)";
}

/// How this node's refusals name the link-local opt-in: the node's own input first (a flow
/// author can resolve the refusal on the node), then the operator's setting.
const ACCEPT_ON_NODE_OR_OPERATOR: &str = "Accept Link-Local Egress (accept_egress_exceptions) \
     on the node, or LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS";

/// The settings this surface's refusals name: the node's own inputs, and the link-local opt-in
/// (the node's input or the operator's setting).
pub const SETTING_NAMES: SettingNames = SettingNames {
    restrict_egress: "Allow Network off (allow_network=false)",
    allow_egress: "Allow Network on (allow_network=true)",
    accept_egress_exceptions: ACCEPT_ON_NODE_OR_OPERATOR,
    memory: input::SHAPE,
};

/// The settings a domains run's refusals name.
pub const DOMAIN_SETTING_NAMES: SettingNames = SettingNames {
    restrict_egress: input::ALLOWED_DOMAINS,
    allow_egress: "an empty Allowed Domains (with Allow Network on)",
    accept_egress_exceptions: ACCEPT_ON_NODE_OR_OPERATOR,
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
    /// under `lfx run` of a JSON file, whose exported id
    /// [`identity::resolve`](crate::identity::resolve) then reads). Guest Reuse needs an id:
    /// the node's id alone is copied by templates and exports and would let two flows share a
    /// guest.
    pub flow_id: String,
    /// The process's command line (Python's `sys.argv`), read only to find the exported flow
    /// `lfx run` was given when the graph carries no flow id ([`identity`](crate::identity)).
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
    /// [`ARTIFACTS_DIR`](crate::ARTIFACTS_DIR) while no other run shares the guest) and hand
    /// back its files.
    pub return_files: bool,
    /// Allow Network: unrestricted egress; off is deny-all (with the link-local opt-in).
    pub allow_network: bool,
    /// Accept Link-Local Egress: the node's own acceptance that deny-all egress still reaches
    /// `169.254.0.0/16` on CreateOS (the operator's
    /// [`ENV_ACCEPT_EGRESS_EXCEPTIONS`](crate::ENV_ACCEPT_EGRESS_EXCEPTIONS) accepts it for every
    /// node). It grants less than Allow Network on, which every node may set.
    pub accept_egress_exceptions: bool,
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
            .field("accept_egress_exceptions", &self.accept_egress_exceptions)
            .field("allowed_domains", &self.allowed_domains)
            .field("timeout_seconds", &self.timeout_seconds)
            .field("shape", &self.shape)
            .finish()
    }
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
    fn debug_shows_no_session_id() {
        let inputs = ComponentInputs {
            session_id: "private-session-7".into(),
            ..ComponentInputs::default()
        };
        let shown = format!("{inputs:?}");
        assert!(!shown.contains("private-session-7") && shown.contains("has_session_id: true"));
    }
}
