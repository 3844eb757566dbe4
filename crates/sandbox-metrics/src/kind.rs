//! Which surface a guest or a run belongs to, and which provider it ran on: labels of every
//! figure, log line and usage record, below everything that counts or reports
//! (sandbox-core's `surface` re-exports [`SurfaceKind`], its `provider` [`ProviderKind`]).

use std::fmt;

/// Which surface a guest or a run belongs to (a label of every figure the kit reports).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SurfaceKind {
    /// The lfx sandbox backend (lfx's backend setting set to `createos`).
    Backend,
    /// The "CreateOS Sandbox" component.
    Component,
    /// The whole-flow executor (Langflow's executor-kind setting set to `createos`).
    Executor,
}

impl SurfaceKind {
    /// Every surface, in a fixed order.
    pub const ALL: [SurfaceKind; 3] = [
        SurfaceKind::Backend,
        SurfaceKind::Component,
        SurfaceKind::Executor,
    ];

    /// `backend`, `component` or `executor`.
    pub fn as_str(self) -> &'static str {
        match self {
            SurfaceKind::Backend => "backend",
            SurfaceKind::Component => "component",
            SurfaceKind::Executor => "executor",
        }
    }

    /// How log lines name it (`sandbox backend`, `sandbox component`, `flow executor`).
    pub fn label(self) -> &'static str {
        match self {
            SurfaceKind::Backend => "sandbox backend",
            SurfaceKind::Component => "sandbox component",
            SurfaceKind::Executor => "flow executor",
        }
    }

    /// Its position in [`SurfaceKind::ALL`].
    pub fn index(self) -> usize {
        match self {
            SurfaceKind::Backend => 0,
            SurfaceKind::Component => 1,
            SurfaceKind::Executor => 2,
        }
    }
}

impl fmt::Display for SurfaceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The providers a user can choose (lfx's backend setting, Langflow's executor kind, the
/// component's provider input).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum ProviderKind {
    /// CreateOS Firecracker microVMs (the default: existing flows are unchanged).
    #[default]
    CreateOs,
    /// A self-hosted OpenSandbox server.
    OpenSandbox,
}

impl ProviderKind {
    /// Every provider, in the order settings and docs list them.
    pub const ALL: [ProviderKind; 2] = [ProviderKind::CreateOs, ProviderKind::OpenSandbox];

    /// The spelling in settings, entry points and logs: `createos`, `opensandbox`.
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::CreateOs => "createos",
            ProviderKind::OpenSandbox => "opensandbox",
        }
    }

    /// The name messages give it: `CreateOS`, `OpenSandbox` (an error or status names the
    /// provider the guest ran on, so that an operator of one is not sent to the other).
    pub fn display_name(self) -> &'static str {
        match self {
            ProviderKind::CreateOs => "CreateOS",
            ProviderKind::OpenSandbox => "OpenSandbox",
        }
    }

    /// The setting that holds the provider's credential, as hints name it
    /// (`CREATEOS_SANDBOX_API_KEY`, `OPEN_SANDBOX_API_KEY`; each provider crate checks that its
    /// own spelling is this one).
    pub fn key_setting(self) -> &'static str {
        match self {
            ProviderKind::CreateOs => "CREATEOS_SANDBOX_API_KEY",
            ProviderKind::OpenSandbox => "OPEN_SANDBOX_API_KEY",
        }
    }

    /// The setting that says where the provider's server is, as hints name it
    /// (`CREATEOS_SANDBOX_BASE_URL`, `OPEN_SANDBOX_DOMAIN`).
    pub fn address_setting(self) -> &'static str {
        match self {
            ProviderKind::CreateOs => "CREATEOS_SANDBOX_BASE_URL",
            ProviderKind::OpenSandbox => "OPEN_SANDBOX_DOMAIN",
        }
    }

    /// The provider a setting's value names (trimmed, any case); `None` for anything else.
    pub fn parse(value: &str) -> Option<Self> {
        let v = value.trim();
        Self::ALL
            .into_iter()
            .find(|k| k.as_str().eq_ignore_ascii_case(v))
    }
}

impl fmt::Display for ProviderKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
