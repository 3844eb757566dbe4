//! Guaranteed destroy: a registry of every guest this process may own, a guard per guest, and
//! background retries.
//!
//! A [`GuestGuard`] is registered *before* create, by name, so a guest whose create response
//! never arrived can still be found. When the guard is dropped without [`GuestGuard::destroy`]
//! having succeeded (an error, a timeout, a cancelled future, a panic), the guest is handed to
//! a background task that destroys it with retries. [`Reaper::shutdown`] destroys everything
//! still registered, including guests of runs still in flight, within a bounded time.
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
use crate::control::{CallError, ControlPlane};
use crate::error::Redactor;
use crate::retry::Backoff;

/// How hard the reaper tries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReaperConfig {
    /// Backoff between background destroy attempts.
    pub backoff: Backoff,
    /// How long a name lookup keeps looking for a guest whose create may still land.
    pub lookup_patience: Duration,
}

impl Default for ReaperConfig {
    fn default() -> Self {
        Self {
            backoff: Backoff {
                base: Duration::from_millis(250),
                max: Duration::from_secs(10),
                budget: Duration::from_secs(300),
            },
            lookup_patience: Duration::from_secs(3),
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
    cp: Arc<dyn ControlPlane>,
    target: Target,
    redactor: Redactor,
    /// True once the owning run let go of it.
    abandoned: bool,
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

    /// True after [`Reaper::shutdown`]: new guests are refused.
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

    /// Registers a guest about to be created under `name`. Returns `None` after shutdown.
    pub fn register(
        &self,
        cp: Arc<dyn ControlPlane>,
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
                cp,
                target: Target::Name(name.to_owned()),
                redactor,
                abandoned: false,
            },
        );
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
        self.lock().remove(&slot);
    }

    fn abandon(&self, slot: u64) {
        let spawn = {
            let mut map = self.lock();
            match map.get_mut(&slot) {
                Some(e) => {
                    e.abandoned = true;
                    true
                }
                None => false,
            }
        };
        if !spawn || self.is_closed() {
            return;
        }
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

    /// Destroys one target once: by id, or by finding the name first. `Ok(true)` when it is
    /// gone (or was never created), `Ok(false)` never; errors are the last call's.
    async fn destroy_target(
        cp: &Arc<dyn ControlPlane>,
        target: &Target,
        patience: Duration,
    ) -> Result<(), CallError> {
        match target {
            Target::Id { id, .. } => cp.destroy(id.clone()).await,
            Target::Name(name) => {
                // A create that was cut off may still land: look a few times.
                let give_up = Instant::now() + patience;
                loop {
                    match cp.find_by_name(name.clone()).await? {
                        Some(g) if g.is_terminal() => return Ok(()),
                        Some(g) => return cp.destroy(g.id).await,
                        None if Instant::now() >= give_up => return Ok(()),
                        None => tokio::time::sleep(Duration::from_millis(200)).await,
                    }
                }
            }
        }
    }

    async fn reap_in_background(self, slot: u64) {
        let started = Instant::now();
        let cfg = self.inner.config;
        let mut attempt = 0u32;
        loop {
            if self.is_closed() {
                return; // shutdown owns it now
            }
            let snapshot = {
                let map = self.lock();
                map.get(&slot)
                    .map(|e| (e.cp.clone(), e.target.clone(), e.redactor.clone()))
            };
            let Some((cp, target, redactor)) = snapshot else {
                return;
            };
            let t0 = Instant::now();
            match Self::destroy_target(&cp, &target, cfg.lookup_patience).await {
                Ok(()) => {
                    self.forget(slot);
                    self.inner.destroyed.fetch_add(1, Ordering::SeqCst);
                    tracing::info!(
                        target: LOG_TARGET,
                        guest = target.name(),
                        destroy_ms = ms(t0.elapsed()),
                        attempts = attempt + 1,
                        "guest destroyed"
                    );
                    return;
                }
                Err(e) => {
                    self.inner.failures.fetch_add(1, Ordering::SeqCst);
                    let delay = cfg.backoff.delay(attempt);
                    attempt += 1;
                    let msg = redactor.apply(&e.message);
                    if started.elapsed() + delay > cfg.backoff.budget {
                        tracing::error!(
                            target: LOG_TARGET,
                            guest = target.name(),
                            attempts = attempt,
                            error = %msg,
                            "could not destroy guest; it stays registered for shutdown, and \
                             auto-pause bounds its cost"
                        );
                        return;
                    }
                    tracing::warn!(
                        target: LOG_TARGET,
                        guest = target.name(),
                        attempt,
                        error = %msg,
                        "guest destroy failed; retrying"
                    );
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }

    /// Destroys every registered guest (running or abandoned), concurrently, within `timeout`,
    /// and stops background retries. Idempotent; later registrations are refused.
    pub async fn shutdown(&self, timeout: Duration) -> ShutdownReport {
        self.inner.closed.store(true, Ordering::SeqCst);
        let entries: Vec<(u64, Arc<dyn ControlPlane>, Target, Redactor)> = self
            .lock()
            .iter()
            .map(|(k, e)| (*k, e.cp.clone(), e.target.clone(), e.redactor.clone()))
            .collect();
        if entries.is_empty() {
            return ShutdownReport::default();
        }
        let deadline = Instant::now() + timeout;
        let patience = self.inner.config.lookup_patience.min(timeout / 2);
        let jobs = entries.into_iter().map(|(slot, cp, target, redactor)| {
            let me = self.clone();
            async move {
                let mut attempt = 0u32;
                loop {
                    let t0 = Instant::now();
                    let res = tokio::time::timeout_at(
                        deadline,
                        Self::destroy_target(&cp, &target, patience),
                    )
                    .await;
                    match res {
                        Ok(Ok(())) => {
                            me.forget(slot);
                            me.inner.destroyed.fetch_add(1, Ordering::SeqCst);
                            tracing::info!(
                                target: LOG_TARGET,
                                guest = target.name(),
                                destroy_ms = ms(t0.elapsed()),
                                "guest destroyed at shutdown"
                            );
                            return true;
                        }
                        Ok(Err(e)) => {
                            me.inner.failures.fetch_add(1, Ordering::SeqCst);
                            let delay = Duration::from_millis(100 << attempt.min(4));
                            attempt += 1;
                            if Instant::now() + delay >= deadline {
                                tracing::error!(
                                    target: LOG_TARGET,
                                    guest = target.name(),
                                    error = %redactor.apply(&e.message),
                                    "could not destroy guest at shutdown; auto-pause bounds its cost"
                                );
                                return false;
                            }
                            tokio::time::sleep(delay).await;
                        }
                        Err(_) => {
                            tracing::error!(
                                target: LOG_TARGET,
                                guest = target.name(),
                                "guest destroy did not finish before the shutdown deadline; \
                                 auto-pause bounds its cost"
                            );
                            return false;
                        }
                    }
                }
            }
        });
        let results = futures::future::join_all(jobs).await;
        let destroyed = results.iter().filter(|ok| **ok).count();
        ShutdownReport {
            destroyed,
            failed: results.len() - destroyed,
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

    /// Destroys the guest now, with retries inside `backoff.budget`. On failure the guard is
    /// dropped, which hands the guest to the background reaper.
    pub async fn destroy(mut self, backoff: &Backoff) -> Result<Duration, CallError> {
        let cp = {
            let map = self.reaper.lock();
            map.get(&self.slot)
                .map(|e| (e.cp.clone(), e.target.clone()))
        };
        let Some((cp, target)) = cp else {
            // Already destroyed by shutdown.
            self.armed = false;
            return Ok(Duration::ZERO);
        };
        let t0 = Instant::now();
        let patience = self.reaper.inner.config.lookup_patience;
        let (res, _) = crate::retry::retry_until(
            backoff,
            t0 + backoff.budget,
            "destroy",
            CallError::is_transient,
            |_| {
                let (cp, target) = (cp.clone(), target.clone());
                async move { Reaper::destroy_target(&cp, &target, patience).await }
            },
        )
        .await;
        res?;
        self.armed = false;
        self.reaper.forget(self.slot);
        Ok(t0.elapsed())
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
