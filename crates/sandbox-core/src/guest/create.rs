//! Creating a one-shot guest: the attempts under the deadline (and the account's quota), and
//! the checks on what the create answered.

use std::time::Duration;

use tokio::time::Instant;

use super::{Guest, GuestContext, GuestSpec, Hold, ms};
use crate::LOG_TARGET;
use crate::admission::{GuestSlot, Ticket};
use crate::classify::{self, Stage};
use crate::control::{CallFailure, GuestInfo, GuestStatus};
use crate::error::{ErrorKind, SandboxError};
use crate::names::mint_name;
use crate::observe::{Tracked, egress_kind};
use crate::provider::{EgressCheck, ProviderKind};
use crate::retry::{attempt_floor, clipped, worth_retrying};
use crate::settings::ENV_ADMISSION_WAIT;

impl Guest {
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
            let Some(mut guard) =
                cx.reaper
                    .register_with(cx.provider.clone(), &name, cx.redactor.clone())
            else {
                if attempt > 0 {
                    // This run was already under way when shutdown began.
                    return Err(classify::shut_down(
                        cx.provider.kind(),
                        Stage::BeforeDispatch,
                    ));
                }
                return Err(no_new_guests(cx));
            };
            if let Some(s) = slot.take() {
                guard.hold_slot(s);
            }
            cx.count();
            let sent = Instant::now();
            let request = spec.for_provider(&name, cx.labels());
            match clipped(until, "create", cx.provider.create(request)).await {
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
                    // Readiness has the provider's own budget when it has one.
                    return guest.created_as(spec, info, cx.ready_by(until)).await;
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
                            return Err(quota_exhausted(cx, &err, started.elapsed()));
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
            return Err(classify::shut_down(
                cx.provider.kind(),
                Stage::BeforeDispatch,
            ));
        }
        let shown = cx.provider.egress_in_answer(&info, &spec.egress);
        if let Some(EgressCheck::Differs(eg)) = &shown {
            let msg = format!(
                "guest {} was created with egress {eg}, but {} was requested; it was \
                 destroyed and the run refused",
                self.name,
                cx.provider.describe_egress(&spec.egress)
            );
            let _ = self.destroy().await;
            return Err(SandboxError::refused(msg).redacted(&cx.redactor));
        }
        if info.status == GuestStatus::Running {
            if shown.is_some() {
                self.confirmed_egress = Some(spec.egress.clone());
            }
            return match self.until_ready(deadline).await {
                Ok(()) => Ok(self),
                Err(e) => {
                    let _ = self.destroy().await;
                    Err(e)
                }
            };
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
            Ok(Some(_)) => match self.until_ready(deadline).await {
                Ok(()) => Ok(self),
                Err(e) => {
                    let _ = self.destroy().await;
                    Err(e)
                }
            },
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
}

/// The refusal of a create the control plane kept declining with 429 (the account's quota of
/// live sandboxes, or its rate limit) for the whole of the run's admission wait.
pub(super) fn quota_exhausted(
    cx: &GuestContext,
    err: &SandboxError,
    waited: Duration,
) -> SandboxError {
    SandboxError::new(
        ErrorKind::AtCapacity,
        format!(
            "{} The {} had no room for another guest (429, its quota or rate limit) for \
             {:.1}s, the run's admission wait ({ENV_ADMISSION_WAIT}, cut to the run's own \
             budget); nothing ran",
            err.message(),
            account_of(cx),
            waited.as_secs_f64()
        ),
    )
}

/// How messages name where guests are made: CreateOS's account, or another provider's server.
fn account_of(cx: &GuestContext) -> String {
    match cx.provider.kind() {
        ProviderKind::CreateOs => "CreateOS account".to_owned(),
        other => format!("{other} server"),
    }
}

/// The refusal once shutdown began.
pub(super) fn no_new_guests(cx: &GuestContext) -> SandboxError {
    let name = match cx.provider.kind() {
        ProviderKind::CreateOs => "CreateOS",
        other => other.as_str(),
    };
    SandboxError::new(
        ErrorKind::Refused,
        format!("the {name} sandbox backend has been shut down; no new guests are created"),
    )
}
