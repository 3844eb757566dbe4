//! One execution in one fresh guest, composed of sandbox-core's guest primitives through its
//! surface kit: create (whose response shows the egress: that is the read-back) → streaming
//! exec carrying the program → capture → destroy, with the guarantees described in the crate
//! docs; a larger program is uploaded first, and a create response without `egress` is read
//! back with `GET` beside that upload. With a warm pool, a pooled guest (created and verified
//! ahead of time) skips the create. The lfx backend runs on it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use sandbox_core::admission::Caps;
use sandbox_core::classify::{self, Stage};
use sandbox_core::control::ControlPlane;
use sandbox_core::egress::EgressPolicy;
use sandbox_core::exec::{Command, ExecLimits};
use sandbox_core::gateway::Grant;
use sandbox_core::guest::{ExecInput, ExecOutcome, Guest, GuestContext, GuestSpec};
use sandbox_core::observe::RunOutcome;
use sandbox_core::output::Text;
use sandbox_core::pool::WarmPool;
use sandbox_core::reaper::Reaper;
use sandbox_core::retry::Backoff;
use sandbox_core::surface::{
    Acquire, Begin, End, Origin, PoolUse, StartError, Surface, SurfaceKind, SurfaceOptions, Want,
};
pub use sandbox_core::timings::Timings;
use sandbox_core::timings::{GuestEnd, run_line};
use sandbox_core::{LOG_TARGET, Redactor, SandboxError};
use tokio::time::Instant;

/// Where programs are written in the guest.
pub const WORKSPACE: &str = "/workspace";

/// Everything one run needs, decided before any I/O. `Debug` shows the environment's names,
/// never its values. The guest is one-shot: its name is `lf-` and random characters.
#[derive(Clone)]
pub struct RunSpec {
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

/// The result of a program that ran, as it is carried up to Python: one report from the run to
/// the glue. A failing program is a result, not an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunOutput {
    /// Standard output (its tail, with a visible marker, if over the cap), as pieces that
    /// can be taken one at a time (see [`Text`]); `to_string()` joins them.
    pub stdout: Text,
    /// Standard error (likewise).
    pub stderr: Text,
    /// Stdout was truncated to the cap.
    pub stdout_truncated: bool,
    /// Stderr was truncated to the cap.
    pub stderr_truncated: bool,
    /// Exit code: `-1` when the run hit its timeout (lfx: "timed out"), `137` for a kill inside
    /// the budget (lfx: memory), otherwise the program's status.
    pub exit_code: i32,
    /// The raw exit status from the guest, if one arrived.
    pub raw_exit_code: Option<i32>,
    /// The host deadline fired: the control plane stopped answering and the guest was destroyed.
    pub host_timed_out: bool,
    /// Exec wall time in milliseconds.
    pub execution_time_ms: u64,
    /// Phase timings: `acquire_ms` (create, or a pool guest), `upload_ms`, `exec_ms`,
    /// `destroy_ms` (`None` when handed to the reaper), `total_ms`, `requests`.
    pub timings: Timings,
    /// The guest's name.
    pub guest: String,
    /// The guest's id.
    pub guest_id: String,
    /// How the run got its guest (the warm pool).
    pub pool: PoolUse,
    /// How the run went (ok, program failed, timed out), as the metrics count it.
    pub outcome: RunOutcome,
}

/// Runs `program` as a Python file in a fresh guest through `cp` and destroys the guest (a
/// standalone run, without a warm pool, on `reaper`).
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
) -> Result<RunOutput, SandboxError> {
    run_python_pooled(cp, reaper, None, spec, program, redactor).await
}

/// [`run_python`], taking the guest from `pool` (at its current size) when it holds one for
/// this run's policy: only the upload and the exec remain, and a pooled guest that cannot
/// take the program before anything was dispatched is replaced by a fresh one.
pub async fn run_python_pooled(
    cp: Arc<dyn ControlPlane>,
    reaper: &Reaper,
    pool: Option<&WarmPool>,
    spec: &RunSpec,
    program: Bytes,
    redactor: &Redactor,
) -> Result<RunOutput, SandboxError> {
    let opts = SurfaceOptions {
        backoff: spec.backoff,
        background_destroy: spec.background_destroy,
        orphan_sweep: false,
        ..SurfaceOptions::default()
    };
    let pool = pool.cloned().unwrap_or_default();
    let size = pool.stats().size;
    let surface = Surface::with_parts(SurfaceKind::Backend, opts, reaper.clone(), pool);
    let cx = GuestContext::new(cp, reaper.clone(), redactor.clone(), spec.backoff);
    run_on(&surface, &cx, spec, size, Caps::default(), program).await
}

/// [`run_python`] on `surface`, taking the guest from its warm pool (sized `pool_size`) when
/// the pool holds one for this run's policy (the create and the egress read-back were done
/// ahead of time, so only the upload and the exec remain), and otherwise creating it. A pooled
/// guest is one-shot like any other: it is destroyed after this run. If it cannot take the
/// program before anything was dispatched, the kit destroys it and the run goes on in a fresh
/// guest, so the pool never fails a run that would have succeeded without it. The run is
/// admitted under `caps` first (the process's cap on live guests; the backend has no flow id).
pub(crate) async fn run_on(
    surface: &Surface,
    cx: &GuestContext,
    spec: &RunSpec,
    pool_size: usize,
    caps: Caps,
    program: Bytes,
) -> Result<RunOutput, SandboxError> {
    let t_start = Instant::now();
    let guest_spec = spec.guest_spec();
    let path = format!(
        "{WORKSPACE}/main_{:012x}.py",
        rand::random::<u64>() & 0xffff_ffff_ffff
    );
    let req = Acquire {
        cx,
        spec: &guest_spec,
        want: Want::OneShot,
        pool_size,
        caps,
        flow: None,
        run_budget: spec.limits.budget,
        node: None,
        session: None,
    };
    let started = surface
        .acquire(&req, |guest, begin| {
            let (program, path) = (program.clone(), path.clone());
            async move {
                let ran = start(&guest, begin, spec, &path, program).await;
                (guest, ran)
            }
        })
        .await?;
    let (mut lease, ran) = (started.lease, started.result);
    match &ran {
        Ok((o, _)) => lease.set_outcome(o.run_outcome(), o.bytes_returned()),
        Err(e) => lease.set_outcome(sandbox_core::observe::outcome_of(e), 0),
    }
    let create_ms = ms(lease.create_time());
    let pool_use = lease.pool_use();

    // Destroy: now, or off the critical path with the reaper's guarantee. A host timeout
    // always destroys now, because that is what stops runaway code; so does a shutdown,
    // and so does every path when background destroy is off.
    let now = !spec.background_destroy
        || surface.reaper().is_closed()
        || ran.as_ref().is_ok_and(|(o, _)| o.host_timed_out);
    let ended = lease
        .end(if now { End::Destroy } else { End::Release })
        .await;
    let destroy_ms = ended.destroy_time.map(ms);
    let (out, upload_ms) = ran?;

    let timings = Timings {
        acquire_ms: Some(create_ms),
        upload_ms: Some(upload_ms),
        exec_ms: Some(out.exec_ms),
        destroy_ms,
        total_ms: Some(ms(t_start.elapsed())),
        requests: Some(u64::from(cx.requests())),
        ..Timings::default()
    };
    let stats = surface.pool_stats();
    let outcome = out.run_outcome();
    let report = RunOutput {
        stdout: out.stdout.text,
        stderr: out.stderr.text,
        stdout_truncated: out.stdout.truncated,
        stderr_truncated: out.stderr.truncated,
        exit_code: out.exit_code,
        raw_exit_code: out.raw_exit_code,
        host_timed_out: out.host_timed_out,
        execution_time_ms: out.exec_ms,
        timings,
        guest: ended.name,
        guest_id: ended.id,
        pool: pool_use,
        outcome,
    };
    tracing::info!(
        target: LOG_TARGET,
        guest = %report.guest,
        exit_code = report.exit_code,
        raw_exit_code = ?report.raw_exit_code,
        create_ms = create_ms,
        upload_ms = upload_ms,
        exec_ms = report.execution_time_ms,
        // `background`: the reaper destroys the guest off the critical path and logs the time.
        destroy_ms = %timings
            .destroy_ms
            .map_or_else(|| "background".to_owned(), |ms| ms.to_string()),
        total_ms = timings.total_ms.unwrap_or_default(),
        requests = cx.requests(),
        stdout_truncated = report.stdout_truncated,
        stderr_truncated = report.stderr_truncated,
        pool = pool_use.as_str(),
        pool_size = stats.size,
        pool_ready = stats.ready,
        pool_hits = stats.hits,
        pool_misses = stats.misses,
        "sandbox run finished"
    );
    let end = match (&ended.destroy_error, report.timings.destroy_ms) {
        (Some(_), _) => GuestEnd::Failed,
        (None, Some(ms)) => GuestEnd::Destroyed(ms),
        (None, None) => GuestEnd::Background,
    };
    tracing::info!(
        target: LOG_TARGET,
        "{}",
        run_line(
            "backend",
            &report.guest,
            &report.guest_id,
            Some(create_ms),
            Some(report.execution_time_ms),
            end
        )
    );
    Ok(report)
}

/// The run's work on its guest: the program to `path`, dispatched and captured. Returns the
/// outcome and the upload time.
///
/// A pooled guest was verified when it entered the pool, so a program small enough to travel
/// inside the exec request needs nothing else: one round trip; a larger one is uploaded first.
/// A failure before dispatch there is [`StartError::NotStarted`] (the kit then moves the run to
/// a fresh guest). A fresh guest whose create response showed the policy (it is the read-back,
/// see `Guest::egress_confirmed`) takes a program that fits in the exec request in the exec
/// alone: two round trips with the create. Otherwise upload ∥ read back, then exec.
async fn start(
    guest: &Guest,
    begin: Begin,
    spec: &RunSpec,
    path: &str,
    program: Bytes,
) -> Result<(ExecOutcome, u64), StartError<SandboxError>> {
    let t1 = Instant::now();
    let deadline = begin.deadline;
    if begin.origin == Origin::Pooled {
        if let Some(inline) = Command::python_inline(path.to_owned(), &program) {
            let input = spec
                .exec_input(guest.name())
                .map_err(StartError::NotStarted)?;
            let run = guest
                .exec(&inline, &spec.limits, &input, deadline)
                .await
                .map_err(StartError::classify)?;
            let out = guest
                .capture(run, &spec.limits, spec.max_output_bytes)
                .await
                .map_err(StartError::Failed)?;
            return Ok((out, 0));
        }
        prepare(guest, path, program, None, deadline)
            .await
            .map_err(StartError::classify)?;
        let upload_ms = ms(t1.elapsed());
        return in_guest(guest, spec, &Command::python(path.to_owned()), deadline)
            .await
            .map(|out| (out, upload_ms))
            .map_err(StartError::Failed);
    }
    let inline = guest
        .egress_confirmed(&spec.egress)
        .then(|| Command::python_inline(path.to_owned(), &program))
        .flatten();
    // (`Guest::exec` refuses once shutdown began, as `prepare` does.)
    let ran = if let Some(inline) = inline {
        in_guest(guest, spec, &inline, deadline)
            .await
            .map(|out| (out, 0))
    } else {
        match prepare(guest, path, program, Some(&spec.egress), deadline).await {
            Ok(()) => {
                let upload_ms = ms(t1.elapsed());
                in_guest(guest, spec, &Command::python(path.to_owned()), deadline)
                    .await
                    .map(|out| (out, upload_ms))
            }
            Err(e) => Err(e),
        }
    };
    ran.map_err(StartError::Failed)
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
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
        return Err(classify::shut_down(
            guest.context().provider.kind(),
            Stage::BeforeDispatch,
        ));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_of_a_run_spec_shows_env_names_never_values() {
        let spec = RunSpec {
            shape: "s-2vcpu-4gb".into(),
            rootfs: "devbox:1".into(),
            envs: BTreeMap::from([("OPENAI_API_KEY".to_owned(), "s3cr3t-value-7f1e".to_owned())]),
            egress: EgressPolicy::AllowAll,
            limits: ExecLimits::for_seconds(5),
            max_output_bytes: 1024,
            backoff: Backoff::default(),
            background_destroy: true,
            grant: None,
        };
        for text in [format!("{spec:?}"), format!("{spec:#?}")] {
            assert!(text.contains("OPENAI_API_KEY"), "{text}");
            assert!(!text.contains("s3cr3t"), "{text}");
        }
    }
}
