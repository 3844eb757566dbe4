//! One execution in one fresh guest: create → (upload ∥ egress read-back) → streaming exec →
//! destroy, with the guarantees described in the crate docs.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use rand::Rng;
use tokio::time::Instant;

use crate::LOG_TARGET;
use crate::control::{CallError, CallFailure, ControlPlane, CreateGuest, ExecFrame};
use crate::egress::EgressPolicy;
use crate::error::{ErrorKind, Redactor, SandboxError};
use crate::exec::{ExecLimits, classify_exit, python_command};
use crate::names::mint_name;
use crate::output::{Captured, TailBuffer};
use crate::reaper::{GuestGuard, Reaper};
use crate::retry::{Backoff, retry_until};

/// Where programs are written in the guest.
pub const WORKSPACE: &str = "/workspace";

/// Everything one run needs, decided before any I/O.
#[derive(Debug, Clone)]
pub struct RunSpec {
    /// Guest name prefix (`lf-` for the backend).
    pub name_prefix: &'static str,
    /// Shape id.
    pub shape: String,
    /// Rootfs.
    pub rootfs: String,
    /// Environment declared at create.
    pub envs: BTreeMap<String, String>,
    /// Egress policy (sent, then read back).
    pub egress: EgressPolicy,
    /// The clocks.
    pub limits: ExecLimits,
    /// Per-stream output cap, bytes.
    pub max_output_bytes: usize,
    /// Backoff and deadline for calls before dispatch.
    pub backoff: Backoff,
    /// Destroy off the critical path (the reaper guarantees it) instead of before returning.
    pub background_destroy: bool,
}

/// Per-phase timings of a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Timings {
    /// Create (including retries and lost-response recovery).
    pub create_ms: u64,
    /// Upload and egress read-back (concurrent).
    pub upload_ms: u64,
    /// Streaming exec, dispatch to exit.
    pub exec_ms: u64,
    /// Destroy, when it ran before returning; `None` when handed to the reaper.
    pub destroy_ms: Option<u64>,
    /// The whole run.
    pub total_ms: u64,
    /// Control-plane requests this run made (every attempt counts).
    pub requests: u32,
}

/// The result of a program that ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunReport {
    /// Captured standard output (tail, with a marker if truncated).
    pub stdout: Captured,
    /// Captured standard error.
    pub stderr: Captured,
    /// The exit code lfx should see (-1 = timed out).
    pub exit_code: i32,
    /// The raw exit status from the guest, if one arrived.
    pub raw_exit_code: Option<i32>,
    /// The host deadline fired: the control plane stopped answering and the guest was destroyed.
    pub host_timed_out: bool,
    /// Exec wall time in milliseconds.
    pub execution_time_ms: u64,
    /// Phase timings.
    pub timings: Timings,
    /// Guest name.
    pub guest_name: String,
    /// Guest id.
    pub guest_id: String,
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The message every surface gives when a shutdown overtook a run.
fn shut_down(stage: Stage) -> SandboxError {
    match stage {
        Stage::BeforeDispatch => SandboxError::new(
            ErrorKind::Transient,
            "the CreateOS sandbox backend was shut down while this run was starting; the \
             program was not started and its guest is destroyed",
        ),
        Stage::Dispatched => SandboxError::new(
            ErrorKind::OutcomeUnknown,
            "the CreateOS sandbox backend was shut down while the program was running; its \
             guest was destroyed, so the code may have run but did not finish",
        ),
    }
}

/// Whether the program may have started when something failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Nothing was dispatched: the program certainly did not run.
    BeforeDispatch,
    /// The exec request was sent.
    Dispatched,
}

/// Maps a call error before dispatch to the taxonomy. After shutdown began, whatever the
/// control plane answered (a 409 on a guest being destroyed, a reset) is reported as the
/// shutdown it is.
fn before_dispatch(op: &str, e: &CallError, reaper: &Reaper, redactor: &Redactor) -> SandboxError {
    if reaper.is_closed() {
        return shut_down(Stage::BeforeDispatch);
    }
    let detail = redactor.cap(&e.message);
    let (kind, hint) = match e.failure {
        CallFailure::Status(401) => (
            ErrorKind::Rejected,
            " Check CREATEOS_SANDBOX_API_KEY (or CREATEOS_API_KEY).",
        ),
        CallFailure::Status(403) => (
            ErrorKind::Rejected,
            " The key is not allowed to do this (quota or scope).",
        ),
        CallFailure::Status(s) if (400..500).contains(&s) && s != 429 => (ErrorKind::Rejected, ""),
        CallFailure::Redirect => (
            ErrorKind::Rejected,
            " The control plane redirected; set CREATEOS_SANDBOX_BASE_URL to the final URL.",
        ),
        CallFailure::Config => (ErrorKind::Refused, ""),
        _ => (
            ErrorKind::Transient,
            " The program was not started; retrying later may succeed.",
        ),
    };
    SandboxError::new(kind, format!("CreateOS {op} failed: {detail}.{hint}")).redacted(redactor)
}

/// Maps a failed or broken exec, after the request was sent, to the taxonomy.
fn after_dispatch(e: &CallError, reaper: &Reaper, redactor: &Redactor) -> SandboxError {
    if reaper.is_closed() {
        return shut_down(Stage::Dispatched);
    }
    let detail = redactor.cap(&e.message);
    let rejected = match e.failure {
        CallFailure::Status(s) => (400..500).contains(&s),
        CallFailure::Redirect | CallFailure::Config => true,
        _ => false,
    };
    if rejected {
        SandboxError::new(
            ErrorKind::Rejected,
            format!("CreateOS exec was rejected: {detail}. The program was not started"),
        )
    } else {
        SandboxError::new(
            ErrorKind::OutcomeUnknown,
            format!(
                "CreateOS exec failed after the program was dispatched ({detail}); the code may \
                 have run. It was not retried"
            ),
        )
    }
    .redacted(redactor)
}

/// The largest exit status a process can have; anything else from the agent is not one.
const MAX_EXIT_STATUS: i64 = 255;

/// Runs `program` as a Python file in a fresh guest and destroys the guest.
///
/// Cancellation-safe: dropping the returned future at any await point leaves the guest (or,
/// during create, its name) with `reaper`, which destroys it. With
/// [`RunSpec::background_destroy`] off, the guest is destroyed before this returns on every
/// path, errors included (a forked child that ends with `os._exit` never runs the reaper).
pub async fn run_python(
    cp: Arc<dyn ControlPlane>,
    reaper: &Reaper,
    spec: &RunSpec,
    program: Bytes,
    redactor: &Redactor,
) -> Result<RunReport, SandboxError> {
    let t_start = Instant::now();
    let requests = Arc::new(AtomicU32::new(0));
    let count = || requests.fetch_add(1, Ordering::Relaxed);
    let deadline = t_start + spec.backoff.budget;

    // 1. Create, under a name minted before the call.
    let t0 = Instant::now();
    let guard = create_guest(&cp, reaper, spec, redactor, deadline, &count).await?;
    let create_ms = ms(t0.elapsed());

    // 2-3. Upload and read back, then exec.
    let ran = in_guest(
        &cp, reaper, spec, &guard, program, redactor, deadline, &count,
    )
    .await;

    // 4. Destroy: now, or off the critical path with the reaper's guarantee. A host timeout
    //    always destroys now, because that is what stops runaway code; so does a shutdown,
    //    and so does every path when background destroy is off.
    let now = !spec.background_destroy
        || reaper.is_closed()
        || ran.as_ref().is_ok_and(|r| r.host_timed_out);
    let name = guard.name().to_owned();
    let destroy_ms = if now {
        count();
        match guard.destroy(&spec.backoff).await {
            Ok(d) => Some(ms(d)),
            Err(e) => {
                tracing::warn!(
                    target: LOG_TARGET,
                    guest = %name,
                    error = %redactor.apply(&e.message),
                    "guest destroy failed; the reaper keeps retrying"
                );
                None
            }
        }
    } else {
        guard.release_to_reaper();
        None
    };
    let ran = ran?;

    let timings = Timings {
        create_ms,
        upload_ms: ran.upload_ms,
        exec_ms: ran.exec_ms,
        destroy_ms,
        total_ms: ms(t_start.elapsed()),
        requests: requests.load(Ordering::Relaxed),
    };
    let report = RunReport {
        stdout: ran.stdout,
        stderr: ran.stderr,
        exit_code: ran.exit_code,
        raw_exit_code: ran.raw_exit_code,
        host_timed_out: ran.host_timed_out,
        execution_time_ms: ran.exec_ms,
        timings,
        guest_name: name,
        guest_id: ran.guest_id,
    };
    tracing::info!(
        target: LOG_TARGET,
        guest = %report.guest_name,
        exit_code = report.exit_code,
        raw_exit_code = ?report.raw_exit_code,
        create_ms = timings.create_ms,
        upload_ms = timings.upload_ms,
        exec_ms = timings.exec_ms,
        // `background`: the reaper destroys the guest off the critical path and logs the time.
        destroy_ms = %timings
            .destroy_ms
            .map_or_else(|| "background".to_owned(), |ms| ms.to_string()),
        total_ms = timings.total_ms,
        requests = timings.requests,
        stdout_truncated = report.stdout.truncated,
        stderr_truncated = report.stderr.truncated,
        "sandbox run finished"
    );
    Ok(report)
}

/// What happened inside the guest.
struct InGuest {
    stdout: Captured,
    stderr: Captured,
    exit_code: i32,
    raw_exit_code: Option<i32>,
    host_timed_out: bool,
    upload_ms: u64,
    exec_ms: u64,
    guest_id: String,
}

/// Upload ∥ egress read-back, then the streaming exec under both clocks. The caller owns
/// the guest's destroy.
#[allow(clippy::too_many_arguments)]
async fn in_guest(
    cp: &Arc<dyn ControlPlane>,
    reaper: &Reaper,
    spec: &RunSpec,
    guard: &GuestGuard,
    program: Bytes,
    redactor: &Redactor,
    deadline: Instant,
    count: &impl Fn() -> u32,
) -> Result<InGuest, SandboxError> {
    let id = guard.id().unwrap_or_default().to_owned();
    let name = guard.name();
    if reaper.is_closed() {
        return Err(shut_down(Stage::BeforeDispatch));
    }

    // 2. Upload the program while reading the egress back.
    let t1 = Instant::now();
    let path = format!(
        "{WORKSPACE}/main_{:012x}.py",
        rand::rng().random::<u64>() & 0xffff_ffff_ffff
    );
    let upload = retry_until(
        &spec.backoff,
        deadline,
        "upload",
        |e| e.is_transient() && !reaper.is_closed(),
        |_| {
            count();
            cp.upload(id.clone(), path.clone(), program.clone())
        },
    );
    let readback = retry_until(
        &spec.backoff,
        deadline,
        "egress read-back",
        |e| e.is_transient() && !reaper.is_closed(),
        |_| {
            count();
            let (cp, id) = (cp.clone(), id.clone());
            async move { cp.egress(id).await }
        },
    );
    let ((up, _), (eg, _)) = tokio::join!(upload, readback);
    let reported = eg.map_err(|e| before_dispatch("egress read-back", &e, reaper, redactor))?;
    if !spec.egress.matches(reported.as_deref()) {
        let got = reported.map_or_else(|| "(none)".to_owned(), |r| format!("{r:?}"));
        let msg = format!(
            "guest {name} reports egress {got}, but {} was requested; it was destroyed and the \
             run refused rather than run code under a policy nobody asked for",
            spec.egress
        );
        tracing::error!(target: LOG_TARGET, guest = %name, "{msg}");
        return Err(SandboxError::refused(msg).redacted(redactor));
    }
    up.map_err(|e| before_dispatch("upload", &e, reaper, redactor))?;
    let upload_ms = ms(t1.elapsed());

    // 3. Exec, streaming. Dispatch first: only a server that declined the request (429/503)
    //    is known not to have started it, so only that is retried, inside the pre-dispatch
    //    deadline (at least one second from now). A dispatch that never answers fails on
    //    its own HTTP timeout as "may have run". The host clock starts once the exec is
    //    accepted, so a declined or slow dispatch can never read as a program timeout.
    let (cmd, args) = python_command(&path, &spec.limits);
    let host_budget = spec.limits.host_deadline();
    let t2 = Instant::now();
    let (opened, _) = retry_until(
        &spec.backoff,
        deadline.max(t2 + Duration::from_secs(1)),
        "exec",
        |e| e.is_declined() && !reaper.is_closed(),
        |_| {
            let (cp, id, cmd, args) = (cp.clone(), id.clone(), cmd.clone(), args.clone());
            let closed = reaper.is_closed();
            if !closed {
                count();
            }
            async move {
                if closed {
                    // Shutdown began: no program is dispatched any more.
                    return Err(CallError::new(CallFailure::Config, "shut down"));
                }
                // The HTTP budget outlasts the host clock, so the host clock is the one that
                // fires once the stream is open. The dispatch is bounded here too, in case a
                // control plane does not honour its timeout.
                let http = host_budget + Duration::from_secs(2);
                tokio::time::timeout(
                    http + Duration::from_secs(1),
                    cp.exec_stream(id, cmd, args, http),
                )
                .await
                .unwrap_or_else(|_| {
                    Err(CallError::new(
                        CallFailure::Timeout,
                        "no answer to the exec request",
                    ))
                })
            }
        },
    )
    .await;
    let mut stream = match opened {
        Ok(s) => s,
        Err(_) if reaper.is_closed() => return Err(shut_down(Stage::BeforeDispatch)),
        Err(e) if e.is_declined() => return Err(before_dispatch("exec", &e, reaper, redactor)),
        Err(e) => return Err(after_dispatch(&e, reaper, redactor)),
    };
    let host_deadline = Instant::now() + host_budget;

    let mut out = TailBuffer::new(spec.max_output_bytes);
    let mut err = TailBuffer::new(spec.max_output_bytes);
    let mut exit: Option<i64> = None;
    let mut agent_error: Option<String> = None;
    let mut broken: Option<CallError> = None;
    let mut frames = 0u64;
    let mut host_timed_out = false;
    loop {
        match tokio::time::timeout_at(host_deadline, stream.next()).await {
            Err(_) => {
                host_timed_out = true;
                break;
            }
            Ok(None) => break,
            Ok(Some(Ok(frame))) => {
                frames += 1;
                match frame {
                    ExecFrame::Stdout(s) => out.push(s.as_bytes()),
                    ExecFrame::Stderr(s) => err.push(s.as_bytes()),
                    ExecFrame::Exit(c) => {
                        exit = Some(c);
                        break;
                    }
                    ExecFrame::Error(m) => agent_error = Some(m),
                    ExecFrame::Heartbeat => {}
                }
            }
            Ok(Some(Err(e))) => {
                broken = Some(e);
                break;
            }
        }
    }
    drop(stream);
    let exec_elapsed = t2.elapsed();
    let exec_ms = ms(exec_elapsed);

    if reaper.is_closed() && exit != Some(0) {
        // Shutdown destroys the guest, which kills the program: its 137 (or the missing
        // exit) is the shutdown's doing, not a result of the program's own.
        return Err(shut_down(Stage::Dispatched));
    }
    if let Some(e) = broken {
        let detail = redactor.cap(&e.message);
        let (o, se) = (out.total_bytes(), err.total_bytes());
        return Err(SandboxError::new(
            ErrorKind::OutcomeUnknown,
            format!(
                "the exec stream from CreateOS broke after the program was dispatched ({detail}); \
                 the code may have run ({o} bytes of stdout and {se} of stderr had arrived). It \
                 was not retried"
            ),
        )
        .redacted(redactor));
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
            guest = %name,
            waited_ms = exec_ms,
            "the control plane did not finish the exec within budget + grace; destroying the guest \
             and reporting a timeout with the output that arrived"
        );
        crate::exec::EXIT_TIMED_OUT
    } else {
        match exit {
            Some(c) if (0..=MAX_EXIT_STATUS).contains(&c) => {
                let c = i32::try_from(c).unwrap_or(i32::MAX);
                classify_exit(c, exec_elapsed, spec.limits.budget)
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
                    format!("CreateOS exec did not complete: {what}{why}; the code may have run"),
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
    Ok(InGuest {
        stdout: out.finish(),
        stderr: err.finish(),
        exit_code,
        raw_exit_code: exit.and_then(|c| i32::try_from(c).ok()),
        host_timed_out,
        upload_ms,
        exec_ms,
        guest_id: id,
    })
}

/// Creates a guest, retrying transient failures with a fresh name each time. A create whose
/// outcome is unknown leaves its name with the reaper, which finds and destroys the guest.
async fn create_guest(
    cp: &Arc<dyn ControlPlane>,
    reaper: &Reaper,
    spec: &RunSpec,
    redactor: &Redactor,
    deadline: Instant,
    count: &impl Fn() -> u32,
) -> Result<GuestGuard, SandboxError> {
    let mut attempt = 0u32;
    loop {
        let name = mint_name(spec.name_prefix);
        let Some(mut guard) = reaper.register(cp.clone(), &name, redactor.clone()) else {
            if attempt > 0 {
                // This run was already under way when shutdown began.
                return Err(shut_down(Stage::BeforeDispatch));
            }
            return Err(SandboxError::new(
                ErrorKind::Refused,
                "the CreateOS sandbox backend has been shut down; no new guests are created",
            ));
        };
        let req = CreateGuest {
            name: name.clone(),
            shape: spec.shape.clone(),
            rootfs: spec.rootfs.clone(),
            envs: spec.envs.clone(),
            egress: spec.egress.rules(),
            auto_pause_after_seconds: spec.limits.auto_pause_seconds(),
        };
        count();
        match cp.create(req).await {
            Ok(info) => {
                guard.set_id(&info.id);
                if reaper.is_closed() {
                    // Shutdown began while the create was in flight: nothing is dispatched
                    // any more, and the guest is destroyed (once: shutdown may be at it).
                    count();
                    let _ = guard.destroy(&spec.backoff).await;
                    return Err(shut_down(Stage::BeforeDispatch));
                }
                // The create response's own echo is a first read-back.
                if let Some(eg) = &info.egress
                    && !spec.egress.matches(Some(eg))
                {
                    let msg = format!(
                        "guest {name} was created with egress {eg:?}, but {} was requested; it \
                         was destroyed and the run refused",
                        spec.egress
                    );
                    count();
                    let _ = guard.destroy(&spec.backoff).await;
                    return Err(SandboxError::refused(msg).redacted(redactor));
                }
                return Ok(guard);
            }
            Err(e) => {
                let retryable = e.is_transient();
                if e.is_declined() || !retryable {
                    // The server answered and did not take the request on.
                    guard.disarm_not_created();
                } else {
                    // Outcome unknown: the guest may exist. The reaper looks the name up and
                    // destroys whatever it finds.
                    tracing::warn!(
                        target: LOG_TARGET,
                        guest = %name,
                        error = %redactor.apply(&e.message),
                        "create response lost; the guest will be looked up by name and destroyed"
                    );
                    drop(guard);
                }
                let delay = spec.backoff.delay_after(attempt, e.retry_after);
                attempt += 1;
                if !retryable || reaper.is_closed() || Instant::now() + delay >= deadline {
                    return Err(before_dispatch("create", &e, reaper, redactor));
                }
                tracing::info!(
                    target: LOG_TARGET,
                    attempt,
                    delay_ms = ms(delay),
                    error = %redactor.apply(&e.message),
                    "retrying create with a fresh name"
                );
                tokio::time::sleep(delay).await;
            }
        }
    }
}
