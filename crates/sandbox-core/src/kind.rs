//! Which surface a guest or a run belongs to: a label of every figure, log line and usage
//! record, below everything that counts or reports ([`crate::surface`] re-exports it).

use std::fmt;

/// Which surface a guest or a run belongs to (a label of every figure the kit reports).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SurfaceKind {
    /// The lfx sandbox backend (`LANGFLOW_SANDBOX_BACKEND=createos`).
    Backend,
    /// The "CreateOS Sandbox" component.
    Component,
    /// The whole-flow executor (`LANGFLOW_EXECUTOR_KIND=createos`).
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
