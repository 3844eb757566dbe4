//! Admission control: how many guests a process keeps live at once, in all and per flow.
//!
//! One [`Admission`] per [`crate::session::Session`], so every surface of a process and every
//! warm pool shares it (a forked child builds its own session, so its counts are its own):
//!
//! - **A slot per live guest** ([`GuestSlot`]), under `CREATEOS_MAX_LIVE_GUESTS` (unset:
//!   unlimited, still counted). A one-shot guest's slot is taken before its create is sent and
//!   travels with the guest's reaper registration, so it is given back only once the guest is
//!   known to be gone (destroyed, or never created), whoever destroys it: the run, the reaper,
//!   shutdown. A pooled guest holds its slot while it is pooled, and handing it to a run hands
//!   the slot over with it. A kept guest (the component's Guest Reuse) counts while a run uses
//!   it: its slot is the run's, given back when the run releases the guest (a kept guest idle
//!   between runs costs little: auto-pause pauses it) or once it is destroyed.
//! - **A slot per run of a flow** ([`FlowSlot`]), under `CREATEOS_MAX_LIVE_GUESTS_PER_FLOW`,
//!   keyed by the flow id, for the component and the executor (the lfx backend is handed no
//!   flow id, so only the process-wide cap applies to it).
//! - **Waiting is fair**: a run over a cap queues, first come first served, until a slot frees
//!   or its wait runs out (`CREATEOS_ADMISSION_WAIT_SECONDS`, default 30, never beyond the
//!   run's own budget); it is then refused as unavailable, nothing having run, by
//!   [`at_capacity`]'s message (the cap, the live count, the setting). A waiting run that is
//!   cancelled leaves the queue at once (its place goes to the next).
//! - **Pool refills never take a slot a waiting run needs**: they only try
//!   ([`Admission::try_guest_slot`]), which fails while anyone waits; and a run that has to
//!   wait asks the registered pools to give up one idle guest ([`Admission::reclaim_with`]).
//!
//! - **Deployment-wide, with a store** (`CREATEOS_ADMISSION_STORE`, [`crate::lease`]): the
//!   same caps then hold for every worker process and host of the deployment. A run first takes
//!   its place in this process's queue as above (fairness within a process; the local cap is the
//!   same number, so a process never holds more than the deployment may), then a lease in the
//!   store, polling with short jittered backoff while the deployment is at its cap, never past
//!   its own wait. The slot holds the lease: it is released when the slot is given back, and
//!   renewed while it is held. When the store fails, `CREATEOS_ADMISSION_STORE_ON_FAILURE`
//!   refuses the run (the default) or admits it under this process's own cap (`local`).
//!   Refused at the cap, a run is told the deployment is full (its cap, its live count as the
//!   store last reported it, the store), also when it waited in this process's queue behind
//!   runs that wait for the deployment (places taken here but not yet admitted); only a run
//!   refused while every place of its process holds a live guest is told of this process. The
//!   wait a refusal reports is the run's whole wait for its slots.
//!
//! Cheap: one short mutex section per slot taken or given back (plus one store round trip per
//! slot with a store).

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::error::{ErrorKind, SandboxError};
use crate::lease::{Denied, Deployment, DeploymentStats, OnFailure, StoreConfig, StoreLease};
use crate::settings::{ENV_ADMISSION_WAIT, ENV_MAX_LIVE_GUESTS, ENV_MAX_LIVE_GUESTS_PER_FLOW};

/// The caps and the wait of one run, read from its settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// Guests live in this process at once (`None`: unlimited).
    pub max_live: Option<usize>,
    /// Runs of one flow holding a guest at once (`None`: unlimited).
    pub max_live_per_flow: Option<usize>,
    /// The longest a run waits for a slot (before its own budget cuts it shorter).
    pub wait: Duration,
    /// The deployment's store (`None`: the caps are per process).
    pub store: Option<&'static StoreConfig>,
}

impl Default for Caps {
    fn default() -> Self {
        Self {
            max_live: None,
            max_live_per_flow: None,
            wait: crate::settings::DEFAULT_ADMISSION_WAIT,
            store: None,
        }
    }
}

impl Caps {
    /// The caps alone, read through `lookup` ([`ENV_MAX_LIVE_GUESTS`],
    /// [`ENV_MAX_LIVE_GUESTS_PER_FLOW`], [`ENV_ADMISSION_WAIT`] and the deployment's store),
    /// for a provider whose runs read none of CreateOS's other settings: the same caps then
    /// hold for every provider's guests. A bad value is a refusal naming its variable.
    pub fn from_lookup(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Self, SandboxError> {
        use crate::vars::{non_blank, parse_cap};
        let cap = |var: &str| {
            non_blank(lookup, var)
                .map(|raw| parse_cap(var, &raw))
                .transpose()
        };
        Ok(Self {
            max_live: cap(ENV_MAX_LIVE_GUESTS)?,
            max_live_per_flow: cap(ENV_MAX_LIVE_GUESTS_PER_FLOW)?,
            wait: non_blank(lookup, ENV_ADMISSION_WAIT)
                .map(|raw| crate::settings::parse_admission_wait(&raw))
                .transpose()?
                .unwrap_or(crate::settings::DEFAULT_ADMISSION_WAIT),
            store: StoreConfig::from_lookup(lookup)?,
        })
    }

    /// The caps of `settings`.
    pub fn of(settings: &crate::settings::Settings) -> Self {
        Self {
            max_live: settings.max_live_guests,
            max_live_per_flow: settings.max_live_guests_per_flow,
            wait: settings.admission_wait,
            store: settings.admission_store,
        }
    }
}

/// A place in a queue.
struct Waiter {
    id: u64,
    grant: oneshot::Sender<()>,
}

/// One counted resource (the process's guests, or one flow's runs) and its queue.
#[derive(Default)]
struct Pool {
    live: usize,
    cap: Option<usize>,
    queue: VecDeque<Waiter>,
    /// Of `live`, the places whose runs were admitted (a run past the deployment's store too,
    /// or a pool's refill). The others are runs granted a place here that still wait for
    /// their place in the deployment's store: while there are such, the deployment, not this
    /// process, is what keeps the queue waiting.
    confirmed: usize,
}

impl Pool {
    fn has_room(&self) -> bool {
        self.cap.is_none_or(|cap| self.live < cap)
    }

    /// Gives a freed place to the waiters, first come first served, while there is room.
    fn grant(&mut self) {
        while self.has_room() {
            let Some(w) = self.queue.pop_front() else {
                return;
            };
            // A waiter whose run was dropped is gone from the queue already (see `Wait`); a
            // failed send cannot happen under the lock, but if it did the place stays free.
            if w.grant.send(()).is_ok() {
                self.live += 1;
            }
        }
    }

    /// Takes a place now if there is room and nobody waits.
    fn take_now(&mut self) -> bool {
        if self.queue.is_empty() && self.has_room() {
            self.live += 1;
            true
        } else {
            false
        }
    }

    fn enqueue(&mut self, id: u64) -> oneshot::Receiver<()> {
        let (grant, rx) = oneshot::channel();
        self.queue.push_back(Waiter { id, grant });
        rx
    }

    /// Removes waiter `id`; false when it was not queued any more (it was granted).
    fn dequeue(&mut self, id: u64) -> bool {
        match self.queue.iter().position(|w| w.id == id) {
            Some(at) => {
                self.queue.remove(at);
                true
            }
            None => false,
        }
    }

    fn give_back(&mut self, confirmed: bool) {
        self.live = self.live.saturating_sub(1);
        if confirmed {
            self.confirmed = self.confirmed.saturating_sub(1);
        }
        self.grant();
    }
}

#[derive(Default)]
struct State {
    guests: Pool,
    flows: HashMap<String, Pool>,
    next_id: u64,
    waits: u64,
    refusals: u64,
    /// The store the last run read (pool refills use it, as they use the last cap).
    store: Option<&'static StoreConfig>,
}

/// A warm pool's way of giving up one idle guest for a waiting run: true when it did.
pub type Reclaim = dyn Fn() -> bool + Send + Sync;

struct Inner {
    state: Mutex<State>,
    /// The pools that can give up an idle guest for a waiting run.
    reclaimers: Mutex<Vec<Weak<Reclaim>>>,
    /// This process's use of the deployment's store, once a run named one.
    deployment: Mutex<Option<Deployment>>,
    /// Where the store's errors, fallbacks and lost leases are counted.
    observation: Mutex<Option<crate::observe::Observation>>,
}

/// What an [`Admission`] holds right now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AdmissionStats {
    /// Guests counted live (runs' guests, pooled guests, guests being destroyed).
    pub live: usize,
    /// The process-wide cap last read (`None`: unlimited).
    pub cap: Option<usize>,
    /// Runs waiting for a guest slot.
    pub waiting: usize,
    /// Runs waiting for a slot of their flow.
    pub waiting_per_flow: usize,
    /// Flows with a run holding a slot, and how many each.
    pub flows: Vec<(String, usize)>,
    /// Runs that had to wait, so far.
    pub waits: u64,
    /// Runs refused at capacity, so far (deployment-wide refusals included).
    pub refusals: u64,
    /// The deployment's store, once a run named one.
    pub deployment: Option<DeploymentStats>,
}

/// The process's admission control (see the module docs). Cheap to clone (shared state).
#[derive(Clone)]
pub struct Admission {
    inner: Arc<Inner>,
}

impl Default for Admission {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for Admission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.lock();
        f.debug_struct("Admission")
            .field("live", &st.guests.live)
            .field("cap", &st.guests.cap)
            .field("waiting", &st.guests.queue.len())
            .finish_non_exhaustive()
    }
}

/// Which queue a wait is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope<'a> {
    Guests,
    Flow(&'a str),
}

/// A run's wait in one queue; dropping it (the run was cancelled, or its wait ran out) takes
/// it out of the queue, or gives back the place it was granted meanwhile.
struct Wait<'a> {
    adm: &'a Admission,
    scope: Scope<'a>,
    id: u64,
    done: bool,
}

impl Drop for Wait<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut st = self.adm.lock();
        let Some(pool) = st.pool_mut(self.scope) else {
            return;
        };
        if !pool.dequeue(self.id) {
            // Granted between the end of the wait and now: the place was counted for us.
            pool.give_back(false);
        }
        st.tidy(self.scope);
    }
}

impl State {
    fn pool_mut(&mut self, scope: Scope<'_>) -> Option<&mut Pool> {
        match scope {
            Scope::Guests => Some(&mut self.guests),
            Scope::Flow(flow) => self.flows.get_mut(flow),
        }
    }

    /// Forgets a flow nobody holds or waits for.
    fn tidy(&mut self, scope: Scope<'_>) {
        if let Scope::Flow(flow) = scope
            && self
                .flows
                .get(flow)
                .is_some_and(|p| p.live == 0 && p.queue.is_empty())
        {
            self.flows.remove(flow);
        }
    }
}

impl Admission {
    /// No guest counted, no cap yet (each run sets the caps it read).
    pub fn new() -> Self {
        Self {
            inner: Arc::new(Inner {
                state: Mutex::new(State::default()),
                reclaimers: Mutex::new(Vec::new()),
                deployment: Mutex::new(None),
                observation: Mutex::new(None),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// What it holds now.
    pub fn stats(&self) -> AdmissionStats {
        let st = self.lock();
        let mut flows: Vec<(String, usize)> = st
            .flows
            .iter()
            .filter(|(_, p)| p.live > 0)
            .map(|(k, p)| (k.clone(), p.live))
            .collect();
        flows.sort();
        AdmissionStats {
            live: st.guests.live,
            cap: st.guests.cap,
            waiting: st.guests.queue.len(),
            waiting_per_flow: st.flows.values().map(|p| p.queue.len()).sum(),
            flows,
            waits: st.waits,
            refusals: st.refusals,
            deployment: self.current_deployment().map(|d| d.stats()),
        }
    }

    /// This process's use of the deployment's store, if a run named one.
    pub fn current_deployment(&self) -> Option<Deployment> {
        self.inner
            .deployment
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// This process's use of the store of `config`, made on first use (a changed setting makes
    /// a new one; leases held under the old one stay with their slots).
    pub fn deployment(&self, config: &'static StoreConfig) -> Result<Deployment, SandboxError> {
        let mut held = self
            .inner
            .deployment
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(d) = held.as_ref().filter(|d| std::ptr::eq(d.config(), config)) {
            return Ok(d.clone());
        }
        let obs = self
            .inner
            .observation
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let d = Deployment::observed(config, obs)?;
        *held = Some(d.clone());
        Ok(d)
    }

    /// Counts the store's errors, fallbacks and lost leases in `obs` (the session's).
    pub fn observe_with(&self, obs: &crate::observe::Observation) {
        *self
            .inner
            .observation
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(obs.clone());
    }

    /// The create lock of the kept guest `name` in the deployment's store, when `caps` name
    /// one: the worker that holds it creates the guest (or finds it), the others wait for it
    /// and then find the guest by name, so two workers never race one create. Waits until
    /// `until` at most; then, or when the store fails under `local`, `Ok(None)`: the run goes
    /// on without it (the control plane's name uniqueness still allows one create). A store
    /// that fails under `refuse` refuses the run.
    pub async fn create_lock(
        &self,
        caps: Caps,
        name: &str,
        until: Instant,
    ) -> Result<Option<StoreLease>, SandboxError> {
        let Some(config) = caps.store else {
            return Ok(None);
        };
        let dep = self.deployment(config)?;
        match dep
            .lease(&config.create_lock_key(name), Some(1), until, || {})
            .await
        {
            Ok(lock) => Ok(Some(lock)),
            Err(Denied::AtCap { .. }) => Ok(None),
            Err(Denied::Store(e)) => match config.on_failure {
                OnFailure::Refuse => Err(dep.store_refusal(&e)),
                OnFailure::Local => {
                    dep.note_fallback(&e);
                    Ok(None)
                }
            },
        }
    }

    /// Uses `deployment` for its store's config (tests hand one on their own store).
    pub fn set_deployment(&self, deployment: Deployment) {
        *self
            .inner
            .deployment
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(deployment);
    }

    /// A lease under `scope`'s deployment-wide cap, when `caps` name a store: `Ok((None, _))`
    /// without a store, or when it failed under `local`. Also says how long it polled.
    async fn deploy(
        &self,
        scope: Scope<'_>,
        cap: Option<usize>,
        caps: Caps,
        until: Instant,
        since: Instant,
    ) -> Result<(Option<StoreLease>, Option<Duration>), SandboxError> {
        let Some(config) = caps.store else {
            return Ok((None, None));
        };
        let dep = self.deployment(config)?;
        let key = match scope {
            Scope::Guests => config.guests_key(),
            Scope::Flow(flow) => config.flow_key(flow),
        };
        let started = Instant::now();
        let mut waited = false;
        let got = dep
            .lease(&key, cap, until, || {
                waited = true;
                self.lock().waits += 1;
                if scope == Scope::Guests {
                    self.reclaim_one();
                }
            })
            .await;
        match got {
            Ok(lease) => Ok((Some(lease), waited.then(|| started.elapsed()))),
            Err(Denied::AtCap { live }) => {
                dep.note_refusal();
                self.lock().refusals += 1;
                Err(at_capacity(
                    scope,
                    cap.unwrap_or(0),
                    Some(live),
                    since.elapsed(),
                    caps,
                    Some(config),
                ))
            }
            Err(Denied::Store(e)) => match config.on_failure {
                OnFailure::Refuse => Err(dep.store_refusal(&e)),
                OnFailure::Local => {
                    dep.note_fallback(&e);
                    Ok((None, None))
                }
            },
        }
    }

    /// Registers a pool's way of giving up one idle guest (true when it did). Held weakly:
    /// a dropped pool is forgotten.
    pub fn reclaim_with(&self, reclaim: &Arc<Reclaim>) {
        let mut list = self
            .inner
            .reclaimers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        list.retain(|w| w.strong_count() > 0);
        list.push(Arc::downgrade(reclaim));
    }

    /// Asks the registered pools, in turn, to give up one idle guest.
    fn reclaim_one(&self) {
        let list: Vec<Arc<Reclaim>> = self
            .inner
            .reclaimers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        for reclaim in list {
            if reclaim() {
                return;
            }
        }
    }

    /// A guest slot now, for a warm pool's refill: only when there is room and no run waits
    /// (a refill never takes a slot a waiting run needs). Uses the cap the last run read.
    pub fn try_guest_slot(&self) -> Option<GuestSlot> {
        let mut st = self.lock();
        if !st.guests.take_now() {
            return None;
        }
        st.guests.confirmed += 1;
        Some(GuestSlot {
            adm: self.clone(),
            lease: None,
            confirmed: true,
        })
    }

    /// [`Admission::try_guest_slot`], also under the deployment-wide cap when the last run
    /// named a store: one try at a lease, no waiting. A store that fails gives no slot under
    /// `refuse`, and the local one alone under `local` (counted as a fallback).
    pub async fn try_guest_slot_deployed(&self) -> Option<GuestSlot> {
        let (store, cap) = {
            let st = self.lock();
            (st.store, st.guests.cap)
        };
        let mut slot = self.try_guest_slot()?;
        let Some(config) = store else {
            return Some(slot);
        };
        let dep = self.deployment(config).ok()?;
        let until = Instant::now() + crate::lease::STORE_CALL_TIMEOUT;
        match dep.try_lease(&config.guests_key(), cap, until).await {
            Ok((Some(lease), _)) => {
                slot.lease = Some(lease);
                Some(slot)
            }
            Ok((None, _)) => None,
            Err(e) => match config.on_failure {
                OnFailure::Refuse => None,
                OnFailure::Local => {
                    dep.note_fallback(&e);
                    Some(slot)
                }
            },
        }
    }

    /// Whether any run waits for a guest slot.
    pub fn has_waiters(&self) -> bool {
        !self.lock().guests.queue.is_empty()
    }

    /// A guest slot under `caps`, waiting in line until `until` if the process is at its cap.
    /// A run that has to wait first asks the warm pools to give up an idle guest.
    pub async fn guest_slot(&self, caps: Caps, until: Instant) -> Result<GuestSlot, SandboxError> {
        self.guest_slot_timed(caps, until, Duration::ZERO)
            .await
            .map(|(slot, _)| slot)
    }

    /// [`Admission::guest_slot`], also saying how long it queued (`None`: it did not);
    /// `before`: how long the run waited for its other slots already (a refusal reports the
    /// whole wait).
    async fn guest_slot_timed(
        &self,
        caps: Caps,
        until: Instant,
        before: Duration,
    ) -> Result<(GuestSlot, Option<Duration>), SandboxError> {
        let since = Instant::now()
            .checked_sub(before)
            .unwrap_or_else(Instant::now);
        let queued = self
            .wait_in(Scope::Guests, caps.max_live, caps, until, since)
            .await?;
        let mut slot = GuestSlot {
            adm: self.clone(),
            lease: None,
            confirmed: false,
        };
        // Boxed: the store's state machine stays off the run's own future (and the path
        // without a store allocates nothing).
        let (lease, polled) = if caps.store.is_some() {
            Box::pin(self.deploy(Scope::Guests, caps.max_live, caps, until, since)).await?
        } else {
            (None, None)
        };
        slot.lease = lease;
        self.confirm(Scope::Guests);
        slot.confirmed = true;
        Ok((slot, add(queued, polled)))
    }

    /// A slot of `flow` under `caps`, waiting in line until `until` if the flow is at its cap.
    pub async fn flow_slot(
        &self,
        flow: &str,
        caps: Caps,
        until: Instant,
    ) -> Result<FlowSlot, SandboxError> {
        self.flow_slot_timed(flow, caps, until, Duration::ZERO)
            .await
            .map(|(slot, _)| slot)
    }

    async fn flow_slot_timed(
        &self,
        flow: &str,
        caps: Caps,
        until: Instant,
        before: Duration,
    ) -> Result<(FlowSlot, Option<Duration>), SandboxError> {
        let since = Instant::now()
            .checked_sub(before)
            .unwrap_or_else(Instant::now);
        let queued = self
            .wait_in(
                Scope::Flow(flow),
                caps.max_live_per_flow,
                caps,
                until,
                since,
            )
            .await?;
        let mut slot = FlowSlot {
            adm: self.clone(),
            flow: flow.to_owned(),
            lease: None,
            confirmed: false,
        };
        // Boxed: the store's state machine stays off the run's own future (and the path
        // without a store allocates nothing).
        let (lease, polled) = if caps.store.is_some() {
            Box::pin(self.deploy(
                Scope::Flow(flow),
                caps.max_live_per_flow,
                caps,
                until,
                since,
            ))
            .await?
        } else {
            (None, None)
        };
        slot.lease = lease;
        self.confirm(Scope::Flow(flow));
        slot.confirmed = true;
        Ok((slot, add(queued, polled)))
    }

    /// A place in `scope`'s queue of this process; `since`: when the run began to wait for
    /// its slots (what a refusal reports as its wait).
    async fn wait_in(
        &self,
        scope: Scope<'_>,
        cap: Option<usize>,
        caps: Caps,
        until: Instant,
        since: Instant,
    ) -> Result<Option<Duration>, SandboxError> {
        let (mut rx, id) = {
            let mut guard = self.lock();
            let st = &mut *guard;
            if scope == Scope::Guests {
                st.store = caps.store;
            }
            let pool = match scope {
                Scope::Guests => &mut st.guests,
                Scope::Flow(flow) => st.flows.entry(flow.to_owned()).or_default(),
            };
            // The cap last read wins: a changed setting applies from the next run on, and a
            // raised cap lets the waiters in at once.
            pool.cap = cap;
            pool.grant();
            if pool.take_now() {
                return Ok(None);
            }
            st.waits += 1;
            st.next_id += 1;
            (pool.enqueue(st.next_id), st.next_id)
        };
        let mut wait = Wait {
            adm: self,
            scope,
            id,
            done: false,
        };
        if scope == Scope::Guests {
            self.reclaim_one();
        }
        let started = Instant::now();
        // The receiver outlives the timeout: a place granted at the last moment is then ours
        // (counted), never lost.
        if let Ok(Ok(())) = tokio::time::timeout_at(until, &mut rx).await {
            wait.done = true;
            return Ok(Some(started.elapsed()));
        }
        // Out of time: leave the queue (or keep a place granted in the meantime).
        let mut st = self.lock();
        let granted = st.pool_mut(scope).is_some_and(|p| !p.dequeue(id));
        wait.done = true;
        if granted {
            return Ok(Some(started.elapsed()));
        }
        st.refusals += 1;
        let (live, confirmed) = st.pool_mut(scope).map_or((0, 0), |p| (p.live, p.confirmed));
        st.tidy(scope);
        drop(st);
        // While places of this process wait for the deployment's, the deployment is what is
        // full: say so (its cap, its live count as the store last reported it, the store).
        if live > confirmed
            && let Some(config) = caps.store
        {
            let key = match scope {
                Scope::Guests => config.guests_key(),
                Scope::Flow(flow) => config.flow_key(flow),
            };
            let dep_live = self
                .current_deployment()
                .filter(|d| std::ptr::eq(d.config(), config))
                .and_then(|d| d.last_live(&key));
            return Err(at_capacity(
                scope,
                cap.unwrap_or(live),
                dep_live,
                since.elapsed(),
                caps,
                Some(config),
            ));
        }
        Err(at_capacity(
            scope,
            cap.unwrap_or(live),
            Some(live as u64),
            since.elapsed(),
            caps,
            None,
        ))
    }

    fn give_back(&self, scope: Scope<'_>, confirmed: bool) {
        let mut st = self.lock();
        if let Some(pool) = st.pool_mut(scope) {
            pool.give_back(confirmed);
        }
        st.tidy(scope);
    }

    /// Counts a place of `scope` as admitted (see `Pool::confirmed`).
    fn confirm(&self, scope: Scope<'_>) {
        if let Some(pool) = self.lock().pool_mut(scope) {
            pool.confirmed += 1;
        }
    }
}

fn add(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or_default() + b.unwrap_or_default()),
    }
}

/// The refusal of a run that waited for a slot in vain: it names the cap, the live count, the
/// setting, and that nothing ran; under a deployment-wide cap (`store`: where it is held,
/// shown without its password) the count is the whole deployment's as the store last reported
/// it (`None`: no answer yet). `waited`: the run's whole wait for its slots.
fn at_capacity(
    scope: Scope<'_>,
    cap: usize,
    live: Option<u64>,
    waited: Duration,
    caps: Caps,
    store: Option<&StoreConfig>,
) -> SandboxError {
    let (where_, cap_kind) = match store {
        Some(_) => (" in the whole deployment", "the deployment-wide cap"),
        None => (" in this process", "the cap"),
    };
    // The deployment's count is the store's last answer to this process.
    let (count, counted) = match (live, store) {
        (Some(n), Some(_)) => (n.to_string(), " (the store's last count)"),
        (Some(n), None) => (n.to_string(), ""),
        (None, _) => ("?".to_owned(), " (the store has not counted them yet)"),
    };
    let what = match scope {
        Scope::Guests => format!(
            "{count} guest(s) are live{where_}{counted}, {cap_kind} {ENV_MAX_LIVE_GUESTS}={cap}"
        ),
        Scope::Flow(flow) => {
            let where_ = if store.is_some() { where_ } else { "" };
            format!(
                "flow {flow:?} has {count} run(s) holding a guest{where_}{counted}, {cap_kind} \
                 {ENV_MAX_LIVE_GUESTS_PER_FLOW}={cap}"
            )
        }
    };
    let held = store.map_or_else(String::new, |config| {
        format!(", held in {}", config.describe())
    });
    let setting = match scope {
        Scope::Guests => ENV_MAX_LIVE_GUESTS,
        Scope::Flow(_) => ENV_MAX_LIVE_GUESTS_PER_FLOW,
    };
    SandboxError::new(
        ErrorKind::AtCapacity,
        format!(
            "the sandbox is at capacity: {what}{held}. The run waited {:.1}s for a \
             slot ({ENV_ADMISSION_WAIT}={}s, cut to the run's own budget) and nothing ran; \
             raise {setting} or retry later",
            waited.as_secs_f64(),
            caps.wait.as_secs_f64()
        ),
    )
}

/// One run's admission: the process's [`Admission`], the caps the run read, and until when it
/// may wait (its admission wait, cut to its own budget). Also bounds how long a create declined
/// for the account's quota (429) keeps trying ([`crate::guest::Guest::create_admitted`]).
#[derive(Debug, Clone)]
pub struct Ticket {
    admission: Admission,
    caps: Caps,
    until: Instant,
    /// How long the run queued for its slots so far (`None`: it never queued).
    queued: Arc<Mutex<Option<Duration>>>,
}

impl Ticket {
    /// A run's ticket: it may wait until `until`.
    pub fn new(admission: Admission, caps: Caps, until: Instant) -> Self {
        Self {
            admission,
            caps,
            until,
            queued: Arc::new(Mutex::new(None)),
        }
    }

    /// How long the run queued for its slots so far (`None`: it never had to).
    pub fn queued(&self) -> Option<Duration> {
        *self.queued.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn add_queued(&self, d: Option<Duration>) {
        if let Some(d) = d {
            let mut q = self.queued.lock().unwrap_or_else(PoisonError::into_inner);
            *q = Some(q.unwrap_or_default() + d);
        }
    }

    /// Until when the run may wait.
    pub fn until(&self) -> Instant {
        self.until
    }

    /// A guest slot, waiting in line until [`Ticket::until`] (or `deadline`, if sooner).
    pub async fn guest_slot(&self, deadline: Option<Instant>) -> Result<GuestSlot, SandboxError> {
        let until = deadline.map_or(self.until, |d| d.min(self.until));
        let before = self.queued().unwrap_or_default();
        let (slot, queued) = self
            .admission
            .guest_slot_timed(self.caps, until, before)
            .await?;
        self.add_queued(queued);
        Ok(slot)
    }

    /// A slot of `flow`, waiting in line until [`Ticket::until`].
    pub async fn flow_slot(&self, flow: &str) -> Result<FlowSlot, SandboxError> {
        let before = self.queued().unwrap_or_default();
        let (slot, queued) = self
            .admission
            .flow_slot_timed(flow, self.caps, self.until, before)
            .await?;
        self.add_queued(queued);
        Ok(slot)
    }
}

/// One live guest's place under the process-wide cap. Dropping it gives the place back (to
/// the first waiting run).
pub struct GuestSlot {
    adm: Admission,
    /// Its lease under the deployment-wide cap, when a store holds the caps.
    lease: Option<StoreLease>,
    /// Admitted (counted in `Pool::confirmed`).
    confirmed: bool,
}

impl fmt::Debug for GuestSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GuestSlot").finish_non_exhaustive()
    }
}

impl GuestSlot {
    /// Whether it holds a lease in the deployment's store.
    pub fn is_deployed(&self) -> bool {
        self.lease.is_some()
    }
}

impl Drop for GuestSlot {
    fn drop(&mut self) {
        drop(self.lease.take());
        self.adm.give_back(Scope::Guests, self.confirmed);
    }
}

/// One run's place under its flow's cap. Dropping it gives the place back.
pub struct FlowSlot {
    adm: Admission,
    flow: String,
    /// Its lease under the flow's deployment-wide cap, when a store holds the caps.
    lease: Option<StoreLease>,
    /// Admitted (counted in `Pool::confirmed`).
    confirmed: bool,
}

impl fmt::Debug for FlowSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FlowSlot")
            .field("flow", &self.flow)
            .finish_non_exhaustive()
    }
}

impl Drop for FlowSlot {
    fn drop(&mut self) {
        drop(self.lease.take());
        self.adm.give_back(Scope::Flow(&self.flow), self.confirmed);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    fn caps(max: usize) -> Caps {
        Caps {
            max_live: Some(max),
            max_live_per_flow: Some(max),
            wait: Duration::from_secs(30),
            store: None,
        }
    }

    fn soon(ms: u64) -> Instant {
        Instant::now() + Duration::from_millis(ms)
    }

    #[tokio::test]
    async fn unlimited_counts_but_never_waits() {
        let a = Admission::new();
        let slots: Vec<GuestSlot> =
            futures::future::join_all((0..100).map(|_| a.guest_slot(Caps::default(), soon(0))))
                .await
                .into_iter()
                .map(Result::unwrap)
                .collect();
        assert_eq!(a.stats().live, 100);
        drop(slots);
        assert_eq!(a.stats().live, 0);
    }

    #[tokio::test]
    async fn waiters_are_served_first_come_first_served() {
        let a = Admission::new();
        let first = a.guest_slot(caps(1), soon(10)).await.unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..5 {
            let (a, order) = (a.clone(), Arc::clone(&order));
            tasks.push(tokio::spawn(async move {
                let slot = a.guest_slot(caps(1), soon(60_000)).await.unwrap();
                order.lock().unwrap().push(i);
                tokio::time::sleep(Duration::from_millis(10)).await;
                drop(slot);
            }));
            // Each one queued before the next arrives.
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(a.stats().waiting, 5);
        drop(first);
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4]);
        assert_eq!(a.stats().live, 0);
        assert_eq!(a.stats().waits, 5);
    }

    #[tokio::test]
    async fn a_wait_that_runs_out_is_refused_naming_cap_count_and_setting() {
        let a = Admission::new();
        let held = a.guest_slot(caps(2), soon(0)).await.unwrap();
        let held2 = a.guest_slot(caps(2), soon(0)).await.unwrap();
        let e = a.guest_slot(caps(2), soon(500)).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::AtCapacity);
        assert!(e.kind().is_unavailable());
        let text = e.to_string();
        for want in [
            "at capacity",
            "2 guest(s) are live",
            "CREATEOS_MAX_LIVE_GUESTS=2",
            "CREATEOS_ADMISSION_WAIT_SECONDS",
            "nothing ran",
        ] {
            assert!(text.contains(want), "{want}: {text}");
        }
        let s = a.stats();
        assert_eq!((s.live, s.waiting, s.refusals), (2, 0, 1));
        drop((held, held2));
    }

    #[tokio::test]
    async fn a_cancelled_waiter_frees_its_place() {
        let a = Admission::new();
        let held = a.guest_slot(caps(1), soon(0)).await.unwrap();
        let a2 = a.clone();
        let cancelled = tokio::spawn(async move { a2.guest_slot(caps(1), soon(60_000)).await });
        tokio::time::sleep(Duration::from_millis(5)).await;
        let a3 = a.clone();
        let next = tokio::spawn(async move { a3.guest_slot(caps(1), soon(60_000)).await });
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert_eq!(a.stats().waiting, 2);
        cancelled.abort();
        let _ = cancelled.await;
        assert_eq!(a.stats().waiting, 1, "the cancelled run left the queue");
        drop(held);
        let got = next.await.unwrap().unwrap();
        assert_eq!(a.stats().live, 1);
        drop(got);
        assert_eq!(a.stats().live, 0);
    }

    #[tokio::test]
    async fn refills_never_take_a_slot_a_waiting_run_needs() {
        let a = Admission::new();
        let held = a.guest_slot(caps(2), soon(0)).await.unwrap();
        let pool_slot = a.try_guest_slot().expect("room and nobody waits");
        assert!(a.try_guest_slot().is_none(), "at the cap");
        let a2 = a.clone();
        let waiter = tokio::spawn(async move { a2.guest_slot(caps(2), soon(60_000)).await });
        tokio::time::sleep(Duration::from_millis(5)).await;
        drop(pool_slot);
        // The freed place went to the waiting run, not to a refill.
        let got = waiter.await.unwrap().unwrap();
        assert!(a.try_guest_slot().is_none());
        drop((held, got));
        assert!(a.try_guest_slot().is_some());
    }

    #[tokio::test]
    async fn a_waiting_run_asks_the_pools_for_an_idle_guest() {
        let a = Admission::new();
        let pooled = Arc::new(Mutex::new(Some(a.try_guest_slot().unwrap())));
        let asked = Arc::new(AtomicUsize::new(0));
        let reclaim: Arc<Reclaim> = {
            let (pooled, asked) = (Arc::clone(&pooled), Arc::clone(&asked));
            Arc::new(move || {
                asked.fetch_add(1, Ordering::SeqCst);
                pooled.lock().unwrap().take().is_some()
            })
        };
        a.reclaim_with(&reclaim);
        let got = a.guest_slot(caps(1), soon(1000)).await.unwrap();
        assert_eq!(asked.load(Ordering::SeqCst), 1);
        assert_eq!(a.stats().live, 1);
        drop(got);
    }

    #[tokio::test]
    async fn flows_are_capped_each_on_its_own() {
        let a = Admission::new();
        let f1 = a.flow_slot("flow-a", caps(1), soon(0)).await.unwrap();
        let other = a.flow_slot("flow-b", caps(1), soon(0)).await.unwrap();
        let e = a.flow_slot("flow-a", caps(1), soon(100)).await.unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("\"flow-a\"") && text.contains("CREATEOS_MAX_LIVE_GUESTS_PER_FLOW=1"),
            "{text}"
        );
        assert_eq!(
            a.stats().flows,
            vec![("flow-a".into(), 1), ("flow-b".into(), 1)]
        );
        drop((f1, other));
        assert!(a.stats().flows.is_empty());
        assert!(a.flow_slot("flow-a", caps(1), soon(0)).await.is_ok());
    }

    #[test]
    fn caps_read_alone_name_a_bad_value() {
        let l = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert_eq!(Caps::from_lookup(&l(&[])).unwrap(), Caps::default());
        let c = Caps::from_lookup(&l(&[
            (ENV_MAX_LIVE_GUESTS, "3"),
            (ENV_MAX_LIVE_GUESTS_PER_FLOW, "2"),
            (ENV_ADMISSION_WAIT, "5"),
        ]))
        .unwrap();
        assert_eq!(
            (c.max_live, c.max_live_per_flow, c.wait),
            (Some(3), Some(2), Duration::from_secs(5))
        );
        for bad in [
            &[(ENV_MAX_LIVE_GUESTS, "lots")],
            &[(ENV_MAX_LIVE_GUESTS_PER_FLOW, "0")],
            &[(ENV_ADMISSION_WAIT, "-1")],
        ] {
            let e = Caps::from_lookup(&l(bad)).unwrap_err();
            assert!(e.to_string().contains(bad[0].0), "{e}");
        }
    }

    #[tokio::test]
    async fn a_raised_cap_lets_the_waiters_in() {
        let a = Admission::new();
        let held = a.guest_slot(caps(1), soon(0)).await.unwrap();
        let a2 = a.clone();
        let waiter = tokio::spawn(async move { a2.guest_slot(caps(1), soon(60_000)).await });
        tokio::time::sleep(Duration::from_millis(5)).await;
        let more = a.guest_slot(caps(3), soon(0)).await.unwrap();
        let served = waiter.await.unwrap().expect("the waiter went first");
        assert_eq!(a.stats().live, 3);
        drop((held, more, served));
    }
}
