//! The executor's error: [`ExecutorError`], whose variant is the lfx exception a failure
//! raises, and its conversions from sandbox-core's errors.

use sandbox_core::SandboxError;
use sandbox_core::plan::SurfaceError;

/// Why a flow run could not produce its events. `Display` is the message, which names the
/// setting involved and the fix; it never contains the API key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecutorError {
    /// Configured but unusable; nothing ran (lfx: `SandboxUnavailableError`).
    #[error("{0}")]
    Unavailable(String),
    /// An infrastructure failure, a timeout, or an unknown outcome (lfx:
    /// `SandboxExecutionError`). The message says whether the flow may have run.
    #[error("{0}")]
    Execution(String),
    /// The flow itself failed in the guest, as it would have in-process.
    #[error("{message}")]
    Flow {
        /// The Python exception type raised in the guest.
        error_type: Option<String>,
        /// Its message.
        message: String,
    },
}

impl From<SurfaceError> for ExecutorError {
    fn from(e: SurfaceError) -> Self {
        match e {
            SurfaceError::Unavailable(m) => ExecutorError::Unavailable(m),
            SurfaceError::Execution(m) => ExecutorError::Execution(m),
        }
    }
}

impl From<SandboxError> for ExecutorError {
    /// sandbox-core's one mapping of a core error onto lfx's classes.
    fn from(e: SandboxError) -> Self {
        SurfaceError::from(e).into()
    }
}
