//! A warm pool of one-shot guests: up to N guests created, egress-verified and idle for the
//! policy the caller will next ask for, so a run that matches skips create and the read-back.
//!
//! The rules:
//!
//! - **One policy at a time.** The pool warms for the policy runs ask for ([`PoolKey`]:
//!   account, shape, rootfs, egress, auto-pause backstop, and the declared environment, keys
//!   *and* values). A run whose policy differs is a miss: it creates its guest as without a
//!   pool. Once [`SWITCH_AFTER`] runs in a row asked for the same other policy, the pool
//!   switches to it and destroys the guests it held (so runs alternating between two policies
//!   do not throw the pool away at every run).
//!   Values count, not only keys, so a pooled guest never relies on an exec overriding a value
//!   declared at create (the contract leaves that unverified, `createos-api.md` §4.4).
//! - **One-shot guests.** Pool guests are created by [`Guest::create`] under the caller's
//!   one-shot prefix (`lf-`), registered with the [`crate::reaper::Reaper`] before their create
//!   is sent: a run that takes one destroys it afterwards like any other, shutdown destroys
//!   the rest, and the orphan sweep covers them if the process dies.
//! - **Verified before pooled.** A guest enters the pool only after its egress read-back
//!   matched; one that fails it is destroyed at once, never handed out.
//! - **Never handed out paused.** A guest idle for longer than its auto-pause backstop minus
//!   [`IDLE_MARGIN`] is retired (destroyed and replaced), never resumed. Idle counts from its
//!   last accepted call ([`Guest::last_accepted`]: its create, or the warmer's last exec),
//!   which is when the control plane's clock restarted, not from when it was pooled; a guest
//!   whose preparation outlasted the whole limit is destroyed, never pooled. A guest the control
//!   plane paused anyway is caught by the run's first call to it (409); the run then destroys
//!   it and uses a fresh guest (see [`crate::surface::Surface::acquire`]).
//! - **Off the critical path, bounded.** Refills run in one background task per pool on the
//!   current tokio runtime. Each create is tried once; after a failure the next attempt waits
//!   for the [`PoolConfig::backoff`] schedule and probes with a single create until one
//!   succeeds, so a failing control plane sees no retry storm. A refill failure never fails
//!   a run: a run that finds the pool empty creates its own guest.
//!
//! A pool holds no runtime handle and no global state: a forked child builds its own with its
//! own backend.

use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use futures::future::BoxFuture;
use sha2::{Digest, Sha256};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::LOG_TARGET;
use crate::admission::{Admission, Reclaim};
use crate::control::ControlPlane;
use crate::egress::EgressPolicy;
use crate::guest::{Guest, GuestContext, GuestSpec};
use crate::observe::DestroyReason;
use crate::provider::Provider;
use crate::retry::Backoff;

pub use crate::settings::MAX_WARM_POOL;
/// How many runs in a row must ask for another policy before the pool switches to it.
pub const SWITCH_AFTER: u32 = 2;
/// How long before its auto-pause backstop a pooled guest is retired.
pub const IDLE_MARGIN: Duration = Duration::from_secs(30);

/// What a pooled guest must match to be handed to a run. `Debug` shows the environment's
/// keys, never its values.
#[derive(Clone, PartialEq, Eq)]
pub struct PoolKey {
    /// Identity of the account's provider (one per account per session).
    account: usize,
    shape: String,
    rootfs: String,
    egress: EgressPolicy,
    env_keys: BTreeSet<String>,
    env_digest: [u8; 32],
    auto_pause_after_seconds: u32,
    prefix: String,
}

impl std::fmt::Debug for PoolKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolKey")
            .field("shape", &self.shape)
            .field("rootfs", &self.rootfs)
            .field("egress", &self.egress.fingerprint())
            .field("env_keys", &self.env_keys)
            .field("auto_pause_after_seconds", &self.auto_pause_after_seconds)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl PoolKey {
    /// The key of a guest created through CreateOS's control plane `cp` with `spec` under
    /// `prefix` (keyed by `cp`'s identity). See [`PoolKey::for_provider`] for any provider.
    pub fn new(cp: &Arc<dyn ControlPlane>, spec: &GuestSpec, prefix: &str) -> Self {
        Self::keyed(Arc::as_ptr(cp).cast::<()>() as usize, spec, prefix)
    }

    /// The key of a guest created through `provider` with `spec` under `prefix` (keyed by
    /// [`Provider::identity`]: the same as [`PoolKey::new`] of the control plane a
    /// [`crate::provider::createos::CreateOs`] wraps).
    pub fn for_provider(provider: &Arc<dyn Provider>, spec: &GuestSpec, prefix: &str) -> Self {
        Self::keyed(provider.identity(), spec, prefix)
    }

    fn keyed(account: usize, spec: &GuestSpec, prefix: &str) -> Self {
        let mut digest = Sha256::new();
        for (k, v) in &spec.envs {
            // Length-prefixed, so no two maps share a digest by concatenation.
            digest.update((k.len() as u64).to_le_bytes());
            digest.update(k.as_bytes());
            digest.update((v.len() as u64).to_le_bytes());
            digest.update(v.as_bytes());
        }
        Self {
            account,
            shape: spec.shape.clone(),
            rootfs: spec.rootfs.clone(),
            egress: spec.egress.clone(),
            env_keys: spec.envs.keys().cloned().collect(),
            env_digest: digest.finalize().into(),
            auto_pause_after_seconds: spec.auto_pause_after_seconds,
            prefix: prefix.to_owned(),
        }
    }
}

/// Extra preparation run on each pool guest after its egress read-back and before it is
/// pooled (the executor starts its preloaded runner there). `Err` is the reason, logged; the
/// guest is then destroyed, never pooled, and the failure counts as a refill failure (so a
/// warmer that always fails backs off like a failing create).
pub type Warmer =
    Arc<dyn for<'a> Fn(&'a Guest) -> BoxFuture<'a, Result<(), String>> + Send + Sync + 'static>;

/// How a pool refills and retires its guests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolConfig {
    /// The pause between refill attempts after a failure (`base` doubling up to `max`);
    /// `budget` bounds one guest's create and egress read-back together.
    pub backoff: Backoff,
    /// The longest a guest stays in the pool; `None` means its auto-pause backstop minus
    /// [`IDLE_MARGIN`].
    pub max_idle: Option<Duration>,
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            backoff: Backoff {
                base: Duration::from_millis(500),
                max: Duration::from_secs(30),
                budget: Duration::from_secs(30),
            },
            max_idle: None,
        }
    }
}

/// A pool's counters, for the run log line and `doctor`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// The configured size (0 = off).
    pub size: usize,
    /// Guests ready to be handed out.
    pub ready: usize,
    /// Guests being created or verified for the pool.
    pub filling: usize,
    /// Runs that took a pooled guest.
    pub hits: u64,
    /// Runs, with the pool on, that found no matching guest.
    pub misses: u64,
    /// Pooled guests destroyed unused (policy change, idled out, failed read-back, shutdown).
    pub discarded: u64,
    /// Refill attempts that failed (create or read-back).
    pub refill_failures: u64,
    /// Refills held back because the process was at its cap on live guests or a run was
    /// waiting for a slot (`CREATEOS_MAX_LIVE_GUESTS`: a refill never takes a slot a run needs),
    /// and pooled guests given up to a waiting run.
    pub held_back: u64,
}

impl PoolStats {
    /// Guests the pool holds (ready or being prepared), none of them owned by a run.
    pub fn held(&self) -> usize {
        self.ready + self.filling
    }
}

struct Ready {
    guest: Guest,
    retire_at: Instant,
}

/// What the pool is warming for.
#[derive(Clone)]
struct Want {
    key: PoolKey,
    spec: GuestSpec,
    cx: GuestContext,
}

#[derive(Default)]
struct State {
    size: usize,
    want: Option<Want>,
    /// In retirement order (the one to retire first at the front).
    ready: VecDeque<Ready>,
    filling: usize,
    failures: u32,
    retry_at: Option<Instant>,
    task: bool,
    closed: bool,
    /// Bumped when the policy changes, so a refill for the old one is discarded.
    generation: u64,
    /// Another policy asked for by the last runs in a row, and how many times.
    pending: Option<(PoolKey, u32)>,
}

struct Shared {
    config: PoolConfig,
    warmer: Option<Warmer>,
    state: Mutex<State>,
    wake: Arc<Notify>,
    hits: AtomicU64,
    misses: AtomicU64,
    discarded: AtomicU64,
    refill_failures: AtomicU64,
    held_back: AtomicU64,
    /// The process's admission control, once attached: every pooled guest holds a slot.
    admission: Mutex<Option<(Admission, Arc<Reclaim>)>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Let the refill task see that the pool is gone (its guests are released with it).
        self.wake.notify_one();
    }
}

/// A warm pool of one-shot guests (see the module docs). Cheap to clone (shared state);
/// starts empty and off (size 0).
#[derive(Clone)]
pub struct WarmPool {
    inner: Arc<Shared>,
}

impl std::fmt::Debug for WarmPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WarmPool")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl Default for WarmPool {
    fn default() -> Self {
        Self::new(PoolConfig::default())
    }
}

impl WarmPool {
    /// An empty pool of size 0 (off).
    pub fn new(config: PoolConfig) -> Self {
        Self::build(config, None)
    }

    /// An empty pool of size 0 (off) whose guests are prepared by `warmer` before they are
    /// pooled.
    pub fn with_warmer(config: PoolConfig, warmer: Warmer) -> Self {
        Self::build(config, Some(warmer))
    }

    fn build(config: PoolConfig, warmer: Option<Warmer>) -> Self {
        Self {
            inner: Arc::new(Shared {
                config,
                warmer,
                state: Mutex::new(State::default()),
                wake: Arc::new(Notify::new()),
                hits: AtomicU64::new(0),
                misses: AtomicU64::new(0),
                discarded: AtomicU64::new(0),
                refill_failures: AtomicU64::new(0),
                held_back: AtomicU64::new(0),
                admission: Mutex::new(None),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.inner)
    }

    /// The pool's counters.
    pub fn stats(&self) -> PoolStats {
        let st = self.lock();
        PoolStats {
            size: st.size,
            ready: st.ready.len(),
            filling: st.filling,
            hits: self.inner.hits.load(Ordering::Relaxed),
            misses: self.inner.misses.load(Ordering::Relaxed),
            discarded: self.inner.discarded.load(Ordering::Relaxed),
            refill_failures: self.inner.refill_failures.load(Ordering::Relaxed),
            held_back: self.inner.held_back.load(Ordering::Relaxed),
        }
    }

    /// Puts the pool under `admission` (the process's caps on live guests): each refill first
    /// takes a guest slot, only when one is free and no run waits for one, and the pooled guest
    /// holds it (a run that takes the guest takes the slot with it); a run that has to wait for
    /// a slot makes the pool give up its oldest idle guest. Once; later calls are ignored.
    pub fn attach(&self, admission: &Admission) {
        let mut held = self
            .inner
            .admission
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if held.is_some() {
            return;
        }
        let weak = Arc::downgrade(&self.inner);
        let reclaim: Arc<Reclaim> = Arc::new(move || {
            weak.upgrade()
                .is_some_and(|inner| WarmPool { inner }.give_up_one())
        });
        admission.reclaim_with(&reclaim);
        *held = Some((admission.clone(), reclaim));
    }

    fn admission(&self) -> Option<Admission> {
        self.inner
            .admission
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(|(a, _)| a.clone())
    }

    /// Gives up the oldest ready guest (destroyed by the reaper, its slot given back once it is
    /// gone) for a run waiting for a slot; false when none is ready.
    fn give_up_one(&self) -> bool {
        let Some(r) = self.lock().ready.pop_front() else {
            return false;
        };
        self.inner.held_back.fetch_add(1, Ordering::Relaxed);
        self.discard([r]);
        true
    }

    /// True after [`WarmPool::close`].
    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// Sets the pool's size (capped at [`MAX_WARM_POOL`]). A smaller size destroys the
    /// guests beyond it; 0 destroys them all and stops refilling.
    pub fn set_size(&self, size: usize) {
        let size = size.min(MAX_WARM_POOL);
        let extra = {
            let mut st = self.lock();
            if st.size == size || st.closed {
                return;
            }
            st.size = size;
            let keep = st.ready.len().min(size);
            // Keep the oldest (they retire first and are replaced anyway).
            st.ready.split_off(keep)
        };
        self.discard(extra);
        self.kick();
    }

    /// Takes a ready guest matching `spec`, `prefix` and `cx`'s control plane, or `None` (a
    /// miss, or the pool is off). The guest's calls go through `cx` from now on. With the
    /// pool on, the pool warms for this policy from now on, and a refill starts in the
    /// background; it never waits for anything.
    pub fn take(&self, cx: &GuestContext, spec: &GuestSpec, prefix: &str) -> Option<Guest> {
        let key = PoolKey::for_provider(&cx.provider, spec, prefix);
        let now = Instant::now();
        let mut drop_these = Vec::new();
        let got = {
            let mut st = self.lock();
            if st.size == 0 || st.closed {
                return None;
            }
            let matches = st.want.as_ref().is_some_and(|w| w.key == key);
            let switch = !matches && {
                // Switch only for a policy asked for SWITCH_AFTER times in a row (at once when
                // the pool warms for nothing yet): runs alternating between two policies must
                // not destroy the pool at every run.
                let seen = match st.pending.take() {
                    Some((k, n)) if k == key => n + 1,
                    _ => 1,
                };
                st.pending = Some((key.clone(), seen));
                st.want.is_none() || seen >= SWITCH_AFTER
            };
            if matches {
                st.pending = None;
            }
            if !matches && !switch {
                None
            } else if switch {
                st.pending = None;
                if let Some(old) = &st.want {
                    tracing::info!(
                        target: LOG_TARGET,
                        from = ?old.key,
                        to = ?key,
                        "warm pool: a run asked for another policy; the pool now warms for it"
                    );
                }
                drop_these.extend(st.ready.drain(..));
                st.generation += 1;
                // The refill backoff is kept: failures are the control plane's, not the
                // policy's, so a policy change never restarts a storm.
                st.want = Some(Want {
                    key,
                    spec: spec.clone(),
                    // The pool's own request count, not the run's.
                    // Its guests are counted where the run's are (no admission ticket: a
                    // refill only tries for a slot).
                    cx: {
                        let own = GuestContext::with_provider(
                            cx.provider.clone(),
                            cx.reaper.clone(),
                            cx.redactor.clone(),
                            cx.backoff,
                        );
                        match cx.observation() {
                            Some((obs, surface)) => own.with_observation(obs.clone(), *surface),
                            None => own,
                        }
                    },
                });
                None
            } else {
                let mut got = None;
                while let Some(r) = st.ready.pop_front() {
                    if r.retire_at <= now {
                        drop_these.push(r);
                    } else {
                        got = Some(r.guest);
                        break;
                    }
                }
                got
            }
        };
        let counter = if got.is_some() {
            &self.inner.hits
        } else {
            &self.inner.misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
        self.discard(drop_these);
        self.kick();
        got.map(|mut g| {
            g.rebind(cx.clone());
            g
        })
    }

    /// Counts a taken guest that turned out unusable (the caller destroys it).
    pub fn note_unusable(&self) {
        self.inner.discarded.fetch_add(1, Ordering::Relaxed);
    }

    /// Stops refilling and hands every ready guest to the reaper, which destroys them (a
    /// [`crate::reaper::Reaper::shutdown`] afterwards waits for that). Guests still being
    /// created are registered with the reaper and destroyed when they land. Idempotent.
    pub fn close(&self) {
        let all: Vec<Ready> = {
            let mut st = self.lock();
            st.closed = true;
            st.want = None;
            st.ready.drain(..).collect()
        };
        for r in &all {
            r.guest.set_destroy_reason(DestroyReason::Shutdown);
        }
        self.discard(all);
        self.inner.wake.notify_one();
    }

    fn discard(&self, guests: impl IntoIterator<Item = Ready>) {
        for r in guests {
            self.inner.discarded.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(target: LOG_TARGET, guest = r.guest.name(), "warm pool: guest retired");
            // A one-shot guest let go is destroyed by the reaper in the background.
            r.guest.set_destroy_reason(DestroyReason::PoolRetire);
            r.guest.release();
        }
    }

    /// Makes sure the refill task runs (or wakes it).
    fn kick(&self) {
        let spawn = {
            let mut st = self.lock();
            if st.task || st.closed || st.size == 0 || st.want.is_none() {
                false
            } else {
                st.task = true;
                true
            }
        };
        if !spawn {
            self.inner.wake.notify_one();
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            self.lock().task = false;
            tracing::debug!(target: LOG_TARGET, "no async runtime: the warm pool is not refilled");
            return;
        };
        let weak = Arc::downgrade(&self.inner);
        let wake = Arc::clone(&self.inner.wake);
        rt.spawn(maintain(weak, wake));
    }
}

fn lock(shared: &Shared) -> MutexGuard<'_, State> {
    shared.state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What one pass of the refill task decided.
struct Pass {
    batch: usize,
    want: Option<Want>,
    generation: u64,
    retired: Vec<Ready>,
    wake_at: Option<Instant>,
}

/// The refill task: retires idled-out guests, creates what is missing (one probe at a time
/// after a failure, spaced by the backoff), and sleeps until the next retirement, retry or
/// wake-up. Holds the pool only weakly between passes, so dropping the pool ends it.
async fn maintain(weak: Weak<Shared>, wake: Arc<Notify>) {
    loop {
        let Some(shared) = weak.upgrade() else {
            return;
        };
        let pool = WarmPool { inner: shared };
        let pass = plan_pass(&pool);
        let Some(pass) = pass else {
            return;
        };
        pool.discard(pass.retired);
        if pass.batch > 0
            && let Some(want) = pass.want
        {
            refill(&pool, &want, pass.batch, pass.generation).await;
            continue;
        }
        drop(pool);
        match pass.wake_at {
            Some(at) => {
                tokio::select! {
                    () = wake.notified() => {}
                    () = tokio::time::sleep_until(at) => {}
                }
            }
            None => wake.notified().await,
        }
    }
}

/// Decides one pass under the lock; `None` ends the task.
fn plan_pass(pool: &WarmPool) -> Option<Pass> {
    let mut st = pool.lock();
    if st.closed || st.size == 0 || st.want.is_none() {
        st.task = false;
        return None;
    }
    let now = Instant::now();
    let mut retired = Vec::new();
    while st.ready.front().is_some_and(|r| r.retire_at <= now) {
        retired.extend(st.ready.pop_front());
    }
    let deficit = st.size.saturating_sub(st.ready.len() + st.filling);
    let may_try = st.retry_at.is_none_or(|t| now >= t);
    let batch = match (may_try, st.failures) {
        (false, _) => 0,
        (true, 0) => deficit,
        (true, _) => deficit.min(1),
    };
    st.filling += batch;
    let mut wake_at = st.ready.front().map(|r| r.retire_at);
    if deficit > batch
        && let Some(t) = st.retry_at
    {
        wake_at = Some(wake_at.map_or(t, |w| w.min(t)));
    }
    Some(Pass {
        batch,
        want: st.want.clone(),
        generation: st.generation,
        retired,
        wake_at,
    })
}

/// Creates and verifies `batch` guests for `want` concurrently, and pools the ones that
/// passed while the pool still wants them.
async fn refill(pool: &WarmPool, want: &Want, batch: usize, generation: u64) {
    let config = pool.inner.config;
    let warmer = pool.inner.warmer.as_ref();
    let admission = pool.admission();
    let results = futures::future::join_all(
        (0..batch).map(|_| prepare(want, config.backoff, warmer, admission.as_ref())),
    )
    .await;
    let max_idle = config.max_idle.unwrap_or_else(|| {
        Duration::from_secs(u64::from(want.spec.auto_pause_after_seconds))
            .saturating_sub(IDLE_MARGIN)
    });
    let mut unwanted = Vec::new();
    let mut failed = 0u32;
    let mut no_slot = 0u64;
    // The longest `Retry-After` the control plane asked for: the next attempt waits at least
    // that long (a declining server is not probed sooner than it said).
    let mut retry_after: Option<Duration> = None;
    {
        let mut st = pool.lock();
        st.filling = st.filling.saturating_sub(batch);
        for r in results {
            match r {
                Err(Refill::NoSlot) => no_slot += 1,
                Err(Refill::Failed(ra)) => {
                    failed += 1;
                    retry_after = retry_after.max(ra);
                }
                Ok(guest) => {
                    // The control plane's idle clock restarted at the guest's last accepted
                    // call (its create, or the warmer's last exec), not when the whole batch
                    // was ready: the retirement is measured from there.
                    let retire_at = guest.last_accepted() + max_idle;
                    let ready = Ready { guest, retire_at };
                    let needed = admission.as_ref().is_some_and(Admission::has_waiters);
                    if st.closed
                        || st.generation != generation
                        || st.ready.len() >= st.size
                        || needed
                    {
                        // (`needed`: a run waits for a slot; this guest's goes to it.)
                        unwanted.push(ready);
                    } else if retire_at <= Instant::now() {
                        // Its preparation outlasted its idle limit: the control plane may
                        // pause it any moment. Never pooled; counted as a failure so a
                        // preparation that is always this slow backs off.
                        tracing::warn!(
                            target: LOG_TARGET,
                            guest = ready.guest.name(),
                            max_idle_ms = crate::guest::ms(max_idle),
                            "warm pool: the guest was idle for its whole idle limit while it \
                             was prepared; destroyed, not used"
                        );
                        failed += 1;
                        unwanted.push(ready);
                    } else {
                        // Kept in retirement order, so the front always retires first.
                        let at = st.ready.partition_point(|r| r.retire_at <= retire_at);
                        st.ready.insert(at, ready);
                    }
                }
            }
        }
        if failed > 0 {
            let attempt = st.failures;
            st.failures = st.failures.saturating_add(1);
            st.retry_at = Some(Instant::now() + config.backoff.delay_after(attempt, retry_after));
        } else if no_slot > 0 {
            // At the cap: look again after the backoff's first step, without counting a
            // failure (the control plane did nothing wrong).
            st.retry_at = Some(Instant::now() + config.backoff.base);
        } else {
            st.failures = 0;
            st.retry_at = None;
        }
    }
    if no_slot > 0 {
        pool.inner.held_back.fetch_add(no_slot, Ordering::Relaxed);
    }
    if failed > 0 {
        pool.inner
            .refill_failures
            .fetch_add(u64::from(failed), Ordering::Relaxed);
    }
    pool.discard(unwanted);
}

/// Why one pool guest was not prepared.
enum Refill {
    /// No guest slot was free (or a run waited for one): nothing was sent.
    NoSlot,
    /// A failure (logged), with the server's `Retry-After` if the create was declined with one.
    Failed(Option<Duration>),
}

/// One pool guest: a guest slot when the pool is under admission control (only one that is free
/// with nobody waiting), a single create attempt, then the egress read-back, then the warmer. A
/// guest that fails the read-back or the warmer is destroyed here.
async fn prepare(
    want: &Want,
    backoff: Backoff,
    warmer: Option<&Warmer>,
    admission: Option<&Admission>,
) -> Result<Guest, Refill> {
    let cx = &want.cx;
    let slot = match admission {
        Some(a) => Some(a.try_guest_slot_deployed().await.ok_or(Refill::NoSlot)?),
        None => None,
    };
    // Exactly one create attempt (the pool's backoff spaces the next); it and the read-back
    // end within the backoff budget (the readiness wait has the provider's own budget, if
    // any, and the read-back a budget of its own after it).
    let deadline = Instant::now() + backoff.budget;
    let guest = match Guest::create_once(cx, &want.spec, &want.key.prefix, deadline, slot).await {
        Ok(g) => g,
        Err(e) => {
            tracing::warn!(
                target: LOG_TARGET,
                error = %e,
                "warm pool: create failed; runs create their own guests meanwhile"
            );
            return Err(Refill::Failed(e.retry_after()));
        }
    };
    match guest
        .verify_egress(&want.spec.egress, cx.after_ready(deadline))
        .await
    {
        Ok(()) => {}
        Err(e) => {
            tracing::warn!(
                target: LOG_TARGET,
                guest = guest.name(),
                error = %e,
                "warm pool: guest failed its egress read-back; destroyed, not used"
            );
            let _ = guest.destroy().await;
            return Err(Refill::Failed(None));
        }
    }
    let Some(warm) = warmer else {
        return Ok(guest);
    };
    match warm(&guest).await {
        Ok(()) => Ok(guest),
        Err(why) => {
            if cx.reaper.is_closed() {
                // Shutdown interrupted the preparation: expected, not a fault.
                tracing::debug!(target: LOG_TARGET, guest = guest.name(), "warm pool: preparation stopped by shutdown");
            } else {
                tracing::warn!(
                    target: LOG_TARGET,
                    guest = guest.name(),
                    "warm pool: guest could not be prepared ({why}); destroyed, not used"
                );
            }
            let _ = guest.destroy().await;
            Err(Refill::Failed(None))
        }
    }
}
