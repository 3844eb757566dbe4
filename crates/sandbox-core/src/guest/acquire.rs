//! Acquiring a kept guest by its derived name: look it up, adopt it (resume, renew a
//! server-side expiry, read its environment keys and egress back, cover its auto-pause
//! backstop; on a provider that replaces drifted kept guests, destroy one that differs) or
//! create it, and wait until it runs.

use std::collections::BTreeSet;
use std::time::Duration;

use tokio::time::Instant;

use super::create::{no_new_guests, quota_exhausted};
use super::{Guest, GuestContext, GuestSpec, Hold, KeptTrack};
use crate::LOG_TARGET;
use crate::admission::Ticket;
use crate::classify::{self, Stage};
use crate::control::{CallFailure, GuestInfo, GuestStatus};
use crate::error::{ErrorKind, SandboxError};
use crate::names::is_valid_name;
use crate::observe::DestroyReason;
use crate::provider::{EgressCheck, Labels};
use crate::retry::{attempt_floor, clipped, worth_retrying};

/// Longest pause between two status reads while a guest resumes or starts.
const STATUS_POLL_MAX: Duration = Duration::from_secs(1);
/// First pause between two status reads.
const STATUS_POLL_MIN: Duration = Duration::from_millis(50);

impl Guest {
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
                return Err(no_new_guests(cx));
            }
            let found = cx
                .retried("guest lookup", deadline, || {
                    cx.provider.find(name.to_owned())
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
                    wait_reason = Some("it went away, or was replaced, while it was being adopted");
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
                    let request = spec.for_provider(name, cx.labels().with(Labels::KEPT, "true"));
                    let created = clipped(deadline, "create", cx.provider.create(request)).await;
                    match created {
                        Ok(info) => {
                            let hold = Hold::Kept(KeptTrack::new(cx, spec, name, true));
                            let guest = Self::handle(cx, name, &info.id, hold, true, sent);
                            if let Some(EgressCheck::Differs(eg)) =
                                cx.provider.egress_in_answer(&info, &spec.egress)
                            {
                                // Nobody can use a guest created under the wrong policy, and
                                // it would hold the name: destroy it.
                                let msg = format!(
                                    "guest {name} was created with egress {eg}, but {} was \
                                     requested; it was destroyed and not used",
                                    cx.provider.describe_egress(&spec.egress)
                                );
                                guest.set_destroy_reason(DestroyReason::Error);
                                let _ = guest.destroy().await;
                                return Err(SandboxError::refused(msg).redacted(&cx.redactor));
                            }
                            let ready_by = cx.ready_by(deadline);
                            if info.status != GuestStatus::Running
                                && guest.until_running(info, ready_by).await?.is_none()
                            {
                                wait_reason = Some("it went away before it ran");
                            } else {
                                if let Err(e) = guest.until_ready(ready_by).await {
                                    // Created by this call and never used: nobody else can
                                    // use it either.
                                    guest.set_destroy_reason(DestroyReason::Error);
                                    let _ = guest.destroy().await;
                                    return Err(e);
                                }
                                let after = cx.after_ready(deadline);
                                if let Err(e) = guest.verify_egress(&spec.egress, after).await {
                                    if cx.provider.replaces_drifted_kept_guests() {
                                        // Nobody can use it; on this provider it would be
                                        // replaced by the next lookup anyway.
                                        guest.set_destroy_reason(DestroyReason::Error);
                                        let _ = guest.destroy().await;
                                    }
                                    return Err(e);
                                }
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
                                    return Err(quota_exhausted(cx, &err, started.elapsed()));
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
        // A provider without idle pauses expires its guests on a server-side clock: push it
        // past this run (and an idle backstop after it) before anything else is asked of it.
        if !cx.provider.pauses_idle_guests() && !guest.renew_lifetime(spec, deadline).await? {
            return Ok(None);
        }
        guest.until_ready(deadline).await?;
        let replaces = cx.provider.replaces_drifted_kept_guests();
        let want: BTreeSet<&str> = spec.envs.keys().map(String::as_str).collect();
        let have: Option<BTreeSet<&str>> = info
            .envs
            .as_ref()
            .map(|v| v.iter().map(String::as_str).collect());
        if have.as_ref() != Some(&want) {
            let have = have.map_or_else(|| "(not reported)".to_owned(), |h| format!("{h:?}"));
            if replaces {
                let why = format!(
                    "guest {name} was created with the environment keys {have}, but {want:?} \
                     are declared now"
                );
                return guest.replace_drifted(&why).await;
            }
            return Err(SandboxError::refused(format!(
                "guest {name} was created with the environment keys {have}, but {want:?} are \
                 declared now; it was left as it is and not used. Destroy it to recreate it \
                 with the new keys"
            ))
            .redacted(&cx.redactor));
        }
        match guest.verify_egress(&spec.egress, deadline).await {
            Ok(()) => {}
            Err(e) if replaces && e.kind() == ErrorKind::Refused => {
                return guest.replace_drifted(e.message()).await;
            }
            Err(e) => return Err(e),
        }
        let backstop = (info.auto_pause_after_seconds, spec.auto_pause_after_seconds);
        if !guest.cover_backstop(backstop, deadline).await? {
            return Ok(None);
        }
        Ok(Some(guest))
    }

    /// Destroys a kept guest found with another policy than asked (`why`), on a provider that
    /// replaces such guests ([`crate::provider::Provider::replaces_drifted_kept_guests`]):
    /// `Ok(None)`, so the caller looks the name up again and creates it anew. Nothing ran on
    /// it. A destroy that fails is the run's refusal.
    async fn replace_drifted(self, why: &str) -> Result<Option<Guest>, SandboxError> {
        let (cx, name) = (self.cx.clone(), self.name.clone());
        tracing::warn!(
            target: LOG_TARGET,
            guest = %name,
            "{}; destroying it and creating it again",
            cx.redactor.apply(why)
        );
        self.set_destroy_reason(DestroyReason::Error);
        match self.destroy().await {
            Ok(_) => Ok(None),
            Err(e) => Err(SandboxError::refused(format!(
                "{why}; destroying it failed ({}), so it was not used and the run is refused; \
                 delete it with reap",
                e.message
            ))
            .redacted(&cx.redactor)),
        }
    }

    /// Pushes an adopted guest's server-side expiry past this run and an idle backstop after
    /// it ([`GuestSpec::lifetime`], through [`crate::provider::Provider::keep_alive`]), for a
    /// provider that does not pause idle guests: a kept guest nobody uses then still expires
    /// on its own. Retried on transient failures until `deadline`; a failure runs nothing.
    /// `Ok(false)` when the guest went away meanwhile (404, 409).
    async fn renew_lifetime(
        &self,
        spec: &GuestSpec,
        deadline: Instant,
    ) -> Result<bool, SandboxError> {
        let cx = &self.cx;
        let lifetime = spec.lifetime();
        let want = lifetime.budget + lifetime.idle_backstop;
        let op = format!(
            "renewal of kept guest {}'s lifetime ({}s)",
            self.name,
            want.as_secs()
        );
        let renewed = cx
            .retried(&op, deadline, || {
                cx.provider.keep_alive(self.id.clone(), want)
            })
            .await;
        match renewed {
            Ok(_) => Ok(true),
            Err(e) if e.is_conflict() || e.is_not_found() => Ok(false),
            Err(e) => Err(cx.before_dispatch(&op, &e)),
        }
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
                let idle = Duration::from_secs(u64::from(want));
                cx.provider.keep_alive(self.id.clone(), idle)
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

    /// Once the guest runs: waits until it serves exec and files, for a provider whose
    /// `running` does not mean that yet ([`crate::provider::Provider::running_is_ready`]); its
    /// checks inside the guest (identity, isolation) happen there, before any program. No
    /// request for a provider whose running guest is ready (CreateOS). A failure runs nothing.
    pub(super) async fn until_ready(&self, deadline: Instant) -> Result<(), SandboxError> {
        let cx = &self.cx;
        if cx.provider.running_is_ready() {
            return Ok(());
        }
        if cx.closed() {
            return Err(classify::shut_down(
                cx.provider.kind(),
                Stage::BeforeDispatch,
            ));
        }
        cx.count();
        let ready = cx.provider.wait_ready(self.id.clone(), deadline);
        let (within, advice) = cx.readiness_words();
        match clipped(deadline, &format!("readiness wait ({within})"), ready).await {
            Ok(_) => Ok(()),
            Err(e) => {
                let err = cx.before_dispatch(&format!("readiness of guest {}", self.name), &e);
                Err(if advice.is_empty() || e.failure != CallFailure::Timeout {
                    err
                } else {
                    SandboxError::new(err.kind(), format!("{}{advice}", err.message()))
                })
            }
        }
    }

    /// Resumes the guest if it is paused and polls until it runs, bounded by `deadline` (each
    /// call clipped to it). `info` is its last known state. `Ok(None)` when the guest is gone
    /// (404 or a terminal status).
    pub(super) async fn until_running(
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
                return Err(classify::shut_down(
                    cx.provider.kind(),
                    Stage::BeforeDispatch,
                ));
            }
            match info.status {
                GuestStatus::Running => return Ok(Some(info)),
                ref s if s.is_terminal() => return Ok(None),
                GuestStatus::Paused => {
                    tracing::info!(target: LOG_TARGET, guest = name, "resuming a paused guest");
                    cx.count();
                    let sent = Instant::now();
                    match clipped(deadline, "resume", cx.provider.resume(id.clone())).await {
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
                let (within, advice) = cx.readiness_words();
                return Err(SandboxError::new(
                    ErrorKind::Transient,
                    format!(
                        "{} guest {name} did not become running {within} (last status {}); \
                         nothing was started.{advice} Retrying later may succeed",
                        cx.provider.kind().display_name(),
                        info.status
                    ),
                ));
            }
            tokio::time::sleep(poll).await;
            poll = (poll * 2).min(STATUS_POLL_MAX);
            cx.count();
            match clipped(deadline, "status read", cx.provider.get(id.clone())).await {
                Ok(next) => info = next,
                Err(e) if e.is_not_found() => return Ok(None),
                Err(e) if e.is_transient() => {}
                Err(e) => return Err(cx.before_dispatch(&format!("status of guest {name}"), &e)),
            }
        }
    }
}
