//! The run lifecycle against an in-memory control plane whose every call can be made to fail,
//! lose its response, or hang. (The same guarantees are tested over HTTP against the fake
//! control plane in langflow-backend's tests.)

#![allow(
    clippy::many_single_char_names,
    clippy::type_complexity,
    clippy::case_sensitive_file_extension_comparisons
)]

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use langflow_backend::lifecycle::{RunOutput, RunSpec, run_python};
use sandbox_core::control::{
    CallError, CallFailure, ControlPlane, CreateGuest, ExecFrame, ExecRequest, ExecStream,
    GuestInfo,
};
use sandbox_core::egress::EgressPolicy;
use sandbox_core::exec::ExecLimits;
use sandbox_core::reaper::{Reaper, ReaperConfig};
use sandbox_core::retry::Backoff;
use sandbox_core::shapes::Shape;
use sandbox_core::{ErrorKind, Redactor, SandboxError};

const KEY: &str = "mock-secret-key-123";

#[derive(Clone)]
enum Fault {
    /// Fail without effect.
    Fail(CallError),
    /// Do the effect, then lose the response.
    LoseResponse(CallError),
    /// Never answer.
    Hang,
    /// Panic inside the call.
    Panic,
    /// Answer normally, but only after this long (a slow control plane).
    Delay(Duration),
}

#[derive(Default)]
struct Mock {
    guests: Mutex<HashMap<String, (String, Vec<String>, bool)>>, // id -> (name, egress, live)
    next: AtomicU64,
    faults: Mutex<HashMap<&'static str, VecDeque<Fault>>>,
    calls: Mutex<HashMap<&'static str, u32>>,
    egress_override: Mutex<Option<Vec<String>>>,
    frames: Mutex<Vec<(Duration, ExecFrame)>>,
    exec_error_after: Mutex<Option<CallError>>,
    exec_hang_after: AtomicU32,
    uploaded: Mutex<Vec<(String, Bytes)>>,
    created: AtomicU32,
}

impl Mock {
    fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }
    fn fault(&self, op: &'static str, f: Fault) {
        self.faults
            .lock()
            .unwrap()
            .entry(op)
            .or_default()
            .push_back(f);
    }
    fn live(&self) -> usize {
        self.guests.lock().unwrap().values().filter(|g| g.2).count()
    }
    fn calls(&self, op: &'static str) -> u32 {
        self.calls.lock().unwrap().get(op).copied().unwrap_or(0)
    }
    fn frames(&self, f: Vec<(Duration, ExecFrame)>) {
        *self.frames.lock().unwrap() = f;
    }
    /// Counts the call and returns the injected fault, if any.
    fn enter(&self, op: &'static str) -> Option<Fault> {
        *self.calls.lock().unwrap().entry(op).or_default() += 1;
        self.faults
            .lock()
            .unwrap()
            .get_mut(op)
            .and_then(VecDeque::pop_front)
    }
}

async fn apply<T>(fault: Option<Fault>, effect: impl FnOnce() -> T) -> Result<T, CallError> {
    match fault {
        None => Ok(effect()),
        Some(Fault::Fail(e)) => Err(e),
        Some(Fault::LoseResponse(e)) => {
            effect();
            Err(e)
        }
        Some(Fault::Hang) => futures::future::pending().await,
        Some(Fault::Panic) => panic!("injected panic"),
        Some(Fault::Delay(d)) => {
            tokio::time::sleep(d).await;
            Ok(effect())
        }
    }
}

struct Cp(Arc<Mock>);

impl ControlPlane for Cp {
    fn check_credential(&self) -> BoxFuture<'_, Result<String, CallError>> {
        async move { apply(self.0.enter("whoami"), || "acct".to_owned()).await }.boxed()
    }
    fn list_shapes(&self) -> BoxFuture<'_, Result<Vec<Shape>, CallError>> {
        async move {
            apply(self.0.enter("shapes"), || {
                vec![Shape {
                    id: "s-2vcpu-4gb".into(),
                    vcpu: 2,
                    mem_mib: 4096,
                }]
            })
            .await
        }
        .boxed()
    }
    fn create(&self, req: CreateGuest) -> BoxFuture<'_, Result<GuestInfo, CallError>> {
        async move {
            let m = &self.0;
            let f = m.enter("create");
            apply(f, || {
                let id = format!("sb-{}", m.next.fetch_add(1, Ordering::SeqCst));
                m.created.fetch_add(1, Ordering::SeqCst);
                m.guests
                    .lock()
                    .unwrap()
                    .insert(id.clone(), (req.name.clone(), req.egress.clone(), true));
                GuestInfo {
                    id,
                    name: Some(req.name.clone()),
                    status: "running".into(),
                    ..GuestInfo::default()
                }
            })
            .await
        }
        .boxed()
    }
    fn find_by_name(&self, name: String) -> BoxFuture<'_, Result<Option<GuestInfo>, CallError>> {
        async move {
            let m = &self.0;
            apply(m.enter("list"), || {
                m.guests
                    .lock()
                    .unwrap()
                    .iter()
                    .find(|(_, g)| g.0 == name && g.2)
                    .map(|(id, g)| GuestInfo {
                        id: id.clone(),
                        name: Some(g.0.clone()),
                        status: "running".into(),
                        egress: Some(g.1.clone()),
                        envs: None,
                        auto_pause_after_seconds: None,
                    })
            })
            .await
        }
        .boxed()
    }
    fn egress(&self, id: String) -> BoxFuture<'_, Result<Option<Vec<String>>, CallError>> {
        async move {
            let m = &self.0;
            apply(m.enter("egress_get"), || {
                m.egress_override
                    .lock()
                    .unwrap()
                    .clone()
                    .or_else(|| m.guests.lock().unwrap().get(&id).map(|g| g.1.clone()))
            })
            .await
        }
        .boxed()
    }
    fn upload(
        &self,
        _id: String,
        path: String,
        data: Bytes,
    ) -> BoxFuture<'_, Result<(), CallError>> {
        async move {
            let m = &self.0;
            apply(m.enter("upload"), || {
                m.uploaded.lock().unwrap().push((path, data));
            })
            .await
        }
        .boxed()
    }
    fn exec_stream(
        &self,
        _id: String,
        _req: ExecRequest,
    ) -> BoxFuture<'_, Result<ExecStream, CallError>> {
        async move {
            let m = &self.0;
            apply(m.enter("exec_stream"), || ()).await?;
            let frames = m.frames.lock().unwrap().clone();
            let tail_err = m.exec_error_after.lock().unwrap().clone();
            let hang = m.exec_hang_after.load(Ordering::SeqCst) == 1;
            let s = futures::stream::iter(frames)
                .then(|(d, f)| async move {
                    if !d.is_zero() {
                        tokio::time::sleep(d).await;
                    }
                    Ok(f)
                })
                .chain(futures::stream::iter(tail_err.map(Err)))
                .chain(
                    futures::stream::once(async move {
                        if hang {
                            futures::future::pending::<()>().await;
                        }
                        None
                    })
                    .filter_map(|x: Option<Result<ExecFrame, CallError>>| async move { x }),
                );
            Ok(s.boxed())
        }
        .boxed()
    }
    fn destroy(&self, id: String) -> BoxFuture<'_, Result<(), CallError>> {
        async move {
            let m = &self.0;
            apply(m.enter("delete"), || {
                if let Some(g) = m.guests.lock().unwrap().get_mut(&id) {
                    g.2 = false;
                }
            })
            .await
        }
        .boxed()
    }
}

fn quick_backoff() -> Backoff {
    Backoff {
        base: Duration::from_millis(5),
        max: Duration::from_millis(20),
        budget: Duration::from_secs(3),
    }
}

fn reaper() -> Reaper {
    Reaper::new(ReaperConfig {
        backoff: quick_backoff(),
        lookup_patience: Duration::from_millis(300),
    })
}

fn spec() -> RunSpec {
    RunSpec {
        shape: "s-2vcpu-4gb".into(),
        rootfs: "devbox:1".into(),
        envs: BTreeMap::new(),
        egress: EgressPolicy::DenyAll,
        limits: ExecLimits {
            budget: Duration::from_millis(200),
            kill_after: Duration::from_millis(50),
            host_grace: Duration::from_millis(300),
        },
        max_output_bytes: 1024,
        backoff: quick_backoff(),
        background_destroy: false,
        grant: None,
    }
}

fn ok_frames() -> Vec<(Duration, ExecFrame)> {
    vec![
        (Duration::ZERO, ExecFrame::Heartbeat),
        (Duration::ZERO, ExecFrame::Stdout("hello\n".into())),
        (Duration::ZERO, ExecFrame::Stderr("warn\n".into())),
        (Duration::ZERO, ExecFrame::Exit(0)),
    ]
}

async fn run(m: &Arc<Mock>, r: &Reaper, s: &RunSpec) -> Result<RunOutput, SandboxError> {
    run_python(
        Arc::new(Cp(m.clone())),
        r,
        s,
        Bytes::from_static(b"print('hello')"),
        &Redactor::new(KEY),
    )
    .await
}

/// Waits (bounded) until the mock has no live guest.
async fn settle(m: &Arc<Mock>) {
    for _ in 0..200 {
        if m.live() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn transport() -> CallError {
    CallError::new(CallFailure::Transport, "connection reset")
}

#[tokio::test]
async fn happy_path_destroys_inline() {
    let m = Mock::new();
    m.frames(ok_frames());
    let r = reaper();
    let rep = run(&m, &r, &spec()).await.unwrap();
    assert_eq!(rep.stdout, "hello\n");
    assert_eq!(rep.stderr, "warn\n");
    assert_eq!(rep.exit_code, 0);
    assert!(rep.timings.destroy_ms.is_some());
    // create, upload, egress, exec, delete
    assert_eq!(rep.timings.requests, Some(5));
    assert_eq!(m.live(), 0);
    assert_eq!(r.registered(), 0);
    let up = m.uploaded.lock().unwrap();
    assert!(up[0].0.starts_with("/workspace/main_") && up[0].0.ends_with(".py"));
    assert_eq!(&up[0].1[..], b"print('hello')");
}

#[tokio::test]
async fn background_destroy_is_guaranteed() {
    let m = Mock::new();
    m.frames(ok_frames());
    let r = reaper();
    let mut s = spec();
    s.background_destroy = true;
    let rep = run(&m, &r, &s).await.unwrap();
    assert_eq!(rep.timings.destroy_ms, None);
    assert_eq!(rep.timings.requests, Some(4));
    settle(&m).await;
    assert_eq!(m.live(), 0);
    assert_eq!(r.registered(), 0);
}

#[tokio::test]
async fn background_destroy_retries_failures() {
    let m = Mock::new();
    m.frames(ok_frames());
    m.fault(
        "delete",
        Fault::Fail(CallError::new(CallFailure::Status(503), "busy")),
    );
    m.fault("delete", Fault::Fail(transport()));
    let r = reaper();
    let mut s = spec();
    s.background_destroy = true;
    run(&m, &r, &s).await.unwrap();
    settle(&m).await;
    assert_eq!(m.live(), 0);
    assert_eq!(m.calls("delete"), 3);
}

#[tokio::test]
async fn lost_create_response_is_found_by_name_and_destroyed() {
    let m = Mock::new();
    m.frames(ok_frames());
    m.fault("create", Fault::LoseResponse(transport()));
    let r = reaper();
    let rep = run(&m, &r, &spec()).await.unwrap();
    assert_eq!(rep.exit_code, 0);
    assert_eq!(m.created.load(Ordering::SeqCst), 2);
    settle(&m).await;
    assert_eq!(m.live(), 0, "the orphan of the lost response leaked");
    assert!(m.calls("list") >= 1);
}

#[tokio::test]
async fn create_rejection_is_unavailable_and_not_retried() {
    let m = Mock::new();
    m.fault(
        "create",
        Fault::Fail(CallError::new(
            CallFailure::Status(401),
            format!("HTTP 401: bad key {KEY}"),
        )),
    );
    let r = reaper();
    let e = run(&m, &r, &spec()).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Rejected);
    assert!(!e.to_string().contains(KEY), "{e}");
    assert!(e.to_string().contains("CREATEOS_SANDBOX_API_KEY"));
    assert_eq!(m.calls("create"), 1);
    assert_eq!(r.registered(), 0);
}

#[tokio::test]
async fn transient_create_is_retried_then_reported() {
    let m = Mock::new();
    for _ in 0..1000 {
        m.fault(
            "create",
            Fault::Fail(CallError::new(CallFailure::Status(503), "no capacity")),
        );
    }
    let r = reaper();
    let mut s = spec();
    s.backoff.budget = Duration::from_millis(150);
    let e = run(&m, &r, &s).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Transient);
    assert!(e.to_string().contains("not started"), "{e}");
    assert!(m.calls("create") >= 2);
    assert_eq!(m.live(), 0);
}

#[tokio::test]
async fn egress_mismatch_destroys_and_refuses() {
    let m = Mock::new();
    m.frames(ok_frames());
    *m.egress_override.lock().unwrap() = Some(vec!["*".into()]);
    let r = reaper();
    let e = run(&m, &r, &spec()).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Refused);
    assert!(e.to_string().contains("egress"));
    assert_eq!(m.calls("exec_stream"), 0, "code ran under the wrong policy");
    settle(&m).await;
    assert_eq!(m.live(), 0);
}

#[tokio::test]
async fn upload_and_readback_are_retried_before_dispatch() {
    let m = Mock::new();
    m.frames(ok_frames());
    m.fault(
        "upload",
        Fault::Fail(CallError::new(CallFailure::Status(502), "bad gateway")),
    );
    m.fault("egress_get", Fault::Fail(transport()));
    let r = reaper();
    let rep = run(&m, &r, &spec()).await.unwrap();
    assert_eq!(rep.exit_code, 0);
    assert_eq!(m.calls("upload"), 2);
    assert_eq!(m.calls("egress_get"), 2);
    assert_eq!(m.live(), 0);
}

#[tokio::test]
async fn exec_failure_after_dispatch_is_not_retried() {
    let m = Mock::new();
    m.frames(ok_frames());
    m.fault(
        "exec_stream",
        Fault::Fail(CallError::new(CallFailure::Status(500), "boom")),
    );
    let r = reaper();
    let e = run(&m, &r, &spec()).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::OutcomeUnknown);
    assert!(e.to_string().contains("may have run"), "{e}");
    assert_eq!(m.calls("exec_stream"), 1);
    settle(&m).await;
    assert_eq!(m.live(), 0);
}

#[tokio::test]
async fn exec_declined_is_retried() {
    let m = Mock::new();
    m.frames(ok_frames());
    m.fault(
        "exec_stream",
        Fault::Fail(CallError::new(CallFailure::Status(429), "slow down")),
    );
    let r = reaper();
    let rep = run(&m, &r, &spec()).await.unwrap();
    assert_eq!(rep.exit_code, 0);
    assert_eq!(m.calls("exec_stream"), 2);
}

#[tokio::test]
async fn broken_stream_is_outcome_unknown() {
    let m = Mock::new();
    m.frames(vec![(Duration::ZERO, ExecFrame::Stdout("partial".into()))]);
    *m.exec_error_after.lock().unwrap() = Some(transport());
    let r = reaper();
    let e = run(&m, &r, &spec()).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::OutcomeUnknown);
    assert!(e.to_string().contains("may have run"));
    settle(&m).await;
    assert_eq!(m.live(), 0);
}

#[tokio::test]
async fn stalled_control_plane_gives_timeout_with_partial_output() {
    let m = Mock::new();
    m.frames(vec![(
        Duration::ZERO,
        ExecFrame::Stdout("before the stall\n".into()),
    )]);
    m.exec_hang_after.store(1, Ordering::SeqCst);
    let r = reaper();
    let rep = run(&m, &r, &spec()).await.unwrap();
    assert_eq!(rep.exit_code, -1);
    assert!(rep.host_timed_out);
    assert_eq!(rep.stdout, "before the stall\n");
    assert!(
        rep.timings.destroy_ms.is_some(),
        "a host timeout destroys inline"
    );
    assert_eq!(m.live(), 0);
}

#[tokio::test]
async fn exit_classification_uses_elapsed_time() {
    let r = reaper();
    // 137 well inside the budget: out of memory, not a timeout.
    let m = Mock::new();
    m.frames(vec![(Duration::ZERO, ExecFrame::Exit(137))]);
    assert_eq!(run(&m, &r, &spec()).await.unwrap().exit_code, 137);
    // 137 after the budget: timeout's KILL.
    let m = Mock::new();
    m.frames(vec![(Duration::from_millis(260), ExecFrame::Exit(137))]);
    assert_eq!(run(&m, &r, &spec()).await.unwrap().exit_code, -1);
    // 124 after the budget: TERM.
    let m = Mock::new();
    m.frames(vec![
        (Duration::ZERO, ExecFrame::Stdout("tick\n".into())),
        (Duration::from_millis(210), ExecFrame::Exit(124)),
    ]);
    let rep = run(&m, &r, &spec()).await.unwrap();
    assert_eq!(rep.exit_code, -1);
    assert_eq!(rep.raw_exit_code, Some(124));
    assert_eq!(rep.stdout, "tick\n");
}

#[tokio::test]
async fn output_is_capped_while_streaming() {
    let m = Mock::new();
    let mut frames: Vec<(Duration, ExecFrame)> = (0..500)
        .map(|i| (Duration::ZERO, ExecFrame::Stdout(format!("line {i:04}\n"))))
        .collect();
    frames.push((Duration::ZERO, ExecFrame::Exit(0)));
    m.frames(frames);
    let r = reaper();
    let rep = run(&m, &r, &spec()).await.unwrap();
    assert!(rep.stdout_truncated);
    let stdout = rep.stdout.to_string();
    assert!(stdout.starts_with("[... "));
    assert!(stdout.ends_with("line 0499\n"));
    assert!(rep.stdout.len() < 1024 + 64);
    assert!(!rep.stderr_truncated);
}

#[tokio::test]
async fn agent_error_without_exit_is_an_execution_error() {
    let m = Mock::new();
    m.frames(vec![(
        Duration::ZERO,
        ExecFrame::Error("no such file: timeout".into()),
    )]);
    let r = reaper();
    let e = run(&m, &r, &spec()).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::OutcomeUnknown);
    assert!(e.to_string().contains("no such file"));
    settle(&m).await;
    assert_eq!(m.live(), 0);
}

/// Cancels a run while `op` hangs and checks the guest is destroyed anyway.
async fn cancel_at(op: &'static str) {
    let m = Mock::new();
    m.frames(ok_frames());
    m.fault(op, Fault::Hang);
    let r = reaper();
    let s = spec();
    let fut = run(&m, &r, &s);
    let res = tokio::time::timeout(Duration::from_millis(150), fut).await;
    assert!(res.is_err(), "{op}: the run should still be hanging");
    settle(&m).await;
    assert_eq!(m.live(), 0, "{op}: cancelled run leaked its guest");
    r.shutdown(Duration::from_secs(2)).await;
    assert_eq!(m.live(), 0);
}

#[tokio::test]
async fn cancellation_at_every_await_point_destroys_the_guest() {
    for op in ["upload", "egress_get", "exec_stream"] {
        cancel_at(op).await;
    }
}

#[tokio::test]
async fn cancellation_during_exec_stream_destroys_the_guest() {
    let m = Mock::new();
    m.frames(vec![(Duration::from_secs(30), ExecFrame::Exit(0))]);
    let r = reaper();
    let mut s = spec();
    s.limits.budget = Duration::from_secs(60);
    let res = tokio::time::timeout(Duration::from_millis(100), run(&m, &r, &s)).await;
    assert!(res.is_err());
    assert_eq!(m.created.load(Ordering::SeqCst), 1);
    settle(&m).await;
    assert_eq!(m.live(), 0);
}

/// A create that the server completes but whose caller is cancelled while waiting.
struct SlowCreate(Cp);

impl ControlPlane for SlowCreate {
    fn check_credential(&self) -> BoxFuture<'_, Result<String, CallError>> {
        self.0.check_credential()
    }
    fn list_shapes(&self) -> BoxFuture<'_, Result<Vec<Shape>, CallError>> {
        self.0.list_shapes()
    }
    fn create(&self, req: CreateGuest) -> BoxFuture<'_, Result<GuestInfo, CallError>> {
        async move {
            let info = self.0.create(req).await;
            futures::future::pending::<()>().await;
            info
        }
        .boxed()
    }
    fn find_by_name(&self, name: String) -> BoxFuture<'_, Result<Option<GuestInfo>, CallError>> {
        self.0.find_by_name(name)
    }
    fn egress(&self, id: String) -> BoxFuture<'_, Result<Option<Vec<String>>, CallError>> {
        self.0.egress(id)
    }
    fn upload(
        &self,
        id: String,
        path: String,
        data: Bytes,
    ) -> BoxFuture<'_, Result<(), CallError>> {
        self.0.upload(id, path, data)
    }
    fn exec_stream(
        &self,
        id: String,
        req: ExecRequest,
    ) -> BoxFuture<'_, Result<ExecStream, CallError>> {
        self.0.exec_stream(id, req)
    }
    fn destroy(&self, id: String) -> BoxFuture<'_, Result<(), CallError>> {
        self.0.destroy(id)
    }
}

#[tokio::test]
async fn cancellation_during_create_finds_the_guest_by_name() {
    let m = Mock::new();
    let cp = Arc::new(SlowCreate(Cp(m.clone())));
    let r = reaper();
    let s = spec();
    let red = Redactor::new(KEY);
    let fut = run_python(cp, &r, &s, Bytes::from_static(b"x"), &red);
    assert!(
        tokio::time::timeout(Duration::from_millis(100), fut)
            .await
            .is_err()
    );
    assert_eq!(m.created.load(Ordering::SeqCst), 1);
    settle(&m).await;
    assert_eq!(m.live(), 0, "a guest created under a cancelled call leaked");
    assert!(m.calls("list") >= 1);
}

#[tokio::test]
async fn panic_inside_a_run_still_destroys_the_guest() {
    let m = Mock::new();
    m.frames(ok_frames());
    m.fault("upload", Fault::Panic);
    let r = reaper();
    let (m2, r2) = (m.clone(), r.clone());
    let j = tokio::spawn(async move { run(&m2, &r2, &spec()).await.map(|_| ()) });
    let err = j.await.unwrap_err();
    assert!(err.is_panic());
    settle(&m).await;
    assert_eq!(m.live(), 0);
}

#[tokio::test]
async fn shutdown_destroys_in_flight_guests_and_refuses_new_runs() {
    let m = Mock::new();
    m.frames(vec![(Duration::from_secs(30), ExecFrame::Exit(0))]);
    let r = reaper();
    let mut s = spec();
    s.limits.budget = Duration::from_secs(60);
    let (m2, r2, s2) = (m.clone(), r.clone(), s.clone());
    let j = tokio::spawn(async move { run(&m2, &r2, &s2).await });
    for _ in 0..100 {
        if m.calls("exec_stream") > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(m.live(), 1);
    let rep = r.shutdown(Duration::from_secs(2)).await;
    assert_eq!(rep.destroyed, 1);
    assert_eq!(m.live(), 0);
    j.abort();
    let e = run(&m, &r, &s).await.unwrap_err();
    assert!(e.to_string().contains("shut down"));
    // Idempotent.
    assert_eq!(r.shutdown(Duration::from_secs(1)).await.destroyed, 0);
}

#[tokio::test]
async fn shutdown_flushes_guests_abandoned_without_a_runtime_task() {
    // A guard dropped outside any runtime cannot spawn; shutdown must still destroy it.
    let m = Mock::new();
    let r = reaper();
    let guard = r
        .register(Arc::new(Cp(m.clone())), "lf-orphan", Redactor::default())
        .unwrap();
    // Create the guest under that name directly.
    m.guests
        .lock()
        .unwrap()
        .insert("sb-x".into(), ("lf-orphan".into(), vec![], true));
    std::thread::spawn(move || drop(guard)).join().unwrap();
    assert_eq!(r.registered(), 1);
    let rep = r.shutdown(Duration::from_secs(2)).await;
    assert_eq!(rep.destroyed, 1);
    assert_eq!(m.live(), 0);
}

#[tokio::test]
async fn control_plane_that_never_answers_exec_may_have_run_and_is_no_timeout() {
    // The exec request was sent and never answered: nothing says the program ran to its
    // budget, so this is "may have run", not lfx's "timed out" (issue: hardening #2).
    let m = Mock::new();
    m.frames(ok_frames());
    m.fault("exec_stream", Fault::Hang);
    let r = reaper();
    let e = run(&m, &r, &spec()).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::OutcomeUnknown, "{e}");
    assert!(e.to_string().contains("may have run"), "{e}");
    settle(&m).await;
    assert_eq!(m.live(), 0);
}

fn declined() -> CallError {
    CallError::new(CallFailure::Status(503), "busy")
}

#[tokio::test]
async fn agent_exit_minus_one_is_not_a_timeout() {
    // -1 is lfx's "timed out"; an agent that reports it (or any status no process can have)
    // is a protocol failure, never a timeout verdict.
    for bad in [-1_i64, 1 << 40, 256] {
        let m = Mock::new();
        m.frames(vec![(Duration::ZERO, ExecFrame::Exit(bad))]);
        let r = reaper();
        let e = run(&m, &r, &spec()).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::OutcomeUnknown, "{bad}: {e}");
        assert!(e.to_string().contains(&bad.to_string()), "{e}");
        assert!(e.to_string().contains("may have run"), "{e}");
        assert_eq!(m.live(), 0);
    }
}

#[tokio::test]
async fn agent_error_text_is_kept_next_to_an_exit_code() {
    let m = Mock::new();
    m.frames(vec![
        (Duration::ZERO, ExecFrame::Stderr("boom\n".into())),
        (
            Duration::ZERO,
            ExecFrame::Error("process killed: OOM".into()),
        ),
        (Duration::ZERO, ExecFrame::Exit(137)),
    ]);
    let r = reaper();
    let rep = run(&m, &r, &spec()).await.unwrap();
    assert_eq!(rep.exit_code, 137);
    let err = rep.stderr.to_string();
    assert!(err.starts_with("boom\n"), "{err}");
    assert!(err.contains("process killed: OOM"), "{err}");
}

#[tokio::test]
async fn exec_declined_past_the_host_budget_is_not_started_not_timed_out() {
    // Declined (503) until long after budget + grace: the program never started, so the run
    // is an error that says so, never exit -1.
    let m = Mock::new();
    m.frames(ok_frames());
    for _ in 0..10_000 {
        m.fault("exec_stream", Fault::Fail(declined()));
    }
    let r = reaper();
    let mut s = spec();
    s.backoff.budget = Duration::from_millis(1500); // > host deadline of 550 ms
    let e = run(&m, &r, &s).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Transient, "{e}");
    assert!(e.to_string().contains("not started"), "{e}");
    assert!(m.calls("exec_stream") >= 2);
    assert_eq!(m.live(), 0);
}

#[tokio::test]
async fn an_accepted_exec_that_sends_nothing_may_have_run() {
    // The stream opened and then not one frame (no heartbeat either) until the host deadline.
    let m = Mock::new();
    m.frames(vec![]);
    m.exec_hang_after.store(1, Ordering::SeqCst);
    let r = reaper();
    let e = run(&m, &r, &spec()).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::OutcomeUnknown, "{e}");
    assert!(e.to_string().contains("sent nothing"), "{e}");
    assert_eq!(m.live(), 0, "destroyed before returning");
}

#[tokio::test]
async fn without_background_destroy_every_error_path_destroys_before_returning() {
    // A forked child ends with os._exit: whatever failed, its guest must already be gone.
    let cases: Vec<(&'static str, Fault)> = vec![
        (
            "upload",
            Fault::Fail(CallError::new(CallFailure::Status(500), "x")),
        ),
        (
            "egress_get",
            Fault::Fail(CallError::new(CallFailure::Status(404), "x")),
        ),
        (
            "exec_stream",
            Fault::Fail(CallError::new(CallFailure::Status(500), "x")),
        ),
    ];
    for (op, fault) in cases {
        let m = Mock::new();
        m.frames(ok_frames());
        for _ in 0..1000 {
            m.fault(op, fault.clone());
        }
        let r = reaper();
        let mut s = spec();
        s.background_destroy = false;
        s.backoff.budget = Duration::from_millis(200);
        assert!(run(&m, &r, &s).await.is_err(), "{op}");
        assert_eq!(m.live(), 0, "{op}: the guest outlived run()");
        assert_eq!(r.registered(), 0, "{op}");
    }
}

/// Starts a run whose create answers after `delay` while listing fails (so nothing can find
/// the guest by name meanwhile), and returns once the create is in flight.
async fn run_with_a_create_in_flight(
    delay: Duration,
) -> (
    Arc<Mock>,
    Reaper,
    tokio::task::JoinHandle<Result<RunOutput, SandboxError>>,
) {
    let m = Mock::new();
    m.frames(ok_frames());
    m.fault("create", Fault::Delay(delay));
    for _ in 0..1000 {
        m.fault(
            "list",
            Fault::Fail(CallError::new(CallFailure::Status(500), "list down")),
        );
    }
    let r = reaper();
    let s = spec();
    let (m2, r2) = (m.clone(), r.clone());
    let j = tokio::spawn(async move { run(&m2, &r2, &s).await });
    for _ in 0..200 {
        if m.calls("create") > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    (m, r, j)
}

#[tokio::test]
async fn shutdown_during_an_in_flight_create_dispatches_nothing_and_leaves_nothing() {
    // Create answers after 800 ms; listing fails meanwhile. Shutdown starts while the create
    // is in flight: the program must never be uploaded or run, and the guest that lands is
    // destroyed exactly once.
    let (m, r, j) = run_with_a_create_in_flight(Duration::from_millis(800)).await;
    let rep = r.shutdown(Duration::from_secs(5)).await;
    assert_eq!(rep.destroyed, 1, "{rep:?}");
    let e = j.await.unwrap().unwrap_err();
    assert!(e.to_string().contains("shut down"), "{e}");
    assert!(e.to_string().contains("not started"), "{e}");
    assert_eq!(m.calls("upload"), 0);
    assert_eq!(m.calls("exec_stream"), 0);
    assert_eq!(m.live(), 0);
    assert_eq!(m.calls("delete"), 1, "one guest, one DELETE");
}

#[tokio::test]
async fn a_late_create_is_still_destroyed_when_shutdown_gave_up() {
    // Shutdown's deadline passes before the create answers: the run itself destroys the guest
    // it gets back, and dispatches nothing.
    let (m, r, j) = run_with_a_create_in_flight(Duration::from_millis(600)).await;
    let rep = r.shutdown(Duration::from_millis(100)).await;
    assert_eq!(rep.failed, 1, "{rep:?}");
    let e = j.await.unwrap().unwrap_err();
    assert!(e.to_string().contains("shut down"), "{e}");
    assert_eq!(m.calls("exec_stream"), 0);
    assert_eq!(m.live(), 0);
    assert_eq!(m.calls("delete"), 1);
}

#[tokio::test]
async fn shutdown_waits_for_a_background_destroy_instead_of_repeating_it() {
    let m = Mock::new();
    m.frames(ok_frames());
    m.fault("delete", Fault::Delay(Duration::from_millis(300)));
    let r = reaper();
    let mut s = spec();
    s.background_destroy = true;
    let rep = run(&m, &r, &s).await.unwrap();
    assert_eq!(rep.timings.destroy_ms, None);
    // The process exits right after the run: the background DELETE is in flight.
    for _ in 0..200 {
        if m.calls("delete") > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let out = r.shutdown(Duration::from_secs(3)).await;
    assert_eq!(out.failed, 0);
    assert_eq!(m.live(), 0);
    assert_eq!(m.calls("delete"), 1, "one guest, one DELETE");
}

#[tokio::test]
async fn a_slow_create_is_found_after_the_first_lookups_miss() {
    // The create's response is lost and the guest appears only 3.5 s later (the old lookup
    // gave up after 3 s): with the default patience the reaper still finds and destroys it.
    let m = Mock::new();
    m.frames(ok_frames());
    let r = Reaper::new(ReaperConfig::default());
    let guard = r
        .register(
            Arc::new(Cp(m.clone())),
            "lf-slowcreate",
            Redactor::default(),
        )
        .unwrap();
    drop(guard); // the run gave up on the create
    tokio::time::sleep(Duration::from_millis(3500)).await;
    m.guests
        .lock()
        .unwrap()
        .insert("sb-late".into(), ("lf-slowcreate".into(), vec![], true));
    for _ in 0..2000 {
        if m.live() == 0 && r.registered() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(m.live(), 0, "the late guest was never found");
    // Spaced out, not a poll every 200 ms: a handful of lookups.
    assert!((2..=10).contains(&m.calls("list")), "{}", m.calls("list"));
}
