//! The guest primitives over HTTP against the fake control plane, whose guests run as real
//! local processes: acquire by name (create, find, resume, drift refusals, create races and
//! lost create responses), the exec stream, download caps, and keep vs destroy at shutdown.

#![allow(clippy::too_many_lines)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use createos_fake::{FakeOptions, FakeServer};
use futures::StreamExt;
use futures::future::BoxFuture;
use sandbox_core::control::{
    CallError, ControlPlane, CreateGuest, Download, ExecFrame, ExecRequest, ExecStream, GuestInfo,
    GuestStatus,
};
use sandbox_core::egress::EgressPolicy;
use sandbox_core::exec::{Command, ExecLimits};
use sandbox_core::guest::{ExecInput, ExecStep, Guest, GuestContext, GuestSpec};
use sandbox_core::names::{REUSED_PREFIX, derived_name};
use sandbox_core::observe::{DestroyReason, Observation};
use sandbox_core::reaper::{Reaper, ReaperConfig};
use sandbox_core::retry::Backoff;
use sandbox_core::shapes::Shape;
use sandbox_core::surface::SurfaceKind;
use sandbox_core::{ErrorKind, Redactor};
use sandbox_createos::CreateOsControlPlane;
use secrecy::SecretString;
use tokio::time::Instant;

const KEY: &str = "core-guest-fake-key-5b1d";

fn quick() -> Backoff {
    Backoff {
        base: Duration::from_millis(20),
        max: Duration::from_millis(200),
        budget: Duration::from_secs(5),
    }
}

async fn fake_with(faults: &str) -> FakeServer {
    FakeServer::start(FakeOptions {
        api_key: KEY.to_owned(),
        faults: faults.to_owned(),
        heartbeat: Duration::from_millis(300),
        resume_delay: Duration::from_millis(200),
        ..FakeOptions::default()
    })
    .await
    .expect("fake control plane starts")
}

fn plane(fake: &FakeServer) -> Arc<dyn ControlPlane> {
    Arc::new(
        CreateOsControlPlane::new(
            &SecretString::from(KEY),
            &fake.url(),
            Duration::from_secs(2),
        )
        .unwrap(),
    )
}

fn context(cp: Arc<dyn ControlPlane>, reaper: &Reaper) -> GuestContext {
    GuestContext::new(cp, reaper.clone(), Redactor::new(KEY), quick())
}

fn reaper() -> Reaper {
    Reaper::new(ReaperConfig {
        backoff: quick(),
        lookup_patience: Duration::from_millis(300),
    })
}

fn spec(egress: EgressPolicy, env_keys: &[&str]) -> GuestSpec {
    GuestSpec {
        shape: "s-2vcpu-4gb".into(),
        rootfs: "devbox:1".into(),
        envs: env_keys
            .iter()
            .map(|k| ((*k).to_owned(), "value".to_owned()))
            .collect(),
        egress,
        auto_pause_after_seconds: 600,
    }
}

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(10)
}

fn limits(budget_ms: u64) -> ExecLimits {
    ExecLimits {
        budget: Duration::from_millis(budget_ms),
        kill_after: Duration::from_millis(200),
        host_grace: Duration::from_millis(500),
    }
}

fn api(fake: &FakeServer) -> createos_api::Client {
    createos_api::Client::builder()
        .api_key(SecretString::from(KEY))
        .base_url(fake.url())
        .build()
        .unwrap()
}

async fn status(cp: &Arc<dyn ControlPlane>, id: &str) -> GuestStatus {
    cp.get(id.to_owned()).await.unwrap().status
}

#[tokio::test(flavor = "multi_thread")]
async fn acquire_creates_then_finds_the_same_guest() {
    let fake = fake_with("").await;
    let cp = plane(&fake);
    let r = reaper();
    let cx = context(cp.clone(), &r);
    let s = spec(EgressPolicy::DenyAll, &["TOKEN"]);
    let name = derived_name(REUSED_PREFIX, &["flow", "node-1"], &s.egress.fingerprint());
    let first = Guest::acquire(&cx, &s, &name, soon()).await.unwrap();
    assert!(first.is_kept());
    assert_eq!(first.name(), name);
    let id = first.id().to_owned();
    first.release();
    let again = Guest::acquire(&cx, &s, &name, soon()).await.unwrap();
    assert_eq!(again.id(), id, "the second acquire adopts the guest");
    assert_eq!(fake.stats().created, 1);
    drop(again);
    // Released, not destroyed: still there for the next run.
    assert_eq!(status(&cp, &id).await, GuestStatus::Running);
    assert_eq!(fake.stats().live, 1);
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
#[allow(clippy::float_cmp)] // whole counts, exact in f64
async fn a_kept_guest_is_counted_created_once_and_destroyed_only_when_destroyed() {
    let fake = fake_with("").await;
    let cp = plane(&fake);
    let r = reaper();
    let obs = Observation::new();
    let cx = context(cp.clone(), &r).with_observation(obs.clone(), SurfaceKind::Component);
    let s = spec(EgressPolicy::DenyAll, &[]);
    let name = derived_name(
        REUSED_PREFIX,
        &["flow", "node-obs"],
        &s.egress.fingerprint(),
    );
    let value = |family: &str, labels: &[(&str, &str)]| {
        obs.counters().value(family, labels).unwrap_or(-1.0)
    };
    let c = ("surface", "component");
    // Created, released alive, found again and released: one create, no destroy, none live
    // here (a kept guest counts live in the process that holds it; released, it is held by
    // none until a run takes it again, so another worker's destroy never drives a gauge below
    // zero and the workers' sum stays right).
    Guest::acquire(&cx, &s, &name, soon())
        .await
        .unwrap()
        .release();
    let again = Guest::acquire(&cx, &s, &name, soon()).await.unwrap();
    drop(again);
    assert_eq!(value("createos_guests_created_total", &[c]), 1.0);
    assert_eq!(value("createos_guests_destroyed_total", &[c]), 0.0);
    assert_eq!(value("createos_guests_live", &[c]), 0.0);
    assert_eq!(fake.stats().live, 1);
    // Destroyed by a later run: counted once, with that run's reason.
    let last = Guest::acquire(&cx, &s, &name, soon()).await.unwrap();
    assert_eq!(value("createos_guests_live", &[c]), 1.0, "held by a run");
    last.set_destroy_reason(DestroyReason::Timeout);
    last.destroy().await.unwrap();
    assert_eq!(
        value(
            "createos_guests_destroyed_total",
            &[c, ("reason", "timeout")]
        ),
        1.0
    );
    assert_eq!(value("createos_guests_destroyed_total", &[c]), 1.0);
    assert_eq!(value("createos_guests_live", &[c]), 0.0);
    assert_eq!(fake.stats().live, 0);
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn acquire_resumes_a_paused_guest_and_waits_until_it_runs() {
    let fake = fake_with("").await;
    let cp = plane(&fake);
    let r = reaper();
    let cx = context(cp.clone(), &r);
    let s = spec(EgressPolicy::AllowAll, &[]);
    let name = derived_name(REUSED_PREFIX, &["paused"], &s.egress.fingerprint());
    let g = Guest::acquire(&cx, &s, &name, soon()).await.unwrap();
    let id = g.id().to_owned();
    g.release();
    api(&fake).sandbox_handle(id.clone()).pause().await.unwrap();
    assert_eq!(status(&cp, &id).await, GuestStatus::Paused);

    let g = Guest::acquire(&cx, &s, &name, soon()).await.unwrap();
    assert_eq!(g.id(), id);
    assert_eq!(status(&cp, &id).await, GuestStatus::Running);
    // It runs commands again.
    let run = g
        .exec(
            &Command::shell("echo back"),
            &limits(5000),
            &ExecInput::default(),
            soon(),
        )
        .await
        .unwrap();
    let out = g.capture(run, &limits(5000), 1024).await.unwrap();
    assert_eq!(out.exit_code, 0);
    assert_eq!(out.stdout.text, "back\n");
    assert!(fake.stats().requests.get("resume").copied().unwrap_or(0) >= 1);
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn acquire_refuses_egress_drift_and_leaves_the_guest_alone() {
    let fake = fake_with("").await;
    let cp = plane(&fake);
    let r = reaper();
    let cx = context(cp.clone(), &r);
    let s = spec(EgressPolicy::DenyAll, &[]);
    let name = derived_name(REUSED_PREFIX, &["drift"], &s.egress.fingerprint());
    let g = Guest::acquire(&cx, &s, &name, soon()).await.unwrap();
    let id = g.id().to_owned();
    g.release();
    // Someone widened the guest's egress behind our back.
    api(&fake)
        .sandbox_handle(id.clone())
        .set_egress(["*"])
        .await
        .unwrap();
    let e = Guest::acquire(&cx, &s, &name, soon()).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Refused, "{e}");
    assert!(e.message().contains("egress"), "{e}");
    assert!(e.message().contains("left as it is"), "{e}");
    assert_eq!(status(&cp, &id).await, GuestStatus::Running);
    assert_eq!(fake.stats().created, 1);
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn acquire_refuses_env_drift() {
    let fake = fake_with("").await;
    let cp = plane(&fake);
    let r = reaper();
    let cx = context(cp.clone(), &r);
    let name = "lf-c-envdrift-test";
    let g = Guest::acquire(&cx, &spec(EgressPolicy::AllowAll, &["A"]), name, soon())
        .await
        .unwrap();
    g.release();
    for keys in [&["A", "B"][..], &[][..]] {
        let e = Guest::acquire(&cx, &spec(EgressPolicy::AllowAll, keys), name, soon())
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Refused, "{e}");
        assert!(e.message().contains("environment keys"), "{e}");
        // Values are never in a message.
        assert!(!e.message().contains("value"), "{e}");
    }
    assert_eq!(fake.stats().created, 1);
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn two_tasks_racing_to_create_end_up_on_one_guest() {
    let fake = fake_with("").await;
    let cp: Arc<dyn ControlPlane> = Arc::new(Twisted::new(plane(&fake), false, true));
    let r = reaper();
    let s = spec(EgressPolicy::DenyAll, &[]);
    let name = derived_name(REUSED_PREFIX, &["race"], &s.egress.fingerprint());
    for _ in 0..2 {
        let (cx1, cx2) = (context(cp.clone(), &r), context(cp.clone(), &r));
        let (a, b) = tokio::join!(
            Guest::acquire(&cx1, &s, &name, soon()),
            Guest::acquire(&cx2, &s, &name, soon()),
        );
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_eq!(a.id(), b.id());
    }
    assert_eq!(fake.stats().created, 1, "exactly one guest under the name");
    // Both creates were sent: the loser's 409 made it look the name up again and adopt.
    assert_eq!(fake.stats().requests.get("create").copied(), Some(2));
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lost_create_response_is_found_again_and_adopted() {
    // The create is processed, then the connection closes unanswered.
    let fake = fake_with("create=reset-after#1").await;
    let cp = plane(&fake);
    let r = reaper();
    let cx = context(cp.clone(), &r);
    let s = spec(EgressPolicy::DenyAll, &[]);
    let name = derived_name(REUSED_PREFIX, &["lost"], &s.egress.fingerprint());
    let g = Guest::acquire(&cx, &s, &name, soon()).await.unwrap();
    assert_eq!(status(&cp, g.id()).await, GuestStatus::Running);
    assert_eq!(fake.stats().created, 1, "adopted, not created twice");
    assert_eq!(fake.stats().requests.get("create").copied(), Some(1));
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_policy_change_derives_another_name_and_another_guest() {
    let fake = fake_with("").await;
    let cp = plane(&fake);
    let r = reaper();
    let cx = context(cp.clone(), &r);
    let mut ids = Vec::new();
    for egress in [EgressPolicy::DenyAll, EgressPolicy::AllowAll] {
        let s = spec(egress, &[]);
        let name = derived_name(REUSED_PREFIX, &["same-flow"], &s.egress.fingerprint());
        let g = Guest::acquire(&cx, &s, &name, soon()).await.unwrap();
        ids.push((g.name().to_owned(), g.id().to_owned()));
    }
    assert_ne!(ids[0].0, ids[1].0);
    assert_ne!(ids[0].1, ids[1].1);
    assert_eq!(fake.stats().created, 2);
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_stream_delivers_frames_in_order_with_env_and_stdin() {
    let fake = fake_with("").await;
    let cp = plane(&fake);
    let r = reaper();
    let cx = context(cp.clone(), &r);
    let g = Guest::create(
        &cx,
        &spec(EgressPolicy::AllowAll, &["GREETING"]),
        "lf-",
        soon(),
    )
    .await
    .unwrap();
    let input = ExecInput {
        env: BTreeMap::from([("GREETING".to_owned(), "hi".to_owned())]),
        stdin: "from-stdin\n".to_owned(),
    };
    let script = "for i in 1 2 3; do echo \"$GREETING $i\"; sleep 0.05; done; cat; exit 4";
    let run = g
        .exec(&Command::shell(script), &limits(5000), &input, soon())
        .await
        .unwrap();
    let steps: Vec<ExecStep> = run.into_stream().collect().await;
    let stdout: String = steps
        .iter()
        .filter_map(|s| match s {
            ExecStep::Frame(ExecFrame::Stdout(t)) => Some(t.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(stdout, "hi 1\nhi 2\nhi 3\nfrom-stdin\n");
    assert_eq!(steps.last(), Some(&ExecStep::Frame(ExecFrame::Exit(4))));
    g.destroy().await.unwrap();
    assert_eq!(fake.stats().live, 0);
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn dropping_the_exec_stream_stops_the_command() {
    let fake = fake_with("").await;
    let cp = plane(&fake);
    let r = reaper();
    let cx = context(cp.clone(), &r);
    let g = Guest::create(&cx, &spec(EgressPolicy::AllowAll, &[]), "lf-", soon())
        .await
        .unwrap();
    let mut run = g
        .exec(
            &Command::shell("echo started; sleep 1; touch /workspace/survived"),
            &limits(10_000),
            &ExecInput::default(),
            soon(),
        )
        .await
        .unwrap();
    loop {
        match run.next().await {
            ExecStep::Frame(ExecFrame::Stdout(s)) => {
                assert_eq!(s, "started\n");
                break;
            }
            ExecStep::Frame(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    drop(run);
    // Well past the point where the command would have written its marker.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let e = g
        .download("/workspace/survived", 1024, soon())
        .await
        .unwrap_err();
    assert!(
        e.message().contains("404") || e.message().contains("not found"),
        "{e}"
    );
    // The guard still owns the guest: dropping the handle leaves it with the reaper, whose
    // shutdown (bounded) sees it destroyed.
    drop(g);
    let report = r.shutdown(Duration::from_secs(5)).await;
    assert_eq!(report.failed, 0);
    assert_eq!(fake.stats().live, 0);
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stalled_stream_hits_the_host_deadline_and_keeps_what_arrived() {
    let fake = fake_with("exec_stream=stall-mid").await;
    let cp = plane(&fake);
    let r = reaper();
    let cx = context(cp.clone(), &r);
    let g = Guest::create(&cx, &spec(EgressPolicy::AllowAll, &[]), "lf-", soon())
        .await
        .unwrap();
    let lim = limits(800);
    let run = g
        .exec(
            &Command::shell("echo partial"),
            &lim,
            &ExecInput::default(),
            soon(),
        )
        .await
        .unwrap();
    let out = g.capture(run, &lim, 1024).await.unwrap();
    assert!(out.host_timed_out);
    assert_eq!(out.exit_code, sandbox_core::exec::EXIT_TIMED_OUT);
    assert_eq!(out.stdout.text, "partial\n");
    assert!(out.exec_ms >= 1500, "{}", out.exec_ms);

    // The same stall seen step by step: the host deadline is a step of its own.
    let mut run = g
        .exec(
            &Command::shell("echo again"),
            &lim,
            &ExecInput::default(),
            soon(),
        )
        .await
        .unwrap();
    let mut steps = Vec::new();
    loop {
        let s = run.next().await;
        let last = !matches!(s, ExecStep::Frame(_));
        steps.push(s);
        if last {
            break;
        }
    }
    assert_eq!(steps.last(), Some(&ExecStep::HostDeadline));
    assert!(steps.contains(&ExecStep::Frame(ExecFrame::Stdout("again\n".into()))));
    assert_eq!(run.next().await, ExecStep::End);
    g.destroy().await.unwrap();
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn download_cap_refuses_early_from_content_length() {
    let fake = fake_with("").await;
    let cp = plane(&fake);
    let r = reaper();
    let cx = context(cp.clone(), &r);
    let g = Guest::create(&cx, &spec(EgressPolicy::AllowAll, &[]), "lf-", soon())
        .await
        .unwrap();
    let data = Bytes::from(vec![b'x'; 4096]);
    g.upload("/workspace/big.bin", data.clone(), soon())
        .await
        .unwrap();
    let got = g
        .download("/workspace/big.bin", 4096, soon())
        .await
        .unwrap();
    assert_eq!(got, data);
    let e = g
        .download("/workspace/big.bin", 1000, soon())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Refused, "{e}");
    assert!(e.message().contains("1000-byte cap"), "{e}");
    g.destroy().await.unwrap();
    fake.shutdown().await;
}

/// The HTTP control plane with a twist: with `strip_length`, downloads arrive without a
/// declared length, in small chunks, as a server streaming a file it is still producing would
/// send them; with `gate`, the first two creates wait for each other, so two racing callers
/// have both looked the name up (and found nothing) before either create is sent.
struct Twisted {
    inner: Arc<dyn ControlPlane>,
    strip_length: bool,
    gate: Option<tokio::sync::Barrier>,
    gated: std::sync::atomic::AtomicU32,
}

impl Twisted {
    fn new(inner: Arc<dyn ControlPlane>, strip_length: bool, gate: bool) -> Self {
        Self {
            inner,
            strip_length,
            gate: gate.then(|| tokio::sync::Barrier::new(2)),
            gated: std::sync::atomic::AtomicU32::new(0),
        }
    }
}

impl ControlPlane for Twisted {
    fn check_credential(&self) -> BoxFuture<'_, Result<String, CallError>> {
        self.inner.check_credential()
    }
    fn list_shapes(&self) -> BoxFuture<'_, Result<Vec<Shape>, CallError>> {
        self.inner.list_shapes()
    }
    fn create(&self, req: CreateGuest) -> BoxFuture<'_, Result<GuestInfo, CallError>> {
        Box::pin(async move {
            if let Some(gate) = &self.gate
                && self.gated.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < 2
            {
                gate.wait().await;
            }
            self.inner.create(req).await
        })
    }
    fn find_by_name(&self, name: String) -> BoxFuture<'_, Result<Option<GuestInfo>, CallError>> {
        self.inner.find_by_name(name)
    }
    fn egress(&self, id: String) -> BoxFuture<'_, Result<Option<Vec<String>>, CallError>> {
        self.inner.egress(id)
    }
    fn upload(
        &self,
        id: String,
        path: String,
        data: Bytes,
    ) -> BoxFuture<'_, Result<(), CallError>> {
        self.inner.upload(id, path, data)
    }
    fn exec_stream(
        &self,
        id: String,
        req: ExecRequest,
    ) -> BoxFuture<'_, Result<ExecStream, CallError>> {
        self.inner.exec_stream(id, req)
    }
    fn destroy(&self, id: String) -> BoxFuture<'_, Result<(), CallError>> {
        self.inner.destroy(id)
    }
    fn download(
        &self,
        id: String,
        path: String,
        max_bytes: Option<u64>,
    ) -> BoxFuture<'_, Result<Download, CallError>> {
        Box::pin(async move {
            if !self.strip_length {
                return self.inner.download(id, path, max_bytes).await;
            }
            // Ask without a cap, so only the caller's own counting can stop the transfer.
            let dl = self.inner.download(id, path, None).await?;
            let body = dl
                .body
                .flat_map(|chunk| {
                    let parts: Vec<Result<Bytes, CallError>> = match chunk {
                        Ok(b) => b
                            .chunks(512)
                            .map(|c| Ok(Bytes::copy_from_slice(c)))
                            .collect(),
                        Err(e) => vec![Err(e)],
                    };
                    futures::stream::iter(parts)
                })
                .boxed();
            Ok(Download {
                content_length: None,
                body,
            })
        })
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn download_cap_stops_mid_stream_without_a_declared_length() {
    let fake = fake_with("").await;
    let cp: Arc<dyn ControlPlane> = Arc::new(Twisted::new(plane(&fake), true, false));
    let r = reaper();
    let cx = context(cp.clone(), &r);
    let g = Guest::create(&cx, &spec(EgressPolicy::AllowAll, &[]), "lf-", soon())
        .await
        .unwrap();
    g.upload("/workspace/big.bin", Bytes::from(vec![b'y'; 8192]), soon())
        .await
        .unwrap();
    let e = g
        .download("/workspace/big.bin", 3000, soon())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Refused, "{e}");
    assert!(e.message().contains("more than 3000 bytes arrived"), "{e}");
    // Exactly at the cap is fine.
    let ok = g
        .download("/workspace/big.bin", 8192, soon())
        .await
        .unwrap();
    assert_eq!(ok.len(), 8192);
    g.destroy().await.unwrap();
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn shutdown_destroys_one_shot_guests_and_keeps_named_ones() {
    let fake = fake_with("").await;
    let cp = plane(&fake);
    let r = reaper();
    let cx = context(cp.clone(), &r);
    let s = spec(EgressPolicy::DenyAll, &[]);
    let kept = Guest::acquire(
        &cx,
        &s,
        &derived_name(REUSED_PREFIX, &["keep"], &s.egress.fingerprint()),
        soon(),
    )
    .await
    .unwrap();
    let one_shot = Guest::create(&cx, &s, "lf-", soon()).await.unwrap();
    let (kept_id, one_shot_id) = (kept.id().to_owned(), one_shot.id().to_owned());
    let report = r.shutdown(Duration::from_secs(5)).await;
    assert_eq!((report.destroyed, report.failed), (1, 0));
    assert!(status(&cp, &one_shot_id).await.is_terminal());
    assert_eq!(status(&cp, &kept_id).await, GuestStatus::Running);
    // After shutdown: nothing is dispatched, on either kind of guest.
    let e = kept
        .exec(
            &Command::shell("true"),
            &limits(1000),
            &ExecInput::default(),
            soon(),
        )
        .await
        .unwrap_err();
    assert!(e.message().contains("shut down"), "{e}");
    drop((kept, one_shot));
    assert_eq!(status(&cp, &kept_id).await, GuestStatus::Running);
    assert_eq!(fake.stats().live, 1);
    fake.shutdown().await;
}

/// Every primitive ends by its deadline when the control plane declines three times and then
/// never answers, although each request may take 10 s: the attempt that stalls is clipped to
/// what is left of the budget. (The backend's routes are in the fault matrix.)
#[tokio::test(flavor = "multi_thread")]
async fn every_primitive_ends_by_its_deadline_when_the_control_plane_stalls() {
    use sandbox_core::control::ProcessSpec;

    const BUDGET: Duration = Duration::from_secs(1);
    // Generous for a loaded 2-core machine, and still far below the 10 s request timeout
    // that an unclipped attempt would take: the bound tells the two apart.
    const SLACK: Duration = Duration::from_secs(4);
    let fake = fake_with("").await;
    let cp: Arc<dyn ControlPlane> = Arc::new(
        CreateOsControlPlane::new(
            &SecretString::from(KEY),
            &fake.url(),
            Duration::from_secs(10),
        )
        .unwrap(),
    );
    let r = reaper();
    let cx = GuestContext::new(
        cp.clone(),
        r.clone(),
        Redactor::new(KEY),
        Backoff {
            budget: BUDGET,
            ..quick()
        },
    );
    let s = spec(EgressPolicy::AllowAll, &[]);
    let one_shot = Guest::create(&cx, &s, "lf-", soon()).await.unwrap();
    one_shot
        .upload("/workspace/f.txt", Bytes::from_static(b"x"), soon())
        .await
        .unwrap();
    let kept_name = derived_name(REUSED_PREFIX, &["budget"], &s.egress.fingerprint());
    let kept = Guest::acquire(&cx, &s, &kept_name, soon()).await.unwrap();
    let kept_id = kept.id().to_owned();
    kept.release();
    api(&fake)
        .sandbox_handle(kept_id.clone())
        .pause()
        .await
        .unwrap();

    let stall = |route: &str| format!("{route}=503#3;{route}=stall");
    let mut problems = Vec::new();
    let mut check = |what: &str, took: Duration, kind: Option<ErrorKind>, want: ErrorKind| {
        if took > BUDGET + SLACK {
            problems.push(format!("{what} took {took:?} against a {BUDGET:?} budget"));
        }
        if kind != Some(want) {
            problems.push(format!("{what} ended {kind:?}, not {want:?}"));
        }
    };

    fake.set_faults(&stall("upload")).unwrap();
    let t = Instant::now();
    let res = one_shot
        .upload("/workspace/g.txt", Bytes::from_static(b"y"), t + BUDGET)
        .await;
    check(
        "upload",
        t.elapsed(),
        res.err().map(|e| e.kind()),
        ErrorKind::Transient,
    );

    fake.set_faults(&stall("download")).unwrap();
    let t = Instant::now();
    let res = one_shot
        .download("/workspace/f.txt", 1024, t + BUDGET)
        .await;
    check(
        "download",
        t.elapsed(),
        res.err().map(|e| e.kind()),
        ErrorKind::Transient,
    );

    // A process start that never answered may have started the process.
    fake.set_faults(&stall("process_create")).unwrap();
    let t = Instant::now();
    let process = ProcessSpec {
        cmd: "sleep".to_owned(),
        args: vec!["30".to_owned()],
        cwd: String::new(),
    };
    let res = one_shot.spawn_process(&process, t + BUDGET).await;
    check(
        "process start",
        t.elapsed(),
        res.err().map(|e| e.kind()),
        ErrorKind::OutcomeUnknown,
    );

    // A lookup by name, then a resume of the paused kept guest.
    for route in ["list", "resume"] {
        fake.set_faults(&stall(route)).unwrap();
        let t = Instant::now();
        let res = Guest::acquire(&cx, &s, &kept_name, t + BUDGET).await;
        check(
            &format!("acquire ({route} stalls)"),
            t.elapsed(),
            res.err().map(|e| e.kind()),
            ErrorKind::Transient,
        );
    }

    // Destroys, inside the backoff budget: a kept guest's, and a one-shot guest's (which then
    // stays with the reaper).
    fake.set_faults("").unwrap();
    let kept = Guest::acquire(&cx, &s, &kept_name, soon()).await.unwrap();
    fake.set_faults(&stall("delete")).unwrap();
    for (what, guest) in [("kept destroy", kept), ("one-shot destroy", one_shot)] {
        let t = Instant::now();
        let res = guest.destroy().await;
        let took = t.elapsed();
        if took > BUDGET + SLACK {
            problems.push(format!("{what} took {took:?} against a {BUDGET:?} budget"));
        }
        if res.is_ok() {
            problems.push(format!("{what} succeeded although every DELETE stalls"));
        }
    }
    assert_eq!(
        r.registered(),
        1,
        "the guest whose destroy failed is not kept"
    );

    fake.set_faults("").unwrap();
    r.shutdown(Duration::from_secs(5)).await;
    cp.destroy(kept_id).await.unwrap();
    assert_eq!(fake.stats().live, 0, "{:?}", fake.stats());
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn single_address_rules_reach_the_control_plane_as_cidr() {
    // `1.2.3.4/32` must not travel as `1.2.3.4` (a spelling without live evidence of
    // enforcement), and a bare address given by the user goes out as its /32.
    let fake = fake_with("").await;
    let cp = plane(&fake);
    let r = reaper();
    let cx = context(cp.clone(), &r);
    let rules = ["1.2.3.4/32", "::1/128", "5.6.7.8"].map(str::to_owned);
    let names = sandbox_core::settings::SettingNames {
        restrict_egress: "E",
        allow_egress: "E=*",
        accept_egress_exceptions: "A",
        memory: "M",
    };
    let policy = EgressPolicy::restricted(&rules, true, &names).unwrap();
    let g = Guest::create(&cx, &spec(policy.clone(), &[]), "lf-", soon())
        .await
        .unwrap();
    let mut stored = api(&fake)
        .sandbox_handle(g.id().to_owned())
        .egress()
        .await
        .unwrap();
    stored.sort();
    assert_eq!(stored, ["1.2.3.4/32", "5.6.7.8/32", "::1/128"]);
    g.verify_egress(&policy, soon()).await.unwrap();
    g.destroy().await.unwrap();
    fake.shutdown().await;
}
