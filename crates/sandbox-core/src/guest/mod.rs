//! A guest handle and the primitives every surface composes: create a one-shot guest, acquire
//! a named one, upload, read the egress back, exec as a stream of frames under the host
//! deadline, capture a stream into capped tail buffers, download under a cap, and destroy or
//! release.
//!
//! A [`Guest`] owns its lifecycle guard:
//!
//! - a **one-shot** guest ([`Guest::create`]) is registered with the [`Reaper`] before its
//!   create is sent; dropping the handle without [`Guest::destroy`] hands it to the reaper,
//!   and [`Reaper::shutdown`] destroys it;
//! - a **kept** guest ([`Guest::acquire`], a derived name) survives runs: dropping the handle
//!   or [`Guest::release`] lets it go alive (auto-pause bounds its cost), and shutdown leaves
//!   it for the next process to find. Only [`Guest::destroy`] destroys it.
//!
//! Every call before a program is dispatched is retried (transient failures, with backoff,
//! inside a deadline); an exec is retried only while the server declines it (429/503), and
//! nothing is dispatched once shutdown began.

mod acquire;
mod create;
mod exec;
mod files;

pub use exec::{ExecInput, ExecOutcome, ExecRun, ExecStep};

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::LOG_TARGET;
use crate::admission::Ticket;
use crate::classify;
use crate::control::{CallError, ControlPlane};
use crate::egress::EgressPolicy;
use crate::error::{Redactor, SandboxError};
use crate::kind::SurfaceKind;
use crate::observe::{DestroyReason, Observation, RunUsage, Tracked, egress_kind};
use crate::provider::createos::CreateOs;
use crate::provider::{self, EgressCheck, Labels, Lifetime, Provider, Size};
use crate::reaper::{GuestGuard, Reaper};
use crate::retry::{Backoff, retry_until};

/// What a surface asks a guest to be created with. `Debug` shows the environment's names,
/// never its values. The lifecycle turns it into the provider's neutral
/// [`provider::GuestSpec`] ([`GuestSpec::for_provider`]) for every create.
#[derive(Clone, PartialEq, Eq)]
pub struct GuestSpec {
    /// The provider's size id (a CreateOS shape id).
    pub shape: String,
    /// The image (a CreateOS rootfs name or template id, an OpenSandbox container image).
    pub rootfs: String,
    /// Environment declared at create (an exec may only use declared keys).
    pub envs: BTreeMap<String, String>,
    /// Egress policy (sent, then read back).
    pub egress: EgressPolicy,
    /// The idle backstop, in seconds ([`crate::exec::ExecLimits::auto_pause_seconds`]: the
    /// run's budget and a grace; CreateOS: its auto-pause, 60..=86400).
    pub auto_pause_after_seconds: u32,
}

impl std::fmt::Debug for GuestSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Env values may be secrets: names only.
        f.debug_struct("GuestSpec")
            .field("shape", &self.shape)
            .field("rootfs", &self.rootfs)
            .field("envs", &self.envs.keys().collect::<Vec<_>>())
            .field("egress", &self.egress)
            .field("auto_pause_after_seconds", &self.auto_pause_after_seconds)
            .finish()
    }
}

impl GuestSpec {
    /// The neutral spec a provider creates the guest `name` from, labelled `labels`.
    ///
    /// The idle backstop already covers the run's whole budget (it is that budget plus a
    /// grace), so it is also the lifetime's `budget`: a provider that expires guests on its own
    /// keeps one at least as long as any run on it may take. The size carries only its id
    /// here; the surfaces chose it from the provider's sizes.
    pub fn for_provider(&self, name: &str, labels: Labels) -> provider::GuestSpec {
        provider::GuestSpec {
            name: name.to_owned(),
            image: self.rootfs.clone(),
            size: Size {
                id: self.shape.clone(),
                vcpu: 0,
                mem_mib: 0,
            },
            envs: self.envs.clone(),
            egress: self.egress.clone(),
            lifetime: self.lifetime(),
            labels,
        }
    }

    /// How long a guest of this spec may live: see [`GuestSpec::for_provider`].
    pub fn lifetime(&self) -> Lifetime {
        let idle = Duration::from_secs(u64::from(self.auto_pause_after_seconds));
        Lifetime {
            budget: idle,
            idle_backstop: idle,
        }
    }
}

/// What every call of a guest shares: the provider, the process's reaper, the redactor, the
/// backoff, and a count of the requests made (every attempt counts). Cheap to clone; clones
/// share the count.
#[derive(Clone)]
pub struct GuestContext {
    /// The provider every call goes to.
    pub provider: Arc<dyn Provider>,
    /// The registry that guarantees one-shot guests are destroyed.
    pub reaper: Reaper,
    /// Removes the API key from every message.
    pub redactor: Redactor,
    /// Backoff for calls that are safe to repeat.
    pub backoff: Backoff,
    requests: Arc<AtomicU32>,
    /// The run's admission, when it has one (see [`GuestContext::with_ticket`]).
    ticket: Option<Ticket>,
    /// Where its guests are counted, and for which surface (see [`crate::observe`]).
    observed: Option<(Observation, SurfaceKind)>,
}

impl std::fmt::Debug for GuestContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuestContext")
            .field("reaper", &self.reaper)
            .field("backoff", &self.backoff)
            .field("requests", &self.requests())
            .finish_non_exhaustive()
    }
}

impl GuestContext {
    /// A context on CreateOS's control plane `cp` (wrapped in [`CreateOs`]), with a fresh
    /// request count. See [`GuestContext::with_provider`] for any provider.
    pub fn new(
        cp: Arc<dyn ControlPlane>,
        reaper: Reaper,
        redactor: Redactor,
        backoff: Backoff,
    ) -> Self {
        Self::with_provider(Arc::new(CreateOs::new(cp)), reaper, redactor, backoff)
    }

    /// A context on `provider`, with a fresh request count.
    pub fn with_provider(
        provider: Arc<dyn Provider>,
        reaper: Reaper,
        redactor: Redactor,
        backoff: Backoff,
    ) -> Self {
        Self {
            provider,
            reaper,
            redactor,
            backoff,
            requests: Arc::new(AtomicU32::new(0)),
            ticket: None,
            observed: None,
        }
    }

    /// The same context, whose created guests are counted in `obs` as `surface`'s: each
    /// reported created, and destroyed once with its usage record, whoever destroys it.
    #[must_use]
    pub fn with_observation(mut self, obs: Observation, surface: SurfaceKind) -> Self {
        self.observed = Some((obs, surface));
        self
    }

    /// Where its guests are counted, if anywhere.
    pub fn observation(&self) -> Option<&(Observation, SurfaceKind)> {
        self.observed.as_ref()
    }

    /// The labels its guests are created with: [`Labels::ours`], and the surface when the
    /// context knows it.
    fn labels(&self) -> Labels {
        match &self.observed {
            Some((_, surface)) => Labels::ours().with(Labels::SURFACE, surface.as_str()),
            None => Labels::ours(),
        }
    }

    /// The same context (sharing its request count) for a run admitted with `ticket`: a create
    /// through it waits for another guest slot when one whose outcome is unknown keeps its
    /// own, and a create declined for the account's quota (429) keeps trying until the
    /// ticket's wait ends (see [`Guest::create_admitted`]).
    #[must_use]
    pub fn with_ticket(mut self, ticket: Ticket) -> Self {
        self.ticket = Some(ticket);
        self
    }

    /// The run's admission, if any.
    pub fn ticket(&self) -> Option<&Ticket> {
        self.ticket.as_ref()
    }

    /// Control-plane requests made through this context so far.
    pub fn requests(&self) -> u32 {
        self.requests.load(Ordering::Relaxed)
    }

    fn count(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    /// When a guest whose create was just answered must be ready: the provider's own
    /// readiness budget from now ([`provider::Readiness`], e.g. `OPEN_SANDBOX_READY_SECONDS`),
    /// or `fallback` (the run's control-plane deadline) for a provider without one.
    fn ready_by(&self, fallback: Instant) -> Instant {
        self.provider
            .readiness()
            .map_or(fallback, |r| Instant::now() + r.budget)
    }

    /// The deadline of the calls that follow a new guest's readiness wait: `deadline`, or, for
    /// a provider with its own readiness budget (which may have run past `deadline`), at
    /// least a control-plane budget from now.
    pub(crate) fn after_ready(&self, deadline: Instant) -> Instant {
        if self.provider.readiness().is_some() {
            deadline.max(Instant::now() + self.backoff.budget)
        } else {
            deadline
        }
    }

    /// How a message about a guest that was not ready in time names the budget: `in time`
    /// for a provider without a setting of its own, else the setting and its value, and the
    /// advice to raise it (empty without one).
    fn readiness_words(&self) -> (String, String) {
        self.provider.readiness().map_or_else(
            || ("in time".to_owned(), String::new()),
            |r| {
                (
                    format!("within {}={}s", r.setting, r.budget.as_secs()),
                    format!(
                        " Raise {} if the server needs longer (a Kubernetes pod pulling its \
                         image, a slow execd start).",
                        r.setting
                    ),
                )
            },
        )
    }

    fn closed(&self) -> bool {
        self.reaper.is_closed()
    }

    fn before_dispatch(&self, op: &str, e: &CallError) -> SandboxError {
        classify::before_dispatch(self.provider.kind(), op, e, self.closed(), &self.redactor)
    }

    /// Retries `op` on transient failures until `deadline`, counting every attempt.
    async fn retried<T, F, Fut>(&self, what: &str, deadline: Instant, op: F) -> Result<T, CallError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, CallError>>,
    {
        let (res, _) = retry_until(
            &self.backoff,
            deadline,
            what,
            |e| e.is_transient() && !self.closed(),
            |_| {
                self.count();
                op()
            },
        )
        .await;
        res
    }
}

/// How a guest ends.
enum Hold {
    /// Registered with the reaper: destroyed when let go.
    OneShot(GuestGuard),
    /// Survives runs: released alive when let go.
    Kept(KeptTrack),
}

/// A kept guest's usage account: reported destroyed only when this handle destroys it (a
/// guest released alive is forgotten, not reported). Created by this process: its create was
/// reported; found by name: its record counts from when this process found it.
/// (Boxed: a usage record is large next to a one-shot guest's guard.)
struct KeptTrack(std::sync::Mutex<Option<Box<Tracked>>>);

impl KeptTrack {
    fn new(cx: &GuestContext, spec: &GuestSpec, name: &str, created: bool) -> Self {
        let tracked = cx.observed.as_ref().map(|(obs, surface)| {
            let (obs, egress) = (obs.clone(), egress_kind(&spec.egress));
            if created {
                Tracked::created(obs, *surface, name, &spec.shape, &spec.rootfs, egress)
            } else {
                Tracked::adopted(obs, *surface, name, &spec.shape, &spec.rootfs, egress)
            }
        });
        Self(std::sync::Mutex::new(tracked.map(Box::new)))
    }

    fn with(&self, f: impl FnOnce(&mut Tracked)) {
        if let Some(t) = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_mut()
        {
            f(t);
        }
    }

    fn take(&self) -> Option<Tracked> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
            .map(|b| *b)
    }
}

impl Drop for KeptTrack {
    fn drop(&mut self) {
        if let Some(t) = self.take() {
            t.forget();
        }
    }
}

/// A guest this process uses. See the module docs for what dropping it does.
pub struct Guest {
    cx: GuestContext,
    name: String,
    id: String,
    hold: Hold,
    /// Created by this handle's create or acquire (not found by name).
    created: bool,
    /// The policy the create response's `egress` matched: the control plane's stored record
    /// of this guest, the same one `GET …/egress` reads (see [`Guest::verify_egress`]).
    confirmed_egress: Option<EgressPolicy>,
    /// When the request of the last call that restarts the guest's idle clock was sent (see
    /// [`Guest::last_accepted`]).
    last_accepted: std::sync::Mutex<Instant>,
    /// How long its create waited for the account's quota (declined with 429).
    quota_waited: Duration,
}

impl std::fmt::Debug for Guest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guest")
            .field("name", &self.name)
            .field("id", &self.id)
            .field("kept", &self.is_kept())
            .finish_non_exhaustive()
    }
}

pub(crate) fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Guest {
    /// A handle on the guest `name` (`id`), whose last call that restarts its idle clock was
    /// sent at `accepted`.
    fn handle(
        cx: &GuestContext,
        name: &str,
        id: &str,
        hold: Hold,
        created: bool,
        accepted: Instant,
    ) -> Guest {
        Guest {
            cx: cx.clone(),
            name: name.to_owned(),
            id: id.to_owned(),
            hold,
            created,
            confirmed_egress: None,
            last_accepted: std::sync::Mutex::new(accepted),
            quota_waited: Duration::ZERO,
        }
    }

    /// Notes that a call restarting the guest's idle clock, sent at `at`, was accepted.
    fn accepted_at(&self, at: Instant) {
        let mut last = self
            .last_accepted
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *last = (*last).max(at);
    }

    /// When the request of the last call that restarts the control plane's idle clock of this
    /// guest (and so its auto-pause backstop) was sent: its create, a resume, or an accepted
    /// exec (`createos-api.md` §4.6: the clock is touched when an exec is accepted). Measured
    /// at the request, not the answer, so it is never later than the control plane's own
    /// mark; uploads and other calls are not counted (the contract does not say they touch it).
    pub fn last_accepted(&self) -> Instant {
        *self
            .last_accepted
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The guest's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The guest's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// True when this handle's [`Guest::create`] or [`Guest::acquire`] created the guest;
    /// false for a guest that [`Guest::acquire`] found by name (and adopted).
    pub fn was_created(&self) -> bool {
        self.created
    }

    /// How long this guest's create waited for the account's quota (a create declined with 429
    /// under [`Guest::create_admitted`]): admission time, which the run's later steps are not
    /// charged for.
    pub fn quota_waited(&self) -> Duration {
        self.quota_waited
    }

    /// True for a guest that survives runs (acquired by name).
    pub fn is_kept(&self) -> bool {
        matches!(self.hold, Hold::Kept(_))
    }

    /// The context the guest's calls go through.
    pub fn context(&self) -> &GuestContext {
        &self.cx
    }

    /// Sends the guest's further calls through `cx` (a pooled guest handed to a run counts
    /// the run's requests from then on). `cx` must share the guest's control plane and reaper.
    pub(crate) fn rebind(&mut self, cx: GuestContext) {
        self.cx = cx;
    }

    fn what_happens_on_refusal(&self) -> &'static str {
        if self.is_kept() && !self.cx.provider.replaces_drifted_kept_guests() {
            "it was left as it is and not used"
        } else if self.is_kept() {
            "it was destroyed and not used; the next lookup creates it again"
        } else {
            "it was destroyed and the run refused rather than run code under a policy nobody \
             asked for"
        }
    }

    /// Whether this guest's create response already showed `policy` as its egress. That
    /// answer is the control plane's record of the guest, not an echo of the request: it
    /// carries what only the server assigns (id, status, address, sizes, `spawn_ms`) and lacks
    /// `ingress_enabled`, which the request sent, and the create holds until the guest runs
    /// (`createos-api.md` §2.6, create); and `GET …/egress` reads the same stored list, which is
    /// why neither call proves enforcement (a hostname rule is returned by both and enforced by
    /// neither, §4.1; hostname rules are refused before any create for that reason). So a
    /// create response whose `egress` matched is the read-back; one without `egress` is not,
    /// and [`Guest::verify_egress`] then reads it with `GET`.
    pub fn egress_confirmed(&self, policy: &EgressPolicy) -> bool {
        self.confirmed_egress.as_ref() == Some(policy)
    }

    /// Makes sure the guest's egress is `policy` before any program runs: done already when
    /// its create response showed it ([`Guest::egress_confirmed`], no request); otherwise
    /// reads it back (retrying transient failures until `deadline`) and refuses when it is not
    /// `policy`.
    pub async fn verify_egress(
        &self,
        policy: &EgressPolicy,
        deadline: Instant,
    ) -> Result<(), SandboxError> {
        if self.egress_confirmed(policy) {
            return Ok(());
        }
        let cx = &self.cx;
        let checked = cx
            .retried("egress read-back", deadline, || {
                let (provider, id) = (cx.provider.clone(), self.id.clone());
                let policy = policy.clone();
                async move { provider.verify_egress(id, policy).await }
            })
            .await
            .map_err(|e| cx.before_dispatch("egress read-back", &e))?;
        let EgressCheck::Differs(got) = checked else {
            return Ok(());
        };
        let msg = format!(
            "guest {} reports egress {got}, but {} was requested; {}",
            self.name,
            cx.provider.describe_egress(policy),
            self.what_happens_on_refusal()
        );
        tracing::error!(target: LOG_TARGET, guest = %self.name, "{msg}");
        Err(SandboxError::refused(msg).redacted(&cx.redactor))
    }

    /// Destroys the guest now (one-shot or kept), with retries inside the backoff budget. A
    /// one-shot guest whose destroy fails stays with the reaper, which keeps trying.
    pub async fn destroy(self) -> Result<Duration, CallError> {
        let Guest {
            cx, name, id, hold, ..
        } = self;
        cx.count();
        match hold {
            Hold::OneShot(guard) => guard.destroy(&cx.backoff).await,
            Hold::Kept(track) => {
                let t0 = Instant::now();
                let deadline = t0 + cx.backoff.budget;
                let (res, _) = retry_until(
                    &cx.backoff,
                    deadline,
                    "destroy",
                    CallError::is_transient,
                    |_| cx.provider.destroy(id.clone()),
                )
                .await;
                res.map(|()| {
                    tracing::info!(target: LOG_TARGET, guest = %name, "kept guest destroyed");
                    if let Some(t) = track.take() {
                        t.finish();
                    }
                    t0.elapsed()
                })
            }
        }
    }

    /// Sets why the guest will be destroyed, for its usage record (the first reason set wins;
    /// shutdown and pool retirements set theirs too). A kept guest's counts only if this
    /// handle destroys it.
    pub fn set_destroy_reason(&self, reason: DestroyReason) {
        match &self.hold {
            Hold::OneShot(guard) => guard.note(|t| t.reason(reason)),
            Hold::Kept(track) => track.with(|t| t.reason(reason)),
        }
    }

    /// Adds a run it served to the guest's usage record (a kept guest's: the runs of this
    /// handle).
    pub fn note_run(&self, run: &RunUsage) {
        match &self.hold {
            Hold::OneShot(guard) => guard.note(|t| t.served(run)),
            Hold::Kept(track) => track.with(|t| t.served(run)),
        }
    }

    /// Lets the guest go: a one-shot guest is handed to the reaper, which destroys it off the
    /// critical path; a kept guest is left alive for the next run (auto-pause bounds its
    /// cost). Dropping the handle does the same.
    pub fn release(self) {
        if let Hold::OneShot(guard) = self.hold {
            guard.release_to_reaper();
        }
    }
}
