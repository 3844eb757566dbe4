//! Observation: what every guest and run of a process did, for metrics and usage records.
//!
//! One [`Observation`] per sandbox-core `Session` (so a forked child, which builds its own
//! session, counts on its own). It keeps native [`Counters`] (atomics; [`Counters::snapshot`]
//! gives totals by label) and hands every [`Event`] to a registered [`Observer`] (none by
//! default). Where the events come from:
//!
//! - guest created: a create that the control plane accepted (one-shot, pooled or kept);
//! - guest destroyed: once per created one-shot guest, whoever destroys it (the run, the
//!   reaper, background destroy, shutdown, the pool's retirements: the report rides on the
//!   guest's reaper registration), and a kept guest its run destroys; with a [`GuestUsage`];
//! - run finished: every run that reached the kit's acquire (sandbox-core's `surface::Surface`);
//! - control-plane request: every call through the session's control planes, by route and
//!   status class;
//! - pool hit or miss, admission wait and refusal, orphans reaped.
//!
//! Events never carry the key, code or output.
//!
//! **Providers.** An [`Observation`] handle is tagged with the provider its events come from
//! ([`Observation::for_provider`]; CreateOS by default), so every guest of every provider is
//! counted and recorded in this one place. CreateOS's totals are [`Observation::counters`],
//! unchanged; another provider's are kept apart ([`Observation::counters_of`]), its usage
//! records say which provider ([`GuestUsage::provider`]), and an observer learns it with each
//! event ([`Observer::observe_on`]).

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, SystemTime};

use crate::kind::{ProviderKind, SurfaceKind};

/// Why a guest was destroyed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DestroyReason {
    /// Its run ended (with a result, or a program that failed).
    RunEnd,
    /// Its run failed (refused, not started, may have run).
    Error,
    /// Its run timed out.
    Timeout,
    /// The warm pool retired it (idle too long, resized, given up for a waiting run).
    PoolRetire,
    /// The process shut down.
    Shutdown,
    /// An orphan of an earlier process, deleted by the sweep.
    Orphan,
    /// The reaper, after its run let it go without destroying it.
    Reaper,
}

impl DestroyReason {
    /// Every reason, in a fixed order.
    pub const ALL: [DestroyReason; 7] = [
        DestroyReason::RunEnd,
        DestroyReason::Error,
        DestroyReason::Timeout,
        DestroyReason::PoolRetire,
        DestroyReason::Shutdown,
        DestroyReason::Orphan,
        DestroyReason::Reaper,
    ];

    /// `run-end`, `error`, `timeout`, `pool-retire`, `shutdown`, `orphan` or `reaper`.
    pub fn as_str(self) -> &'static str {
        match self {
            DestroyReason::RunEnd => "run-end",
            DestroyReason::Error => "error",
            DestroyReason::Timeout => "timeout",
            DestroyReason::PoolRetire => "pool-retire",
            DestroyReason::Shutdown => "shutdown",
            DestroyReason::Orphan => "orphan",
            DestroyReason::Reaper => "reaper",
        }
    }

    fn index(self) -> usize {
        Self::ALL.iter().position(|r| *r == self).unwrap_or(0)
    }
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RunOutcome {
    /// The program ran and exited 0 (the flow completed).
    Ok,
    /// The program ran and failed (nonzero exit, an error the flow raised).
    ProgramFailed,
    /// The program did not finish within its timeout.
    TimedOut,
    /// Refused: the configuration cannot be served (fail closed), nothing ran.
    Refused,
    /// Unavailable: no guest could be had now (at capacity, not started), nothing ran.
    Unavailable,
    /// The program may have run (a failure after dispatch).
    MayHaveRun,
}

impl RunOutcome {
    /// Every outcome, in a fixed order.
    pub const ALL: [RunOutcome; 6] = [
        RunOutcome::Ok,
        RunOutcome::ProgramFailed,
        RunOutcome::TimedOut,
        RunOutcome::Refused,
        RunOutcome::Unavailable,
        RunOutcome::MayHaveRun,
    ];

    /// `ok`, `program_failed`, `timed_out`, `refused`, `unavailable` or `may_have_run`.
    pub fn as_str(self) -> &'static str {
        match self {
            RunOutcome::Ok => "ok",
            RunOutcome::ProgramFailed => "program_failed",
            RunOutcome::TimedOut => "timed_out",
            RunOutcome::Refused => "refused",
            RunOutcome::Unavailable => "unavailable",
            RunOutcome::MayHaveRun => "may_have_run",
        }
    }

    /// The reason its guest is destroyed for.
    pub fn destroy_reason(self) -> DestroyReason {
        match self {
            RunOutcome::Ok | RunOutcome::ProgramFailed => DestroyReason::RunEnd,
            RunOutcome::TimedOut => DestroyReason::Timeout,
            RunOutcome::Refused | RunOutcome::Unavailable | RunOutcome::MayHaveRun => {
                DestroyReason::Error
            }
        }
    }

    fn index(self) -> usize {
        Self::ALL.iter().position(|r| *r == self).unwrap_or(0)
    }
}

/// The class of a control-plane call's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StatusClass {
    /// Answered 2xx.
    Success,
    /// Answered 3xx (never followed).
    Redirect,
    /// Answered 4xx.
    ClientError,
    /// Answered 5xx.
    ServerError,
    /// No usable answer (transport, timeout, undecodable, refused by the client).
    NoAnswer,
}

impl StatusClass {
    /// `2xx`, `3xx`, `4xx`, `5xx` or `error`.
    pub fn as_str(self) -> &'static str {
        match self {
            StatusClass::Success => "2xx",
            StatusClass::Redirect => "3xx",
            StatusClass::ClientError => "4xx",
            StatusClass::ServerError => "5xx",
            StatusClass::NoAnswer => "error",
        }
    }

    /// The class of an answer with HTTP status `status` (`None`: no usable answer); a refused
    /// redirect counts as `3xx` whatever its status (sandbox-core's `observe::status_class`
    /// reads a call's result with it).
    pub fn of_status(status: Option<u16>, redirect: bool) -> Self {
        match status {
            _ if redirect => StatusClass::Redirect,
            Some(s) if (200..300).contains(&s) => StatusClass::Success,
            Some(s) if (300..400).contains(&s) => StatusClass::Redirect,
            Some(s) if (400..500).contains(&s) => StatusClass::ClientError,
            Some(s) if s >= 500 => StatusClass::ServerError,
            _ => StatusClass::NoAnswer,
        }
    }
}

/// One destroyed guest's usage record (issue 20's "usage records"). No key, code or output.
#[derive(Debug, Clone, PartialEq)]
pub struct GuestUsage {
    /// The surface that created it.
    pub surface: SurfaceKind,
    /// The guest's name.
    pub guest: String,
    /// The flow of its (last) run, when known.
    pub flow_id: Option<String>,
    /// The node of its (last) run, when known.
    pub node_id: Option<String>,
    /// A hash of the Langflow session id of its (last) run, when known.
    pub session_hash: Option<String>,
    /// Its shape.
    pub shape: String,
    /// Its root filesystem.
    pub rootfs: String,
    /// Its egress: `none`, `allowlist` or `open`.
    pub egress: &'static str,
    /// When its create was accepted.
    pub created_at: SystemTime,
    /// When it was known destroyed.
    pub destroyed_at: SystemTime,
    /// Seconds it lived (the cost figure).
    pub guest_seconds: f64,
    /// Runs it served.
    pub runs: u32,
    /// The outcome of its last run (`None`: it served none, e.g. a retired pool guest).
    pub outcome: Option<RunOutcome>,
    /// Bytes of output its runs returned to the host.
    pub bytes_returned: u64,
    /// Why it was destroyed.
    pub reason: DestroyReason,
    /// The process that held it when it was destroyed (its pid).
    pub worker: u32,
    /// The host of that process ([`crate::host::host_name`]: `CREATEOS_HOST_ID` or the
    /// machine's name).
    pub host: String,
    /// The provider the guest ran on (`createos`, `opensandbox`).
    pub provider: ProviderKind,
}

/// Something worth counting. Cheap to build: borrowed strings, no allocation.
#[derive(Debug, Clone, Copy)]
pub enum Event<'a> {
    /// A guest's create was accepted.
    GuestCreated {
        /// Its surface.
        surface: SurfaceKind,
        /// Its shape.
        shape: &'a str,
    },
    /// A created guest is gone.
    GuestDestroyed(&'a GuestUsage),
    /// A kept guest created elsewhere (an earlier process, another worker) is held here now:
    /// counted live here until it is destroyed or let go.
    GuestAdopted {
        /// Its surface.
        surface: SurfaceKind,
    },
    /// A kept guest this process held was released alive: no longer counted live here (the
    /// worker that takes it next counts it).
    GuestLetGo {
        /// Its surface.
        surface: SurfaceKind,
    },
    /// A run ended.
    RunFinished {
        /// Its surface.
        surface: SurfaceKind,
        /// How.
        outcome: RunOutcome,
        /// From its admission to its end.
        seconds: f64,
    },
    /// A control-plane call was answered (or not).
    ControlRequest {
        /// The call (`create`, `exec_stream`, `destroy`, ...).
        route: &'static str,
        /// Its answer's class.
        status: StatusClass,
    },
    /// A one-shot run with a warm pool got a pooled guest (`hit`) or not.
    Pool {
        /// Its surface.
        surface: SurfaceKind,
        /// Whether the pool served it.
        hit: bool,
    },
    /// A run waited for admission (a slot, or the account's quota).
    AdmissionWait {
        /// Its surface.
        surface: SurfaceKind,
        /// How long.
        seconds: f64,
    },
    /// A run was refused at capacity.
    AdmissionRefused {
        /// Its surface.
        surface: SurfaceKind,
    },
    /// Something happened with the deployment's admission store (sandbox-core's `lease`).
    AdmissionStore(StoreEvent),
    /// The orphan sweep deleted this many guests of earlier processes.
    OrphansReaped {
        /// How many.
        count: u64,
    },
}

/// What the deployment's admission store did that an operator counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StoreEvent {
    /// A store call failed or did not answer in time.
    Error,
    /// A run was admitted under this process's own cap because the store failed (`local`).
    Fallback,
    /// A held lease was found expired at renewal (the store was away longer than a lease).
    LeaseLost,
}

impl StoreEvent {
    /// Every kind, in index order.
    pub const ALL: [StoreEvent; 3] = [
        StoreEvent::Error,
        StoreEvent::Fallback,
        StoreEvent::LeaseLost,
    ];

    /// `error`, `fallback` or `lease_lost`.
    pub fn as_str(self) -> &'static str {
        match self {
            StoreEvent::Error => "error",
            StoreEvent::Fallback => "fallback",
            StoreEvent::LeaseLost => "lease_lost",
        }
    }

    /// Its native family: `createos_admission_store_errors_total`, `..._fallbacks_total`,
    /// `..._leases_lost_total`.
    pub fn family(self) -> &'static str {
        match self {
            StoreEvent::Error => "createos_admission_store_errors_total",
            StoreEvent::Fallback => "createos_admission_store_fallbacks_total",
            StoreEvent::LeaseLost => "createos_admission_store_leases_lost_total",
        }
    }
}

/// A sink for [`Event`]s (the metrics and usage-record exporters). Called inline: keep it
/// quick and never block.
pub trait Observer: Send + Sync {
    /// One event.
    fn observe(&self, event: &Event<'_>);

    /// One event of `provider`'s guests. The default hands it to [`Observer::observe`]
    /// (which then cannot tell the providers apart); an exporter that labels by provider
    /// overrides it.
    fn observe_on(&self, provider: ProviderKind, event: &Event<'_>) {
        let _ = provider;
        self.observe(event);
    }
}

/// One total of [`Counters::snapshot`]: a family name (`createos_…`), its labels, its value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The family (`createos_guests_created_total`, ...).
    pub name: &'static str,
    /// Its labels, in a fixed order.
    pub labels: Vec<(&'static str, String)>,
    /// Its value.
    pub value: f64,
}

const SURFACES: usize = SurfaceKind::ALL.len();

/// Seconds as whole microseconds in an atomic.
fn micros(seconds: f64) -> u64 {
    if seconds.is_finite() && seconds > 0.0 {
        Duration::from_secs_f64(seconds.min(1e9))
            .as_micros()
            .try_into()
            .unwrap_or(u64::MAX)
    } else {
        0
    }
}

#[allow(clippy::cast_precision_loss)] // totals far below 2^52
fn secs(micros: u64) -> f64 {
    micros as f64 / 1e6
}

/// The native totals of one process (see [`Counters::snapshot`]).
#[derive(Default)]
pub struct Counters {
    created: [AtomicU64; SURFACES],
    adopted: [AtomicU64; SURFACES],
    let_go: [AtomicU64; SURFACES],
    destroyed: [[AtomicU64; DestroyReason::ALL.len()]; SURFACES],
    runs: [[AtomicU64; RunOutcome::ALL.len()]; SURFACES],
    run_micros: [AtomicU64; SURFACES],
    pool_hits: [AtomicU64; SURFACES],
    pool_misses: [AtomicU64; SURFACES],
    admission_waits: [AtomicU64; SURFACES],
    admission_wait_micros: [AtomicU64; SURFACES],
    admission_refusals: [AtomicU64; SURFACES],
    orphans_reaped: AtomicU64,
    store_events: [AtomicU64; StoreEvent::ALL.len()],
    requests: Mutex<HashMap<(&'static str, StatusClass), u64>>,
    guest_micros: Mutex<HashMap<(SurfaceKind, String), u64>>,
}

impl fmt::Debug for Counters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Counters").finish_non_exhaustive()
    }
}

fn add(a: &AtomicU64, n: u64) {
    a.fetch_add(n, Ordering::Relaxed);
}

fn get(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

impl Counters {
    fn apply(&self, e: &Event<'_>) {
        match *e {
            Event::GuestCreated { surface, .. } => add(&self.created[surface.index()], 1),
            Event::GuestAdopted { surface } => add(&self.adopted[surface.index()], 1),
            Event::GuestLetGo { surface } => add(&self.let_go[surface.index()], 1),
            Event::GuestDestroyed(u) => {
                add(&self.destroyed[u.surface.index()][u.reason.index()], 1);
                *self
                    .guest_micros
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .entry((u.surface, u.shape.clone()))
                    .or_default() += micros(u.guest_seconds);
            }
            Event::RunFinished {
                surface,
                outcome,
                seconds,
            } => {
                add(&self.runs[surface.index()][outcome.index()], 1);
                add(&self.run_micros[surface.index()], micros(seconds));
            }
            Event::ControlRequest { route, status } => {
                *self
                    .requests
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .entry((route, status))
                    .or_default() += 1;
            }
            Event::Pool { surface, hit } => add(
                if hit {
                    &self.pool_hits[surface.index()]
                } else {
                    &self.pool_misses[surface.index()]
                },
                1,
            ),
            Event::AdmissionWait { surface, seconds } => {
                add(&self.admission_waits[surface.index()], 1);
                add(
                    &self.admission_wait_micros[surface.index()],
                    micros(seconds),
                );
            }
            Event::AdmissionRefused { surface } => {
                add(&self.admission_refusals[surface.index()], 1);
            }
            Event::OrphansReaped { count } => add(&self.orphans_reaped, count),
            Event::AdmissionStore(what) => add(&self.store_events[what as usize], 1),
        }
    }

    /// The sum of the totals of family `name` whose labels include all of `labels` (`None`: no
    /// such total).
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.snapshot()
            .into_iter()
            .filter(|s| {
                s.name == name
                    && labels
                        .iter()
                        .all(|(k, v)| s.labels.iter().any(|(lk, lv)| lk == k && lv == v))
            })
            .map(|s| s.value)
            .reduce(|a, b| a + b)
    }

    /// Every total, by label (zeros included for the fixed labels, so a family is always
    /// there): guests created, destroyed (by reason) and live (created less destroyed, by
    /// surface); runs (by outcome) and run seconds; control-plane requests (by route and
    /// status class); pool hits and misses; admission waits, wait seconds and refusals;
    /// orphans reaped; guest-seconds (by surface and shape).
    #[allow(clippy::cast_precision_loss)] // counts far below 2^52
    pub fn snapshot(&self) -> Vec<Sample> {
        let mut out = Vec::new();
        let s = |k: SurfaceKind| ("surface", k.as_str().to_owned());
        for k in SurfaceKind::ALL {
            let i = k.index();
            let created = get(&self.created[i]);
            let mut destroyed = 0;
            for r in DestroyReason::ALL {
                let n = get(&self.destroyed[i][r.index()]);
                destroyed += n;
                out.push(Sample {
                    name: "createos_guests_destroyed_total",
                    labels: vec![s(k), ("reason", r.as_str().to_owned())],
                    value: n as f64,
                });
            }
            out.push(Sample {
                name: "createos_guests_created_total",
                labels: vec![s(k)],
                value: created as f64,
            });
            out.push(Sample {
                name: "createos_guests_live",
                labels: vec![s(k)],
                // Every guest counted here came in once (created or adopted) and goes once
                // (destroyed or let go): never below zero, and the workers' sum is the
                // deployment's.
                value: (created + get(&self.adopted[i]))
                    .saturating_sub(destroyed + get(&self.let_go[i])) as f64,
            });
            for o in RunOutcome::ALL {
                out.push(Sample {
                    name: "createos_runs_total",
                    labels: vec![s(k), ("outcome", o.as_str().to_owned())],
                    value: get(&self.runs[i][o.index()]) as f64,
                });
            }
            let per_surface = [
                ("createos_run_seconds_total", secs(get(&self.run_micros[i]))),
                ("createos_pool_hits_total", get(&self.pool_hits[i]) as f64),
                (
                    "createos_pool_misses_total",
                    get(&self.pool_misses[i]) as f64,
                ),
                (
                    "createos_admission_waits_total",
                    get(&self.admission_waits[i]) as f64,
                ),
                (
                    "createos_admission_wait_seconds_total",
                    secs(get(&self.admission_wait_micros[i])),
                ),
                (
                    "createos_admission_refusals_total",
                    get(&self.admission_refusals[i]) as f64,
                ),
            ];
            for (name, value) in per_surface {
                out.push(Sample {
                    name,
                    labels: vec![s(k)],
                    value,
                });
            }
        }
        out.push(Sample {
            name: "createos_orphans_reaped_total",
            labels: Vec::new(),
            value: get(&self.orphans_reaped) as f64,
        });
        for what in StoreEvent::ALL {
            out.push(Sample {
                name: what.family(),
                labels: Vec::new(),
                value: get(&self.store_events[what as usize]) as f64,
            });
        }
        let mut requests: Vec<_> = self
            .requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(k, v)| (*k, *v))
            .collect();
        requests.sort_unstable();
        for ((route, status), n) in requests {
            out.push(Sample {
                name: "createos_control_requests_total",
                labels: vec![
                    ("route", route.to_owned()),
                    ("status_class", status.as_str().to_owned()),
                ],
                value: n as f64,
            });
        }
        let mut guest: Vec<_> = self
            .guest_micros
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        guest.sort();
        for ((k, shape), us) in guest {
            out.push(Sample {
                name: "createos_guest_seconds_total",
                labels: vec![s(k), ("shape", shape)],
                value: secs(us),
            });
        }
        out
    }
}

struct Inner {
    /// One set of totals per provider, in [`ProviderKind::ALL`]'s order.
    counters: [Counters; ProviderKind::ALL.len()],
    observer: RwLock<Option<Arc<dyn Observer>>>,
}

fn provider_index(provider: ProviderKind) -> usize {
    ProviderKind::ALL
        .iter()
        .position(|p| *p == provider)
        .unwrap_or(0)
}

/// A process's observation: its [`Counters`] and its [`Observer`], if one is registered.
/// Cheap to clone (shared). Each handle says which provider its events come from
/// ([`Observation::for_provider`]).
#[derive(Clone)]
pub struct Observation {
    inner: Arc<Inner>,
    provider: ProviderKind,
}

impl Default for Observation {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for Observation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Observation")
            .field("observer", &self.observer().is_some())
            .finish_non_exhaustive()
    }
}

impl Observation {
    /// Zero counters, no observer.
    pub fn new() -> Self {
        Self {
            inner: Arc::new(Inner {
                counters: Default::default(),
                observer: RwLock::new(None),
            }),
            provider: ProviderKind::CreateOs,
        }
    }

    /// The same observation (same totals, same observer), its events tagged as `provider`'s.
    #[must_use]
    pub fn for_provider(&self, provider: ProviderKind) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
            provider,
        }
    }

    /// The provider this handle's events come from.
    pub fn provider(&self) -> ProviderKind {
        self.provider
    }

    /// Registers `observer` (replacing any earlier one); `None` removes it.
    pub fn set_observer(&self, observer: Option<Arc<dyn Observer>>) {
        *self
            .inner
            .observer
            .write()
            .unwrap_or_else(PoisonError::into_inner) = observer;
    }

    fn observer(&self) -> Option<Arc<dyn Observer>> {
        self.inner
            .observer
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The native totals of CreateOS's guests (the `createos_…` families, as they always
    /// were).
    pub fn counters(&self) -> &Counters {
        self.counters_of(ProviderKind::CreateOs)
    }

    /// The native totals of `provider`'s guests.
    pub fn counters_of(&self, provider: ProviderKind) -> &Counters {
        &self.inner.counters[provider_index(provider)]
    }

    /// Counts `event` as this handle's provider's and hands it to the observer.
    pub fn emit(&self, event: &Event<'_>) {
        self.counters_of(self.provider).apply(event);
        if let Some(o) = self.observer() {
            o.observe_on(self.provider, event);
        }
    }
}

/// A created one-shot guest's account, carried by its reaper registration: dropped when the
/// registration goes (the guest is gone), it reports the guest destroyed, once.
pub struct Tracked {
    obs: Observation,
    usage: GuestUsage,
    created: tokio::time::Instant,
    reason: Option<DestroyReason>,
}

impl fmt::Debug for Tracked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tracked")
            .field("guest", &self.usage.guest)
            .finish_non_exhaustive()
    }
}

impl Tracked {
    /// A guest of `surface` just created; reports [`Event::GuestCreated`] now.
    pub fn created(
        obs: Observation,
        surface: SurfaceKind,
        guest: &str,
        shape: &str,
        rootfs: &str,
        egress: &'static str,
    ) -> Self {
        obs.emit(&Event::GuestCreated { surface, shape });
        Self::new(obs, surface, guest, shape, rootfs, egress)
    }

    fn new(
        obs: Observation,
        surface: SurfaceKind,
        guest: &str,
        shape: &str,
        rootfs: &str,
        egress: &'static str,
    ) -> Self {
        let provider = obs.provider();
        Self {
            obs,
            usage: GuestUsage {
                surface,
                guest: guest.to_owned(),
                flow_id: None,
                node_id: None,
                session_hash: None,
                shape: shape.to_owned(),
                rootfs: rootfs.to_owned(),
                egress,
                created_at: SystemTime::now(),
                destroyed_at: SystemTime::now(),
                guest_seconds: 0.0,
                runs: 0,
                outcome: None,
                bytes_returned: 0,
                reason: DestroyReason::Reaper,
                worker: std::process::id(),
                host: crate::host::host_name(),
                provider,
            },
            created: tokio::time::Instant::now(),
            reason: None,
        }
    }

    /// A kept guest of `surface` that this process found (created by an earlier run or
    /// process): no [`Event::GuestCreated`]; its record counts from now.
    pub fn adopted(
        obs: Observation,
        surface: SurfaceKind,
        guest: &str,
        shape: &str,
        rootfs: &str,
        egress: &'static str,
    ) -> Self {
        obs.emit(&Event::GuestAdopted { surface });
        Self::new(obs, surface, guest, shape, rootfs, egress)
    }

    /// Drops the account without a usage record (a kept guest released alive); it is no
    /// longer counted live here ([`Event::GuestLetGo`]).
    pub fn forget(mut self) {
        if !self.usage.guest.is_empty() {
            self.obs.emit(&Event::GuestLetGo {
                surface: self.usage.surface,
            });
        }
        self.usage.guest.clear();
    }

    /// Sets why it will be destroyed, unless a reason was set already (the first wins).
    pub fn reason(&mut self, reason: DestroyReason) {
        self.reason.get_or_insert(reason);
    }

    /// Records a run it served.
    pub fn served(&mut self, run: &RunUsage) {
        self.usage.runs += 1;
        self.usage.outcome = Some(run.outcome);
        self.usage.bytes_returned += run.bytes_returned;
        self.usage.flow_id.clone_from(&run.flow_id);
        self.usage.node_id.clone_from(&run.node_id);
        self.usage.session_hash.clone_from(&run.session_hash);
    }

    /// Reports the guest destroyed now (and not again).
    pub fn finish(mut self) {
        self.report();
    }

    fn report(&mut self) {
        if self.usage.guest.is_empty() {
            return;
        }
        self.usage.reason = self.reason.unwrap_or(DestroyReason::Reaper);
        self.usage.destroyed_at = SystemTime::now();
        self.usage.worker = std::process::id();
        self.usage.guest_seconds = self.created.elapsed().as_secs_f64();
        self.obs.emit(&Event::GuestDestroyed(&self.usage));
        self.usage.guest.clear();
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.report();
    }
}

/// The hash of a Langflow session id that a usage record carries instead of the id: the first
/// 16 hex digits of the SHA-256 of a fixed domain tag and the id. Stable across processes and
/// hosts (records of one session can be grouped), and the id itself (which Langflow may hand
/// out as a bearer of a chat's history) never reaches a record.
pub fn session_hash(session_id: &str) -> String {
    use sha2::{Digest, Sha256};
    use std::fmt::Write as _;
    let digest = Sha256::new()
        .chain_update(b"langflow-sandbox-createos/session\0")
        .chain_update(session_id.as_bytes())
        .finalize();
    digest.iter().take(8).fold(String::new(), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}

/// What one run adds to its guest's usage record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunUsage {
    /// How it ended.
    pub outcome: RunOutcome,
    /// Output bytes it returned to the host.
    pub bytes_returned: u64,
    /// Its flow, when known.
    pub flow_id: Option<String>,
    /// Its node, when known.
    pub node_id: Option<String>,
    /// A hash of its Langflow session id, when known.
    pub session_hash: Option<String>,
}

#[cfg(test)]
#[allow(clippy::float_cmp)] // whole counts, exact in f64
mod tests {
    use super::*;

    struct Seen(Mutex<Vec<String>>);

    impl Observer for Seen {
        fn observe(&self, event: &Event<'_>) {
            let line = match event {
                Event::GuestDestroyed(u) => format!("destroyed {} {}", u.guest, u.reason.as_str()),
                other => format!("{other:?}"),
            };
            self.0.lock().unwrap().push(line);
        }
    }

    fn value(obs: &Observation, name: &str, labels: &[(&str, &str)]) -> f64 {
        obs.counters().value(name, labels).unwrap_or(-1.0)
    }

    #[test]
    fn a_kept_guest_destroyed_by_another_worker_drives_no_gauge_below_zero() {
        let c = ("surface", "component");
        // Worker A creates the kept guest and releases it alive; worker B finds it by name and
        // destroys it. Each gauge is back at 0, neither below, and the sum is right.
        let (a, b) = (Observation::new(), Observation::new());
        let made = Tracked::created(
            a.clone(),
            SurfaceKind::Component,
            "lf-c-x",
            "s",
            "r",
            "none",
        );
        assert_eq!(value(&a, "createos_guests_live", &[c]), 1.0);
        made.forget();
        let found = Tracked::adopted(
            b.clone(),
            SurfaceKind::Component,
            "lf-c-x",
            "s",
            "r",
            "none",
        );
        assert_eq!(value(&b, "createos_guests_live", &[c]), 1.0);
        found.finish();
        for obs in [&a, &b] {
            assert_eq!(value(obs, "createos_guests_live", &[c]), 0.0);
        }
        assert_eq!(value(&b, "createos_guests_destroyed_total", &[c]), 1.0);
    }

    #[test]
    fn another_providers_guests_are_counted_apart_and_their_records_say_so() {
        type Seen = Vec<(ProviderKind, Option<ProviderKind>)>;
        struct Keep(Arc<Mutex<Seen>>);
        impl Observer for Keep {
            fn observe(&self, _: &Event<'_>) {
                unreachable!("observe_on is overridden");
            }
            fn observe_on(&self, provider: ProviderKind, event: &Event<'_>) {
                let record = match event {
                    Event::GuestDestroyed(u) => Some(u.provider),
                    _ => None,
                };
                self.0.lock().unwrap().push((provider, record));
            }
        }
        let obs = Observation::new();
        let seen = Arc::new(Mutex::new(Vec::new()));
        obs.set_observer(Some(Arc::new(Keep(Arc::clone(&seen)))));
        let os = obs.for_provider(ProviderKind::OpenSandbox);
        assert_eq!(obs.provider(), ProviderKind::CreateOs);
        Tracked::created(
            os.clone(),
            SurfaceKind::Backend,
            "sb-1",
            "512Mi",
            "img",
            "none",
        )
        .finish();
        let b = ("surface", "backend");
        let created = "createos_guests_created_total";
        assert_eq!(
            value(&obs, created, &[b]),
            0.0,
            "CreateOS's totals unchanged"
        );
        let theirs = os.counters_of(ProviderKind::OpenSandbox);
        assert_eq!(theirs.value(created, &[b]), Some(1.0));
        assert_eq!(theirs.value("createos_guests_live", &[b]), Some(0.0));
        let seen = seen.lock().unwrap().clone();
        assert_eq!(
            seen,
            [
                (ProviderKind::OpenSandbox, None),
                (ProviderKind::OpenSandbox, Some(ProviderKind::OpenSandbox))
            ]
        );
    }

    #[test]
    fn a_usage_record_names_its_worker_and_host() {
        struct Keep(Arc<Mutex<Vec<GuestUsage>>>);
        impl Observer for Keep {
            fn observe(&self, event: &Event<'_>) {
                if let Event::GuestDestroyed(u) = event {
                    self.0.lock().unwrap().push((*u).clone());
                }
            }
        }
        let obs = Observation::new();
        let seen = Arc::new(Mutex::new(Vec::new()));
        obs.set_observer(Some(Arc::new(Keep(Arc::clone(&seen)))));
        Tracked::created(obs, SurfaceKind::Backend, "lf-w", "s", "r", "none").finish();
        let got = seen.lock().unwrap();
        assert_eq!(got[0].worker, std::process::id());
        assert_eq!(got[0].host, crate::host::host_name());
        assert!(!got[0].host.is_empty());
    }

    #[test]
    fn a_tracked_guest_is_reported_destroyed_once_with_its_first_reason() {
        let obs = Observation::new();
        let seen = Arc::new(Seen(Mutex::new(Vec::new())));
        obs.set_observer(Some(seen.clone()));
        let mut t = Tracked::created(
            obs.clone(),
            SurfaceKind::Component,
            "lf-a",
            "s-1",
            "python:3.12",
            "none",
        );
        let b = ("surface", "component");
        assert_eq!(value(&obs, "createos_guests_live", &[b]), 1.0);
        t.reason(DestroyReason::Timeout);
        t.reason(DestroyReason::Shutdown);
        t.served(&RunUsage {
            outcome: RunOutcome::TimedOut,
            bytes_returned: 12,
            flow_id: Some("f".into()),
            node_id: None,
            session_hash: None,
        });
        t.finish();
        assert_eq!(value(&obs, "createos_guests_live", &[b]), 0.0);
        assert_eq!(
            value(
                &obs,
                "createos_guests_destroyed_total",
                &[b, ("reason", "timeout")]
            ),
            1.0
        );
        assert!(value(&obs, "createos_guest_seconds_total", &[b, ("shape", "s-1")]) >= 0.0);
        let seen = seen.0.lock().unwrap().clone();
        assert_eq!(
            seen.iter().filter(|l| l.starts_with("destroyed")).count(),
            1
        );
        assert!(
            seen.contains(&"destroyed lf-a timeout".to_owned()),
            "{seen:?}"
        );
    }

    #[test]
    fn a_session_hash_is_stable_short_and_not_the_id() {
        let h = session_hash("chat-42");
        assert_eq!(h, session_hash("chat-42"));
        assert_ne!(h, session_hash("chat-43"));
        assert_eq!(h.len(), 16);
        assert!(h.bytes().all(|b| b.is_ascii_hexdigit()));
        assert!(!h.contains("chat"));
    }

    #[test]
    fn status_classes() {
        assert_eq!(
            StatusClass::of_status(Some(200), false),
            StatusClass::Success
        );
        assert_eq!(
            StatusClass::of_status(Some(429), false),
            StatusClass::ClientError
        );
        assert_eq!(
            StatusClass::of_status(Some(503), false),
            StatusClass::ServerError
        );
        assert_eq!(StatusClass::of_status(None, true), StatusClass::Redirect);
        assert_eq!(
            StatusClass::of_status(Some(302), false),
            StatusClass::Redirect
        );
        assert_eq!(StatusClass::of_status(None, false), StatusClass::NoAnswer);
    }
}
