//! One flow run in one guest: create (reaper-guarded) → upload the runner and the job ∥ read
//! the egress back → streaming exec of the runner → each frame yielded as it arrives → the
//! guest destroyed at the end, on an error, and when the consumer stops early.
//!
//! With a warm pool (`CREATEOS_EXECUTOR_WARM_POOL`), a run that finds a ready guest skips all
//! of that but the job: the pool created the guest, read its egress back and started a
//! *preloaded runner* there (`lfx_runner.py --serve`), which imported lfx and warmed its graph
//! machinery before any flow was known. The run uploads the job and execs the hand-off script
//! (`lfx_handoff.py`), which passes its own standard output and error to the preloaded runner:
//! the frames then travel on the run's exec stream exactly as a cold runner's do, under the
//! same guest clock, and everything below (frames, errors, timeouts, destroy) is the same code.
//! A pooled guest that cannot take the flow before the runner said hello (refused upload or
//! exec, no runner listening) is destroyed and the run falls back to a fresh guest: nothing of
//! the flow ran there.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use createos_api::{LineFramer, LineTooLong};
use futures::FutureExt as _;
use futures::future::{BoxFuture, Shared};
use sandbox_core::admission::Caps;
use sandbox_core::classify;
use sandbox_core::control::ExecFrame;
use sandbox_core::control::ProcessSpec;
use sandbox_core::exec::{Command, EXIT_KILLED, EXIT_TIMED_OUT, ExecLimits, classify_exit};
use sandbox_core::gateway::Grant;
use sandbox_core::guest::{ExecInput, ExecRun, ExecStep, Guest, GuestSpec};
use sandbox_core::observe::RunOutcome;
use sandbox_core::plan::SurfaceError;
use sandbox_core::pool::{PoolStats, Warmer};
use sandbox_core::settings::{DEFAULT_ROOTFS, Settings};
use sandbox_core::shapes::{Pin, in_catalog};
use sandbox_core::surface::{
    Acquire, End, Lease, Origin, StartError, Surface, SurfaceKind, SurfaceOptions, Want,
};
use sandbox_core::{ErrorKind, LOG_TARGET, Redactor, SandboxError};
use tokio::time::Instant;

use crate::frames::{
    Bound, FrameLimits, Line, LogLines, MAX_FRAME_BYTES, Payload, RunnerFrame, cut,
    escape_controls, parse_line,
};
use crate::job::{FlowRequest, Mode, RunHead};
use crate::runner::{
    EXIT_NO_RUNNER, EXIT_RUNNER_LOST, HANDOFF_PATH, HANDOFF_SOURCE, JOB_PATH, RUNNER_PATH, SOURCE,
    socket_name,
};
use crate::settings::{
    ENV_ALLOWED_DOMAINS, ENV_INSTALL_LFX, ENV_ROOTFS, ENV_SHAPE, ENV_TIMEOUT, ExecutorSettings,
};
use crate::timings::{self, FlowTimings};

/// The longest frame line accepted by default (16 MiB): the terminal frame carries the run's
/// outputs. The same as [`MAX_FRAME_BYTES`].
pub const DEFAULT_MAX_FRAME_BYTES: usize = MAX_FRAME_BYTES;
/// How many of the guest's last log lines an error message quotes.
const TAIL_LINES: usize = 12;

/// Why a flow run could not produce its events. `Display` is the message, which names the
/// setting involved and the fix; it never contains the API key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecutorError {
    /// Configured but unusable; nothing ran (lfx: `SandboxUnavailableError`).
    #[error("{0}")]
    Unavailable(String),
    /// An infrastructure failure, a timeout, or an unknown outcome (lfx:
    /// `SandboxExecutionError`). The message says whether the flow may have run.
    #[error("{0}")]
    Execution(String),
    /// The flow itself failed in the guest, as it would have in-process.
    #[error("{message}")]
    Flow {
        /// The Python exception type raised in the guest.
        error_type: Option<String>,
        /// Its message.
        message: String,
    },
}

impl From<SurfaceError> for ExecutorError {
    fn from(e: SurfaceError) -> Self {
        match e {
            SurfaceError::Unavailable(m) => ExecutorError::Unavailable(m),
            SurfaceError::Execution(m) => ExecutorError::Execution(m),
        }
    }
}

impl From<SandboxError> for ExecutorError {
    /// sandbox-core's one mapping of a core error onto lfx's classes.
    fn from(e: SandboxError) -> Self {
        SurfaceError::from(e).into()
    }
}

/// Reads one environment variable (sandbox-core's, shared by every surface).
pub use sandbox_core::surface::EnvLookup;

/// Knobs for tests, benchmarks and embedders; [`Executor::new`] uses the defaults.
#[derive(Clone)]
pub struct ExecutorOptions {
    /// What every surface shares (the environment lookup, the clocks, the backoff, the reaper,
    /// the session, the warm pool, the fork rule). The executor always destroys a run's guest
    /// before its run ends, whatever `background_destroy` says.
    pub surface: SurfaceOptions,
    /// The host's bounds on what it parses from the guest (default: the `frames::MAX_*`
    /// constants).
    pub limits: FrameLimits,
    /// How long a pool guest's preloaded runner may take to import lfx before the guest is
    /// given up (default 120 s).
    pub preload_wait: Duration,
}

impl fmt::Debug for ExecutorOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExecutorOptions")
            .field("surface", &self.surface)
            .field("limits", &self.limits)
            .field("preload_wait", &self.preload_wait)
            .finish()
    }
}

impl Default for ExecutorOptions {
    fn default() -> Self {
        Self {
            surface: SurfaceOptions::default(),
            limits: FrameLimits::default(),
            preload_wait: Duration::from_secs(120),
        }
    }
}

/// One event of a flow run, in the order the guest produced it.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A vertex finished: the runner's vertex frame (`id`, `display_name`,
    /// `component_display_name`, `valid`, `result`: a serialized `ResultData`), as the guest
    /// sent it once it passed the host's bounds.
    Vertex(Payload),
    /// The flow stored, updated or deleted a chat message: the runner's message frame (`op`,
    /// `id`, `message`), for the caller's message store, in the order the flow wrote it.
    Message(Payload),
    /// The run finished: the serialized `list[RunOutputs]` (empty for a streaming run). Always
    /// the last event; the guest is destroyed before it is returned.
    Complete(Payload),
}

/// Everything a run decides before any I/O.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The package's shared settings (key, endpoint).
    pub settings: Settings,
    /// The executor's own.
    pub executor: ExecutorSettings,
    /// The clocks.
    pub limits: ExecLimits,
    /// The domain grant (`CREATEOS_EXECUTOR_ALLOWED_DOMAINS`): the guest's proxy variables.
    pub grant: Option<Grant>,
}

impl Plan {
    /// The rootfs the guest gets.
    pub fn rootfs(&self) -> &str {
        self.executor.rootfs.as_deref().unwrap_or(DEFAULT_ROOTFS)
    }
}

/// The whole-flow executor: cheap to build (no I/O), `Send + Sync`, shared by every concurrent
/// run of a process. Build a fresh one in a child after `fork()`.
pub struct Executor {
    opts: ExecutorOptions,
    surface: Surface,
}

impl fmt::Debug for Executor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Executor")
            .field("surface", &self.surface)
            .finish_non_exhaustive()
    }
}

impl Default for Executor {
    fn default() -> Self {
        Self::new()
    }
}

impl Executor {
    /// An executor with default options. Reads nothing yet.
    pub fn new() -> Self {
        Self::with_options(ExecutorOptions::default())
    }

    /// An executor with explicit options.
    pub fn with_options(opts: ExecutorOptions) -> Self {
        let warmer = preloader(opts.preload_wait, opts.surface.kill_after);
        Self {
            surface: Surface::with_warmer(SurfaceKind::Executor, opts.surface.clone(), warmer),
            opts,
        }
    }

    /// The surface kit this executor runs on.
    pub fn surface(&self) -> &Surface {
        &self.surface
    }

    /// The warm pool's counters (size 0 while `CREATEOS_EXECUTOR_WARM_POOL` is unset).
    pub fn pool_stats(&self) -> PoolStats {
        self.surface.pool_stats()
    }

    /// Guests currently registered with this executor (live runs plus pending destroys).
    pub fn registered_guests(&self) -> usize {
        self.surface.registered_guests()
    }

    /// The refusals that need no I/O, in the order an operator would fix them.
    pub fn plan(&self) -> Result<Plan, ExecutorError> {
        let lookup = |k: &str| self.surface.lookup(k);
        let settings = Settings::from_lookup(&lookup)?;
        let executor = ExecutorSettings::from_lookup(&lookup)?;
        settings.require_key()?;
        let limits = self
            .surface
            .limits(Duration::from_secs(u64::from(executor.timeout_seconds)));
        let grant = if executor.domains.is_empty() {
            None
        } else {
            let gateway = settings.gateway.require(ENV_ALLOWED_DOMAINS)?;
            Some(gateway.grant(&executor.domains, limits.host_deadline()))
        };
        Ok(Plan {
            settings,
            executor,
            limits,
            grant,
        })
    }

    /// Starts `request` in a fresh guest and returns the running flow, whose events arrive
    /// through [`FlowRun::next`]. `host_lfx_version` is the host's lfx version: the per-run
    /// install (`CREATEOS_EXECUTOR_INSTALL_LFX`) pins it, and a guest with another version is
    /// logged. Every refusal happens before a guest exists; a failure after create destroys the
    /// guest before this returns. Dropping the returned future destroys the guest too.
    pub async fn start(
        &self,
        request: &FlowRequest,
        host_lfx_version: Option<&str>,
    ) -> Result<FlowRun, ExecutorError> {
        let body = request.clone();
        self.start_with(&request.head(), async move { Ok(body) }, host_lfx_version)
            .await
    }

    /// [`Executor::start`] for a request whose flow is still being prepared: `head` admits,
    /// refuses and creates the guest, whose runner starts importing lfx at once, while `body`
    /// (the glue's dump of the graph and what it resolves for the flow) completes; the job is
    /// uploaded once both the body and the guest's egress read-back are there. `body` failing
    /// ends the run (the guest destroyed) with its error.
    pub async fn start_with(
        &self,
        head: &RunHead,
        body: impl Future<Output = Result<FlowRequest, ExecutorError>> + Send + 'static,
        host_lfx_version: Option<&str>,
    ) -> Result<FlowRun, ExecutorError> {
        let began = Instant::now();
        let mut t = FlowTimings::default();
        let plan = self.plan()?;
        t.plan_ms = Some(timings::since(began));
        // Uploaded files are measured and read before anything is sent: over a bound, the run
        // is refused before any guest exists.
        let at = Instant::now();
        let files = head
            .read_files()
            .await
            .map_err(|why| ExecutorError::Unavailable(escape_controls(&why).into_owned()))?;
        t.files_ms = Some(timings::since(at));
        let at = Instant::now();
        let opened = self.surface.open(&plan.settings).await?;
        t.open_ms = Some(timings::since(at));
        let pin = Pin {
            id: &plan.executor.shape,
            setting: ENV_SHAPE,
            otherwise: "",
        };
        in_catalog(&opened.catalog, &pin)?;
        let install: Vec<String> = if plan.executor.install_lfx {
            let lfx = host_lfx_version.map_or_else(|| "lfx".to_owned(), |v| format!("lfx=={v}"));
            std::iter::once(lfx)
                .chain(plan.executor.pip_extras.iter().cloned())
                .collect()
        } else {
            Vec::new()
        };
        // The body is awaited by whichever guest gets the run (a pool guest that cannot take
        // it hands the run to a fresh one, which awaits the same body).
        let body: Body = body.map(|r| r.map(Arc::new)).boxed().shared();
        let spec = GuestSpec {
            shape: plan.executor.shape.clone(),
            rootfs: plan.rootfs().to_owned(),
            envs: plan
                .grant
                .as_ref()
                .map(Grant::declared_env)
                .unwrap_or_default(),
            egress: plan.executor.egress.clone(),
            auto_pause_after_seconds: plan.limits.auto_pause_seconds(),
        };
        let cx = self.surface.context(&opened);
        let req = Acquire {
            cx: &cx,
            spec: &spec,
            want: Want::OneShot,
            pool_size: plan.executor.warm_pool,
            caps: Caps::of(&plan.settings),
            flow: head.flow_id.as_deref(),
            run_budget: plan.limits.budget,
            node: None,
            session: head.session_id.as_deref(),
        };
        let at = Instant::now();
        let job = Job {
            body: &body,
            install: &install,
            files: &files,
            host_lfx: host_lfx_version,
            began,
            acquire_began: at,
            timings: t,
        };
        let (plan, spec, job) = (&plan, &spec, &job);
        // Boxed: the guest's start holds the exec stream and the uploads' futures.
        let acquired = Box::pin(self.surface.acquire(&req, |guest, begin| async move {
            let run = if begin.origin == Origin::Pooled {
                self.start_warm(&guest, plan, job).await
            } else {
                self.start_cold(&guest, plan, spec, head, job, begin.deadline)
                    .await
            };
            (guest, run)
        }))
        .await?;
        let lease = acquired.lease;
        match acquired.result {
            Ok(mut run) => {
                if lease.origin() == Origin::Pooled {
                    tracing::info!(
                        target: LOG_TARGET,
                        guest = %lease.guest().name(),
                        mode = head.mode.as_str(),
                        pool = ?self.surface.pool_stats(),
                        "flow run: a warm guest took the flow (preloaded runner)"
                    );
                }
                run.lease = Some(lease);
                Ok(run)
            }
            Err(e) => {
                let mut lease = lease;
                let outcome = match &e {
                    ExecutorError::Unavailable(_) => RunOutcome::Refused,
                    _ => RunOutcome::Unavailable,
                };
                lease.set_outcome(outcome, 0);
                lease.end(End::Destroy).await;
                Err(e)
            }
        }
    }

    /// Starts the runner on a guest created for this run at once, so it imports lfx while the
    /// host reads the egress back, writes the run's files and waits for the body; the job is
    /// uploaded once all of that is done (the runner waits for it), all by `deadline` (the
    /// create's too: one budget from when the run was admitted).
    async fn start_cold(
        &self,
        guest: &Guest,
        plan: &Plan,
        spec: &GuestSpec,
        head: &RunHead,
        job: &Job<'_>,
        deadline: Instant,
    ) -> Result<FlowRun, StartError<ExecutorError>> {
        let created = Instant::now();
        let mut t = job.timings;
        t.create_ms = Some(timings::ms(created - job.acquire_began));
        tracing::info!(
            target: LOG_TARGET,
            guest = %guest.name(),
            rootfs = %spec.rootfs,
            shape = %spec.shape,
            mode = head.mode.as_str(),
            pool = plan.executor.warm_pool,
            "flow run: guest created"
        );
        let mut dispatched = created;
        let runner = async {
            guest
                .upload(RUNNER_PATH, Bytes::from_static(SOURCE.as_bytes()), deadline)
                .await?;
            let exec = guest
                .exec(
                    &cold_runner(),
                    &plan.limits,
                    &ExecInput::default(),
                    deadline,
                )
                .await;
            dispatched = Instant::now();
            exec
        };
        // The job goes only to a guest whose egress was read back and matched: until then the
        // runner has the image's lfx to import and nothing of the flow.
        let job_written = async {
            let (egress, uploads, body) = tokio::join!(
                guest.verify_egress(&spec.egress, deadline),
                upload_files(guest, job.files, deadline),
                job.body_within(plan),
            );
            egress.map_err(ExecutorError::from)?;
            uploads.map_err(ExecutorError::from)?;
            let request = body?;
            let bytes = job_for(&request.job(job.install), plan.grant.as_ref(), guest.name())?;
            guest
                .upload(JOB_PATH, bytes, deadline)
                .await
                .map_err(ExecutorError::from)?;
            Ok::<_, ExecutorError>(request)
        };
        let (exec, request) = tokio::join!(runner, job_written);
        t.job_ms = Some(timings::since(created));
        t.dispatch_ms = Some(timings::ms(dispatched - created));
        let exec = exec.map_err(|e| StartError::Failed(e.into()))?;
        let request = request.map_err(StartError::Failed)?;
        t.host_context_ms = request.host_context_ms;
        let mut run = self.flow_run(exec, plan, &request, job, false);
        run.timings = t;
        run.dispatched = dispatched;
        Ok(run)
    }

    fn flow_run(
        &self,
        exec: ExecRun,
        plan: &Plan,
        request: &FlowRequest,
        job: &Job<'_>,
        preloaded: bool,
    ) -> FlowRun {
        let (host_lfx_version, started) = (job.host_lfx, job.began);
        let host_deadline = Instant::now() + exec.host_budget().saturating_sub(exec.elapsed());
        // The values of the flow's variables are masked like the key in what the guest prints.
        let mut redactor = plan.settings.redactor();
        for secret in request.secrets() {
            redactor.add(secret);
        }
        FlowRun {
            lease: None,
            exec: Some(exec),
            framer: LineFramer::new(self.opts.limits.frame_bytes),
            bounds: self.opts.limits,
            run_bytes: 0,
            run_values: 0,
            host_deadline,
            logs: LogLines::default(),
            tail: VecDeque::new(),
            pending: VecDeque::new(),
            failure: None,
            done: false,
            exit: None,
            agent_error: None,
            malformed: 0,
            vertices: 0,
            started,
            limits: plan.limits,
            rootfs: plan.rootfs().to_owned(),
            host_lfx: host_lfx_version.map(str::to_owned),
            install: plan.executor.install_lfx,
            mode: request.mode(),
            redactor,
            messages: 0,
            preloaded,
            hello: false,
            not_handed_over: false,
            timed_out: false,
            dispatched: Instant::now(),
            timings: FlowTimings::default(),
        }
    }

    /// Hands the flow to a pooled guest's preloaded runner: wait for the body, upload the job,
    /// exec the hand-off, wait for the runner's hello. Anything that fails before the hello
    /// (nothing of the flow ran) is [`StartError::NotStarted`]: the kit destroys the guest and
    /// the run goes to a fresh one.
    async fn start_warm(
        &self,
        guest: &Guest,
        plan: &Plan,
        job: &Job<'_>,
    ) -> Result<FlowRun, StartError<ExecutorError>> {
        let taken = Instant::now();
        let mut t = job.timings;
        t.create_ms = Some(timings::ms(taken - job.acquire_began));
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
        let mut run = self.flow_run(exec, plan, &request, job, true);
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

    /// Destroys every guest still registered (the warm pool's among them), within a bounded
    /// time, and refuses new runs.
    pub async fn shutdown(&self) {
        self.surface.shutdown().await;
    }
}

/// The rest of a run's request, as the glue completes it (shared: a pool guest that cannot
/// take the run hands it to a fresh guest, which awaits the same body).
type Body = Shared<BoxFuture<'static, Result<Arc<FlowRequest>, ExecutorError>>>;

/// What every guest a run tries needs from the run's start.
struct Job<'a> {
    body: &'a Body,
    /// The pip requirements of the per-run install (empty: none).
    install: &'a [String],
    /// The uploaded files, read before any guest existed.
    files: &'a [(String, Bytes)],
    host_lfx: Option<&'a str>,
    /// When the run started, and when it asked for its guest.
    began: Instant,
    acquire_began: Instant,
    /// The phases measured before the guest.
    timings: FlowTimings,
}

impl Job<'_> {
    /// The rest of the request, waited for no longer than the run's own host deadline.
    async fn body_within(&self, plan: &Plan) -> Result<Arc<FlowRequest>, ExecutorError> {
        let within = plan.limits.host_deadline();
        tokio::time::timeout(within, self.body.clone())
            .await
            .unwrap_or_else(|_| {
                Err(ExecutorError::Execution(format!(
                    "the host did not complete the flow's request within {}s (resolving its \
                     variables, history and files); nothing of the flow ran and the guest was \
                     destroyed",
                    within.as_secs()
                )))
            })
    }
}

/// The cold runner's exec: it imports lfx at once and waits for the job (`--wait`).
fn cold_runner() -> Command {
    Command::shell(format!("exec python3 -u {RUNNER_PATH} --wait {JOB_PATH}"))
}

/// The job document for a run in `guest`: with a domain grant, it carries the proxy
/// variables with a token minted for that guest (the runner sets them before anything of the
/// run opens a connection; the job file is removed before the flow runs).
fn job_for(
    job: &serde_json::Value,
    grant: Option<&Grant>,
    guest: &str,
) -> Result<Bytes, ExecutorError> {
    let mut job = job.clone();
    if let (Some(grant), Some(doc)) = (grant, job.as_object_mut()) {
        let env = grant.env_for(guest)?;
        doc.insert("env".to_owned(), serde_json::json!(env));
    }
    serde_json::to_vec(&job)
        .map(Bytes::from)
        .map_err(|e| ExecutorError::Execution(format!("the flow could not be serialized: {e}")))
}

/// The pool's preparation of an executor guest: upload the runner and the hand-off script,
/// start the runner as a long-lived process (`--serve`), and wait until it answers that lfx
/// is imported. A guest whose image has no lfx is given up (and the pool backs off), so runs
/// then go cold and report the missing lfx as they would without a pool.
fn preloader(wait: Duration, kill_after: Duration) -> Warmer {
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
        escape_controls(&cut(stderr.trim(), 2000))
    ))
}

/// Writes the run's uploaded files in the guest (at their guest paths), all at once.
async fn upload_files(
    guest: &Guest,
    files: &[(String, Bytes)],
    deadline: Instant,
) -> Result<(), SandboxError> {
    futures::future::try_join_all(
        files
            .iter()
            .map(|(path, data)| guest.upload(path, data.clone(), deadline)),
    )
    .await
    .map(drop)
}

/// A flow running in its guest. Take its events with [`FlowRun::next`]; end it early with
/// [`FlowRun::close`] (or drop it: the guest then goes to the reaper, which destroys it).
#[allow(clippy::struct_excessive_bools)] // independent facts about one run's stream
pub struct FlowRun {
    /// The run's guest (none while a pooled guest's runner is being handed the flow: the kit
    /// holds it then).
    lease: Option<Lease>,
    exec: Option<ExecRun>,
    framer: LineFramer,
    /// The host's bounds on what the guest sends, and what this run's frames used of them.
    bounds: FrameLimits,
    run_bytes: u64,
    run_values: u64,
    /// When the host stops waiting for the exec, whatever the guest does.
    host_deadline: Instant,
    logs: LogLines,
    tail: VecDeque<String>,
    pending: VecDeque<Event>,
    /// The run's failure, held back until the events read before it were taken.
    failure: Option<ExecutorError>,
    done: bool,
    exit: Option<i64>,
    agent_error: Option<String>,
    malformed: u32,
    vertices: u32,
    started: Instant,
    limits: ExecLimits,
    rootfs: String,
    host_lfx: Option<String>,
    install: bool,
    mode: Mode,
    /// The API key and the values of the flow's variables, masked in everything the host logs
    /// or raises from the guest's output.
    redactor: Redactor,
    /// Message frames read so far (bounded by [`FrameLimits::run_messages`]).
    messages: u64,
    /// The run went to a pooled guest's preloaded runner through the hand-off.
    preloaded: bool,
    /// The runner's hello frame arrived (from then on the flow may have run).
    hello: bool,
    /// The hand-off found no runner to take the flow (nothing ran).
    not_handed_over: bool,
    /// The flow did not finish within its timeout (the guest's clock or the host's deadline):
    /// counted as timed out, whatever error reports it.
    timed_out: bool,
    /// When the runner's exec was accepted.
    dispatched: Instant,
    /// Where the run's time went so far.
    timings: FlowTimings,
}

impl fmt::Debug for FlowRun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FlowRun")
            .field("guest", &self.guest_name())
            .field("vertices", &self.vertices)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl FlowRun {
    /// The guest's name (until the run ended).
    pub fn guest_name(&self) -> Option<&str> {
        self.lease.as_ref().map(|l| l.guest().name())
    }

    /// The mode the guest runs.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Where the run's time went so far (complete once the run ended).
    pub fn timings(&self) -> FlowTimings {
        self.timings
    }

    /// When the host gives up on the run's exec (the guest clock plus its grace), whatever the
    /// guest sends. A consumer that holds events back should not wait past it either.
    pub fn host_deadline(&self) -> Instant {
        self.host_deadline
    }

    /// The next event, as soon as the guest produced it; `Ok(None)` after the
    /// [`Event::Complete`]. An error ends the run (the guest is destroyed first).
    pub async fn next(&mut self) -> Result<Option<Event>, ExecutorError> {
        loop {
            if let Some(ev) = self.pending.pop_front() {
                if matches!(ev, Event::Complete(_)) {
                    self.end(RunOutcome::Ok).await;
                }
                return Ok(Some(ev));
            }
            if let Some(err) = self.failure.take() {
                return Err(err);
            }
            if self.done {
                return Ok(None);
            }
            match self.pump().await {
                Ok(true) => {}
                Ok(false) => return Ok(None),
                // The events read before the failure go first (the guest is already gone).
                Err(err) if !self.pending.is_empty() => self.failure = Some(err),
                Err(err) => return Err(err),
            }
        }
    }

    /// Reads until the runner's hello frame: `Ok(true)` once it arrived (or anything after
    /// it), `Ok(false)` when the hand-off reported that no runner took the flow.
    async fn until_hello(&mut self) -> Result<bool, ExecutorError> {
        loop {
            if self.hello || self.done || !self.pending.is_empty() {
                return Ok(true);
            }
            if !self.pump().await? {
                return Ok(self.hello);
            }
            if self.not_handed_over {
                return Ok(false);
            }
        }
    }

    /// Takes one step of the exec; `Ok(false)` when there is nothing more to read.
    async fn pump(&mut self) -> Result<bool, ExecutorError> {
        {
            let Some(exec) = self.exec.as_mut() else {
                return Ok(false);
            };
            let step = exec.next().await;
            match step {
                ExecStep::Frame(ExecFrame::Stdout(s)) => {
                    self.framer.push(Bytes::from(s.into_bytes()));
                    self.take_lines().await?;
                }
                ExecStep::Frame(ExecFrame::Stderr(s)) => {
                    for line in self.logs.push(s.as_bytes()) {
                        self.log(&line);
                    }
                }
                ExecStep::Frame(ExecFrame::Error(m)) => {
                    self.agent_error = Some(escape_controls(&self.redactor.cap(&m)).into_owned());
                }
                ExecStep::Frame(ExecFrame::Heartbeat) => {}
                ExecStep::Frame(ExecFrame::Exit(c)) => {
                    self.exit = Some(c);
                    if self.preloaded
                        && !self.hello
                        && (c == EXIT_NO_RUNNER || c == EXIT_RUNNER_LOST)
                    {
                        self.not_handed_over = true;
                        return Ok(false);
                    }
                    self.end_of_output().await?;
                }
                ExecStep::End => self.end_of_output().await?,
                ExecStep::HostDeadline => {
                    self.timed_out = true;
                    let frames = exec.frames();
                    let msg = if frames == 0 {
                        format!(
                            "CreateOS accepted the exec but sent nothing for {}s; the flow may \
                             have run. The guest was destroyed",
                            exec.host_budget().as_secs()
                        )
                    } else {
                        self.timeout_message()
                    };
                    return Err(self.fail(ExecutorError::Execution(msg)).await);
                }
                ExecStep::Broken(e) => {
                    let err = classify::stream_broke(&e, 0, 0, &self.redactor);
                    return Err(self.fail(err.into()).await);
                }
            }
        }
        Ok(true)
    }

    /// Ends the run now: stops the exec and destroys the guest. Idempotent.
    pub async fn close(&mut self) {
        self.done = true;
        self.pending.clear();
        self.failure = None;
        // Ended by its caller before its complete frame: the flow may have run (in part).
        self.end(RunOutcome::MayHaveRun).await;
    }

    async fn end(&mut self, outcome: RunOutcome) {
        self.done = true;
        self.exec = None;
        if let Some(mut lease) = self.lease.take() {
            lease.set_outcome(outcome, self.run_bytes);
            let ended = lease.end(End::Destroy).await;
            self.timings.total_ms = Some(timings::since(self.started));
            tracing::info!(
                target: LOG_TARGET,
                guest = %ended.name,
                vertices = self.vertices,
                timings = %self.timings.summary(),
                "flow run finished; guest destroyed"
            );
        }
    }

    async fn fail(&mut self, err: ExecutorError) -> ExecutorError {
        // Refusals are the host's (a bound the guest broke, a missing lfx); any other failure
        // after the runner started may have run part of the flow.
        let outcome = match &err {
            _ if self.timed_out => RunOutcome::TimedOut,
            ExecutorError::Unavailable(_) => RunOutcome::Refused,
            ExecutorError::Flow { .. } => RunOutcome::ProgramFailed,
            ExecutorError::Execution(_) if self.hello => RunOutcome::ProgramFailed,
            ExecutorError::Execution(_) => RunOutcome::MayHaveRun,
        };
        self.end(outcome).await;
        err
    }

    fn log(&mut self, line: &str) {
        if line.is_empty() {
            return;
        }
        let line = escape_controls(&self.redactor.apply(line)).into_owned();
        tracing::info!(target: LOG_TARGET, "guest: {line}");
        if self.tail.len() == TAIL_LINES {
            self.tail.pop_front();
        }
        self.tail.push_back(line);
    }

    async fn take_lines(&mut self) -> Result<(), ExecutorError> {
        loop {
            if self.done {
                // Nothing after the terminal frame (or a failure) is read.
                return Ok(());
            }
            let line = match self.framer.next_line() {
                Ok(Some(line)) => line,
                Ok(None) => return Ok(()),
                Err(LineTooLong { .. }) => return Err(self.refuse(Bound::FrameBytes).await),
            };
            let parsed = parse_line(&line, &self.bounds);
            if !matches!(parsed, Line::Log(_)) {
                self.run_bytes = self
                    .run_bytes
                    .saturating_add(u64::try_from(line.len()).unwrap_or(u64::MAX));
                if self.run_bytes > self.bounds.run_bytes {
                    return Err(self.refuse(Bound::RunBytes).await);
                }
            }
            match parsed {
                Line::Log(text) => self.log(&text),
                Line::Refused(bound) => return Err(self.refuse(bound).await),
                Line::Malformed(why) => {
                    let why = self.redactor.apply(&why);
                    self.malformed += 1;
                    tracing::warn!(
                        target: LOG_TARGET,
                        bytes = line.len(),
                        "the guest runner wrote a malformed frame line ({why}); it was skipped"
                    );
                }
                Line::Frame(frame, values) => {
                    self.run_values = self.run_values.saturating_add(values);
                    if self.run_values > self.bounds.run_values {
                        return Err(self.refuse(Bound::RunValues).await);
                    }
                    self.frame(frame).await?;
                }
            }
        }
    }

    /// Stops the run because the guest sent more than `bound` allows.
    async fn refuse(&mut self, bound: Bound) -> ExecutorError {
        let msg = format!(
            "the guest sent {}, over the host's bound {} on what a guest may send; the run was \
             stopped and the guest destroyed. The host bounds everything a flow returns, \
             whatever the guest runner does: make the flow return less",
            bound.describe(&self.bounds),
            bound.name()
        );
        tracing::warn!(target: LOG_TARGET, vertices = self.vertices, "{msg}");
        self.fail(ExecutorError::Execution(msg)).await
    }

    async fn frame(&mut self, frame: RunnerFrame) -> Result<(), ExecutorError> {
        match frame {
            RunnerFrame::Hello {
                lfx,
                python,
                preload_ms,
                wait_ms,
            } => {
                self.hello = true;
                self.timings.runner_ready_ms = Some(timings::since(self.dispatched));
                if !self.preloaded {
                    // A pool guest's preload happened before the run; the hand-off is its wait.
                    self.timings.guest_preload_ms = preload_ms;
                    self.timings.guest_wait_ms = wait_ms;
                }
                tracing::debug!(target: LOG_TARGET, lfx = %lfx, python = %python, "guest runner started");
                if let Some(host) = &self.host_lfx
                    && *host != lfx
                {
                    tracing::warn!(
                        target: LOG_TARGET,
                        "the guest has lfx {lfx} but this host runs lfx {host}; rebuild the \
                         template ({ENV_ROOTFS}) with lfx=={host} if the flow misbehaves"
                    );
                }
            }
            RunnerFrame::Graph { rebuild_ms } => self.timings.rebuild_ms = rebuild_ms,
            RunnerFrame::Vertex(v) => {
                if self.vertices == 0 {
                    self.timings.first_event_ms = Some(timings::since(self.started));
                }
                self.vertices += 1;
                self.pending.push_back(Event::Vertex(v));
            }
            RunnerFrame::Message(m) => {
                self.messages += 1;
                if self.messages > self.bounds.run_messages {
                    return Err(self.refuse(Bound::RunMessages).await);
                }
                self.pending.push_back(Event::Message(m));
            }
            RunnerFrame::Complete(outputs) => {
                self.pending.push_back(Event::Complete(outputs));
                // Nothing after the terminal frame matters: the exec is stopped at `end`.
                self.done = true;
            }
            RunnerFrame::Error {
                kind,
                error_type,
                message,
            } => {
                let message = escape_controls(&self.redactor.apply(&message)).into_owned();
                let err = match kind.as_str() {
                    "missing_lfx" => ExecutorError::Unavailable(self.missing_lfx_message()),
                    "protocol" => ExecutorError::Execution(format!(
                        "the guest runner refused the job ({message}); this is a bug in \
                         langflow-sandbox-createos"
                    )),
                    _ => ExecutorError::Flow {
                        error_type,
                        message,
                    },
                };
                return Err(self.fail(err).await);
            }
        }
        Ok(())
    }

    fn missing_lfx_message(&self) -> String {
        let want = self
            .host_lfx
            .as_deref()
            .map_or_else(|| "lfx".to_owned(), |v| format!("lfx=={v}"));
        if self.install {
            format!(
                "lfx could not be installed in the guest ({ENV_INSTALL_LFX}=true: `pip install \
                 {want}` failed, see the guest log lines above); the flow was not run. Bake a \
                 template instead: `python -m langflow_sandbox_createos template build \
                 FLOW.json` and set {ENV_ROOTFS} to the value it prints"
            )
        } else {
            format!(
                "lfx is not installed in the guest image {:?}; the flow was not run. Set \
                 {ENV_ROOTFS} to a template with {want} and the flow's components (`python -m \
                 langflow_sandbox_createos template build FLOW.json` builds one and prints the \
                 value), or set {ENV_INSTALL_LFX}=true to pip-install lfx in every guest (slow; \
                 for a first experiment)",
                self.rootfs
            )
        }
    }

    fn timeout_message(&self) -> String {
        format!(
            "the flow did not finish within {ENV_TIMEOUT}={}s (enforced in the guest); it was \
             stopped and the guest destroyed after {} vertices",
            self.limits.budget.as_secs(),
            self.vertices
        )
    }

    /// The output ended (exit status or end of stream) before a terminal frame was read.
    async fn end_of_output(&mut self) -> Result<(), ExecutorError> {
        self.framer.finish();
        self.take_lines().await?;
        if let Some(line) = self.logs.finish() {
            self.log(&line);
        }
        if !self.pending.is_empty() || self.done {
            // The terminal frame arrived (or was being read).
            if self.done {
                return Ok(());
            }
        }
        let elapsed = self.exec.as_ref().map_or(Duration::ZERO, ExecRun::elapsed);
        let tail = if self.tail.is_empty() {
            String::new()
        } else {
            format!(
                ". Last guest output: {}",
                self.tail.iter().cloned().collect::<Vec<_>>().join(" | ")
            )
        };
        let malformed = if self.malformed > 0 {
            format!(" ({} malformed frame line(s) were skipped)", self.malformed)
        } else {
            String::new()
        };
        let err = match self.exit {
            Some(c) if (0..=255).contains(&c) => {
                let code = i32::try_from(c).unwrap_or(i32::MAX);
                match classify_exit(code, elapsed, self.limits.budget) {
                    EXIT_TIMED_OUT => {
                        self.timed_out = true;
                        ExecutorError::Execution(self.timeout_message())
                    }
                    EXIT_KILLED => ExecutorError::Execution(format!(
                        "the guest runner was killed (exit status 137) before the flow finished, \
                         most likely out of memory; pick a larger {ENV_SHAPE}{tail}"
                    )),
                    other => ExecutorError::Execution(format!(
                        "the guest runner exited with status {other} without reporting a \
                         result{malformed}{tail}"
                    )),
                }
            }
            other => {
                let what = other.map_or_else(
                    || "the exec stream ended without an exit status".to_owned(),
                    |c| format!("CreateOS reported exit status {c}, which no process can have"),
                );
                let why = self.agent_error.as_ref().map_or_else(String::new, |m| {
                    format!(" (the guest agent reported: {})", self.redactor.cap(m))
                });
                SandboxError::new(
                    ErrorKind::OutcomeUnknown,
                    format!(
                        "the flow run did not complete: {what}{why}{malformed}; the flow may \
                         have run"
                    ),
                )
                .redacted(&self.redactor)
                .into()
            }
        };
        Err(self.fail(err).await)
    }
}
