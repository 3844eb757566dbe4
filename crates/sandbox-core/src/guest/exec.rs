//! Running programs in a guest: an exec as a stream of frames under the host deadline, its
//! capture into capped tail buffers, and long-lived processes.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::time::Instant;

use super::{Guest, ms};
use crate::LOG_TARGET;
use crate::classify::{self, Stage};
use crate::control::{CallError, CallFailure, ExecFrame, ExecRequest, ExecStream, ProcessSpec};
use crate::error::{ErrorKind, SandboxError};
use crate::exec::{Command, EXIT_TIMED_OUT, ExecLimits, classify_exit};
use crate::output::{Captured, TailBuffer};
use crate::retry::retry_until;

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

impl Guest {
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
            return Err(classify::shut_down(
                cx.provider.kind(),
                Stage::BeforeDispatch,
            ));
        }
        let (res, _) = retry_until(
            &cx.backoff,
            deadline,
            "process start",
            |e| e.is_declined() && !cx.closed(),
            |_| {
                cx.count();
                cx.provider.spawn_process(self.id.clone(), spec.clone())
            },
        )
        .await;
        match res {
            Ok(pid) => Ok(pid),
            Err(e) if e.is_declined() => Err(cx.before_dispatch("process start", &e)),
            Err(e) => Err(classify::after_dispatch(
                cx.provider.kind(),
                &e,
                cx.closed(),
                &cx.redactor,
            )),
        }
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
            return Err(classify::shut_down(
                cx.provider.kind(),
                Stage::BeforeDispatch,
            ));
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
                let (cp, id, req) = (cx.provider.clone(), self.id.clone(), req.clone());
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
            Err(_) if cx.closed() => {
                return Err(classify::shut_down(
                    cx.provider.kind(),
                    Stage::BeforeDispatch,
                ));
            }
            Err(e) if e.is_declined() => return Err(cx.before_dispatch("exec", &e)),
            Err(e) => {
                return Err(classify::after_dispatch(
                    cx.provider.kind(),
                    &e,
                    cx.closed(),
                    &cx.redactor,
                ));
            }
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
            return Err(classify::shut_down(cx.provider.kind(), Stage::Dispatched));
        }
        if let Some(e) = broken {
            return Err(classify::stream_broke(
                cx.provider.kind(),
                &e,
                out.total_bytes(),
                err.total_bytes(),
                redactor,
            ));
        }
        let agent_said = agent_error.map(|m| redactor.cap(&m));
        // Every message names the provider the guest ran on.
        let name = cx.provider.kind().display_name();
        if host_timed_out && frames == 0 {
            // Not one frame (no output, no heartbeat) since the exec was accepted: the control
            // plane stopped answering; nothing says the program ran to its budget.
            return Err(SandboxError::new(
                ErrorKind::OutcomeUnknown,
                format!(
                    "{name} accepted the exec but sent nothing (no output, heartbeat or exit \
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
                        |c| format!("{name} reported exit status {c}, which no process can have"),
                    );
                    let why = agent_said
                        .map_or_else(String::new, |m| format!(" (the guest agent reported: {m})"));
                    return Err(SandboxError::new(
                        ErrorKind::OutcomeUnknown,
                        format!("{name} exec did not complete: {what}{why}; the code may have run"),
                    )
                    .redacted(redactor));
                }
            }
        };
        if let Some(m) = agent_said {
            // An exit status and an agent error together: keep the agent's word where the user
            // reads failures.
            err.push(format!("\n[{name} guest agent: {m}]\n").as_bytes());
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
}
