//! Orphans: guests of one-shot runs whose process died before destroying them.
//!
//! A one-shot run (any surface) names its guest [`ONE_SHOT_PREFIX`] followed by exactly
//! 19 characters of `[a-z0-9]` ([`crate::names::mint_name`]), and keeps the guest busy from
//! create to destroy: its program runs under an exec that keeps the guest active, and the
//! auto-pause backstop is longer than any run's budget plus grace. So a one-shot guest found
//! **paused** was left behind by a process that is gone (SIGKILL, OOM kill, power loss) and
//! can only be an orphan. Everything else is left alone: running guests (a run may be using
//! them), names with another shape (reused guests will be named `lf-c-…`, and a one-shot name
//! has no second `-`), and guests nobody here named.
//!
//! A provider whose control plane never pauses an idle guest
//! ([`Provider::pauses_idle_guests`] is false: OpenSandbox) gives no such sign; there a
//! one-shot guest that is still alive [`SweepConfig::orphan_age`] after its create (longer
//! than any run may take) is the orphan ([`is_orphan_by_age`]), and one whose age the provider
//! does not report is left alone.
//!
//! [`sweep`] (CreateOS's control plane) and [`sweep_provider`] (any provider) list the
//! account's guests through [`Provider::list_ours`], pick the orphans and delete them (or, in a
//! dry run, only report them), with bounded retries and a deadline.

use std::time::{Duration, SystemTime};

use futures::StreamExt;
use futures::future::BoxFuture;
use tokio::time::Instant;

use crate::LOG_TARGET;
use crate::control::{AgedGuest, CallError, CallFailure, ControlPlane, GuestInfo, GuestStatus};
use crate::names::ONE_SHOT_PREFIX;
/// What a one-shot guest name is (re-exported from [`crate::names`], where every name format
/// lives).
pub use crate::names::{ONE_SHOT_RANDOM_LEN, is_one_shot_name};
use crate::provider::Provider;
use crate::retry::{Backoff, retry_until};

/// Whether `guest` is an orphan on a control plane that pauses idle guests: a one-shot guest
/// in status `paused`.
pub fn is_orphan(guest: &GuestInfo) -> bool {
    guest.status == GuestStatus::Paused && guest.name.as_deref().is_some_and(is_one_shot_name)
}

/// Whether `guest` is an orphan on a control plane that never pauses idle guests: a one-shot
/// guest, not terminal, created at least `older_than` before `now`. A guest of unknown age is
/// not.
pub fn is_orphan_by_age(guest: &AgedGuest, older_than: Duration, now: SystemTime) -> bool {
    let info = &guest.info;
    !info.is_terminal()
        && info.name.as_deref().is_some_and(is_one_shot_name)
        && guest
            .created_at
            .is_some_and(|t| now.duration_since(t).unwrap_or_default() >= older_than)
}

/// What a sweep needs of whatever it sweeps: CreateOS's control plane or a provider.
trait Sweepable: Sync {
    /// Guests whose name starts with `prefix`, with their ages when known.
    fn listing(&self, prefix: String) -> BoxFuture<'_, Result<Vec<AgedGuest>, CallError>>;
    /// Destroys one guest (idempotent).
    fn remove(&self, id: String) -> BoxFuture<'_, Result<(), CallError>>;
    /// Whether idle guests get paused (the orphan rule: paused, or by age).
    fn pauses(&self) -> bool;
}

impl Sweepable for dyn ControlPlane + '_ {
    fn listing(&self, prefix: String) -> BoxFuture<'_, Result<Vec<AgedGuest>, CallError>> {
        self.list_guests_aged(prefix)
    }
    fn remove(&self, id: String) -> BoxFuture<'_, Result<(), CallError>> {
        self.destroy(id)
    }
    fn pauses(&self) -> bool {
        // CreateOS's auto-pause.
        true
    }
}

impl Sweepable for dyn Provider + '_ {
    fn listing(&self, prefix: String) -> BoxFuture<'_, Result<Vec<AgedGuest>, CallError>> {
        self.list_ours(prefix)
    }
    fn remove(&self, id: String) -> BoxFuture<'_, Result<(), CallError>> {
        self.destroy(id)
    }
    fn pauses(&self) -> bool {
        self.pauses_idle_guests()
    }
}

/// One orphaned guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Orphan {
    /// Sandbox id.
    pub id: String,
    /// Guest name.
    pub name: String,
}

/// What a [`sweep`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Nothing was deleted: `deleted` lists what would have been.
    pub dry_run: bool,
    /// Guests whose name starts with `lf-` that the listing returned (any status).
    pub examined: usize,
    /// Orphans deleted (or, in a dry run, that would be).
    pub deleted: Vec<Orphan>,
    /// Orphans that could not be deleted, with the last error (free of the API key).
    pub failed: Vec<(Orphan, String)>,
}

/// How hard a sweep tries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SweepConfig {
    /// Retries of the listing and of each delete (429, 5xx, transport failures).
    pub backoff: Backoff,
    /// Time the whole sweep may take; what is not done by then is reported as failed.
    pub deadline: Duration,
    /// Deletes in flight at once.
    pub concurrency: usize,
    /// On a provider that never pauses idle guests, how long after its create a one-shot
    /// guest that is still alive counts as an orphan ([`is_orphan_by_age`]): longer than any
    /// run may take. Unused where idle guests are paused (CreateOS).
    pub orphan_age: Duration,
}

impl Default for SweepConfig {
    fn default() -> Self {
        Self {
            backoff: Backoff {
                base: Duration::from_millis(250),
                max: Duration::from_secs(5),
                budget: Duration::from_secs(30),
            },
            deadline: Duration::from_secs(120),
            concurrency: 4,
            orphan_age: ORPHAN_AGE,
        }
    }
}

/// The default [`SweepConfig::orphan_age`]: 24 hours, CreateOS's longest idle backstop and
/// longer than any run's budget.
pub const ORPHAN_AGE: Duration = Duration::from_secs(86_400);

/// Lists the `lf-` guests of CreateOS's control plane `cp` and deletes the paused one-shot
/// ones (see the module docs), or in a `dry_run` only reports them. See [`sweep_provider`]
/// for any provider.
///
/// Fails only when the listing fails (after retries, or past the deadline); a delete that
/// fails is reported in [`SweepReport::failed`]. Every deletion is logged.
pub async fn sweep(
    cp: &dyn ControlPlane,
    dry_run: bool,
    config: &SweepConfig,
) -> Result<SweepReport, CallError> {
    sweep_any(cp, dry_run, config).await
}

/// [`sweep`] through `provider`: its one-shot guests that are paused, or, when it never pauses
/// idle guests, that are older than [`SweepConfig::orphan_age`].
pub async fn sweep_provider(
    provider: &dyn Provider,
    dry_run: bool,
    config: &SweepConfig,
) -> Result<SweepReport, CallError> {
    sweep_any(provider, dry_run, config).await
}

async fn sweep_any<S: Sweepable + ?Sized>(
    cp: &S,
    dry_run: bool,
    config: &SweepConfig,
) -> Result<SweepReport, CallError> {
    let deadline = Instant::now() + config.deadline;
    let guests = listed(config, deadline, || cp.listing(ONE_SHOT_PREFIX.to_owned())).await?;
    let now = SystemTime::now();
    let pauses = cp.pauses();
    let orphans: Vec<Orphan> = guests
        .iter()
        .filter(|g| {
            if pauses {
                is_orphan(&g.info)
            } else {
                is_orphan_by_age(g, config.orphan_age, now)
            }
        })
        .map(|g| Orphan {
            id: g.info.id.clone(),
            name: g.info.name.clone().unwrap_or_default(),
        })
        .collect();
    let mut report = SweepReport {
        dry_run,
        examined: guests.len(),
        ..SweepReport::default()
    };
    if dry_run {
        for orphan in &orphans {
            tracing::info!(
                target: LOG_TARGET,
                guest = %orphan.name,
                id = %orphan.id,
                "orphaned guest found (dry run: not deleted)"
            );
        }
        report.deleted = orphans;
        return Ok(report);
    }
    let outcomes = delete_each(cp, orphans, Orphan::clone, config, deadline).await;
    for (orphan, res) in outcomes {
        match res {
            Ok(()) => {
                tracing::info!(
                    target: LOG_TARGET,
                    guest = %orphan.name,
                    id = %orphan.id,
                    "orphaned guest deleted"
                );
                report.deleted.push(orphan);
            }
            Err(e) => {
                tracing::warn!(
                    target: LOG_TARGET,
                    guest = %orphan.name,
                    id = %orphan.id,
                    error = %e.message,
                    "orphaned guest could not be deleted"
                );
                report.failed.push((orphan, e.message));
            }
        }
    }
    Ok(report)
}

/// A listing, retried on transient failures inside the backoff budget and `deadline`.
async fn listed<T, F, Fut>(config: &SweepConfig, deadline: Instant, op: F) -> Result<T, CallError>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<T, CallError>>,
{
    let listing = retry_until(
        &config.backoff,
        deadline.min(Instant::now() + config.backoff.budget),
        "list guests",
        CallError::is_transient,
        |_| op(),
    );
    match tokio::time::timeout_at(deadline, listing).await {
        Ok((res, _)) => res,
        Err(_) => Err(CallError::new(
            CallFailure::Timeout,
            format!(
                "listing guests did not finish within {}s",
                config.deadline.as_secs()
            ),
        )),
    }
}

/// A reused guest (a derived name, kept between runs) that [`sweep_reused`] examined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReusedGuest {
    /// Sandbox id.
    pub id: String,
    /// Guest name.
    pub name: String,
    /// Its status when listed.
    pub status: String,
    /// Time since it was created; `None` when the control plane did not say (kept).
    pub age: Option<Duration>,
}

/// What a [`sweep_reused`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReusedSweep {
    /// Nothing was deleted: `deleted` lists what would have been.
    pub dry_run: bool,
    /// The age limit.
    pub older_than: Duration,
    /// Reused guests at least `older_than` old, deleted (or, in a dry run, that would be).
    pub deleted: Vec<ReusedGuest>,
    /// Reused guests younger than the limit (or of unknown age), left alone.
    pub kept: Vec<ReusedGuest>,
    /// Reused guests that could not be deleted, with the last error (free of the API key).
    pub failed: Vec<(ReusedGuest, String)>,
}

/// Lists the account's guests named `prefix…` (reused guests, e.g.
/// [`crate::names::REUSED_PREFIX`]) and deletes those created at least `older_than` before
/// `now`, whatever their status; younger ones, and those whose age is unknown, are kept.
/// With `dry_run`, only reports. Fails only when the listing fails; a delete that fails is
/// in [`ReusedSweep::failed`]. Every deletion is logged.
///
/// A reused guest outlives flow runs by design (auto-pause bounds its cost, nothing deletes
/// it); this is the operator's way to bound how long. A run that uses a deleted guest next
/// simply creates it again (its installed packages and files are gone).
///
/// `cp` is CreateOS's control plane; see [`sweep_reused_provider`] for any provider.
pub async fn sweep_reused(
    cp: &dyn ControlPlane,
    prefix: &str,
    older_than: Duration,
    dry_run: bool,
    config: &SweepConfig,
    now: SystemTime,
) -> Result<ReusedSweep, CallError> {
    sweep_reused_any(cp, prefix, (older_than, now), dry_run, config).await
}

/// [`sweep_reused`] through `provider`.
pub async fn sweep_reused_provider(
    provider: &dyn Provider,
    prefix: &str,
    older_than: Duration,
    dry_run: bool,
    config: &SweepConfig,
    now: SystemTime,
) -> Result<ReusedSweep, CallError> {
    sweep_reused_any(provider, prefix, (older_than, now), dry_run, config).await
}

async fn sweep_reused_any<S: Sweepable + ?Sized>(
    cp: &S,
    prefix: &str,
    (older_than, now): (Duration, SystemTime),
    dry_run: bool,
    config: &SweepConfig,
) -> Result<ReusedSweep, CallError> {
    let deadline = Instant::now() + config.deadline;
    let guests = listed(config, deadline, || cp.listing(prefix.to_owned())).await?;
    let mut report = ReusedSweep {
        dry_run,
        older_than,
        ..ReusedSweep::default()
    };
    let mut doomed = Vec::new();
    for g in guests {
        if g.info.is_terminal() {
            continue;
        }
        let found = ReusedGuest {
            id: g.info.id.clone(),
            name: g.info.name.clone().unwrap_or_default(),
            status: g.info.status.to_string(),
            age: g
                .created_at
                .map(|t| now.duration_since(t).unwrap_or_default()),
        };
        if found.age.is_some_and(|age| age >= older_than) {
            doomed.push(found);
        } else {
            report.kept.push(found);
        }
    }
    if dry_run {
        report.deleted = doomed;
        return Ok(report);
    }
    let as_orphan = |g: &ReusedGuest| Orphan {
        id: g.id.clone(),
        name: g.name.clone(),
    };
    for (g, res) in delete_each(cp, doomed, as_orphan, config, deadline).await {
        if let Err(e) = res {
            report.failed.push((g, e.message));
        } else {
            report.deleted.push(g);
        }
    }
    let names: Vec<&str> = report.deleted.iter().map(|g| g.name.as_str()).collect();
    tracing::info!(
        target: LOG_TARGET,
        deleted = ?names,
        failed = report.failed.len(),
        kept = report.kept.len(),
        "reused guests older than {}s deleted",
        older_than.as_secs()
    );
    Ok(report)
}

/// Deletes every item's guest, a few at a time, each with [`delete`]'s retries.
async fn delete_each<T, S: Sweepable + ?Sized>(
    cp: &S,
    items: Vec<T>,
    orphan_of: impl Fn(&T) -> Orphan,
    config: &SweepConfig,
    deadline: Instant,
) -> Vec<(T, Result<(), CallError>)> {
    let orphan_of = &orphan_of;
    futures::stream::iter(items)
        .map(|item| async move {
            let res = delete(cp, &orphan_of(&item), config, deadline).await;
            (item, res)
        })
        .buffer_unordered(config.concurrency.max(1))
        .collect()
        .await
}

/// Deletes one orphan, retrying transient failures inside the backoff budget and the
/// sweep's deadline.
async fn delete<S: Sweepable + ?Sized>(
    cp: &S,
    orphan: &Orphan,
    config: &SweepConfig,
    deadline: Instant,
) -> Result<(), CallError> {
    let attempt_deadline = deadline.min(Instant::now() + config.backoff.budget);
    let attempts = retry_until(
        &config.backoff,
        attempt_deadline,
        "delete orphaned guest",
        CallError::is_transient,
        |_| cp.remove(orphan.id.clone()),
    );
    match tokio::time::timeout_at(deadline, attempts).await {
        Ok((res, _)) => res,
        Err(_) => Err(CallError::new(
            CallFailure::Timeout,
            "the sweep's deadline passed before the delete finished",
        )),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use bytes::Bytes;
    use futures::future::BoxFuture;

    use super::*;
    use crate::control::{CreateGuest, ExecRequest, ExecStream};
    use crate::shapes::Shape;

    #[test]
    fn one_shot_names() {
        assert!(is_one_shot_name("lf-0123456789abcdefghi"));
        assert!(is_one_shot_name(&crate::names::mint_name(ONE_SHOT_PREFIX)));
        // Reused guests of the component: a second '-', never swept.
        assert!(!is_one_shot_name("lf-c-0123456789abcdefg"));
        assert!(!is_one_shot_name("lf-0123456789abcdefgh")); // 18
        assert!(!is_one_shot_name("lf-0123456789abcdefghij")); // 20
        assert!(!is_one_shot_name("lf-0123456789ABCDEFGHI"));
        assert!(!is_one_shot_name("xx-0123456789abcdefghi"));
        assert!(!is_one_shot_name("lf-"));
    }

    fn guest(name: &str, status: &str) -> GuestInfo {
        GuestInfo {
            id: format!("id-{name}"),
            name: Some(name.to_owned()),
            status: status.into(),
            ..GuestInfo::default()
        }
    }

    /// Lists a fixed set of guests; fails each listing and each delete a given number of
    /// times first.
    struct Listed {
        guests: Vec<GuestInfo>,
        list_failures: Mutex<u32>,
        delete_failures: Mutex<u32>,
        deleted: Mutex<Vec<String>>,
    }

    impl Listed {
        fn new(guests: Vec<GuestInfo>, list_failures: u32, delete_failures: u32) -> Self {
            Self {
                guests,
                list_failures: Mutex::new(list_failures),
                delete_failures: Mutex::new(delete_failures),
                deleted: Mutex::new(Vec::new()),
            }
        }
    }

    fn unused<T: Send + 'static>() -> BoxFuture<'static, Result<T, CallError>> {
        Box::pin(async { Err(CallError::new(CallFailure::Config, "unused")) })
    }

    fn take_failure(counter: &Mutex<u32>) -> bool {
        let mut left = counter.lock().unwrap();
        if *left > 0 {
            *left -= 1;
            true
        } else {
            false
        }
    }

    impl ControlPlane for Listed {
        fn check_credential(&self) -> BoxFuture<'_, Result<String, CallError>> {
            unused()
        }
        fn list_shapes(&self) -> BoxFuture<'_, Result<Vec<Shape>, CallError>> {
            unused()
        }
        fn create(&self, _req: CreateGuest) -> BoxFuture<'_, Result<GuestInfo, CallError>> {
            unused()
        }
        fn find_by_name(&self, _n: String) -> BoxFuture<'_, Result<Option<GuestInfo>, CallError>> {
            unused()
        }
        fn egress(&self, _id: String) -> BoxFuture<'_, Result<Option<Vec<String>>, CallError>> {
            unused()
        }
        fn upload(
            &self,
            _i: String,
            _p: String,
            _d: Bytes,
        ) -> BoxFuture<'_, Result<(), CallError>> {
            unused()
        }
        fn exec_stream(
            &self,
            _id: String,
            _req: ExecRequest,
        ) -> BoxFuture<'_, Result<ExecStream, CallError>> {
            unused()
        }
        fn destroy(&self, id: String) -> BoxFuture<'_, Result<(), CallError>> {
            Box::pin(async move {
                if take_failure(&self.delete_failures) {
                    return Err(CallError::new(CallFailure::Status(503), "busy"));
                }
                self.deleted.lock().unwrap().push(id);
                Ok(())
            })
        }
        fn list_guests(&self, prefix: String) -> BoxFuture<'_, Result<Vec<GuestInfo>, CallError>> {
            Box::pin(async move {
                if take_failure(&self.list_failures) {
                    return Err(CallError::new(CallFailure::Status(429), "slow down"));
                }
                Ok(self
                    .guests
                    .iter()
                    .filter(|g| g.name.as_deref().is_some_and(|n| n.starts_with(&prefix)))
                    .cloned()
                    .collect())
            })
        }
    }

    fn quick() -> SweepConfig {
        SweepConfig {
            backoff: Backoff {
                base: Duration::from_millis(1),
                max: Duration::from_millis(5),
                budget: Duration::from_secs(5),
            },
            deadline: Duration::from_secs(10),
            concurrency: 2,
            orphan_age: ORPHAN_AGE,
        }
    }

    fn mixed() -> Vec<GuestInfo> {
        vec![
            guest("lf-aaaaaaaaaaaaaaaaaaa", "paused"),
            guest("lf-bbbbbbbbbbbbbbbbbbb", "running"),
            guest("lf-c-ccccccccccccccccc", "paused"),
            guest("other-guest", "paused"),
            guest("lf-ddddddddddddddddddd", "pausing"),
            guest("lf-eeeeeeeeeeeeeeeeeee", "paused"),
        ]
    }

    #[tokio::test]
    async fn deletes_only_paused_one_shot_guests_after_retries() {
        let cp = Listed::new(mixed(), 2, 1);
        let report = sweep(&cp, false, &quick()).await.unwrap();
        let mut deleted = cp.deleted.lock().unwrap().clone();
        deleted.sort();
        assert_eq!(
            deleted,
            ["id-lf-aaaaaaaaaaaaaaaaaaa", "id-lf-eeeeeeeeeeeeeeeeeee"]
        );
        assert_eq!(report.deleted.len(), 2);
        assert!(report.failed.is_empty());
        assert!(!report.dry_run);
        // "other-guest" does not start with lf- and is not even returned.
        assert_eq!(report.examined, 5);
    }

    #[tokio::test]
    async fn dry_run_deletes_nothing() {
        let cp = Listed::new(mixed(), 0, 0);
        let report = sweep(&cp, true, &quick()).await.unwrap();
        assert!(cp.deleted.lock().unwrap().is_empty());
        let names: Vec<_> = report.deleted.iter().map(|o| o.name.as_str()).collect();
        assert_eq!(names, ["lf-aaaaaaaaaaaaaaaaaaa", "lf-eeeeeeeeeeeeeeeeeee"]);
        assert!(report.dry_run);
    }

    #[tokio::test]
    async fn a_delete_that_keeps_failing_is_reported_not_fatal() {
        let cp = Listed::new(vec![guest("lf-aaaaaaaaaaaaaaaaaaa", "paused")], 0, u32::MAX);
        let mut config = quick();
        config.backoff.budget = Duration::from_millis(50);
        let report = sweep(&cp, false, &config).await.unwrap();
        assert!(report.deleted.is_empty());
        assert_eq!(report.failed.len(), 1);
        assert!(report.failed[0].1.contains("busy"));
    }

    #[tokio::test]
    async fn a_listing_that_keeps_failing_is_an_error() {
        let cp = Listed::new(mixed(), u32::MAX, 0);
        let mut config = quick();
        config.backoff.budget = Duration::from_millis(50);
        let err = sweep(&cp, false, &config).await.unwrap_err();
        assert_eq!(err.failure, CallFailure::Status(429));
        assert!(cp.deleted.lock().unwrap().is_empty());
    }

    /// A control plane that does not implement listing (the trait's default) makes the
    /// sweep fail without retrying.
    #[tokio::test]
    async fn default_listing_is_unsupported() {
        struct NoList;
        impl ControlPlane for NoList {
            fn check_credential(&self) -> BoxFuture<'_, Result<String, CallError>> {
                unused()
            }
            fn list_shapes(&self) -> BoxFuture<'_, Result<Vec<Shape>, CallError>> {
                unused()
            }
            fn create(&self, _r: CreateGuest) -> BoxFuture<'_, Result<GuestInfo, CallError>> {
                unused()
            }
            fn find_by_name(
                &self,
                _n: String,
            ) -> BoxFuture<'_, Result<Option<GuestInfo>, CallError>> {
                unused()
            }
            fn egress(&self, _i: String) -> BoxFuture<'_, Result<Option<Vec<String>>, CallError>> {
                unused()
            }
            fn upload(
                &self,
                _i: String,
                _p: String,
                _d: Bytes,
            ) -> BoxFuture<'_, Result<(), CallError>> {
                unused()
            }
            fn exec_stream(
                &self,
                _i: String,
                _r: ExecRequest,
            ) -> BoxFuture<'_, Result<ExecStream, CallError>> {
                unused()
            }
            fn destroy(&self, _i: String) -> BoxFuture<'_, Result<(), CallError>> {
                unused()
            }
        }
        let err = sweep(&NoList, false, &quick()).await.unwrap_err();
        assert_eq!(err.failure, CallFailure::Config);
        assert!(err.message.contains("cannot list"));
    }
}
