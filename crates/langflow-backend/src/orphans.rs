//! Orphaned guests of earlier processes: swept in the background once per account, and on
//! demand (`python -m langflow_sandbox_createos reap`).
//!
//! What counts as an orphan is `sandbox_core::orphans`' call: a one-shot `lf-` guest found
//! paused. A process killed before it could destroy its guest (SIGKILL, OOM kill, a host that
//! lost power) leaves one behind, which auto-pause stops but nobody deletes.

use sandbox_core::orphans::sweep;
/// What a sweep did, and one orphan (re-exported so callers need not depend on sandbox-core).
pub use sandbox_core::orphans::{Orphan, SweepReport};

use crate::{Backend, BackendError};

impl Backend {
    /// Deletes (or with `dry_run`, only lists) this account's orphaned guests: one-shot `lf-`
    /// guests found paused. Reads the `CREATEOS_*` settings like a run. Fails when the key is
    /// missing or the guests cannot be listed; a delete that fails is in
    /// [`SweepReport::failed`].
    pub async fn sweep_orphans(&self, dry_run: bool) -> Result<SweepReport, BackendError> {
        let settings = self.settings()?;
        let redactor = settings.redactor();
        let account = self.account(&settings)?;
        sweep(
            account.control_plane().as_ref(),
            dry_run,
            &self.surface().sweep_config_for(&settings),
        )
        .await
        .map_err(|e| {
            sandbox_core::classify::call_failed(
                account.provider().kind(),
                "listing of guests",
                &e,
                false,
                &redactor,
            )
            .into()
        })
    }
}
