//! One execution in one fresh guest, composed of the [`crate::guest`] primitives:
//! create (whose response shows the egress: that is the read-back) → streaming exec carrying
//! the program → capture → destroy, with the guarantees described in the crate docs; a larger
//! program is uploaded first, and a create response without `egress` is read back with `GET`
//! beside that upload. The lfx backend runs on it.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use rand::Rng;
use tokio::time::Instant;

use crate::LOG_TARGET;
use crate::classify::{self, Stage};
use crate::control::ControlPlane;
use crate::egress::EgressPolicy;
use crate::error::{ErrorKind, Redactor, SandboxError};
use crate::exec::{Command, ExecLimits};
use crate::gateway::Grant;
use crate::guest::{ExecInput, ExecOutcome, ExecRun, Guest, GuestContext, GuestSpec, ms};
use crate::output::Captured;
use crate::pool::WarmPool;
use crate::reaper::Reaper;
use crate::retry::Backoff;

/// Where programs are written in the guest.
pub const WORKSPACE: &str = "/workspace";

/// Everything one run needs, decided before any I/O. `Debug` shows the environment's names,
/// never its values.
#[derive(Clone)]
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
    /// A domain allowlist: the guest declares the proxy variables and the program's exec sets
    /// them, with a token minted for the guest it runs in ([`Grant::env_for`]).
    pub grant: Option<Grant>,
}

impl std::fmt::Debug for RunSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Env values may be secrets: names only.
        f.debug_struct("RunSpec")
            .field("name_prefix", &self.name_prefix)
            .field("shape", &self.shape)
            .field("rootfs", &self.rootfs)
            .field("envs", &self.envs.keys().collect::<Vec<_>>())
            .field("egress", &self.egress)
            .field("limits", &self.limits)
            .field("max_output_bytes", &self.max_output_bytes)
            .field("backoff", &self.backoff)
            .field("background_destroy", &self.background_destroy)
            .field("grant", &self.grant)
            .finish()
    }
}

impl RunSpec {
    /// The exec input of this run's program in `guest`: the grant's proxy variables, if any.
    pub fn exec_input(&self, guest: &str) -> Result<ExecInput, SandboxError> {
        Ok(ExecInput {
            env: match &self.grant {
                Some(g) => g.env_for(guest)?,
                None => BTreeMap::new(),
            },
            stdin: String::new(),
        })
    }

    /// The guest this run creates.
    pub fn guest_spec(&self) -> GuestSpec {
        let mut envs = self.envs.clone();
        if let Some(grant) = &self.grant {
            envs.extend(grant.declared_env());
        }
        GuestSpec {
            shape: self.shape.clone(),
            rootfs: self.rootfs.clone(),
            envs,
            egress: self.egress.clone(),
            auto_pause_after_seconds: self.limits.auto_pause_seconds(),
        }
    }
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
    /// How the run got its guest (the warm pool).
    pub pool: PoolUse,
}

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
    run_python_pooled(cp, reaper, None, spec, program, redactor).await
}

/// How a run got its guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolUse {
    /// No pool, or a pool of size 0.
    Off,
    /// A pooled guest, already created and egress-verified.
    Hit,
    /// The pool had no guest for this policy: created as without a pool.
    Miss,
    /// A pooled guest turned out unusable before the program was sent (e.g. paused by the
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

/// [`run_python`], taking the guest from `pool` when it holds one for this run's policy (the
/// create and the egress read-back were done ahead of time, so only the upload and the exec
/// remain), and otherwise creating it as [`run_python`] does. A pooled guest is one-shot
/// like any other: it is destroyed after this run. If its upload fails (the program was not
/// sent), it is destroyed and the run goes on in a fresh guest, so the pool never fails a
/// run that would have succeeded without it.
pub async fn run_python_pooled(
    cp: Arc<dyn ControlPlane>,
    reaper: &Reaper,
    pool: Option<&WarmPool>,
    spec: &RunSpec,
    program: Bytes,
    redactor: &Redactor,
) -> Result<RunReport, SandboxError> {
    let t_start = Instant::now();
    let cx = GuestContext::new(cp, reaper.clone(), redactor.clone(), spec.backoff);
    let deadline = t_start + spec.backoff.budget;
    let guest_spec = spec.guest_spec();
    let path = format!(
        "{WORKSPACE}/main_{:012x}.py",
        rand::rng().random::<u64>() & 0xffff_ffff_ffff
    );

    // 1. A pooled guest, or create one under a name minted before the call.
    let pool = pool.filter(|p| p.stats().size > 0);
    let mut pool_use = if pool.is_some() {
        PoolUse::Miss
    } else {
        PoolUse::Off
    };
    // A pooled guest was verified when it entered the pool, so a program small enough to
    // travel inside the exec request needs nothing else: one round trip. A larger one is
    // uploaded first.
    let mut pooled = None;
    if let Some(p) = pool
        && let Some(guest) = p.take(&cx, &guest_spec, spec.name_prefix)
    {
        let t1 = Instant::now();
        let first = match Command::python_inline(path.clone(), &program) {
            Some(inline) => match spec.exec_input(guest.name()) {
                Ok(input) => guest
                    .exec(&inline, &spec.limits, &input, deadline)
                    .await
                    .map(PooledStart::Dispatched),
                Err(e) => Err(e),
            },
            None => prepare(&guest, &path, program.clone(), None, deadline)
                .await
                .map(|()| PooledStart::Uploaded(ms(t1.elapsed()))),
        };
        match first {
            Ok(started) => {
                pool_use = PoolUse::Hit;
                pooled = Some((guest, started));
            }
            Err(e) if reaper.is_closed() => {
                guest.release();
                return Err(e);
            }
            Err(e) if e.kind() == ErrorKind::OutcomeUnknown => {
                // The program may have run in it: no second attempt, and the guest goes.
                pool_use = PoolUse::Hit;
                pooled = Some((guest, PooledStart::Failed(e)));
            }
            Err(e) => {
                tracing::warn!(
                    target: LOG_TARGET,
                    guest = guest.name(),
                    error = %redactor.apply(e.message()),
                    "warm pool: the pooled guest could not take the program (it was not \
                     started); destroying it and using a fresh guest"
                );
                p.note_unusable();
                pool_use = PoolUse::Replaced;
                if spec.background_destroy {
                    guest.release();
                } else {
                    let _ = guest.destroy().await;
                }
            }
        }
    }
    let (guest, create_ms, ran) = match pooled {
        Some((guest, PooledStart::Dispatched(run))) => {
            let ran = guest
                .capture(run, &spec.limits, spec.max_output_bytes)
                .await
                .map(|out| (out, 0));
            (guest, 0, ran)
        }
        Some((guest, PooledStart::Uploaded(upload_ms))) => {
            let ran = in_guest(&guest, spec, &Command::python(path), deadline)
                .await
                .map(|out| (out, upload_ms));
            (guest, 0, ran)
        }
        Some((guest, PooledStart::Failed(e))) => (guest, 0, Err(e)),
        None => {
            // 1-3. Create under a name minted before the call; then, when the create response
            //    showed the policy (it is the read-back, see `Guest::egress_confirmed`) and the
            //    program fits in the exec request, the exec alone: two round trips. Otherwise
            //    upload ∥ read back, then exec.
            let t0 = Instant::now();
            let guest = Guest::create(&cx, &guest_spec, spec.name_prefix, deadline).await?;
            let create_ms = ms(t0.elapsed());
            let t1 = Instant::now();
            let inline = guest
                .egress_confirmed(&spec.egress)
                .then(|| Command::python_inline(path.clone(), &program))
                .flatten();
            // (`Guest::exec` refuses once shutdown began, as `prepare` does.)
            let ran = if let Some(inline) = inline {
                in_guest(&guest, spec, &inline, deadline)
                    .await
                    .map(|out| (out, 0))
            } else {
                match prepare(&guest, &path, program, Some(&spec.egress), deadline).await {
                    Ok(()) => {
                        let upload_ms = ms(t1.elapsed());
                        in_guest(&guest, spec, &Command::python(path), deadline)
                            .await
                            .map(|out| (out, upload_ms))
                    }
                    Err(e) => Err(e),
                }
            };
            (guest, create_ms, ran)
        }
    };

    // 4. Destroy: now, or off the critical path with the reaper's guarantee. A host timeout
    //    always destroys now, because that is what stops runaway code; so does a shutdown,
    //    and so does every path when background destroy is off.
    let now = !spec.background_destroy
        || reaper.is_closed()
        || ran.as_ref().is_ok_and(|(o, _)| o.host_timed_out);
    let name = guest.name().to_owned();
    let id = guest.id().to_owned();
    let destroy_ms = if now {
        match guest.destroy().await {
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
        guest.release();
        None
    };
    let (out, upload_ms) = ran?;

    let timings = Timings {
        create_ms,
        upload_ms,
        exec_ms: out.exec_ms,
        destroy_ms,
        total_ms: ms(t_start.elapsed()),
        requests: cx.requests(),
    };
    let stats = pool.map(WarmPool::stats).unwrap_or_default();
    let report = RunReport {
        stdout: out.stdout,
        stderr: out.stderr,
        exit_code: out.exit_code,
        raw_exit_code: out.raw_exit_code,
        host_timed_out: out.host_timed_out,
        execution_time_ms: out.exec_ms,
        timings,
        guest_name: name,
        guest_id: id,
        pool: pool_use,
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
        pool = pool_use.as_str(),
        pool_size = stats.size,
        pool_ready = stats.ready,
        pool_hits = stats.hits,
        pool_misses = stats.misses,
        "sandbox run finished"
    );
    Ok(report)
}

/// How a pooled guest's run began.
enum PooledStart {
    /// The program travelled inside the exec request, which the guest accepted.
    Dispatched(ExecRun),
    /// The program was uploaded (in this many ms); the exec is still to come.
    Uploaded(u64),
    /// The exec failed after dispatch: the program may have run.
    Failed(SandboxError),
}

/// Uploads the program to `path` and, for a guest not verified yet (`verify`), reads its
/// egress back concurrently. Nothing is dispatched.
async fn prepare(
    guest: &Guest,
    path: &str,
    program: Bytes,
    verify: Option<&EgressPolicy>,
    deadline: Instant,
) -> Result<(), SandboxError> {
    if guest.context().reaper.is_closed() {
        return Err(classify::shut_down(Stage::BeforeDispatch));
    }
    match verify {
        Some(policy) => {
            let (up, eg) = tokio::join!(
                guest.upload(path, program, deadline),
                guest.verify_egress(policy, deadline)
            );
            eg?;
            up
        }
        None => guest.upload(path, program, deadline).await,
    }
}

/// The streaming exec under both clocks, captured. The caller owns the guest's destroy.
async fn in_guest(
    guest: &Guest,
    spec: &RunSpec,
    command: &Command,
    deadline: Instant,
) -> Result<ExecOutcome, SandboxError> {
    let input = spec.exec_input(guest.name())?;
    let run = guest.exec(command, &spec.limits, &input, deadline).await?;
    guest
        .capture(run, &spec.limits, spec.max_output_bytes)
        .await
}
