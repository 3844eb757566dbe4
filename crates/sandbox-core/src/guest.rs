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

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::time::Instant;

use crate::LOG_TARGET;
use crate::admission::{GuestSlot, Ticket};
use crate::classify::{self, Stage};
use crate::control::{
    CallError, CallFailure, ControlPlane, CreateGuest, ExecFrame, ExecRequest, ExecStream,
    GuestInfo, GuestStatus, ProcessSpec,
};
use crate::egress::EgressPolicy;
use crate::error::{ErrorKind, Redactor, SandboxError};
use crate::exec::{Command, EXIT_TIMED_OUT, ExecLimits, classify_exit};
use crate::kind::SurfaceKind;
use crate::names::{is_valid_name, mint_name};
use crate::observe::{DestroyReason, Observation, RunUsage, Tracked, egress_kind};
use crate::output::{Captured, TailBuffer};
use crate::reaper::{GuestGuard, Reaper};
use crate::retry::{Backoff, attempt_floor, clipped, retry_until, worth_retrying};
use crate::settings::ENV_ADMISSION_WAIT;

/// What a guest is created with. `Debug` shows the environment's names, never its values.
#[derive(Clone, PartialEq, Eq)]
pub struct GuestSpec {
    /// Shape id.
    pub shape: String,
    /// Rootfs name or template id.
    pub rootfs: String,
    /// Environment declared at create (an exec may only use declared keys).
    pub envs: BTreeMap<String, String>,
    /// Egress policy (sent, then read back).
    pub egress: EgressPolicy,
    /// Idle auto-pause backstop, in seconds (60..=86400).
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
    fn create_request(&self, name: &str) -> CreateGuest {
        CreateGuest {
            name: name.to_owned(),
            shape: self.shape.clone(),
            rootfs: self.rootfs.clone(),
            envs: self.envs.clone(),
            egress: self.egress.rules(),
            auto_pause_after_seconds: self.auto_pause_after_seconds,
        }
    }
}

/// What every call of a guest shares: the control plane, the process's reaper, the redactor,
/// the backoff, and a count of the requests made (every attempt counts). Cheap to clone; clones
/// share the count.
#[derive(Clone)]
pub struct GuestContext {
    /// The control plane.
    pub cp: Arc<dyn ControlPlane>,
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
    /// A context with a fresh request count.
    pub fn new(
        cp: Arc<dyn ControlPlane>,
        reaper: Reaper,
        redactor: Redactor,
        backoff: Backoff,
    ) -> Self {
        Self {
            cp,
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

    fn closed(&self) -> bool {
        self.reaper.is_closed()
    }

    fn before_dispatch(&self, op: &str, e: &CallError) -> SandboxError {
        classify::before_dispatch(op, e, self.closed(), &self.redactor)
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
struct KeptTrack(std::sync::Mutex<Option<Tracked>>);

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
        Self(std::sync::Mutex::new(tracked))
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

/// Environment and standard input of one exec.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ExecInput {
    /// Environment for this command (keys must have been declared at create).
    pub env: BTreeMap<String, String>,
    /// Standard input.
    pub stdin: String,
}

impl std::fmt::Debug for ExecInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecInput")
            .field("env", &self.env.keys().collect::<Vec<_>>())
            .field("stdin_bytes", &self.stdin.len())
            .finish()
    }
}

/// One step of a running exec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecStep {
    /// A frame, in the order the control plane sent it. After an [`ExecFrame::Exit`] the run
    /// is over.
    Frame(ExecFrame),
    /// The stream ended (after the exit frame, or without one).
    End,
    /// The host deadline passed with the stream still open.
    HostDeadline,
    /// The stream broke after the program was dispatched: it may have run.
    Broken(CallError),
}

/// A streaming exec under the host deadline. Dropping it stops the exec (the HTTP stream
/// closes and the control plane kills the command); the guest stays with its [`Guest`].
pub struct ExecRun {
    stream: Option<ExecStream>,
    started: Instant,
    host_deadline: Instant,
    host_budget: Duration,
    frames: u64,
}

impl std::fmt::Debug for ExecRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecRun")
            .field("frames", &self.frames)
            .field("host_budget", &self.host_budget)
            .field("open", &self.stream.is_some())
            .finish_non_exhaustive()
    }
}

impl ExecRun {
    /// The next step. After a terminal step ([`ExecStep::End`], [`ExecStep::HostDeadline`],
    /// [`ExecStep::Broken`], or an exit frame) the stream is closed and every further call
    /// answers [`ExecStep::End`].
    pub async fn next(&mut self) -> ExecStep {
        let Some(stream) = self.stream.as_mut() else {
            return ExecStep::End;
        };
        let step = match tokio::time::timeout_at(self.host_deadline, stream.next()).await {
            Err(_) => ExecStep::HostDeadline,
            Ok(None) => ExecStep::End,
            Ok(Some(Ok(frame))) => {
                self.frames += 1;
                ExecStep::Frame(frame)
            }
            Ok(Some(Err(e))) => ExecStep::Broken(e),
        };
        if !matches!(step, ExecStep::Frame(ref f) if !matches!(f, ExecFrame::Exit(_))) {
            self.stream = None;
        }
        step
    }

    /// Frames received so far (heartbeats included).
    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// Time since the exec was first dispatched (declined attempts included).
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// The host budget this run is under.
    pub fn host_budget(&self) -> Duration {
        self.host_budget
    }

    /// The steps as a stream, ending after the terminal step. Dropping it stops the exec.
    pub fn into_stream(self) -> BoxStream<'static, ExecStep> {
        futures::stream::unfold((self, false), |(mut run, over)| async move {
            if over {
                return None;
            }
            let step = run.next().await;
            let last = run.stream.is_none();
            Some((step, (run, last)))
        })
        .boxed()
    }
}

/// What [`Guest::capture`] collected from a finished exec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutcome {
    /// Captured standard output (tail, with a marker if truncated).
    pub stdout: Captured,
    /// Captured standard error; an agent error that came with an exit status is appended.
    pub stderr: Captured,
    /// The classified exit code ([`EXIT_TIMED_OUT`] for a timeout).
    pub exit_code: i32,
    /// The raw exit status, if one arrived.
    pub raw_exit_code: Option<i32>,
    /// The host deadline fired with frames already received.
    pub host_timed_out: bool,
    /// Exec wall time, dispatch to end, in milliseconds.
    pub exec_ms: u64,
}

impl ExecOutcome {
    /// How the run went: timed out, exited 0, or failed.
    pub fn run_outcome(&self) -> crate::observe::RunOutcome {
        use crate::observe::RunOutcome;
        if self.exit_code == EXIT_TIMED_OUT || self.host_timed_out {
            RunOutcome::TimedOut
        } else if self.exit_code == 0 {
            RunOutcome::Ok
        } else {
            RunOutcome::ProgramFailed
        }
    }

    /// The output bytes the guest sent (standard output and error, before truncation).
    pub fn bytes_returned(&self) -> u64 {
        self.stdout.total_bytes + self.stderr.total_bytes
    }
}

/// The largest exit status a process can have; anything else from the agent is not one.
const MAX_EXIT_STATUS: i64 = 255;
/// Longest pause between two status reads while a guest resumes or starts.
const STATUS_POLL_MAX: Duration = Duration::from_secs(1);
/// First pause between two status reads.
const STATUS_POLL_MIN: Duration = Duration::from_millis(50);

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

    /// Creates a one-shot guest named `prefix` + random characters, retrying transient
    /// failures with a fresh name each time until `deadline`; every attempt is clipped to what
    /// is left of that budget. A create whose outcome is unknown (no answer, or an attempt cut
    /// at the deadline) leaves its name with the reaper, which finds and destroys the guest;
    /// so does a cancelled call. A create response that says `running` and shows the egress is
    /// the read-back (see [`Guest::egress_confirmed`]); one that says anything else is waited
    /// for until the guest runs (before `deadline`), and its egress is then read back with
    /// `GET`. An egress that differs from the request destroys the guest and refuses.
    pub async fn create(
        cx: &GuestContext,
        spec: &GuestSpec,
        prefix: &str,
        deadline: Instant,
    ) -> Result<Guest, SandboxError> {
        Self::create_within(cx, spec, prefix, deadline, true, None).await
    }

    /// [`Guest::create`] of an admitted run's guest, holding `slot` (its place under the
    /// process's cap, see [`crate::admission`]) for as long as the guest may exist: the slot
    /// goes with the guest's reaper registration and is given back once the guest is gone. A
    /// retry after a create whose outcome is unknown takes another slot through the context's
    /// [`Ticket`] (the first guest may exist and keeps its own). A create the control plane
    /// declines with 429 (the account is at its quota, or rate-limited) keeps trying past
    /// `deadline` until the ticket's wait ends ([`Guest::quota_waited`] says how long it
    /// waited), and is then refused as [`ErrorKind::AtCapacity`].
    pub async fn create_admitted(
        cx: &GuestContext,
        spec: &GuestSpec,
        prefix: &str,
        deadline: Instant,
        slot: GuestSlot,
    ) -> Result<Guest, SandboxError> {
        Self::create_within(cx, spec, prefix, deadline, true, Some(slot)).await
    }

    /// [`Guest::create`] with a single attempt, bounded by `deadline` (the warm pool's: its own
    /// backoff spaces the next attempt), holding `slot` when given.
    pub(crate) async fn create_once(
        cx: &GuestContext,
        spec: &GuestSpec,
        prefix: &str,
        deadline: Instant,
        slot: Option<GuestSlot>,
    ) -> Result<Guest, SandboxError> {
        Self::create_within(cx, spec, prefix, deadline, false, slot).await
    }

    #[allow(clippy::too_many_lines)] // one loop: each attempt and what its failure means
    async fn create_within(
        cx: &GuestContext,
        spec: &GuestSpec,
        prefix: &str,
        deadline: Instant,
        retry: bool,
        mut slot: Option<GuestSlot>,
    ) -> Result<Guest, SandboxError> {
        let mut attempt = 0u32;
        let started = Instant::now();
        let admitted = slot.is_some();
        // A 429 moves the end of the attempts to the end of the run's admission wait.
        let quota_until = cx.ticket.as_ref().map(Ticket::until).filter(|_| admitted);
        let mut until = deadline;
        let mut quota_waited = Duration::ZERO;
        loop {
            if admitted && slot.is_none() {
                // The previous attempt's guest may exist and keeps its slot.
                if let Some(ticket) = &cx.ticket {
                    slot = Some(ticket.guest_slot(Some(until)).await?);
                }
            }
            let name = mint_name(prefix);
            let Some(mut guard) = cx
                .reaper
                .register(cx.cp.clone(), &name, cx.redactor.clone())
            else {
                if attempt > 0 {
                    // This run was already under way when shutdown began.
                    return Err(classify::shut_down(Stage::BeforeDispatch));
                }
                return Err(no_new_guests());
            };
            if let Some(s) = slot.take() {
                guard.hold_slot(s);
            }
            cx.count();
            let sent = Instant::now();
            match clipped(until, "create", cx.cp.create(spec.create_request(&name))).await {
                Ok(info) => {
                    guard.set_id(&info.id);
                    if let Some((obs, surface)) = &cx.observed {
                        guard.track(Tracked::created(
                            obs.clone(),
                            *surface,
                            &name,
                            &spec.shape,
                            &spec.rootfs,
                            egress_kind(&spec.egress),
                        ));
                    }
                    let hold = Hold::OneShot(guard);
                    let mut guest = Self::handle(cx, &name, &info.id, hold, true, sent);
                    guest.quota_waited = quota_waited;
                    return guest.created_as(spec, info, until).await;
                }
                Err(e) => {
                    let retryable = e.is_transient();
                    if e.is_declined() || !retryable {
                        // The server answered and did not take the request on: its slot is
                        // this run's again.
                        slot = guard.take_slot();
                        guard.disarm_not_created();
                    } else {
                        // Outcome unknown (no answer, or none before the budget ran out): the
                        // guest may exist. The reaper looks the name up and destroys whatever
                        // it finds.
                        tracing::warn!(
                            target: LOG_TARGET,
                            guest = %name,
                            error = %cx.redactor.apply(&e.message),
                            "create response lost; the guest will be looked up by name and destroyed"
                        );
                        drop(guard);
                    }
                    let mut delay = cx.backoff.delay_after(attempt, e.retry_after);
                    attempt += 1;
                    let quota = e.failure == CallFailure::Status(429);
                    if let Some(q) = quota_until.filter(|_| quota) {
                        // The account's quota: wait for room inside the run's admission wait,
                        // the last attempt no later than its floor before the end.
                        until = until.max(q);
                        let floor = attempt_floor(until.saturating_duration_since(started));
                        let room = until.saturating_duration_since(Instant::now() + floor);
                        delay = delay.min(room);
                    }
                    if !retry || !retryable || cx.closed() || !worth_retrying(delay, started, until)
                    {
                        let err = cx.before_dispatch("create", &e);
                        if quota && quota_until.is_some() && !cx.closed() {
                            return Err(quota_exhausted(&err, started.elapsed()));
                        }
                        return Err(err);
                    }
                    tracing::info!(
                        target: LOG_TARGET,
                        attempt,
                        delay_ms = ms(delay),
                        error = %cx.redactor.apply(&e.message),
                        "retrying create with a fresh name"
                    );
                    tokio::time::sleep(delay).await;
                    if quota {
                        quota_waited += delay;
                    }
                }
            }
        }
    }

    /// The checks after a one-shot create answered `info`: shutdown, the egress it shows, and
    /// its status (a guest that does not run yet is waited for, and its egress is then read
    /// back rather than trusted).
    async fn created_as(
        mut self,
        spec: &GuestSpec,
        info: GuestInfo,
        deadline: Instant,
    ) -> Result<Guest, SandboxError> {
        let cx = self.cx.clone();
        if cx.closed() {
            // Shutdown began while the create was in flight: nothing is dispatched any more,
            // and the guest is destroyed (once: shutdown may be at it).
            let _ = self.destroy().await;
            return Err(classify::shut_down(Stage::BeforeDispatch));
        }
        if let Some(eg) = &info.egress
            && !spec.egress.matches(Some(eg))
        {
            let msg = format!(
                "guest {} was created with egress {eg:?}, but {} was requested; it was \
                 destroyed and the run refused",
                self.name, spec.egress
            );
            let _ = self.destroy().await;
            return Err(SandboxError::refused(msg).redacted(&cx.redactor));
        }
        if info.status == GuestStatus::Running {
            if info.egress.is_some() {
                self.confirmed_egress = Some(spec.egress.clone());
            }
            return Ok(self);
        }
        // Not running yet (`creating`, or anything else): the answer is not the stored record
        // of a running guest, so its egress proves nothing. Wait until it runs; the caller then
        // reads the egress back with `GET` (`confirmed_egress` stays unset).
        tracing::info!(
            target: LOG_TARGET,
            guest = %self.name,
            status = %info.status,
            "create answered before the guest runs; waiting for it, then reading its egress back"
        );
        match self.until_running(info, deadline).await {
            Ok(Some(_)) => Ok(self),
            Ok(None) => {
                let name = self.name.clone();
                let _ = self.destroy().await;
                Err(SandboxError::new(
                    ErrorKind::Transient,
                    format!(
                        "guest {name} went away before it ran; nothing was started. Retrying \
                         later may succeed"
                    ),
                ))
            }
            Err(e) => {
                let _ = self.destroy().await;
                Err(e)
            }
        }
    }

    /// Acquires the named guest `name` (a derived name, see [`crate::names::derived_name`]):
    /// finds it by name; if it is paused, resumes it and waits until it runs; reads its
    /// egress and declared environment keys back and refuses on drift (leaving it as it is);
    /// otherwise creates it. A create answered 409 (another task or process created it
    /// first) or whose response was lost is followed by another lookup that adopts the guest.
    /// Everything happens before `deadline`, except that a create the control plane declines
    /// with 429 (the account's quota) keeps trying until the end of the context's admission
    /// wait, when it has a [`Ticket`] (as [`Guest::create_admitted`] does). The guest is kept:
    /// see [`Guest::release`].
    pub async fn acquire(
        cx: &GuestContext,
        spec: &GuestSpec,
        name: &str,
        deadline: Instant,
    ) -> Result<Guest, SandboxError> {
        let mut quota_waited = Duration::ZERO;
        let mut guest = Self::acquire_within(cx, spec, name, deadline, &mut quota_waited).await?;
        guest.quota_waited = quota_waited;
        Ok(guest)
    }

    #[allow(clippy::too_many_lines)] // one loop: each round and what its outcome means
    async fn acquire_within(
        cx: &GuestContext,
        spec: &GuestSpec,
        name: &str,
        mut deadline: Instant,
        quota_waited: &mut Duration,
    ) -> Result<Guest, SandboxError> {
        if !is_valid_name(name) {
            return Err(SandboxError::refused(format!(
                "{name:?} is not a guest name (1 to 22 characters of [a-z0-9-])"
            )));
        }
        let mut round = 0u32;
        let started = Instant::now();
        loop {
            if cx.closed() {
                return Err(no_new_guests());
            }
            let found = cx
                .retried("guest lookup", deadline, || {
                    cx.cp.find_by_name(name.to_owned())
                })
                .await
                .map_err(|e| cx.before_dispatch(&format!("lookup of guest {name}"), &e))?
                // A destroyed guest no longer holds its name (a listing keeps showing it):
                // the name is free to create again.
                .filter(|g| g.status != GuestStatus::Destroyed);
            let mut wait_reason = None;
            match found {
                Some(info) if !info.is_terminal() => {
                    if let Some(guest) = Self::adopt(cx, spec, name, info, deadline).await? {
                        return Ok(guest);
                    }
                    wait_reason = Some("it went away while it was being resumed");
                }
                Some(info) => {
                    // Being destroyed: the name stays taken until it is gone.
                    tracing::info!(
                        target: LOG_TARGET,
                        guest = name,
                        status = %info.status,
                        "named guest is being destroyed; waiting for the name to be free"
                    );
                    wait_reason = Some("its previous guest is still being destroyed");
                }
                None => {
                    cx.count();
                    let sent = Instant::now();
                    let created =
                        clipped(deadline, "create", cx.cp.create(spec.create_request(name))).await;
                    match created {
                        Ok(info) => {
                            let hold = Hold::Kept(KeptTrack::new(cx, spec, name, true));
                            let guest = Self::handle(cx, name, &info.id, hold, true, sent);
                            if let Some(eg) = &info.egress
                                && !spec.egress.matches(Some(eg))
                            {
                                // Nobody can use a guest created under the wrong policy, and
                                // it would hold the name: destroy it.
                                let msg = format!(
                                    "guest {name} was created with egress {eg:?}, but {} was \
                                     requested; it was destroyed and not used",
                                    spec.egress
                                );
                                guest.set_destroy_reason(DestroyReason::Error);
                                let _ = guest.destroy().await;
                                return Err(SandboxError::refused(msg).redacted(&cx.redactor));
                            }
                            if info.status != GuestStatus::Running
                                && guest.until_running(info, deadline).await?.is_none()
                            {
                                wait_reason = Some("it went away before it ran");
                            } else {
                                guest.verify_egress(&spec.egress, deadline).await?;
                                return Ok(guest);
                            }
                        }
                        Err(e) if e.is_conflict() => {
                            tracing::info!(
                                target: LOG_TARGET,
                                guest = name,
                                "the name was taken meanwhile; adopting that guest"
                            );
                            wait_reason = Some("another caller was creating it");
                        }
                        Err(e) if e.is_transient() && !e.is_declined() => {
                            tracing::warn!(
                                target: LOG_TARGET,
                                guest = name,
                                error = %cx.redactor.apply(&e.message),
                                "create response lost; looking the guest up again"
                            );
                            wait_reason = Some("its create answered nothing usable");
                        }
                        Err(e) if e.is_declined() => {
                            let mut delay = cx.backoff.delay_after(round, e.retry_after);
                            let quota = e.failure == CallFailure::Status(429);
                            let quota_until =
                                cx.ticket.as_ref().map(Ticket::until).filter(|_| quota);
                            if let Some(q) = quota_until {
                                // The account's quota: wait for room inside the admission wait.
                                deadline = deadline.max(q);
                                let window = deadline.saturating_duration_since(started);
                                let room = deadline.saturating_duration_since(
                                    Instant::now() + attempt_floor(window),
                                );
                                delay = delay.min(room);
                            }
                            if cx.closed() || !worth_retrying(delay, started, deadline) {
                                let err = cx.before_dispatch("create", &e);
                                if quota_until.is_some() && !cx.closed() {
                                    return Err(quota_exhausted(&err, started.elapsed()));
                                }
                                return Err(err);
                            }
                            tokio::time::sleep(delay).await;
                            if quota {
                                *quota_waited += delay;
                            }
                        }
                        Err(e) => return Err(cx.before_dispatch("create", &e)),
                    }
                }
            }
            if let Some(reason) = wait_reason {
                let delay = cx.backoff.delay(round);
                if !worth_retrying(delay, started, deadline) {
                    return Err(SandboxError::new(
                        ErrorKind::Transient,
                        format!(
                            "guest {name} could not be acquired in time: {reason}. Nothing was \
                             started; retrying later may succeed"
                        ),
                    ));
                }
                tokio::time::sleep(delay).await;
            }
            round += 1;
        }
    }

    /// Brings a found guest to `running` and checks it still has the policy asked for.
    /// `Ok(None)` when it went away meanwhile.
    async fn adopt(
        cx: &GuestContext,
        spec: &GuestSpec,
        name: &str,
        info: GuestInfo,
        deadline: Instant,
    ) -> Result<Option<Guest>, SandboxError> {
        // Its idle clock ran before this process saw it: count from the moment it was found.
        let hold = Hold::Kept(KeptTrack::new(cx, spec, name, false));
        let guest = Self::handle(cx, name, &info.id, hold, false, Instant::now());
        let Some(info) = guest.until_running(info, deadline).await? else {
            return Ok(None);
        };
        let want: BTreeSet<&str> = spec.envs.keys().map(String::as_str).collect();
        let have: Option<BTreeSet<&str>> = info
            .envs
            .as_ref()
            .map(|v| v.iter().map(String::as_str).collect());
        if have.as_ref() != Some(&want) {
            let have = have.map_or_else(|| "(not reported)".to_owned(), |h| format!("{h:?}"));
            return Err(SandboxError::refused(format!(
                "guest {name} was created with the environment keys {have}, but {want:?} are \
                 declared now; it was left as it is and not used. Destroy it to recreate it \
                 with the new keys"
            ))
            .redacted(&cx.redactor));
        }
        guest.verify_egress(&spec.egress, deadline).await?;
        let backstop = (info.auto_pause_after_seconds, spec.auto_pause_after_seconds);
        if !guest.cover_backstop(backstop, deadline).await? {
            return Ok(None);
        }
        Ok(Some(guest))
    }

    /// Raises an adopted guest's idle auto-pause backstop from `have` to `want` seconds when
    /// it is lower. The run that created the guest set it for its own timeout, and the control
    /// plane touches the activity clock only when an exec is accepted, so a longer run would
    /// be paused mid-way; a higher one is left as it is (it only costs idle time), and so is
    /// none (auto-pause off). Retried on transient failures until `deadline`; a failure runs
    /// nothing (the guest is left as it is). `Ok(false)` when the guest stopped running
    /// meanwhile (409, 404): the caller looks it up again.
    async fn cover_backstop(
        &self,
        (have, want): (Option<u32>, u32),
        deadline: Instant,
    ) -> Result<bool, SandboxError> {
        let Some(have) = have.filter(|&have| have < want) else {
            return Ok(true);
        };
        let cx = &self.cx;
        let op = format!(
            "auto-pause update of guest {} ({have}s, too short for this run, to {want}s)",
            self.name
        );
        let set = cx
            .retried(&op, deadline, || {
                cx.cp.set_auto_pause(self.id.clone(), want)
            })
            .await;
        match set {
            Ok(info) => match info.auto_pause_after_seconds {
                Some(now) if now < want => Err(SandboxError::refused(format!(
                    "guest {}'s auto-pause backstop is still {now}s after it was set to {want}s, \
                     too short for this run; it was left as it is and not used",
                    self.name
                ))),
                _ => {
                    tracing::info!(
                        target: LOG_TARGET,
                        guest = %self.name,
                        from = have,
                        to = want,
                        "raised the adopted guest's auto-pause backstop to cover this run"
                    );
                    Ok(true)
                }
            },
            Err(e) if e.is_conflict() || e.is_not_found() => Ok(false),
            Err(e) => Err(cx.before_dispatch(&op, &e)),
        }
    }

    /// Resumes the guest if it is paused and polls until it runs, bounded by `deadline` (each
    /// call clipped to it). `info` is its last known state. `Ok(None)` when the guest is gone
    /// (404 or a terminal status).
    async fn until_running(
        &self,
        mut info: GuestInfo,
        deadline: Instant,
    ) -> Result<Option<GuestInfo>, SandboxError> {
        let (cx, name) = (&self.cx, self.name.as_str());
        let id = self.id.clone();
        let mut poll = STATUS_POLL_MIN;
        let mut attempt = 0u32;
        loop {
            if cx.closed() {
                return Err(classify::shut_down(Stage::BeforeDispatch));
            }
            match info.status {
                GuestStatus::Running => return Ok(Some(info)),
                ref s if s.is_terminal() => return Ok(None),
                GuestStatus::Paused => {
                    tracing::info!(target: LOG_TARGET, guest = name, "resuming a paused guest");
                    cx.count();
                    let sent = Instant::now();
                    match clipped(deadline, "resume", cx.cp.resume(id.clone())).await {
                        Ok(next) => {
                            self.accepted_at(sent);
                            info = next;
                            continue;
                        }
                        Err(e) if e.is_not_found() => return Ok(None),
                        // Still pausing, or resumed by someone else: read the status again.
                        Err(e) if e.is_conflict() || e.is_transient() => {
                            let delay = cx.backoff.delay_after(attempt, e.retry_after);
                            attempt += 1;
                            poll = poll.max(delay);
                        }
                        Err(e) => {
                            return Err(cx.before_dispatch(&format!("resume of guest {name}"), &e));
                        }
                    }
                }
                _ => {}
            }
            if Instant::now() + poll >= deadline {
                return Err(SandboxError::new(
                    ErrorKind::Transient,
                    format!(
                        "guest {name} did not become running in time (last status {}); nothing \
                         was started. Retrying later may succeed",
                        info.status
                    ),
                ));
            }
            tokio::time::sleep(poll).await;
            poll = (poll * 2).min(STATUS_POLL_MAX);
            cx.count();
            match clipped(deadline, "status read", cx.cp.get(id.clone())).await {
                Ok(next) => info = next,
                Err(e) if e.is_not_found() => return Ok(None),
                Err(e) if e.is_transient() => {}
                Err(e) => return Err(cx.before_dispatch(&format!("status of guest {name}"), &e)),
            }
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
        if self.is_kept() {
            "it was left as it is and not used"
        } else {
            "it was destroyed and the run refused rather than run code under a policy nobody \
             asked for"
        }
    }

    /// Writes `data` to `path` in the guest, retrying transient failures until `deadline`.
    pub async fn upload(
        &self,
        path: &str,
        data: Bytes,
        deadline: Instant,
    ) -> Result<(), SandboxError> {
        let cx = &self.cx;
        cx.retried("upload", deadline, || {
            cx.cp.upload(self.id.clone(), path.to_owned(), data.clone())
        })
        .await
        .map_err(|e| cx.before_dispatch("upload", &e))
    }

    /// Starts a long-lived process in the guest (see [`ProcessSpec`]) and returns its process
    /// id. Only a declined request (429/503) is known not to have started it, so only that is
    /// retried, until `deadline`. Nothing is started after shutdown began.
    pub async fn spawn_process(
        &self,
        spec: &ProcessSpec,
        deadline: Instant,
    ) -> Result<String, SandboxError> {
        let cx = &self.cx;
        if cx.closed() {
            return Err(classify::shut_down(Stage::BeforeDispatch));
        }
        let (res, _) = retry_until(
            &cx.backoff,
            deadline,
            "process start",
            |e| e.is_declined() && !cx.closed(),
            |_| {
                cx.count();
                cx.cp.spawn_process(self.id.clone(), spec.clone())
            },
        )
        .await;
        match res {
            Ok(pid) => Ok(pid),
            Err(e) if e.is_declined() => Err(cx.before_dispatch("process start", &e)),
            Err(e) => Err(classify::after_dispatch(&e, cx.closed(), &cx.redactor)),
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
        let reported = cx
            .retried("egress read-back", deadline, || {
                let (cp, id) = (cx.cp.clone(), self.id.clone());
                async move { cp.egress(id).await }
            })
            .await
            .map_err(|e| cx.before_dispatch("egress read-back", &e))?;
        if policy.matches(reported.as_deref()) {
            return Ok(());
        }
        let got = reported.map_or_else(|| "(none)".to_owned(), |r| format!("{r:?}"));
        let msg = format!(
            "guest {} reports egress {got}, but {policy} was requested; {}",
            self.name,
            self.what_happens_on_refusal()
        );
        tracing::error!(target: LOG_TARGET, guest = %self.name, "{msg}");
        Err(SandboxError::refused(msg).redacted(&cx.redactor))
    }

    /// Dispatches `command` under `limits`' guest clock and returns the running exec under the
    /// host deadline. Only a server that declined the request (429/503) is known not to have
    /// started it, so only that is retried, until `deadline` (at least one second from now);
    /// a dispatch that never answers fails as "may have run". The host clock starts once the
    /// exec is accepted. Nothing is dispatched after shutdown began.
    pub async fn exec(
        &self,
        command: &Command,
        limits: &ExecLimits,
        input: &ExecInput,
        deadline: Instant,
    ) -> Result<ExecRun, SandboxError> {
        let cx = &self.cx;
        if cx.closed() {
            return Err(classify::shut_down(Stage::BeforeDispatch));
        }
        let (cmd, args) = command.under_timeout(limits);
        let host_budget = limits.host_deadline();
        // The HTTP budget outlasts the host clock, so the host clock is the one that fires once
        // the stream is open.
        let http = host_budget + Duration::from_secs(2);
        let req = ExecRequest {
            cmd,
            args,
            env: input.env.clone(),
            stdin: input.stdin.clone(),
            timeout: http,
        };
        let started = Instant::now();
        // Every attempt is clipped to this (at least a second from now): a dispatch cut there
        // may have reached the guest, so it reads as "may have run".
        let (opened, _) = retry_until(
            &cx.backoff,
            deadline.max(started + Duration::from_secs(1)),
            "exec",
            |e| e.is_declined() && !cx.closed(),
            |_| {
                let (cp, id, req) = (cx.cp.clone(), self.id.clone(), req.clone());
                let closed = cx.closed();
                if !closed {
                    cx.count();
                }
                let sent = Instant::now();
                async move {
                    if closed {
                        // Shutdown began: no program is dispatched any more.
                        return Err(CallError::new(CallFailure::Config, "shut down"));
                    }
                    // Bounded here too, in case a control plane does not honour its timeout.
                    tokio::time::timeout(http + Duration::from_secs(1), cp.exec_stream(id, req))
                        .await
                        .unwrap_or_else(|_| {
                            Err(CallError::new(
                                CallFailure::Timeout,
                                "no answer to the exec request",
                            ))
                        })
                        .map(|stream| (stream, sent))
                }
            },
        )
        .await;
        let stream = match opened {
            Ok((s, sent)) => {
                self.accepted_at(sent);
                s
            }
            Err(_) if cx.closed() => return Err(classify::shut_down(Stage::BeforeDispatch)),
            Err(e) if e.is_declined() => return Err(cx.before_dispatch("exec", &e)),
            Err(e) => return Err(classify::after_dispatch(&e, cx.closed(), &cx.redactor)),
        };
        Ok(ExecRun {
            stream: Some(stream),
            started,
            host_deadline: Instant::now() + host_budget,
            host_budget,
            frames: 0,
        })
    }

    /// Runs an exec to its end, capturing each stream into a tail buffer of
    /// `max_output_bytes`, and classifies the outcome honestly: a broken stream, a missing or
    /// impossible exit status, or a host deadline with not one frame received is "may have
    /// run"; a host deadline after frames is a timeout with the output that arrived; a
    /// shutdown reads as the shutdown. An agent error that came with an exit status is kept
    /// in stderr.
    pub async fn capture(
        &self,
        mut run: ExecRun,
        limits: &ExecLimits,
        max_output_bytes: usize,
    ) -> Result<ExecOutcome, SandboxError> {
        let cx = &self.cx;
        let redactor = &cx.redactor;
        let mut out = TailBuffer::new(max_output_bytes);
        let mut err = TailBuffer::new(max_output_bytes);
        let mut exit: Option<i64> = None;
        let mut agent_error: Option<String> = None;
        let mut broken: Option<CallError> = None;
        let mut host_timed_out = false;
        loop {
            match run.next().await {
                ExecStep::Frame(ExecFrame::Stdout(s)) => out.push(s.as_bytes()),
                ExecStep::Frame(ExecFrame::Stderr(s)) => err.push(s.as_bytes()),
                ExecStep::Frame(ExecFrame::Exit(c)) => {
                    exit = Some(c);
                    break;
                }
                ExecStep::Frame(ExecFrame::Error(m)) => agent_error = Some(m),
                ExecStep::Frame(ExecFrame::Heartbeat) => {}
                ExecStep::End => break,
                ExecStep::HostDeadline => {
                    host_timed_out = true;
                    break;
                }
                ExecStep::Broken(e) => {
                    broken = Some(e);
                    break;
                }
            }
        }
        let frames = run.frames();
        let host_budget = run.host_budget();
        let exec_elapsed = run.elapsed();
        drop(run);
        let exec_ms = ms(exec_elapsed);

        if cx.closed() && exit != Some(0) {
            // Shutdown destroys a one-shot guest, which kills the program: its 137 (or the
            // missing exit) is the shutdown's doing, not a result of the program's own.
            return Err(classify::shut_down(Stage::Dispatched));
        }
        if let Some(e) = broken {
            return Err(classify::stream_broke(
                &e,
                out.total_bytes(),
                err.total_bytes(),
                redactor,
            ));
        }
        let agent_said = agent_error.map(|m| redactor.cap(&m));
        if host_timed_out && frames == 0 {
            // Not one frame (no output, no heartbeat) since the exec was accepted: the control
            // plane stopped answering; nothing says the program ran to its budget.
            return Err(SandboxError::new(
                ErrorKind::OutcomeUnknown,
                format!(
                    "CreateOS accepted the exec but sent nothing (no output, heartbeat or exit \
                     status) for {}s; the code may have run. The guest was destroyed",
                    host_budget.as_secs()
                ),
            )
            .redacted(redactor));
        }
        let exit_code = if host_timed_out {
            tracing::warn!(
                target: LOG_TARGET,
                guest = %self.name,
                waited_ms = exec_ms,
                "the control plane did not finish the exec within budget + grace; reporting a \
                 timeout with the output that arrived"
            );
            EXIT_TIMED_OUT
        } else {
            match exit {
                Some(c) if (0..=MAX_EXIT_STATUS).contains(&c) => {
                    let c = i32::try_from(c).unwrap_or(i32::MAX);
                    classify_exit(c, exec_elapsed, limits.budget)
                }
                other => {
                    let what = other.map_or_else(
                        || "the exec stream ended without an exit status".to_owned(),
                        |c| format!("CreateOS reported exit status {c}, which no process can have"),
                    );
                    let why = agent_said
                        .map_or_else(String::new, |m| format!(" (the guest agent reported: {m})"));
                    return Err(SandboxError::new(
                        ErrorKind::OutcomeUnknown,
                        format!(
                            "CreateOS exec did not complete: {what}{why}; the code may have run"
                        ),
                    )
                    .redacted(redactor));
                }
            }
        };
        if let Some(m) = agent_said {
            // An exit status and an agent error together: keep the agent's word where the user
            // reads failures.
            err.push(format!("\n[CreateOS guest agent: {m}]\n").as_bytes());
        }
        Ok(ExecOutcome {
            stdout: out.finish(),
            stderr: err.finish(),
            exit_code,
            raw_exit_code: exit.and_then(|c| i32::try_from(c).ok()),
            host_timed_out,
            exec_ms,
        })
    }

    /// Downloads the file at `path`, refusing more than `max_bytes`: before reading anything
    /// when the declared length is larger, and the moment the bytes that arrived pass the cap
    /// otherwise. Opening the download is retried on transient failures, and the whole
    /// transfer ends, by `deadline`.
    pub async fn download(
        &self,
        path: &str,
        max_bytes: u64,
        deadline: Instant,
    ) -> Result<Bytes, SandboxError> {
        let cx = &self.cx;
        let op = format!("download of {path}");
        let too_large = |seen: String| {
            SandboxError::refused(format!(
                "{path} in guest {} is larger than the {max_bytes}-byte cap ({seen}); the \
                 transfer was stopped",
                self.name
            ))
        };
        let dl = cx
            .retried(&op, deadline, || {
                cx.cp
                    .download(self.id.clone(), path.to_owned(), Some(max_bytes))
            })
            .await
            .map_err(|e| match e.failure {
                CallFailure::TooLarge => too_large("declared by the server".to_owned()),
                _ => classify::call_failed(&op, &e, cx.closed(), &cx.redactor),
            })?;
        if let Some(len) = dl.content_length
            && len > max_bytes
        {
            return Err(too_large(format!("{len} bytes declared")));
        }
        let mut body = dl.body;
        let mut buf = BytesMut::new();
        loop {
            let Ok(next) = tokio::time::timeout_at(deadline, body.next()).await else {
                let e = CallError::new(
                    CallFailure::Timeout,
                    format!(
                        "the transfer did not finish within its budget ({} bytes had arrived)",
                        buf.len()
                    ),
                );
                return Err(classify::call_failed(&op, &e, cx.closed(), &cx.redactor));
            };
            let Some(chunk) = next else {
                break;
            };
            match chunk {
                Ok(c) => {
                    if (buf.len() + c.len()) as u64 > max_bytes {
                        return Err(too_large(format!("more than {max_bytes} bytes arrived")));
                    }
                    buf.extend_from_slice(&c);
                }
                Err(e) if e.failure == CallFailure::TooLarge => {
                    return Err(too_large(format!("more than {max_bytes} bytes arrived")));
                }
                Err(e) => return Err(classify::call_failed(&op, &e, cx.closed(), &cx.redactor)),
            }
        }
        Ok(buf.freeze())
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
                    |_| cx.cp.destroy(id.clone()),
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

/// The refusal of a create the control plane kept declining with 429 (the account's quota of
/// live sandboxes, or its rate limit) for the whole of the run's admission wait.
fn quota_exhausted(err: &SandboxError, waited: Duration) -> SandboxError {
    SandboxError::new(
        ErrorKind::AtCapacity,
        format!(
            "{} The CreateOS account had no room for another guest (429, its quota or rate \
             limit) for {:.1}s, the run's admission wait ({ENV_ADMISSION_WAIT}, cut to the \
             run's own budget); nothing ran",
            err.message(),
            waited.as_secs_f64()
        ),
    )
}

/// The refusal once shutdown began.
fn no_new_guests() -> SandboxError {
    SandboxError::new(
        ErrorKind::Refused,
        "the CreateOS sandbox backend has been shut down; no new guests are created",
    )
}
