//! The operator's listing and deletion of old kept guests: the component's reused guests
//! (`lf-c-…`, Guest Reuse: flow or session) created longer ago than a limit,
//! `python -m langflow_sandbox_createos reap --older-than 1h` (`--dry-run` only lists them;
//! `--provider opensandbox` for the kept sandboxes on an OpenSandbox server).
//!
//! A kept guest outlives the flow run by design; auto-pause bounds its cost but nothing
//! deletes it. The orphan sweep never touches one (it may be needed by the next run), so
//! bounding their age is the operator's call, made here.

use std::time::{Duration, SystemTime};

use sandbox_core::names::REUSED_PREFIX;
/// A reused guest the reap examined, and what it did (re-exported from sandbox-core).
pub use sandbox_core::orphans::{ReusedGuest, ReusedSweep as ReapReport};
use sandbox_core::orphans::{sweep_reused, sweep_reused_provider};
use sandbox_core::provider::ProviderKind;

use crate::{ComponentError, SandboxComponent};

/// Reads an age limit such as `90s`, `30m`, `1h`, `2d` or a bare number of seconds.
pub fn parse_age(raw: &str) -> Result<Duration, ComponentError> {
    let t = raw.trim();
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let scale = match unit.trim() {
        "" | "s" | "sec" | "secs" => 1.0,
        "m" | "min" | "mins" => 60.0,
        "h" | "hour" | "hours" => 3600.0,
        "d" | "day" | "days" => 86_400.0,
        _ => f64::NAN,
    };
    number
        .parse::<f64>()
        .ok()
        .map(|n| n * scale)
        .and_then(|secs| Duration::try_from_secs_f64(secs).ok())
        .ok_or_else(|| {
            ComponentError::refused(format!(
                "--older-than {raw:?} is not an age; write e.g. 90s, 30m, 1h or 2d"
            ))
        })
}

impl SandboxComponent {
    /// Deletes (or with `dry_run`, only lists) this account's reused guests created at least
    /// `older_than` ago; younger ones are kept and listed as kept. Reads the `CREATEOS_*`
    /// settings like a run (on the OpenSandbox provider, the `OPEN_SANDBOX_*` ones, and the
    /// kept sandboxes are those whose `lf-name` label starts `lf-c-`). Fails when the key is
    /// missing or the guests cannot be listed; a delete that fails is in
    /// [`ReapReport::failed`].
    pub async fn reap_reused(
        &self,
        older_than: Duration,
        dry_run: bool,
    ) -> Result<ReapReport, ComponentError> {
        let settings = self.surface().settings()?;
        let redactor = settings.redactor();
        let account = self.surface().session().account(&settings)?;
        let config = self.surface().sweep_config_for(&settings);
        let swept = if self.opts.provider == ProviderKind::CreateOs {
            sweep_reused(
                account.control_plane().as_ref(),
                REUSED_PREFIX,
                older_than,
                dry_run,
                &config,
                SystemTime::now(),
            )
            .await
        } else {
            // Another provider's kept guests, by the `lf-name` label it stores the name in.
            sweep_reused_provider(
                account.provider().as_ref(),
                REUSED_PREFIX,
                older_than,
                dry_run,
                &config,
                SystemTime::now(),
            )
            .await
        };
        swept.map_err(|e| {
            sandbox_core::classify::call_failed(
                self.opts.provider,
                "listing of guests",
                &e,
                false,
                &redactor,
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages() {
        assert_eq!(parse_age("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse_age("30m").unwrap(), Duration::from_secs(1800));
        assert_eq!(parse_age("90").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_age("2d").unwrap(), Duration::from_secs(172_800));
        assert_eq!(parse_age("1.5s").unwrap(), Duration::from_millis(1500));
        for bad in ["", "h", "-1h", "1y", "soon"] {
            assert!(parse_age(bad).is_err(), "{bad}");
        }
    }
}
