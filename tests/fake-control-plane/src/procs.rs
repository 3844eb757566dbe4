//! Managed processes: long-lived guest processes with retained, sequenced output.

use std::sync::atomic::{AtomicI32, Ordering};

use nix::sys::signal::Signal;

use crate::state::signal_groups;

/// A managed process.
#[derive(Debug, Default)]
pub(crate) struct ManagedProc {
    pgid: AtomicI32,
}

impl ManagedProc {
    /// Sends `sig` to the process's group.
    pub(crate) fn signal_group(&self, sig: Signal) {
        signal_groups(&[self.pgid.load(Ordering::SeqCst)], sig);
    }
}

/// Managed-process routes.
pub(crate) async fn dispatch(
    app: &std::sync::Arc<crate::state::App>,
    req: &mut crate::server::Req,
) -> crate::jsend::ApiResult {
    crate::handlers::with_sandbox(app, req.sid(), crate::handlers::require_running_result)?;
    Err(crate::jsend::ApiError::error(
        501,
        "managed processes are not implemented yet",
    ))
}
