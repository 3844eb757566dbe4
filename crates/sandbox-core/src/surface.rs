//! The surface kit: what the three surfaces (the lfx backend, the CreateOS Sandbox component,
//! the whole-flow executor) share, so every guest of a process passes through one place.
//!
//! - [`SurfaceOptions`]: the knobs every surface has (environment lookup, clocks, backoff,
//!   reaper, session, shutdown budget, orphan sweep, warm pool, the fork rule), embedded in
//!   each surface's own options type;
//! - [`Surface`]: one surface instance's session, reaper and warm pool, its kind
//!   ([`SurfaceKind`]), and the steps every run takes before its guest exists (settings,
//!   credential and catalog, the orphan sweep: [`Surface::open`]);
//! - [`Surface::acquire`]: the one acquire call. It admits the run (the process's and the
//!   flow's caps on live guests, a fair wait for a slot: [`crate::admission`]), takes a guest
//!   from the warm pool, or creates a one-shot guest, or acquires a kept guest by its derived
//!   name; hands it to the surface's own first step (a closure that starts the program); and
//!   owns the fallback when a pooled guest refuses before anything was dispatched (it is
//!   destroyed, counted, and the step runs again on a fresh guest). It reports one [`PoolUse`]
//!   for every surface;
//! - [`Lease`]: the guest of one run until [`Lease::end`] destroys or releases it (dropping a
//!   lease does what dropping the guest does: a one-shot guest goes to the reaper, a kept one
//!   is left alive), with the run's admission slots: a one-shot guest's slot goes with its
//!   reaper registration (given back once the guest is gone, whoever destroys it), a kept
//!   guest's and the flow's are the lease's.
//!
//! **The fork rule**, once for every surface ([`SurfaceOptions::for_process`]): a process
//! forked from the one that imported the package commonly ends with `os._exit`, which skips
//! `atexit` and kills background work. Such a process keeps no warm pool (idle guests would
//! outlive it) and destroys each guest before the run returns. Its session, reaper and pool
//! are its own: nothing built in the parent is used in the child.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::LOG_TARGET;
use crate::admission::{Caps, FlowSlot, GuestSlot, Ticket};
use crate::control::CallError;
use crate::control::DEFAULT_REQUEST_TIMEOUT;
use crate::error::{Redactor, SandboxError};
use crate::exec::ExecLimits;
use crate::guest::{Guest, GuestContext, GuestSpec};
pub use crate::kind::SurfaceKind;
use crate::names::ONE_SHOT_PREFIX;
use crate::observe::{Event, Observation, RunOutcome, RunUsage};
use crate::orphans::SweepConfig;
use crate::pool::{PoolConfig, PoolStats, WarmPool, Warmer};
use crate::reaper::{Reaper, ReaperConfig};
use crate::retry::Backoff;
use crate::session::{Account, Connector, Session, http_connector};
use crate::settings::Settings;
use crate::shapes::Shape;

/// The least a kept run waits for another worker's create of the same guest (its admission
/// wait may be 0), before it goes on without the lock.
const CREATE_LOCK_WAIT: Duration = Duration::from_secs(10);

/// Reads one environment variable.
pub type EnvLookup = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// The knobs every surface has; each surface's options embed them. `Default` is the process
/// environment, the production clocks and a fresh session. `Debug` shows no closure and no
/// secret.
#[derive(Clone)]
pub struct SurfaceOptions {
    /// Where settings are read from (default: the process environment, at each run, with
    /// secrets given as files read from them: [`crate::vars::process_env`]).
    pub env: EnvLookup,
    /// Timeout of each control call (ignored when `session` is given).
    pub request_timeout: Duration,
    /// Backoff and total deadline for the calls before a program is dispatched.
    pub backoff: Backoff,
    /// TERM→KILL grace given to `timeout(1)` in the guest.
    pub kill_after: Duration,
    /// Extra time the host waits for an exec beyond `timeout + kill_after`.
    pub host_grace: Duration,
    /// How hard the reaper tries to destroy one-shot guests a run could not.
    pub reaper: ReaperConfig,
    /// How a control plane is built from settings (ignored when `session` is given).
    pub connector: Connector,
    /// The process's session to share with the other surfaces (one client, one credential
    /// check and one catalog fetch per account); `None` builds one from `connector` and
    /// `request_timeout`.
    pub session: Option<Session>,
    /// Bound on the surface's shutdown.
    pub shutdown_timeout: Duration,
    /// Delete paused one-shot guests of earlier processes (orphans) in the background, once
    /// per process per account, after the account's first credential check.
    pub orphan_sweep: bool,
    /// How the warm pool refills and retires its guests (its size is the surface's setting,
    /// read at each run).
    pub pool: PoolConfig,
    /// Whether this surface may keep a warm pool at all (see the fork rule in the module
    /// docs).
    pub pool_allowed: bool,
    /// Destroy a one-shot guest off the critical path once its run is over (the reaper
    /// guarantees it and shutdown flushes it). Only the backend honours it
    /// ([`Surface::destroys_in_background`]); the component and the executor always destroy
    /// before returning. Off in a forked process (see the module docs).
    pub background_destroy: bool,
}

impl fmt::Debug for SurfaceOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The env lookup and the connector are closures; the session shows its account count.
        f.debug_struct("SurfaceOptions")
            .field("request_timeout", &self.request_timeout)
            .field("backoff", &self.backoff)
            .field("kill_after", &self.kill_after)
            .field("host_grace", &self.host_grace)
            .field("reaper", &self.reaper)
            .field("session", &self.session)
            .field("shutdown_timeout", &self.shutdown_timeout)
            .field("orphan_sweep", &self.orphan_sweep)
            .field("pool", &self.pool)
            .field("pool_allowed", &self.pool_allowed)
            .field("background_destroy", &self.background_destroy)
            .finish_non_exhaustive()
    }
}

impl Default for SurfaceOptions {
    fn default() -> Self {
        let clocks = ExecLimits::for_seconds(1);
        Self {
            env: Arc::new(crate::vars::process_env),
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            backoff: Backoff::default(),
            kill_after: clocks.kill_after,
            host_grace: clocks.host_grace,
            reaper: ReaperConfig::default(),
            connector: http_connector(),
            session: None,
            shutdown_timeout: Duration::from_secs(20),
            orphan_sweep: true,
            pool: PoolConfig::default(),
            pool_allowed: true,
            background_destroy: true,
        }
    }
}

impl SurfaceOptions {
    /// These options for a process that `forked` (or not) from the one that imported the
    /// package: a forked one keeps no warm pool and destroys every guest before a run returns
    /// (the fork rule, in the module docs). Not forked leaves them as they are.
    #[must_use]
    pub fn for_process(mut self, forked: bool) -> Self {
        if forked {
            self.pool_allowed = false;
            self.background_destroy = false;
        }
        self
    }
}

/// How a run got its guest: the one outcome type of the warm pool for every surface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolUse {
    /// No pool (size 0, not allowed in this process, or a kept guest).
    Off,
    /// A pooled guest, already created and egress-verified.
    Hit,
    /// The pool had no guest for this policy: created as without a pool.
    Miss,
    /// A pooled guest turned out unusable before anything was dispatched (e.g. paused by the
    /// control plane); it was destroyed and the run used a fresh guest.
    Replaced,
}

impl PoolUse {
    /// `off`, `hit`, `miss` or `replaced`.
    pub fn as_str(self) -> &'static str {
        match self {
            PoolUse::Off => "off",
            PoolUse::Hit => "hit",
            PoolUse::Miss => "miss",
            PoolUse::Replaced => "replaced",
        }
    }
}

/// What a run's first step is told about its guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Begin {
    /// Where the guest came from.
    pub origin: Origin,
    /// The calls before the program is dispatched end by then: the run's budget, counted from
    /// when it was admitted (time its create waited for the account's quota is admission time,
    /// not charged).
    pub deadline: Instant,
}

/// Where the guest handed to a run's first step came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The warm pool: created and egress-verified (and warmed) ahead of the run.
    Pooled,
    /// Created for this run (one-shot).
    Created,
    /// A kept guest, acquired by its derived name (created now or found).
    Kept,
}

/// Why a run's first step failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartError<E> {
    /// Nothing was dispatched on the guest (a refused upload or exec, a guest the control plane
    /// paused behind the pool's back, a preloaded runner that was gone): a pooled guest is
    /// destroyed and the step runs again on a fresh guest.
    NotStarted(E),
    /// A failure a fresh guest would not mend, or one after the program may have started.
    Failed(E),
}

impl<E> StartError<E> {
    /// The error, whichever it is.
    pub fn into_inner(self) -> E {
        match self {
            StartError::NotStarted(e) | StartError::Failed(e) => e,
        }
    }
}

impl StartError<SandboxError> {
    /// The usual split of a [`SandboxError`] from a step that dispatches a program: an unknown
    /// outcome (the program may have run) is [`StartError::Failed`], anything else
    /// [`StartError::NotStarted`].
    pub fn classify(e: SandboxError) -> Self {
        if e.kind() == crate::ErrorKind::OutcomeUnknown {
            StartError::Failed(e)
        } else {
            StartError::NotStarted(e)
        }
    }
}

/// Which guest a run asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want<'a> {
    /// A one-shot guest: from the warm pool, or created under a fresh `lf-` name.
    OneShot,
    /// The kept guest of this derived name (never from the pool).
    Kept(&'a str),
}

/// What [`Surface::acquire`] needs to know about one run's guest.
#[derive(Debug, Clone, Copy)]
pub struct Acquire<'a> {
    /// The run's context (its account's control plane, this surface's reaper, the redactor,
    /// the backoff, the run's request count).
    pub cx: &'a GuestContext,
    /// The guest the run needs.
    pub spec: &'a GuestSpec,
    /// One-shot or kept.
    pub want: Want<'a>,
    /// The warm pool size the surface's setting asks for (0 = off); the kit applies
    /// [`SurfaceOptions::pool_allowed`].
    pub pool_size: usize,
    /// The caps the run read ([`Caps::of`] its settings).
    pub caps: Caps,
    /// The flow the run belongs to, for the per-flow cap (`None` or empty: none, as for the
    /// lfx backend, which is handed no flow id).
    pub flow: Option<&'a str>,
    /// The run's own budget (its program's timeout): its admission wait never exceeds it.
    pub run_budget: Duration,
    /// The node the run belongs to, when known (for the guest's usage record).
    pub node: Option<&'a str>,
    /// The Langflow session id of the run, when known: only its hash
    /// ([`crate::observe::session_hash`]) reaches the guest's usage record.
    pub session: Option<&'a str>,
}

/// A started run: its guest's [`Lease`] and what the first step returned.
#[derive(Debug)]
pub struct Started<T, E> {
    /// The guest, until [`Lease::end`].
    pub lease: Lease,
    /// The first step's result on that guest.
    pub result: Result<T, E>,
}

/// The guest of one run. See the module docs for what dropping it does.
pub struct Lease {
    guest: Guest,
    pool: PoolUse,
    origin: Origin,
    create_time: Duration,
    acquired_at: Instant,
    /// A kept guest's place under the process's cap (a one-shot guest's travels with its reaper
    /// registration). Declared after `guest`, so a dropped lease lets the guest go first.
    guest_slot: Option<GuestSlot>,
    /// The run's place under its flow's cap.
    flow_slot: Option<FlowSlot>,
    /// How long the run waited for admission (slots and the account's quota).
    admission_wait: Duration,
    /// Where the run is counted, and as which surface's.
    obs: Observation,
    surface: SurfaceKind,
    /// When the run was admitted (the start of its run seconds).
    admitted_at: Instant,
    /// What the run reports at its end ([`Lease::set_outcome`]).
    usage: RunUsage,
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("guest", &self.guest.name())
            .field("pool", &self.pool)
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

/// How a run lets its guest go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Destroy it now, whatever its kind (a kept guest too), and wait for that.
    Destroy,
    /// Let it go: a one-shot guest to the reaper (destroyed off the critical path), a kept
    /// one alive for the next run.
    Release,
}

/// What [`Lease::end`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    /// The guest's name.
    pub name: String,
    /// The guest's id.
    pub id: String,
    /// How long the destroy took, when it ran and succeeded ([`End::Destroy`]).
    pub destroy_time: Option<Duration>,
    /// The destroy's failure (a one-shot guest stays with the reaper, which keeps trying).
    pub destroy_error: Option<CallError>,
}

impl Lease {
    /// Records how the run went (and the output bytes it returned), for its end's figures and
    /// its guest's usage record. A lease ended without it counts as a run that
    /// [`RunOutcome::MayHaveRun`].
    pub fn set_outcome(&mut self, outcome: RunOutcome, bytes_returned: u64) {
        self.usage.outcome = outcome;
        self.usage.bytes_returned = bytes_returned;
    }

    /// The guest.
    pub fn guest(&self) -> &Guest {
        &self.guest
    }

    /// How the run got its guest.
    pub fn pool_use(&self) -> PoolUse {
        self.pool
    }

    /// Where the guest came from.
    pub fn origin(&self) -> Origin {
        self.origin
    }

    /// How long the create (or acquire by name) took; zero for a pooled guest.
    pub fn create_time(&self) -> Duration {
        self.create_time
    }

    /// When the guest was ready for the run (taken from the pool, created or acquired).
    pub fn acquired_at(&self) -> Instant {
        self.acquired_at
    }

    /// How long the run waited for admission: for a slot under the process's or its flow's
    /// cap, and for the account's quota.
    pub fn admission_wait(&self) -> Duration {
        self.admission_wait
    }

    /// Destroys or releases the guest (see [`End`]). A destroy that fails is logged; a one-shot
    /// guest then stays with the reaper, which keeps trying.
    pub async fn end(self, how: End) -> Ended {
        let Lease {
            guest,
            guest_slot,
            flow_slot,
            obs,
            surface,
            admitted_at,
            usage,
            ..
        } = self;
        obs.emit(&Event::RunFinished {
            surface,
            outcome: usage.outcome,
            seconds: admitted_at.elapsed().as_secs_f64(),
        });
        guest.note_run(&usage);
        guest.set_destroy_reason(usage.outcome.destroy_reason());
        let (name, id) = (guest.name().to_owned(), guest.id().to_owned());
        let mut ended = Ended {
            name,
            id,
            destroy_time: None,
            destroy_error: None,
        };
        match how {
            End::Release => guest.release(),
            End::Destroy => {
                let redactor = guest.context().redactor.clone();
                let kept = guest.is_kept();
                match guest.destroy().await {
                    Ok(took) => ended.destroy_time = Some(took),
                    Err(e) => {
                        tracing::warn!(
                            target: LOG_TARGET,
                            guest = %ended.name,
                            error = %redactor.apply(&e.message),
                            "guest destroy failed{}",
                            if kept { "" } else { "; the reaper keeps retrying" }
                        );
                        ended.destroy_error = Some(e);
                    }
                }
            }
        }
        // A kept guest released alive gives its slot back (see `crate::admission`); one whose
        // destroy failed may live on, but nothing of this process uses it any more.
        drop((guest_slot, flow_slot));
        ended
    }
}

/// An account ready for runs: its credential checked, its catalog read, its orphan sweep
/// started.
#[derive(Debug, Clone)]
pub struct Opened {
    /// The account (one control plane per account and process).
    pub account: Arc<Account>,
    /// The shape catalog.
    pub catalog: Vec<Shape>,
    /// Removes the account's key from every message.
    pub redactor: Redactor,
    /// The run's backoff ([`Surface::backoff`] of the settings it was opened with).
    pub backoff: Backoff,
}

/// One surface instance: its options, session, reaper and warm pool. `Send + Sync`; shared by
/// every concurrent run of the surface in a process.
pub struct Surface {
    kind: SurfaceKind,
    opts: SurfaceOptions,
    session: Session,
    reaper: Reaper,
    pool: WarmPool,
}

impl fmt::Debug for Surface {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Surface")
            .field("kind", &self.kind)
            .field("reaper", &self.reaper)
            .field("pool", &self.pool)
            .finish_non_exhaustive()
    }
}

impl Surface {
    /// A surface of `kind` with `opts`, a reaper and a warm pool of its own. No I/O.
    pub fn new(kind: SurfaceKind, opts: SurfaceOptions) -> Self {
        let (reaper, pool) = (Reaper::new(opts.reaper), WarmPool::new(opts.pool));
        Self::with_parts(kind, opts, reaper, pool)
    }

    /// [`Surface::new`], whose pool prepares each guest with `warmer` before pooling it.
    pub fn with_warmer(kind: SurfaceKind, opts: SurfaceOptions, warmer: Warmer) -> Self {
        let reaper = Reaper::new(opts.reaper);
        let pool = WarmPool::with_warmer(opts.pool, warmer);
        Self::with_parts(kind, opts, reaper, pool)
    }

    /// A surface over an existing reaper and pool (an embedder or a test that drives them
    /// itself; `opts.reaper` and `opts.pool` are then not used).
    pub fn with_parts(
        kind: SurfaceKind,
        opts: SurfaceOptions,
        reaper: Reaper,
        pool: WarmPool,
    ) -> Self {
        let session = opts
            .session
            .clone()
            .unwrap_or_else(|| Session::new(opts.connector.clone(), opts.request_timeout));
        pool.attach(session.admission());
        Self {
            kind,
            opts,
            session,
            reaper,
            pool,
        }
    }

    /// Which surface this is.
    pub fn kind(&self) -> SurfaceKind {
        self.kind
    }

    /// Its options.
    pub fn options(&self) -> &SurfaceOptions {
        &self.opts
    }

    /// Its session (shared with the process's other surfaces when they were given the same).
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// Its reaper.
    pub fn reaper(&self) -> &Reaper {
        &self.reaper
    }

    /// Its warm pool.
    pub fn pool(&self) -> &WarmPool {
        &self.pool
    }

    /// Reads one setting through the options' lookup.
    pub fn lookup(&self, name: &str) -> Option<String> {
        (self.opts.env)(name)
    }

    /// The package's `CREATEOS_*` settings, read now.
    pub fn settings(&self) -> Result<Settings, SandboxError> {
        Settings::from_lookup(&|k| self.lookup(k))
    }

    /// The backoff of a run with `settings`: the options' backoff, its budget replaced by
    /// [`crate::settings::ENV_CONTROL_PLANE_RETRY`] when that is set (so tests that set
    /// [`SurfaceOptions::backoff`] directly keep theirs when the setting is unset).
    pub fn backoff(&self, settings: &Settings) -> Backoff {
        let mut backoff = self.opts.backoff;
        if let Some(budget) = settings.control_plane_retry {
            backoff.budget = budget;
        }
        backoff
    }

    /// The clocks of a program with `budget`.
    pub fn limits(&self, budget: Duration) -> ExecLimits {
        ExecLimits {
            budget,
            kill_after: self.opts.kill_after,
            host_grace: self.opts.host_grace,
        }
    }

    /// Whether this surface destroys a one-shot guest off the critical path: only the backend,
    /// and only with [`SurfaceOptions::background_destroy`].
    pub fn destroys_in_background(&self) -> bool {
        self.kind == SurfaceKind::Backend && self.opts.background_destroy
    }

    /// Whether this surface may keep a warm pool (see the fork rule).
    pub fn pool_allowed(&self) -> bool {
        self.opts.pool_allowed
    }

    /// The warm pool's counters.
    pub fn pool_stats(&self) -> PoolStats {
        self.pool.stats()
    }

    /// Guests registered with the reaper (runs in flight, pending destroys, pooled guests).
    pub fn registered_guests(&self) -> usize {
        self.reaper.registered()
    }

    /// [`Surface::registered_guests`] less the warm pool's idle guests, which belong to no run.
    pub fn unpooled_guests(&self) -> usize {
        self.reaper
            .registered()
            .saturating_sub(self.pool.stats().held())
    }

    /// The orphan sweep's configuration (its retries follow the surface's backoff).
    pub fn sweep_config(&self) -> SweepConfig {
        SweepConfig {
            backoff: self.opts.backoff,
            ..SweepConfig::default()
        }
    }

    /// The configuration of a sweep an operator asked for (`reap`) with `settings`: its
    /// retries end within [`Surface::backoff`]'s budget, like a run's. The background sweep
    /// keeps [`Surface::sweep_config`].
    pub fn sweep_config_for(&self, settings: &Settings) -> SweepConfig {
        SweepConfig {
            backoff: self.backoff(settings),
            ..self.sweep_config()
        }
    }

    /// The account of `settings`, its credential checked and its catalog read (each once per
    /// process), and its orphan sweep started (once per process, when the options ask).
    pub async fn open(&self, settings: &Settings) -> Result<Opened, SandboxError> {
        let redactor = settings.redactor();
        let account = self.session.account(settings)?;
        let backoff = self.backoff(settings);
        let (cred, catalog) = account.preflight(&backoff, &redactor).await;
        cred?;
        let catalog = catalog?;
        if self.opts.orphan_sweep {
            account.start_orphan_sweep(self.sweep_config());
        }
        Ok(Opened {
            account,
            catalog,
            redactor,
            backoff,
        })
    }

    /// A run's context on `opened`'s account: this surface's reaper, the run's backoff
    /// ([`Opened::backoff`]), a fresh request count.
    pub fn context(&self, opened: &Opened) -> GuestContext {
        GuestContext::with_provider(
            opened.account.provider().clone(),
            self.reaper.clone(),
            opened.redactor.clone(),
            opened.backoff,
        )
        .with_observation(self.session.observation().clone(), self.kind)
    }

    /// Counts a run that got no guest (refused, at capacity, not started) and returns its
    /// error as the surface's.
    fn no_guest<E: From<SandboxError>>(&self, e: SandboxError, t_admit: Instant) -> E {
        let obs = self.session.observation();
        if e.kind() == crate::ErrorKind::AtCapacity {
            obs.emit(&Event::AdmissionRefused { surface: self.kind });
        }
        obs.emit(&Event::RunFinished {
            surface: self.kind,
            outcome: crate::observe::outcome_of(&e),
            seconds: t_admit.elapsed().as_secs_f64(),
        });
        E::from(e)
    }

    /// A run's lease on `guest`, counted in this surface's observation.
    fn lease(
        &self,
        guest: Guest,
        (pool, origin): (PoolUse, Origin),
        req: &Acquire<'_>,
        t_admit: Instant,
    ) -> Lease {
        Lease {
            guest,
            pool,
            origin,
            create_time: Duration::ZERO,
            acquired_at: Instant::now(),
            guest_slot: None,
            flow_slot: None,
            admission_wait: Duration::ZERO,
            obs: self.session.observation().clone(),
            surface: self.kind,
            admitted_at: t_admit,
            usage: RunUsage {
                outcome: RunOutcome::MayHaveRun,
                bytes_returned: 0,
                flow_id: req.flow.filter(|f| !f.is_empty()).map(str::to_owned),
                node_id: req.node.filter(|n| !n.is_empty()).map(str::to_owned),
                session_hash: req
                    .session
                    .filter(|s| !s.is_empty())
                    .map(crate::observe::session_hash),
            },
        }
    }

    /// Reports the run's admission wait, if it waited.
    fn waited(&self, ticket: &Ticket, quota: Duration) -> Duration {
        let queued = ticket.queued();
        if queued.is_some() || !quota.is_zero() {
            let total = queued.unwrap_or_default() + quota;
            self.session.observation().emit(&Event::AdmissionWait {
                surface: self.kind,
                seconds: total.as_secs_f64(),
            });
        }
        queued.unwrap_or_default() + quota
    }

    /// The one acquire path: admits the run, gets its guest and hands it to `start`, the
    /// surface's first step on it (upload, dispatch...), which returns the guest with its
    /// result.
    ///
    /// Admission ([`crate::admission`]): a run of a flow first takes a slot under the flow's
    /// cap; a run that needs a new guest (a pool miss, a kept guest) takes a slot under the
    /// process's cap, waiting in line for either up to the caps' wait, cut to
    /// `req.run_budget`, and is refused as [`crate::ErrorKind::AtCapacity`] when that runs
    /// out (nothing ran). A pooled guest already holds its slot and brings it along.
    ///
    /// A one-shot run takes a guest from the warm pool when it holds one for this policy
    /// (after sizing the pool to `req.pool_size`, or 0 where no pool is allowed), and
    /// otherwise creates one under a fresh `lf-` name; a kept run acquires the guest of its
    /// derived name. When `start` reports [`StartError::NotStarted`] on a pooled guest (and
    /// shutdown has not begun), the guest is destroyed (counted as unusable by the pool), the
    /// run gets a fresh guest and `start` runs once more: the pool never fails a run that
    /// would have succeeded without it. The calls before dispatch share the options' backoff
    /// budget, counted from when the run was admitted ([`Begin::deadline`]).
    ///
    /// `Err` only when no guest could be had (nothing ran). Otherwise the lease and the
    /// step's result: the caller ends the lease on every path (or drops it).
    pub async fn acquire<T, E, F, Fut>(
        &self,
        req: &Acquire<'_>,
        mut start: F,
    ) -> Result<Started<T, E>, E>
    where
        E: From<SandboxError> + fmt::Display,
        F: FnMut(Guest, Begin) -> Fut,
        Fut: Future<Output = (Guest, Result<T, StartError<E>>)>,
    {
        let t_admit = Instant::now();
        let ticket = Ticket::new(
            self.session.admission().clone(),
            req.caps,
            t_admit + req.caps.wait.min(req.run_budget),
        );
        let mut cx = req.cx.clone().with_ticket(ticket.clone());
        if cx.observation().is_none() {
            cx = cx.with_observation(self.session.observation().clone(), self.kind);
        }
        let budget = req.cx.backoff.budget;
        let flow_slot = match req.flow.filter(|f| !f.is_empty()) {
            Some(flow) => Some(
                ticket
                    .flow_slot(flow)
                    .await
                    .map_err(|e| self.no_guest::<E>(e, t_admit))?,
            ),
            None => None,
        };
        let one_shot = matches!(req.want, Want::OneShot);
        self.pool.set_size(if self.opts.pool_allowed {
            req.pool_size
        } else {
            0
        });
        let mut pool_use = if one_shot && self.pool.stats().size > 0 {
            PoolUse::Miss
        } else {
            PoolUse::Off
        };
        let mut flow_slot = flow_slot;
        let pooled = if one_shot && pool_use == PoolUse::Miss {
            let got = self.pool.take(&cx, req.spec, ONE_SHOT_PREFIX);
            self.session.observation().emit(&Event::Pool {
                surface: self.kind,
                hit: got.is_some(),
            });
            got
        } else {
            None
        };
        if let Some(guest) = pooled {
            let waited = self.waited(&ticket, Duration::ZERO);
            let acquired_at = Instant::now();
            let begin = Begin {
                origin: Origin::Pooled,
                deadline: acquired_at + budget,
            };
            let (guest, result) = start(guest, begin).await;
            match result {
                Err(StartError::NotStarted(e)) if !self.reaper.is_closed() => {
                    tracing::warn!(
                        target: LOG_TARGET,
                        guest = guest.name(),
                        surface = self.kind.as_str(),
                        error = %cx.redactor.apply(&e.to_string()),
                        "warm pool: the pooled guest could not take the run (nothing was \
                         started); destroying it and using a fresh guest"
                    );
                    self.pool.note_unusable();
                    guest.set_destroy_reason(crate::observe::DestroyReason::Error);
                    pool_use = PoolUse::Replaced;
                    if self.destroys_in_background() {
                        guest.release();
                    } else {
                        let _ = guest.destroy().await;
                    }
                }
                result => {
                    let mut lease = self.lease(guest, (PoolUse::Hit, Origin::Pooled), req, t_admit);
                    lease.acquired_at = acquired_at;
                    lease.flow_slot = flow_slot.take();
                    lease.admission_wait = waited;
                    return Ok(Started {
                        lease,
                        result: result.map_err(StartError::into_inner),
                    });
                }
            }
        }
        let slot = ticket
            .guest_slot(None)
            .await
            .map_err(|e| self.no_guest::<E>(e, t_admit))?;
        let t0 = Instant::now();
        let deadline = t0 + budget;
        let (guest, origin, kept_slot) = match req.want {
            Want::OneShot => (
                Guest::create_admitted(&cx, req.spec, ONE_SHOT_PREFIX, deadline, slot)
                    .await
                    .map_err(|e| self.no_guest::<E>(e, t_admit))?,
                Origin::Created,
                None,
            ),
            Want::Kept(name) => {
                // With a deployment store, one worker at a time looks up or creates the guest
                // of this name; the others wait for it, then find it by name.
                let lock = Box::pin(self.session.admission().create_lock(
                    req.caps,
                    name,
                    deadline.min(ticket.until().max(t0 + CREATE_LOCK_WAIT)),
                ))
                .await
                .map_err(|e| self.no_guest::<E>(e, t_admit))?;
                let got = Guest::acquire(&cx, req.spec, name, deadline)
                    .await
                    .map_err(|e| self.no_guest::<E>(e, t_admit));
                drop(lock);
                (got?, Origin::Kept, Some(slot))
            }
        };
        let create_time = t0.elapsed();
        let quota_waited = guest.quota_waited();
        let acquired_at = Instant::now();
        let begin = Begin {
            origin,
            // A provider with its own readiness budget may have spent it past the control
            // plane's: the calls after it get a control-plane budget of their own.
            deadline: cx.after_ready(deadline + quota_waited),
        };
        let (guest, result) = start(guest, begin).await;
        let mut lease = self.lease(guest, (pool_use, origin), req, t_admit);
        lease.create_time = create_time;
        lease.acquired_at = acquired_at;
        lease.guest_slot = kept_slot;
        lease.flow_slot = flow_slot;
        lease.admission_wait = self.waited(&ticket, quota_waited);
        Ok(Started {
            lease,
            result: result.map_err(StartError::into_inner),
        })
    }

    /// Destroys every one-shot guest still registered (runs in flight, pending destroys, the
    /// warm pool's) within the options' shutdown budget, stops refills, and refuses new
    /// guests. Kept guests are left for the next process. Idempotent.
    pub async fn shutdown(&self) {
        // The pool's guests go to the reaper first, so the shutdown below destroys them too.
        self.pool.close();
        let r = self.reaper.shutdown(self.opts.shutdown_timeout).await;
        // The leases of the guests just destroyed, lingering for a next acquire that will not
        // come: given back now rather than held until they expire.
        if let Some(dep) = self.session.admission().current_deployment() {
            dep.flush().await;
        }
        if r.destroyed + r.failed > 0 {
            tracing::info!(
                target: LOG_TARGET,
                destroyed = r.destroyed,
                failed = r.failed,
                "{} shut down",
                self.kind.label()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_and_pool_uses_have_stable_spellings() {
        let kinds: Vec<&str> = SurfaceKind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(kinds, ["backend", "component", "executor"]);
        for (i, k) in SurfaceKind::ALL.iter().enumerate() {
            assert_eq!(k.index(), i);
        }
        let uses: Vec<&str> = [PoolUse::Off, PoolUse::Hit, PoolUse::Miss, PoolUse::Replaced]
            .iter()
            .map(|p| p.as_str())
            .collect();
        assert_eq!(uses, ["off", "hit", "miss", "replaced"]);
    }

    #[test]
    fn a_forked_process_keeps_no_pool_and_destroys_before_returning() {
        let o = SurfaceOptions::default();
        assert!(o.pool_allowed && o.background_destroy);
        let o = o.for_process(false);
        assert!(o.pool_allowed && o.background_destroy);
        let o = o.for_process(true);
        assert!(!o.pool_allowed && !o.background_destroy);
    }

    #[test]
    fn the_retry_setting_replaces_only_the_budget_of_the_options_backoff() {
        let own = Backoff {
            base: Duration::from_millis(20),
            max: Duration::from_millis(200),
            budget: Duration::from_secs(4),
        };
        let surface = |retry: Option<&'static str>| {
            Surface::new(
                SurfaceKind::Backend,
                SurfaceOptions {
                    env: Arc::new(move |k| {
                        (k == crate::settings::ENV_CONTROL_PLANE_RETRY)
                            .then_some(retry)
                            .flatten()
                            .map(str::to_owned)
                    }),
                    backoff: own,
                    ..SurfaceOptions::default()
                },
            )
        };
        // Unset: a test's (or an embedder's) own backoff is kept whole.
        let s = surface(None);
        assert_eq!(s.backoff(&s.settings().unwrap()), own);
        // Set: the budget is the operator's, the schedule stays the options'.
        let s = surface(Some("2.5"));
        assert_eq!(
            s.backoff(&s.settings().unwrap()),
            Backoff {
                budget: Duration::from_millis(2500),
                ..own
            }
        );
    }

    #[test]
    fn surface_is_send_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Surface>();
        assert_send_sync::<Lease>();
    }
}
