//! A flow run's stream, once its runner's exec was accepted: each frame yielded as it arrives
//! ([`FlowRun::next`], [`Event`]) within the host's bounds on what the guest sends, the run's
//! errors read from its frames, exit status and output, and the guest destroyed at the end, on
//! an error, and when the consumer stops early ([`FlowRun::close`], or dropping the run). A cold
//! and a warm run share all of it.

use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use createos_api::{LineFramer, LineTooLong};
use sandbox_core::classify;
use sandbox_core::control::ExecFrame;
use sandbox_core::exec::{EXIT_KILLED, EXIT_TIMED_OUT, ExecLimits, classify_exit};
use sandbox_core::guest::{ExecRun, ExecStep};
use sandbox_core::observe::RunOutcome;
use sandbox_core::provider::ProviderKind;
use sandbox_core::surface::{End, Lease};
use sandbox_core::timings::{GuestEnd, run_line};
use sandbox_core::{ErrorKind, LOG_TARGET, Redactor, SandboxError};
use sandbox_opensandbox::settings::ENV_IMAGE as OPENSANDBOX_IMAGE;
use tokio::time::Instant;

use crate::chunks::{Broken, Reassembly};
use crate::error::ExecutorError;
use crate::frames::{Bound, FrameLimits, Line, LogLines, Payload, RunnerFrame, parse_line};
use crate::job::{FlowRequest, Mode};
use crate::prepared::{Job, Plan};
use crate::runner::{EXIT_NO_RUNNER, EXIT_RUNNER_LOST};
use crate::settings::{
    ENV_INSTALL_LFX, ENV_MAX_RESULT_BYTES, ENV_ROOTFS, ENV_SHAPE, ENV_TIMEOUT, MAX_MAX_RESULT_BYTES,
};
use crate::timings::{self, Timings};

/// The outcome of a run whose caller stopped reading before its end ([`FlowRun::outcome`]).
pub const STOPPED: &str = "stopped";
/// How many of the guest's last log lines an error message quotes.
const TAIL_LINES: usize = 12;
/// After the runner's error frame: how long the host goes on reading the guest's stderr (until
/// its exit, at most this) so that what the flow printed before it failed is logged. stdout and
/// stderr travel apart, so the frame can arrive before lines written earlier.
const LOG_DRAIN: Duration = Duration::from_secs(1);

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

impl FlowRun {
    /// The stream of a run whose runner's exec `exec` the guest accepted, read within `bounds`
    /// (their bytes for the whole run are the plan's `CREATEOS_EXECUTOR_MAX_RESULT_BYTES`;
    /// `preloaded`: through a pooled guest's hand-off). Its guest's lease is set by the start
    /// once the kit hands it over.
    pub(crate) fn new(
        exec: ExecRun,
        plan: &Plan,
        request: &FlowRequest,
        job: &Job<'_>,
        bounds: FrameLimits,
        preloaded: bool,
        provider: ProviderKind,
    ) -> FlowRun {
        let (host_lfx_version, started) = (job.host_lfx, job.began);
        let bounds = FrameLimits {
            run_bytes: plan.executor.max_result_bytes,
            ..bounds
        };
        let host_deadline = Instant::now() + exec.host_budget().saturating_sub(exec.elapsed());
        // The values of the flow's variables are masked like the key in what the guest prints.
        let mut redactor = plan.settings.redactor();
        for secret in request.secrets() {
            redactor.add(secret);
        }
        FlowRun {
            lease: None,
            exec: Some(exec),
            framer: LineFramer::new(bounds.frame_bytes),
            bounds,
            run_bytes: 0,
            run_values: 0,
            chunks: Reassembly::default(),
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
            provider,
            hello: false,
            not_handed_over: false,
            timed_out: false,
            dispatched: Instant::now(),
            timings: Timings::default(),
            outcome: None,
        }
    }
}

/// A flow running in its guest. Take its events with [`FlowRun::next`]; end it early with
/// [`FlowRun::close`] (or drop it: the guest then goes to the reaper, which destroys it).
#[allow(clippy::struct_excessive_bools)] // independent facts about one run's stream
pub struct FlowRun {
    /// The run's guest (none while a pooled guest's runner is being handed the flow: the kit
    /// holds it then).
    pub(crate) lease: Option<Lease>,
    exec: Option<ExecRun>,
    framer: LineFramer,
    /// The host's bounds on what the guest sends, and what this run's frames used of them.
    bounds: FrameLimits,
    run_bytes: u64,
    run_values: u64,
    /// The frame being put back together from its pieces, if one is.
    chunks: Reassembly,
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
    /// The provider the guest runs on, as messages name it.
    provider: ProviderKind,
    /// The runner's hello frame arrived (from then on the flow may have run).
    hello: bool,
    /// The hand-off found no runner to take the flow (nothing ran).
    not_handed_over: bool,
    /// The flow did not finish within its timeout (the guest's clock or the host's deadline):
    /// counted as timed out, whatever error reports it.
    timed_out: bool,
    /// When the runner's exec was accepted.
    pub(crate) dispatched: Instant,
    /// Where the run's time went so far.
    pub(crate) timings: Timings,
    /// How the run ended (see [`FlowRun::outcome`]).
    outcome: Option<&'static str>,
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
    pub fn timings(&self) -> Timings {
        self.timings
    }

    /// How the run ended, as its span reports it, once it ended: the metrics' outcome (`ok`,
    /// `program_failed`, `timed_out`, `refused`, `may_have_run`), or [`STOPPED`] when its
    /// caller stopped reading before the end ([`FlowRun::close`]).
    pub fn outcome(&self) -> Option<&'static str> {
        self.outcome
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
    pub(crate) async fn until_hello(&mut self) -> Result<bool, ExecutorError> {
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
                    self.agent_error = Some(self.redactor.cap(&m));
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
                        sent_nothing(self.provider, exec.host_budget())
                    } else {
                        self.timeout_message()
                    };
                    return Err(self.fail(ExecutorError::Execution(msg)).await);
                }
                ExecStep::Broken(e) => {
                    let err = classify::stream_broke(self.provider, &e, 0, 0, &self.redactor);
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
        if self.lease.is_some() {
            // The caller stopped reading before the end: what its span reports.
            self.outcome = Some(STOPPED);
        }
        // Ended by its caller before its complete frame: the flow may have run (in part).
        self.end(RunOutcome::MayHaveRun).await;
    }

    async fn end(&mut self, outcome: RunOutcome) {
        self.done = true;
        self.exec = None;
        if let Some(mut lease) = self.lease.take() {
            self.outcome.get_or_insert(outcome.as_str());
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
            let destroy_ms = ended.destroy_time.map(timings::ms);
            let end = match destroy_ms {
                Some(ms) if ended.destroy_error.is_none() => GuestEnd::Destroyed(ms),
                _ => GuestEnd::Failed,
            };
            let acquire = self.timings.acquire_ms;
            let run = self
                .timings
                .total_ms
                .map(|total| total.saturating_sub(acquire.unwrap_or(0) + destroy_ms.unwrap_or(0)));
            tracing::info!(
                target: LOG_TARGET,
                "{}",
                run_line("executor", &ended.name, &ended.id, acquire, run, end)
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
        let line = outside_text::line(&self.redactor.apply(line)).into_owned();
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
            if let Line::Frame(RunnerFrame::Chunk { index, total, data }, _) = parsed {
                if let Some(text) = self.piece(index, total, data.as_bytes()).await? {
                    self.whole(&text).await?;
                }
                continue;
            }
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
                Line::Frame(frame, values) => self.admit(frame, values).await?,
            }
        }
    }

    /// Takes a piece of a chunked frame: the whole frame's text once its last piece arrived.
    /// Its data counts toward the run's bytes (the frame's own length, whatever its pieces'
    /// lines add), and the whole frame must fit in what the run has left.
    async fn piece(
        &mut self,
        index: u64,
        total: u64,
        data: &[u8],
    ) -> Result<Option<Bytes>, ExecutorError> {
        let room = self.bounds.run_bytes.saturating_sub(self.run_bytes);
        match self.chunks.push(index, total, data, room) {
            Ok(whole) => {
                self.run_bytes = self
                    .run_bytes
                    .saturating_add(u64::try_from(data.len()).unwrap_or(u64::MAX));
                Ok(whole)
            }
            Err(broken) => Err(self.broken(broken).await),
        }
    }

    /// Reads a reassembled frame as any frame line (its length was bounded piece by piece);
    /// what is not a frame of the protocol stops the run: only the runner chunks frames.
    async fn whole(&mut self, text: &Bytes) -> Result<(), ExecutorError> {
        let limits = FrameLimits {
            frame_bytes: usize::MAX,
            ..self.bounds
        };
        match parse_line(text, &limits) {
            Line::Frame(RunnerFrame::Chunk { .. }, _) => Err(self
                .unreadable("a chunked frame whose text is itself a chunk frame")
                .await),
            Line::Frame(frame, values) => self.admit(frame, values).await,
            Line::Refused(bound) => Err(self.refuse(bound).await),
            Line::Malformed(why) => {
                let why = self.redactor.apply(&why);
                Err(self
                    .unreadable(&format!("a chunked frame that is not a frame ({why})"))
                    .await)
            }
            Line::Log(_) => Err(self
                .unreadable("a chunked frame whose text is not a JSON object")
                .await),
        }
    }

    /// Takes a frame (read whole from one line or reassembled): within the run's bound on
    /// values, and never in the middle of a chunked frame.
    async fn admit(&mut self, frame: RunnerFrame, values: u64) -> Result<(), ExecutorError> {
        if let Err(broken) = self.chunks.between_frames() {
            return Err(self.broken(broken).await);
        }
        self.run_values = self.run_values.saturating_add(values);
        if self.run_values > self.bounds.run_values {
            return Err(self.refuse(Bound::RunValues).await);
        }
        self.frame(frame).await
    }

    /// Stops the run because the guest sent more than `bound` allows.
    async fn refuse(&mut self, bound: Bound) -> ExecutorError {
        if bound == Bound::RunBytes {
            let what = format!("frames of more than {} bytes in all", self.bounds.run_bytes);
            return self.over_result_bytes(&what).await;
        }
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

    /// Stops the run because its results passed `CREATEOS_EXECUTOR_MAX_RESULT_BYTES`: `what`
    /// the guest sent.
    async fn over_result_bytes(&mut self, what: &str) -> ExecutorError {
        let cap = self.bounds.run_bytes;
        let msg = format!(
            "the flow's results are larger than this host takes from a guest: the guest sent \
             {what}, over {ENV_MAX_RESULT_BYTES}={cap} (the bytes of one run's results: every \
             vertex's result, the chat messages it stores and the run's outputs, where a \
             vertex's result carries its output up to four times). The run was stopped and the \
             guest destroyed. Raise {ENV_MAX_RESULT_BYTES} (at most {MAX_MAX_RESULT_BYTES}) to \
             take larger results, or make the flow return less"
        );
        tracing::warn!(target: LOG_TARGET, vertices = self.vertices, "{msg}");
        self.fail(ExecutorError::Execution(msg)).await
    }

    /// Stops the run because a chunked frame could not be put back together.
    async fn broken(&mut self, broken: Broken) -> ExecutorError {
        if let Broken::OverBound { total, .. } = broken {
            let what = format!(
                "a result frame of {total} bytes after {} bytes of results",
                self.run_bytes
            );
            return self.over_result_bytes(&what).await;
        }
        self.unreadable(&broken.to_string()).await
    }

    /// Stops the run because the guest broke the chunking protocol (`what` it sent).
    async fn unreadable(&mut self, what: &str) -> ExecutorError {
        let msg = format!(
            "the guest sent {what}; the run was stopped and the guest destroyed. Only the guest \
             runner splits a frame into pieces, and it sends them in order: flow code wrote to \
             the runner's frame stream"
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
            RunnerFrame::Chunk { .. } => {
                // Pieces are taken as lines arrive (`piece`); a piece never reaches here.
                return Err(self
                    .unreadable("a piece of a chunked frame out of place")
                    .await);
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
                // Readable as the guest wrote it, but no line of it starts a line of the
                // host's log (whatever logs the exception raised for it).
                let message = outside_text::block(&self.redactor.apply(&message)).into_owned();
                self.drain_logs().await;
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

    /// Reads on after the runner's error frame, logging only what the guest writes to stderr,
    /// until the exec ends or [`LOG_DRAIN`] passes: lines the flow printed before it failed
    /// may arrive after the frame (the two streams are read apart).
    async fn drain_logs(&mut self) {
        let Some(mut exec) = self.exec.take() else {
            return;
        };
        let deadline = tokio::time::Instant::now() + LOG_DRAIN;
        while let Ok(step) = tokio::time::timeout_at(deadline, exec.next()).await {
            match step {
                ExecStep::Frame(ExecFrame::Stderr(s)) => {
                    for line in self.logs.push(s.as_bytes()) {
                        self.log(&line);
                    }
                }
                ExecStep::Frame(
                    ExecFrame::Stdout(_) | ExecFrame::Heartbeat | ExecFrame::Error(_),
                ) => {}
                ExecStep::Frame(ExecFrame::Exit(c)) => {
                    self.exit = Some(c);
                    break;
                }
                ExecStep::End | ExecStep::HostDeadline | ExecStep::Broken(_) => break,
            }
        }
        if let Some(line) = self.logs.finish() {
            self.log(&line);
        }
        self.exec = Some(exec);
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
        } else if self.provider == ProviderKind::OpenSandbox {
            format!(
                "lfx is not installed in the OpenSandbox image {:?}; the flow was not run. Set \
                 {OPENSANDBOX_IMAGE} to an image with {want} and the flow's components (one \
                 the server can pull), or set {ENV_INSTALL_LFX}=true to pip-install lfx in \
                 every sandbox (slow, and it needs egress to PyPI)",
                self.rootfs
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
             stopped and the guest destroyed after {} vertices{}",
            self.limits.budget.as_secs(),
            self.vertices,
            self.unfinished()
        )
    }

    /// What the output stopped in the middle of, for a message: a chunked frame not finished.
    fn unfinished(&self) -> String {
        self.chunks
            .progress()
            .map_or_else(String::new, |(received, total)| {
                format!(
                    ", in the middle of a chunked frame ({received} of its {total} bytes had \
                     arrived)"
                )
            })
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
        let malformed = format!("{}{malformed}", self.unfinished());
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
                    |c| impossible_exit(self.provider, c),
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

/// The failure of an exec that `provider` accepted and then sent not one frame for during
/// `budget`.
fn sent_nothing(provider: ProviderKind, budget: Duration) -> String {
    format!(
        "{} accepted the exec but sent nothing for {}s; the flow may have run. The guest was \
         destroyed",
        provider.display_name(),
        budget.as_secs()
    )
}

/// What `provider` reporting exit status `c`, which no process can have, reads as.
fn impossible_exit(provider: ProviderKind, c: i64) -> String {
    let name = provider.display_name();
    format!("{name} reported exit status {c}, which no process can have")
}

#[cfg(test)]
mod wording {
    use super::*;

    #[test]
    fn failures_name_the_provider_the_guest_ran_on() {
        let os = ProviderKind::OpenSandbox;
        for m in [
            sent_nothing(os, Duration::from_secs(61)),
            impossible_exit(os, 300),
        ] {
            assert!(m.starts_with("OpenSandbox "), "{m}");
            assert!(!m.contains("CreateOS"), "{m}");
        }
        // CreateOS keeps its wording, byte for byte.
        assert_eq!(
            sent_nothing(ProviderKind::CreateOs, Duration::from_secs(61)),
            "CreateOS accepted the exec but sent nothing for 61s; the flow may have run. The \
             guest was destroyed"
        );
        assert_eq!(
            impossible_exit(ProviderKind::CreateOs, -1),
            "CreateOS reported exit status -1, which no process can have"
        );
    }
}
