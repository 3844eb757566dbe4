//! Deleting the component's reused guests (`lf-c-…`) older than a limit:
//! `python -m langflow_sandbox_createos reap --older-than 1h`.
//!
//! A reused guest outlives the flow run by design; auto-pause bounds its cost but nothing
//! deletes it. The orphan sweep never touches one (it may be needed by the next run), so
//! bounding their age is the operator's call, made here.

use std::time::{Duration, SystemTime};

use sandbox_core::names::REUSED_PREFIX;
/// A reused guest the reap examined, and what it did (re-exported from sandbox-core).
pub use sandbox_core::orphans::{ReusedGuest, ReusedSweep as ReapReport};
use sandbox_core::orphans::{SweepConfig, sweep_reused};
use sandbox_core::settings::Settings;

use crate::{ComponentError, SandboxComponent};

impl SandboxComponent {
    /// Deletes (or with `dry_run`, only lists) this account's reused guests created at least
    /// `older_than` ago; younger ones are kept and listed as kept. Reads the `CREATEOS_*`
    /// settings like a run. Fails when the key is missing or the guests cannot be listed; a
    /// delete that fails is in [`ReapReport::failed`].
    pub async fn reap_reused(
        &self,
        older_than: Duration,
        dry_run: bool,
    ) -> Result<ReapReport, ComponentError> {
        let env = self.opts.env.clone();
        let settings = Settings::from_lookup(&move |k| env(k))?;
        let redactor = settings.redactor();
        let account = self.opts.session.account(&settings)?;
        let config = SweepConfig {
            backoff: self.opts.backoff,
            ..SweepConfig::default()
        };
        sweep_reused(
            account.control_plane().as_ref(),
            REUSED_PREFIX,
            older_than,
            dry_run,
            &config,
            SystemTime::now(),
        )
        .await
        .map_err(|e| {
            sandbox_core::classify::call_failed("listing of guests", &e, false, &redactor).into()
        })
    }
}
