//! Guaranteed destroy: a registry of every guest this process may own, a guard per guest, and
//! background retries.
//!
//! A [`GuestGuard`] is registered *before* create, by name, so a guest whose create response
//! never arrived can still be found. When the guard is dropped without [`GuestGuard::destroy`]
//! having succeeded (an error, a timeout, a cancelled future, a panic), the guest is handed to
//! a background task that destroys it with retries. [`Reaper::shutdown`] destroys everything
//! still registered, including guests of runs still in flight and guests whose create is still
//! in flight (found by name once it lands), within a bounded time.
//!
//! One guest, one DELETE: whoever destroys a guest (its run, the background task, shutdown)
//! first *claims* its entry; the others wait for that destroy to finish (bounded) instead of
//! sending their own.
//!
//! A `Reaper` holds no runtime handle: background work is spawned on whatever tokio runtime is
//! current when a guard is dropped, and anything that could not be spawned waits for
//! `shutdown`. A child process after `fork()` builds its own `Reaper`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::LOG_TARGET;
use crate::admission::GuestSlot;
use crate::control::{CallError, ControlPlane};
use crate::error::Redactor;
use crate::observe::{DestroyReason, Tracked};
use crate::provider::Provider;
use crate::provider::createos::CreateOs;
use crate::retry::{Backoff, clipped};

/// How hard the reaper tries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReaperConfig {
    /// Backoff between background destroy attempts.
    pub backoff: Backoff,
    /// How long after a create's response was lost the reaper keeps looking the guest up by
    /// name. A slow create can land well after its client gave up, so this is longer than a
    /// control call's timeout; lookups are spaced out (doubling up to [`LOOKUP_POLL_MAX`]).
    pub lookup_patience: Duration,
}

/// Longest pause between two name lookups of a guest whose create response was lost.
pub const LOOKUP_POLL_MAX: Duration = Duration::from_secs(10);
/// First pause between two name lookups.
const LOOKUP_POLL_MIN: Duration = Duration::from_millis(200);
/// How often a caller waiting for another party's destroy looks again.
const CLAIM_POLL: Duration = Duration::from_millis(20);

impl Default for ReaperConfig {
    fn default() -> Self {
        Self {
            backoff: Backoff {
                base: Duration::from_millis(250),
                max: Duration::from_secs(10),
                budget: Duration::from_secs(300),
            },
            lookup_patience: Duration::from_secs(60),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    /// Create was sent but its response not seen: find by name.
    Name(String),
    /// Known id.
    Id { id: String, name: String },
}

impl Target {
    fn name(&self) -> &str {
        match self {
            Target::Name(n) | Target::Id { name: n, .. } => n,
        }
    }
}

struct Entry {
    provider: Arc<dyn Provider>,
    target: Target,
    redactor: Redactor,
    /// When the owning run let go of it (`None` while the run still owns it).
    abandoned_at: Option<Instant>,
    /// A destroy of this guest is in flight; everyone else waits for it.
    busy: bool,
    /// The guest's place under the process's cap, given back when the entry goes (the guest is
    /// gone, or was never created).
    slot: Option<GuestSlot>,
    /// The created guest's usage account: dropped with the entry, it reports the guest
    /// destroyed (once, whoever destroyed it).
    tracked: Option<Tracked>,
}

struct Inner {
    entries: Mutex<HashMap<u64, Entry>>,
    next: AtomicU64,
    closed: AtomicBool,
    config: ReaperConfig,
    destroyed: AtomicU64,
    failures: AtomicU64,
}

/// The process's registry of guests that must be destroyed. Cheap to clone (shared state).
#[derive(Clone)]
pub struct Reaper {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Reaper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reaper")
            .field("registered", &self.registered())
            .field("closed", &self.inner.closed.load(Ordering::SeqCst))
            .finish()
    }
}

impl Default for Reaper {
    fn default() -> Self {
        Self::new(ReaperConfig::default())
    }
}

/// What [`Reaper::shutdown`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Guests destroyed (or found already gone).
    pub destroyed: usize,
    /// Guests that could not be destroyed in time (auto-pause remains their backstop).
    pub failed: usize,
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The outcome of trying to take the right to destroy one guest.
enum Claim {
    /// Nothing registered under the slot any more: the guest is gone.
    Gone,
    /// Someone else is destroying it right now.
    Busy,
    /// Ours to destroy until the token is dropped.
    Got(Held),
}

/// The right to destroy one guest. Dropping it (also when the task holding it is cancelled,
/// e.g. with its runtime) lets others take over.
struct Held {
    reaper: Reaper,
    slot: u64,
    provider: Arc<dyn Provider>,
    redactor: Redactor,
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(e) = self.reaper.lock().get_mut(&self.slot) {
            e.busy = false;
        }
    }
}

/// Sleeps for `d`, but never past `until`.
async fn sleep_within(d: Duration, until: Instant) {
    tokio::time::sleep_until((Instant::now() + d).min(until)).await;
}

impl Reaper {
    /// An empty registry.
    pub fn new(config: ReaperConfig) -> Self {
        Self {
            inner: Arc::new(Inner {
                entries: Mutex::new(HashMap::new()),
                next: AtomicU64::new(1),
                closed: AtomicBool::new(false),
                config,
                destroyed: AtomicU64::new(0),
                failures: AtomicU64::new(0),
            }),
        }
    }

    /// Guests currently registered (live runs plus pending destroys).
    pub fn registered(&self) -> usize {
        self.lock().len()
    }

    /// Guests destroyed by the reaper (background or shutdown) so far.
    pub fn destroyed_count(&self) -> u64 {
        self.inner.destroyed.load(Ordering::SeqCst)
    }

    /// Destroy attempts that failed so far.
    pub fn failure_count(&self) -> u64 {
        self.inner.failures.load(Ordering::SeqCst)
    }

    /// True after [`Reaper::shutdown`] began: new guests are refused, and a run must not
    /// dispatch its program any more.
    pub fn is_closed(&self) -> bool {
        self.inner.closed.load(Ordering::SeqCst)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Entry>> {
        // A panic while holding this lock cannot leave the map inconsistent.
        self.inner
            .entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Registers a guest about to be created under `name` on CreateOS's control plane `cp`
    /// (wrapped in [`CreateOs`]). Returns `None` after shutdown. See [`Reaper::register_with`]
    /// for any provider.
    pub fn register(
        &self,
        cp: Arc<dyn ControlPlane>,
        name: &str,
        redactor: Redactor,
    ) -> Option<GuestGuard> {
        self.register_with(Arc::new(CreateOs::new(cp)), name, redactor)
    }

    /// Registers a guest about to be created under `name` by `provider`, which finds it by
    /// that name ([`Provider::find`]) when its create response is lost, and destroys it.
    /// Returns `None` after shutdown.
    pub fn register_with(
        &self,
        provider: Arc<dyn Provider>,
        name: &str,
        redactor: Redactor,
    ) -> Option<GuestGuard> {
        if self.is_closed() {
            return None;
        }
        let slot = self.inner.next.fetch_add(1, Ordering::SeqCst);
        self.lock().insert(
            slot,
            Entry {
                provider,
                target: Target::Name(name.to_owned()),
                redactor,
                abandoned_at: None,
                busy: false,
                slot: None,
                tracked: None,
            },
        );
        // A shutdown that began between the check and the insert may have missed this slot:
        // refuse, so no guest is created behind its back.
        if self.is_closed() {
            self.forget(slot);
            return None;
        }
        Some(GuestGuard {
            reaper: self.clone(),
            slot,
            name: name.to_owned(),
            id: None,
            armed: true,
        })
    }

    fn set_id(&self, slot: u64, id: &str) {
        if let Some(e) = self.lock().get_mut(&slot) {
            e.target = Target::Id {
                id: id.to_owned(),
                name: e.target.name().to_owned(),
            };
        }
    }

    fn forget(&self, slot: u64) {
        // The entry (and the admission slot it holds) is dropped after the lock is released:
        // giving the slot back may wake a waiting run.
        let gone = self.lock().remove(&slot);
        drop(gone);
    }

    fn claim(&self, slot: u64) -> Claim {
        let mut map = self.lock();
        match map.get_mut(&slot) {
            None => Claim::Gone,
            Some(e) if e.busy => Claim::Busy,
            Some(e) => {
                e.busy = true;
                Claim::Got(Held {
                    reaper: self.clone(),
                    slot,
                    provider: e.provider.clone(),
                    redactor: e.redactor.clone(),
                })
            }
        }
    }

    /// The guest of `slot` is gone: forget it and count it.
    fn destroyed(&self, slot: u64, name: &str, took: Duration, how: &'static str) {
        self.forget(slot);
        self.inner.destroyed.fetch_add(1, Ordering::SeqCst);
        tracing::info!(
            target: LOG_TARGET,
            guest = name,
            destroy_ms = ms(took),
            "{how}"
        );
    }

    fn abandon(&self, slot: u64) {
        let spawn = {
            let mut map = self.lock();
            match map.get_mut(&slot) {
                Some(e) => {
                    e.abandoned_at = Some(Instant::now());
                    true
                }
                None => false,
            }
        };
        if !spawn {
            return;
        }
        // Spawned even after shutdown began: shutdown may already have given up on this guest
        // (its create answered late), and claims keep the two from destroying it twice.
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let me = self.clone();
            handle.spawn(async move { me.reap_in_background(slot).await });
        } else {
            tracing::warn!(
                target: LOG_TARGET,
                "no async runtime to destroy an abandoned guest now; it will be destroyed at shutdown"
            );
        }
    }

    /// Destroys the guest of a claimed `slot` once: by id, or by finding its name first.
    ///
    /// A name that is not (yet) listed is looked up again, with growing pauses, until `until`
    /// or, for a create whose response was lost, until the lookup patience after it was
    /// abandoned. The target is read again before each lookup, so an id that arrives
    /// meanwhile (the create answered late) is used at once. Every call is clipped to
    /// `until`, whatever the control plane's request timeout. `Ok` when the guest is gone or,
    /// as far as the lookups can tell, was never created.
    async fn destroy_slot(
        &self,
        slot: u64,
        provider: &Arc<dyn Provider>,
        until: Instant,
    ) -> Result<(), CallError> {
        let mut poll = LOOKUP_POLL_MIN;
        loop {
            let current = {
                let map = self.lock();
                map.get(&slot).map(|e| (e.target.clone(), e.abandoned_at))
            };
            let Some((target, abandoned_at)) = current else {
                return Ok(());
            };
            let name = match target {
                Target::Id { id, .. } => {
                    return clipped(until, "destroy", provider.destroy(id)).await;
                }
                Target::Name(name) => name,
            };
            match clipped(until, "lookup by name", provider.find(name.clone())).await? {
                Some(g) if g.is_terminal() => return Ok(()),
                Some(g) => {
                    self.set_id(slot, &g.id);
                    return clipped(until, "destroy", provider.destroy(g.id)).await;
                }
                None => {
                    let give_up = abandoned_at.map_or(until, |t| {
                        (t + self.inner.config.lookup_patience).min(until)
                    });
                    if Instant::now() + poll >= give_up {
                        tracing::debug!(
                            target: LOG_TARGET,
                            guest = %name,
                            "no guest under this name; its create never landed"
                        );
                        return Ok(());
                    }
                    sleep_within(poll, give_up).await;
                    poll = (poll * 2).min(LOOKUP_POLL_MAX);
                }
            }
        }
    }

    async fn reap_in_background(self, slot: u64) {
        let started = Instant::now();
        let cfg = self.inner.config;
        let until = started + cfg.backoff.budget;
        let mut attempt = 0u32;
        loop {
            let held = match self.claim(slot) {
                Claim::Gone => return,
                Claim::Busy => {
                    if Instant::now() >= until {
                        return;
                    }
                    sleep_within(CLAIM_POLL, until).await;
                    continue;
                }
                Claim::Got(held) => held,
            };
            let name = self.name_of(slot);
            let t0 = Instant::now();
            match self.destroy_slot(slot, &held.provider, until).await {
                Ok(()) => {
                    self.destroyed(slot, &name, t0.elapsed(), "guest destroyed");
                    return;
                }
                Err(e) => {
                    let msg = held.redactor.apply(&e.message);
                    drop(held);
                    self.inner.failures.fetch_add(1, Ordering::SeqCst);
                    let delay = cfg.backoff.delay_after(attempt, e.retry_after);
                    attempt += 1;
                    if Instant::now() + delay > until {
                        tracing::error!(
                            target: LOG_TARGET,
                            guest = %name,
                            attempts = attempt,
                            error = %msg,
                            "could not destroy guest; it stays registered for shutdown, and \
                             auto-pause bounds its cost"
                        );
                        return;
                    }
                    tracing::warn!(
                        target: LOG_TARGET,
                        guest = %name,
                        attempt,
                        error = %msg,
                        "guest destroy failed; retrying"
                    );
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }

    fn name_of(&self, slot: u64) -> String {
        self.lock()
            .get(&slot)
            .map(|e| e.target.name().to_owned())
            .unwrap_or_default()
    }

    /// Destroys every registered guest (running, abandoned, or still being created),
    /// concurrently, within `timeout`, and refuses new registrations. A destroy already in
    /// flight elsewhere is waited for, not repeated. Idempotent.
    pub async fn shutdown(&self, timeout: Duration) -> ShutdownReport {
        self.inner.closed.store(true, Ordering::SeqCst);
        let slots: Vec<u64> = {
            let mut map = self.lock();
            for e in map.values_mut() {
                if let Some(t) = &mut e.tracked {
                    t.reason(DestroyReason::Shutdown);
                }
            }
            map.keys().copied().collect()
        };
        if slots.is_empty() {
            return ShutdownReport::default();
        }
        let deadline = Instant::now() + timeout;
        let results =
            futures::future::join_all(slots.into_iter().map(|slot| self.settle(slot, deadline)))
                .await;
        let destroyed = results.iter().filter(|ok| **ok).count();
        ShutdownReport {
            destroyed,
            failed: results.len() - destroyed,
        }
    }

    /// Shutdown's part for one guest: destroy it, or wait for whoever is destroying it.
    /// True when it is gone by `deadline`.
    async fn settle(&self, slot: u64, deadline: Instant) -> bool {
        let mut attempt = 0u32;
        loop {
            let held = match self.claim(slot) {
                Claim::Gone => return true,
                Claim::Busy => {
                    if Instant::now() >= deadline {
                        tracing::error!(
                            target: LOG_TARGET,
                            guest = %self.name_of(slot),
                            "a destroy of this guest was still in flight at the shutdown \
                             deadline; auto-pause bounds its cost"
                        );
                        return false;
                    }
                    sleep_within(CLAIM_POLL, deadline).await;
                    continue;
                }
                Claim::Got(held) => held,
            };
            let name = self.name_of(slot);
            let t0 = Instant::now();
            let res = tokio::time::timeout_at(
                deadline,
                self.destroy_slot(slot, &held.provider, deadline),
            )
            .await;
            match res {
                Ok(Ok(())) => {
                    self.destroyed(slot, &name, t0.elapsed(), "guest destroyed at shutdown");
                    return true;
                }
                Ok(Err(e)) => {
                    let redactor = held.redactor.clone();
                    drop(held);
                    self.inner.failures.fetch_add(1, Ordering::SeqCst);
                    let delay = Duration::from_millis(100 << attempt.min(4))
                        .max(e.retry_after.unwrap_or_default());
                    attempt += 1;
                    if Instant::now() + delay >= deadline {
                        tracing::error!(
                            target: LOG_TARGET,
                            guest = %name,
                            error = %redactor.apply(&e.message),
                            "could not destroy guest at shutdown; auto-pause bounds its cost"
                        );
                        return false;
                    }
                    tokio::time::sleep(delay).await;
                }
                Err(_) => {
                    drop(held);
                    tracing::error!(
                        target: LOG_TARGET,
                        guest = %name,
                        "guest destroy did not finish before the shutdown deadline; \
                         auto-pause bounds its cost"
                    );
                    return false;
                }
            }
        }
    }
}

/// Ownership of one guest by one run. Dropping it without a successful
/// [`GuestGuard::destroy`] hands the guest to the reaper.
pub struct GuestGuard {
    reaper: Reaper,
    slot: u64,
    name: String,
    id: Option<String>,
    armed: bool,
}

impl std::fmt::Debug for GuestGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuestGuard")
            .field("name", &self.name)
            .field("id", &self.id)
            .field("armed", &self.armed)
            .finish_non_exhaustive()
    }
}

impl GuestGuard {
    /// The guest's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The guest's id, once create answered.
    pub fn id(&self) -> Option<&str> {
        self.id.as_deref()
    }

    /// Hands the guest's admission slot to its registration: it is given back once the guest
    /// is gone, whoever destroys it.
    pub fn hold_slot(&mut self, slot: GuestSlot) {
        if let Some(e) = self.reaper.lock().get_mut(&self.slot) {
            e.slot = Some(slot);
        }
    }

    /// Hands the created guest's usage account to its registration (see
    /// [`crate::observe::Tracked`]).
    pub fn track(&mut self, tracked: Tracked) {
        if let Some(e) = self.reaper.lock().get_mut(&self.slot) {
            e.tracked = Some(tracked);
        }
    }

    /// Updates the guest's usage account, if it has one.
    pub fn note(&self, f: impl FnOnce(&mut Tracked)) {
        if let Some(t) = self
            .reaper
            .lock()
            .get_mut(&self.slot)
            .and_then(|e| e.tracked.as_mut())
        {
            f(t);
        }
    }

    /// Takes the admission slot back (a create that was certainly not taken on reuses it).
    pub fn take_slot(&mut self) -> Option<GuestSlot> {
        self.reaper
            .lock()
            .get_mut(&self.slot)
            .and_then(|e| e.slot.take())
    }

    /// Records the id create returned.
    pub fn set_id(&mut self, id: &str) {
        self.id = Some(id.to_owned());
        self.reaper.set_id(self.slot, id);
    }

    /// The control plane definitely did not create the guest (it rejected the request):
    /// nothing to destroy.
    pub fn disarm_not_created(mut self) {
        self.armed = false;
        self.reaper.forget(self.slot);
    }

    /// Destroys the guest now, with retries inside `backoff.budget`; if a destroy of it is
    /// already in flight (shutdown), waits for that one instead of sending another. On
    /// failure the guard is dropped, which hands the guest to the background reaper.
    pub async fn destroy(mut self, backoff: &Backoff) -> Result<Duration, CallError> {
        let t0 = Instant::now();
        let until = t0 + backoff.budget;
        let mut attempt = 0u32;
        loop {
            let held = match self.reaper.claim(self.slot) {
                Claim::Gone => {
                    // Destroyed by someone else (shutdown).
                    self.armed = false;
                    return Ok(t0.elapsed());
                }
                Claim::Busy if Instant::now() < until => {
                    sleep_within(CLAIM_POLL, until).await;
                    continue;
                }
                Claim::Busy => {
                    return Err(CallError::new(
                        crate::control::CallFailure::Timeout,
                        format!(
                            "a destroy of guest {} started elsewhere did not finish in time",
                            self.name
                        ),
                    ));
                }
                Claim::Got(held) => held,
            };
            match self
                .reaper
                .destroy_slot(self.slot, &held.provider, until)
                .await
            {
                Ok(()) => {
                    self.armed = false;
                    self.reaper.forget(self.slot);
                    return Ok(t0.elapsed());
                }
                Err(e) => {
                    drop(held);
                    let delay = backoff.delay_after(attempt, e.retry_after);
                    attempt += 1;
                    if !e.is_transient() || Instant::now() + delay >= until {
                        return Err(e);
                    }
                    tracing::info!(
                        target: LOG_TARGET,
                        guest = %self.name,
                        attempt,
                        error = %e,
                        "retrying destroy"
                    );
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }

    /// Hands the guest to the background reaper now (destroy off the critical path).
    pub fn release_to_reaper(self) {
        drop(self);
    }
}

impl Drop for GuestGuard {
    fn drop(&mut self) {
        if self.armed {
            self.reaper.abandon(self.slot);
        }
    }
}
