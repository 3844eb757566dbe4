//! A flow run's start on a warm pool's guest, and the pool's preparation of one.
//!
//! With a warm pool (`CREATEOS_EXECUTOR_WARM_POOL`), a run that finds a ready guest skips all of
//! the cold start (`start`) but the job: the pool created the guest, read its egress back and
//! started a *preloaded runner* there (`lfx_runner.py --serve`), which imported lfx and warmed its
//! graph machinery before any flow was known. The run uploads the job and execs the hand-off script
//! (`lfx_handoff.py`), which passes its own standard output and error to the preloaded runner: the
//! frames then travel on the run's exec stream exactly as a cold runner's do, under the same guest
//! clock, and everything after (frames, errors, timeouts, destroy: `flow_run`) is the same code. A
//! pooled guest that cannot take the flow before the runner said hello (refused upload or exec, no
//! runner listening) is destroyed and the run falls back to a fresh guest: nothing of the flow ran
//! there.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use sandbox_core::control::ProcessSpec;
use sandbox_core::exec::{Command, ExecLimits};
use sandbox_core::guest::{ExecInput, Guest};
use sandbox_core::pool::Warmer;
use sandbox_core::surface::StartError;
use sandbox_core::{ErrorKind, LOG_TARGET};
use tokio::time::Instant;

use crate::error::ExecutorError;
use crate::flow_run::FlowRun;
use crate::frames::{FrameLimits, cut};
use crate::prepared::{Job, Plan, job_for, upload_files};
use crate::runner::{HANDOFF_PATH, HANDOFF_SOURCE, JOB_PATH, RUNNER_PATH, SOURCE, socket_name};
use crate::settings::ENV_ROOTFS;
use crate::timings;

/// Hands the flow to a pooled guest's preloaded runner: wait for the body, upload the job,
/// exec the hand-off, wait for the runner's hello; the run's frames are then read within
/// `bounds`. Anything that fails before the hello (nothing of the flow ran) is
/// [`StartError::NotStarted`]: the kit destroys the guest and the run goes to a fresh one.
pub(crate) async fn start_warm(
    guest: &Guest,
    plan: &Plan,
    job: &Job<'_>,
    bounds: FrameLimits,
) -> Result<FlowRun, StartError<ExecutorError>> {
    let taken = Instant::now();
    let mut t = job.timings;
    t.acquire_ms = Some(timings::ms(taken - job.acquire_began));
    let request = job.body_within(plan).await.map_err(StartError::Failed)?;
    let job_bytes = job_for(&request.job(job.install), plan.grant.as_ref(), guest.name())
        .map_err(StartError::NotStarted)?;
    let deadline = Instant::now() + guest.context().backoff.budget;
    let (uploaded, uploads) = tokio::join!(
        guest.upload(JOB_PATH, job_bytes, deadline),
        upload_files(guest, job.files, deadline),
    );
    if let Err(e) = uploaded.and(uploads) {
        return Err(StartError::NotStarted(ExecutorError::Execution(format!(
            "the job upload failed: {}",
            e.message()
        ))));
    }
    t.job_ms = Some(timings::since(taken));
    let command = Command::shell(format!(
        "exec python3 -S {HANDOFF_PATH} job {} {JOB_PATH}",
        socket_name(guest.name())
    ));
    let exec = match guest
        .exec(&command, &plan.limits, &ExecInput::default(), deadline)
        .await
    {
        Ok(exec) => exec,
        Err(e) if e.kind() == ErrorKind::OutcomeUnknown => {
            return Err(StartError::Failed(e.into()));
        }
        Err(e) => {
            return Err(StartError::NotStarted(ExecutorError::Execution(format!(
                "the exec was refused: {}",
                e.message()
            ))));
        }
    };
    t.dispatch_ms = Some(timings::since(taken));
    t.host_context_ms = request.host_context_ms;
    let mut run = FlowRun::new(
        exec,
        plan,
        &request,
        job,
        bounds,
        true,
        guest.context().provider.kind(),
    );
    run.timings = t;
    match run.until_hello().await {
        Ok(true) => Ok(run),
        Ok(false) => {
            run.close().await;
            Err(StartError::NotStarted(ExecutorError::Execution(
                "its preloaded runner was gone".to_owned(),
            )))
        }
        Err(e) => Err(StartError::Failed(e)),
    }
}

/// The pool's preparation of an executor guest: upload the runner and the hand-off script,
/// start the runner as a long-lived process (`--serve`), and wait until it answers that lfx
/// is imported. A guest whose image has no lfx is given up (and the pool backs off), so runs
/// then go cold and report the missing lfx as they would without a pool.
pub(crate) fn preloader(wait: Duration, kill_after: Duration) -> Warmer {
    Arc::new(move |guest: &Guest| Box::pin(preload(guest, wait, kill_after)))
}

async fn preload(guest: &Guest, wait: Duration, kill_after: Duration) -> Result<(), String> {
    let deadline = Instant::now() + wait;
    let (runner, handoff) = tokio::join!(
        guest.upload(RUNNER_PATH, Bytes::from_static(SOURCE.as_bytes()), deadline),
        guest.upload(
            HANDOFF_PATH,
            Bytes::from_static(HANDOFF_SOURCE.as_bytes()),
            deadline
        ),
    );
    runner.and(handoff).map_err(|e| e.message().to_owned())?;
    let socket = socket_name(guest.name());
    let spec = ProcessSpec {
        cmd: "python3".to_owned(),
        args: vec![
            "-u".to_owned(),
            RUNNER_PATH.to_owned(),
            "--serve".to_owned(),
            socket.clone(),
        ],
        cwd: "/workspace".to_owned(),
    };
    guest
        .spawn_process(&spec, deadline)
        .await
        .map_err(|e| format!("the preloaded runner did not start: {}", e.message()))?;
    let limits = ExecLimits {
        budget: wait,
        kill_after,
        host_grace: Duration::from_secs(5),
    };
    let ping = Command::shell(format!(
        "exec python3 -S {HANDOFF_PATH} ping {socket} {}",
        wait.as_secs().max(1)
    ));
    let run = guest
        .exec(&ping, &limits, &ExecInput::default(), deadline)
        .await
        .map_err(|e| e.message().to_owned())?;
    let outcome = guest
        .capture(run, &limits, 4096)
        .await
        .map_err(|e| e.message().to_owned())?;
    let answer = outcome.stdout.text.to_string().trim().to_owned();
    if let Some(version) = answer.strip_prefix("READY ") {
        tracing::debug!(target: LOG_TARGET, guest = guest.name(), lfx = version, "warm pool: preloaded runner ready");
        return Ok(());
    }
    if answer == "NOLFX" {
        return Err(format!(
            "lfx is not installed in the guest image; set {ENV_ROOTFS} to a template with lfx"
        ));
    }
    let stderr = outcome.stderr.text.to_string();
    Err(format!(
        "the preloaded runner did not answer (exit {}, {:?}; {})",
        outcome.exit_code,
        cut(&answer, 200),
        outside_text::block(&cut(stderr.trim(), 2000))
    ))
}
