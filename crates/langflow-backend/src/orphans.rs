//! Orphaned guests of earlier processes: swept in the background once per account, and on
//! demand (`python -m langflow_sandbox_createos reap`).
//!
//! What counts as an orphan is `sandbox_core::orphans`' call: a one-shot `lf-` guest found
//! paused. A process killed before it could destroy its guest (SIGKILL, OOM kill, a host that
//! lost power) leaves one behind, which auto-pause stops but nobody deletes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use sandbox_core::LOG_TARGET;
use sandbox_core::control::ControlPlane;
/// What a sweep did, and one orphan (re-exported so callers need not depend on sandbox-core).
pub use sandbox_core::orphans::{Orphan, SweepReport};
use sandbox_core::orphans::{SweepConfig, sweep};

use crate::{Backend, BackendError, call_error};

/// Whether an account's background sweep has started in this process.
#[derive(Debug, Default)]
pub(crate) struct SweepOnce(AtomicBool);

impl SweepOnce {
    /// Starts the background sweep of `cp`'s account, the first time only. Never waits for
    /// it: the sweep runs on the current tokio runtime, bounded by its deadline, and logs its
    /// count at info (or why it failed at warn).
    pub(crate) fn start(&self, cp: &Arc<dyn ControlPlane>, config: SweepConfig) {
        if self.0.swap(true, Ordering::SeqCst) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::debug!(target: LOG_TARGET, "no async runtime: orphan sweep skipped");
            return;
        };
        let cp = Arc::clone(cp);
        runtime.spawn(async move {
            match sweep(cp.as_ref(), false, &config).await {
                Ok(report) => tracing::info!(
                    target: LOG_TARGET,
                    deleted = report.deleted.len(),
                    failed = report.failed.len(),
                    examined = report.examined,
                    "orphan sweep: {} paused one-shot guest(s) of earlier processes deleted",
                    report.deleted.len()
                ),
                Err(e) => tracing::warn!(
                    target: LOG_TARGET,
                    error = %e.message,
                    "orphan sweep failed; orphans stay paused until the next process or \
                     `python -m langflow_sandbox_createos reap`"
                ),
            }
        });
    }
}

impl Backend {
    /// The sweep's retries follow the backend's backoff.
    pub(crate) fn sweep_config(&self) -> SweepConfig {
        SweepConfig {
            backoff: self.opts.backoff,
            ..SweepConfig::default()
        }
    }

    /// Deletes (or with `dry_run`, only lists) this account's orphaned guests: one-shot `lf-`
    /// guests found paused. Reads the `CREATEOS_*` settings like a run. Fails when the key is
    /// missing or the guests cannot be listed; a delete that fails is in
    /// [`SweepReport::failed`].
    pub async fn sweep_orphans(&self, dry_run: bool) -> Result<SweepReport, BackendError> {
        let settings = self.settings()?;
        let redactor = settings.redactor();
        let account = self.account(&settings)?;
        sweep(account.cp.as_ref(), dry_run, &self.sweep_config())
            .await
            .map_err(|e| call_error("listing of guests", &e, &redactor).into())
    }
}
