//! The warm pool over HTTP against the fake control plane: a pooled guest is used once and
//! destroyed, a policy mismatch bypasses the pool, an idled-out guest is replaced and never
//! handed out paused, a guest failing its read-back is destroyed and never used, shutdown
//! destroys the whole pool, failing refills never fail a run and back off, a stalled refill
//! ends within its budget, and idle time counts from a guest's last accepted call.

#![allow(clippy::too_many_lines)]

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use createos_fake::{FakeOptions, FakeServer};
use futures::future::BoxFuture;
use langflow_backend::PoolUse;
use langflow_backend::lifecycle::{RunOutput, RunSpec, run_python_pooled};
use sandbox_core::Redactor;
use sandbox_core::control::{
    CallError, ControlPlane, CreateGuest, Download, ExecRequest, ExecStream, GuestInfo, GuestStatus,
};
use sandbox_core::egress::EgressPolicy;
use sandbox_core::exec::{Command, ExecLimits};
use sandbox_core::guest::{ExecInput, Guest, GuestContext};
use sandbox_core::names::BACKEND_PREFIX;
use sandbox_core::pool::{PoolConfig, PoolStats, WarmPool, Warmer};
use sandbox_core::reaper::{Reaper, ReaperConfig};
use sandbox_core::retry::Backoff;
use sandbox_core::shapes::Shape;
use sandbox_createos::CreateOsControlPlane;
use secrecy::SecretString;

const KEY: &str = "core-pool-fake-key-9c2e";

fn quick() -> Backoff {
    Backoff {
        base: Duration::from_millis(20),
        max: Duration::from_millis(200),
        budget: Duration::from_secs(5),
    }
}

async fn fake() -> FakeServer {
    FakeServer::start(FakeOptions {
        api_key: KEY.to_owned(),
        heartbeat: Duration::from_millis(300),
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

fn reaper() -> Reaper {
    Reaper::new(ReaperConfig {
        backoff: quick(),
        lookup_patience: Duration::from_millis(300),
    })
}

fn pool(size: usize, config: PoolConfig) -> WarmPool {
    let p = WarmPool::new(config);
    p.set_size(size);
    p
}

fn pool_config(base_ms: u64, max_ms: u64) -> PoolConfig {
    PoolConfig {
        backoff: Backoff {
            base: Duration::from_millis(base_ms),
            max: Duration::from_millis(max_ms),
            budget: Duration::from_secs(2),
        },
        max_idle: None,
    }
}

fn spec(egress: EgressPolicy) -> RunSpec {
    RunSpec {
        shape: "s-2vcpu-4gb".into(),
        rootfs: "devbox:1".into(),
        envs: BTreeMap::new(),
        egress,
        limits: ExecLimits {
            budget: Duration::from_secs(10),
            kill_after: Duration::from_millis(500),
            host_grace: Duration::from_millis(1500),
        },
        max_output_bytes: 1 << 20,
        backoff: quick(),
        background_destroy: true,
        grant: None,
    }
}

async fn run(
    cp: &Arc<dyn ControlPlane>,
    r: &Reaper,
    p: &WarmPool,
    s: &RunSpec,
    code: &str,
) -> RunOutput {
    run_python_pooled(
        cp.clone(),
        r,
        Some(p),
        s,
        Bytes::copy_from_slice(code.as_bytes()),
        &Redactor::new(KEY),
    )
    .await
    .expect("the run succeeds")
}

/// Waits (bounded) until `done` holds for the pool's counters.
async fn until(p: &WarmPool, what: &str, done: impl Fn(&PoolStats) -> bool) -> PoolStats {
    for _ in 0..500 {
        let s = p.stats();
        if done(&s) {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for {what}: {:?}", p.stats());
}

async fn status(cp: &Arc<dyn ControlPlane>, id: &str) -> Option<GuestStatus> {
    match cp.get(id.to_owned()).await {
        Ok(info) => Some(info.status),
        Err(e) if e.is_not_found() => None,
        Err(e) => panic!("get {id}: {e}"),
    }
}

async fn gone(cp: &Arc<dyn ControlPlane>, id: &str) -> bool {
    for _ in 0..100 {
        match status(cp, id).await {
            None | Some(GuestStatus::Destroyed | GuestStatus::Destroying) => return true,
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    false
}

/// The pool's guests as the fake lists them: (name, id, status) of every live `lf-` guest.
async fn live_guests(cp: &Arc<dyn ControlPlane>) -> Vec<GuestInfo> {
    cp.list_guests(BACKEND_PREFIX.to_owned())
        .await
        .unwrap()
        .into_iter()
        .filter(|g| !g.is_terminal() && g.status != GuestStatus::Destroyed)
        .collect()
}

/// Closes the pool, shuts the reaper down and asserts the fake has no live guest.
async fn finish(p: WarmPool, r: Reaper, fake: FakeServer) {
    p.close();
    r.shutdown(Duration::from_secs(5)).await;
    let mut live = fake.stats().live;
    for _ in 0..100 {
        if live == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        live = fake.stats().live;
    }
    assert_eq!(live, 0, "guests leaked: {:?}", fake.stats());
    fake.shutdown().await;
}

fn name(g: &GuestInfo) -> &str {
    g.name.as_deref().unwrap_or_default()
}

fn requests(fake: &FakeServer, route: &str) -> u64 {
    fake.stats().requests.get(route).copied().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pooled_guest_is_used_once_and_destroyed() {
    let fake = fake().await;
    let cp = plane(&fake);
    let r = reaper();
    let p = pool(2, pool_config(50, 400));
    let s = spec(EgressPolicy::AllowAll);

    // The first run finds the pool empty: it creates as without a pool, and the pool warms
    // for its policy in the background.
    let first = run(&cp, &r, &p, &s, "print(1)").await;
    assert_eq!(first.pool, PoolUse::Miss);
    assert_eq!(first.stdout, "1\n");
    until(&p, "two ready guests", |s| s.ready == 2).await;
    let pooled: HashSet<String> = live_guests(&cp)
        .await
        .into_iter()
        .filter(|g| name(g) != first.guest)
        .map(|g| name(&g).to_owned())
        .collect();
    assert_eq!(pooled.len(), 2, "{pooled:?}");

    let mut used = HashSet::new();
    for _ in 0..2 {
        let out = run(&cp, &r, &p, &s, "print('warm')").await;
        assert_eq!(out.pool, PoolUse::Hit);
        assert_eq!(out.stdout, "warm\n");
        assert_eq!(out.exit_code, 0);
        assert!(pooled.contains(&out.guest), "{} not pooled", out.guest);
        assert!(
            used.insert(out.guest.clone()),
            "a pooled guest was used twice"
        );
        // One round trip: the program travels inside the exec request.
        assert_eq!(out.timings.requests, Some(1), "{:?}", out.timings);
        assert_eq!(out.timings.acquire_ms, Some(0));
        assert!(gone(&cp, &out.guest_id).await, "used guest not destroyed");
    }
    // No run uploads: the cold run's create response showed its egress, so its program
    // travelled inside the exec request too.
    assert_eq!(requests(&fake, "upload"), 0, "a small program was uploaded");
    // Refilled with new guests, never the used ones again. A program too large for the exec
    // request is uploaded to the pooled guest first: two round trips, same result.
    until(&p, "refilled", |s| s.ready == 2).await;
    let big = format!(
        "{}\nprint(2)",
        "#".repeat(sandbox_core::exec::INLINE_PROGRAM_MAX)
    );
    let again = run(&cp, &r, &p, &s, &big).await;
    assert_eq!(again.pool, PoolUse::Hit);
    assert_eq!(again.stdout, "2\n");
    assert_eq!(again.timings.requests, Some(2), "{:?}", again.timings);
    assert_eq!(requests(&fake, "upload"), 1);
    assert!(!used.contains(&again.guest));
    let st = p.stats();
    assert_eq!((st.hits, st.misses), (3, 1), "{st:?}");
    finish(p, r, fake).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_policy_mismatch_bypasses_the_pool() {
    let fake = fake().await;
    let cp = plane(&fake);
    let r = reaper();
    let p = pool(2, pool_config(50, 400));
    let deny = spec(EgressPolicy::DenyAll);
    let first = run(&cp, &r, &p, &deny, "print(1)").await;
    until(&p, "two deny-all guests", |s| s.ready == 2).await;
    let deny_guests: Vec<GuestInfo> = live_guests(&cp)
        .await
        .into_iter()
        .filter(|g| name(g) != first.guest)
        .collect();
    assert_eq!(deny_guests.len(), 2);

    // Another egress policy: not served from the deny-all pool, which stays.
    let allow = spec(EgressPolicy::AllowAll);
    let out = run(&cp, &r, &p, &allow, "print('open')").await;
    assert_eq!(out.pool, PoolUse::Miss);
    assert!(deny_guests.iter().all(|g| name(g) != out.guest));
    assert_eq!(
        cp.egress(out.guest_id.clone()).await.unwrap(),
        Some(vec!["*".to_owned()])
    );
    // Runs alternating between two policies do not throw the pool away at every run.
    let warm_deny = run(&cp, &r, &p, &deny, "print('warm')").await;
    assert_eq!(warm_deny.pool, PoolUse::Hit);
    assert_eq!(
        cp.egress(warm_deny.guest_id.clone()).await.unwrap(),
        Some(vec!["240.0.0.0/4".to_owned()])
    );
    let open1 = run(&cp, &r, &p, &allow, "print('open')").await;
    assert_eq!(open1.pool, PoolUse::Miss);
    assert_eq!(p.stats().discarded, 0, "{:?}", p.stats());
    until(&p, "refilled for deny-all", |s| s.ready == 2).await;

    // Asked for twice in a row, the other policy takes over: the deny-all guests are
    // destroyed unused and the pool warms for allow-all.
    let open2 = run(&cp, &r, &p, &allow, "print('open')").await;
    assert_eq!(open2.pool, PoolUse::Miss);
    until(&p, "two allow-all guests", |s| {
        s.discarded == 2 && s.ready == 2
    })
    .await;
    for g in live_guests(&cp).await {
        let eg = cp.egress(g.id.clone()).await.unwrap();
        assert_eq!(
            eg,
            Some(vec!["*".to_owned()]),
            "{} is still deny-all",
            name(&g)
        );
    }
    let hit = run(&cp, &r, &p, &allow, "print('warm')").await;
    assert_eq!(hit.pool, PoolUse::Hit);
    assert_eq!(
        cp.egress(hit.guest_id.clone()).await.unwrap(),
        Some(vec!["*".to_owned()])
    );

    // The environment counts, keys and values: guests warmed for one value never serve
    // another, and the program sees its own value.
    let mut with_env = allow.clone();
    with_env.envs = BTreeMap::from([("GREETING".to_owned(), "hej".to_owned())]);
    let greet = "import os; print(os.environ['GREETING'])";
    for _ in 0..2 {
        let greeted = run(&cp, &r, &p, &with_env, greet).await;
        assert_eq!(greeted.pool, PoolUse::Miss);
        assert_eq!(greeted.stdout, "hej\n");
    }
    until(&p, "warm for the env", |s| s.ready == 2 && s.discarded >= 4).await;
    let greeted = run(&cp, &r, &p, &with_env, greet).await;
    assert_eq!(greeted.pool, PoolUse::Hit);
    assert_eq!(greeted.stdout, "hej\n");
    with_env
        .envs
        .insert("GREETING".to_owned(), "hallo".to_owned());
    let e2 = run(&cp, &r, &p, &with_env, greet).await;
    assert_eq!(e2.pool, PoolUse::Miss);
    assert_eq!(e2.stdout, "hallo\n");
    // A longer timeout means a later auto-pause backstop: another policy too.
    let mut longer = with_env.clone();
    longer.limits.budget = Duration::from_secs(200);
    let slow = run(&cp, &r, &p, &longer, "print(3)").await;
    assert_eq!(slow.pool, PoolUse::Miss);
    finish(p, r, fake).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_idled_out_guest_is_replaced_before_it_would_pause() {
    let fake = fake().await;
    let cp = plane(&fake);
    let r = reaper();
    let p = pool(
        1,
        PoolConfig {
            // Long enough that a loaded machine does not retire it again mid-test.
            max_idle: Some(Duration::from_millis(1500)),
            ..pool_config(50, 400)
        },
    );
    let s = spec(EgressPolicy::AllowAll);
    let first = run(&cp, &r, &p, &s, "print(1)").await;
    until(&p, "one ready guest", |s| s.ready == 1).await;
    let before: Vec<GuestInfo> = live_guests(&cp)
        .await
        .into_iter()
        .filter(|g| name(g) != first.guest)
        .collect();
    assert_eq!(before.len(), 1);
    // Past its idle limit it is retired and replaced, without any run asking.
    until(&p, "a retirement", |s| s.discarded >= 1 && s.ready == 1).await;
    assert!(gone(&cp, &before[0].id).await, "the idled-out guest stays");
    let out = run(&cp, &r, &p, &s, "print('fresh')").await;
    assert_eq!(out.pool, PoolUse::Hit);
    assert_ne!(out.guest, name(&before[0]));
    assert_eq!(requests(&fake, "resume"), 0, "a pooled guest was resumed");
    finish(p, r, fake).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_guest_the_control_plane_paused_is_never_handed_out_paused() {
    let fake = fake().await;
    let cp = plane(&fake);
    let r = reaper();
    let p = pool(1, pool_config(50, 400));
    let s = spec(EgressPolicy::AllowAll);
    let first = run(&cp, &r, &p, &s, "print(1)").await;
    until(&p, "one ready guest", |s| s.ready == 1).await;
    let pooled: Vec<GuestInfo> = live_guests(&cp)
        .await
        .into_iter()
        .filter(|g| name(g) != first.guest)
        .collect();
    assert_eq!(pooled.len(), 1);
    // The control plane's clock jumps past the auto-pause backstop: the idle guest pauses
    // behind the pool's back (host suspended, clocks skewed).
    fake.advance_clock(Duration::from_secs(
        u64::from(s.limits.auto_pause_seconds()) + 5,
    ));
    assert_eq!(status(&cp, &pooled[0].id).await, Some(GuestStatus::Paused));

    let out = run(&cp, &r, &p, &s, "print('still works')").await;
    assert_eq!(out.pool, PoolUse::Replaced);
    assert_eq!(out.stdout, "still works\n");
    assert_ne!(out.guest, name(&pooled[0]));
    assert!(gone(&cp, &pooled[0].id).await, "the paused guest stays");
    assert_eq!(requests(&fake, "resume"), 0, "the paused guest was resumed");
    // The run's program travels inside the exec request: the paused guest's control plane
    // refused it with 409 (nothing started there), then the fresh guest ran it.
    assert_eq!(requests(&fake, "exec_stream"), 3);
    // No uploads: every program travelled inside its exec request.
    assert_eq!(requests(&fake, "upload"), 0);
    finish(p, r, fake).await;
}

/// The fake, except that its create responses carry no `egress` (so every guest is read back),
/// and while `lie` is set every egress read-back reports allow-all; the ids it lied about are
/// kept.
struct Liar {
    inner: Arc<dyn ControlPlane>,
    lie: AtomicBool,
    lied_to: Mutex<Vec<String>>,
}

impl ControlPlane for Liar {
    fn check_credential(&self) -> BoxFuture<'_, Result<String, CallError>> {
        self.inner.check_credential()
    }
    fn list_shapes(&self) -> BoxFuture<'_, Result<Vec<Shape>, CallError>> {
        self.inner.list_shapes()
    }
    fn create(&self, req: CreateGuest) -> BoxFuture<'_, Result<GuestInfo, CallError>> {
        Box::pin(async move {
            let mut info = self.inner.create(req).await?;
            info.egress = None;
            Ok(info)
        })
    }
    fn find_by_name(&self, name: String) -> BoxFuture<'_, Result<Option<GuestInfo>, CallError>> {
        self.inner.find_by_name(name)
    }
    fn egress(&self, id: String) -> BoxFuture<'_, Result<Option<Vec<String>>, CallError>> {
        Box::pin(async move {
            if self.lie.load(Ordering::SeqCst) {
                self.lied_to.lock().unwrap().push(id);
                return Ok(Some(vec!["*".to_owned()]));
            }
            self.inner.egress(id).await
        })
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
        self.inner.download(id, path, max_bytes)
    }
    fn get(&self, id: String) -> BoxFuture<'_, Result<GuestInfo, CallError>> {
        self.inner.get(id)
    }
    fn list_guests(&self, prefix: String) -> BoxFuture<'_, Result<Vec<GuestInfo>, CallError>> {
        self.inner.list_guests(prefix)
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_guest_failing_its_read_back_is_destroyed_and_the_run_uses_a_fresh_one() {
    let fake = fake().await;
    let liar = Arc::new(Liar {
        inner: plane(&fake),
        lie: AtomicBool::new(true),
        lied_to: Mutex::new(Vec::new()),
    });
    let cp: Arc<dyn ControlPlane> = liar.clone();
    let r = reaper();
    // A long backoff: after the failed refill the pool stays empty for this test's run.
    let p = pool(2, pool_config(5_000, 10_000));
    let s = spec(EgressPolicy::DenyAll);
    let cx = GuestContext::new(cp.clone(), r.clone(), Redactor::new(KEY), quick());
    // Warm the pool for deny-all while the read-back says allow-all.
    assert!(p.take(&cx, &s.guest_spec(), BACKEND_PREFIX).is_none());
    until(&p, "the failed refill", |s| {
        s.refill_failures == 2 && s.filling == 0
    })
    .await;
    assert_eq!(
        p.stats().ready,
        0,
        "a guest that failed its read-back was pooled"
    );
    let bad: Vec<String> = liar.lied_to.lock().unwrap().clone();
    assert_eq!(bad.len(), 2);
    for id in &bad {
        assert!(
            gone(&cp, id).await,
            "guest {id} failed its read-back but was kept"
        );
    }

    liar.lie.store(false, Ordering::SeqCst);
    let out = run(&cp, &r, &p, &s, "print('fresh')").await;
    assert_eq!(out.pool, PoolUse::Miss);
    assert_eq!(out.stdout, "fresh\n");
    assert!(!bad.contains(&out.guest_id));
    // The run's own guest was read back honestly before its program ran.
    assert_eq!(requests(&fake, "egress_get"), 1);
    finish(p, r, fake).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn shutdown_destroys_the_whole_pool() {
    let fake = fake().await;
    let cp = plane(&fake);
    let r = reaper();
    let p = pool(3, pool_config(50, 400));
    let s = spec(EgressPolicy::AllowAll);
    run(&cp, &r, &p, &s, "print(1)").await;
    until(&p, "three ready guests", |s| s.ready == 3).await;
    assert!(fake.stats().live >= 3);
    // A refill in flight as well: take one, so the pool is creating a replacement.
    let cx = GuestContext::new(cp.clone(), r.clone(), Redactor::new(KEY), quick());
    let taken = p.take(&cx, &s.guest_spec(), BACKEND_PREFIX).expect("a hit");
    drop(taken);
    p.close();
    let report = r.shutdown(Duration::from_secs(5)).await;
    assert_eq!(report.failed, 0, "{report:?}");
    assert!(p.is_closed());
    // Nothing is created once closed.
    assert!(p.take(&cx, &s.guest_spec(), BACKEND_PREFIX).is_none());
    let created = fake.stats().created;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        fake.stats().created,
        created,
        "the pool refilled after shutdown"
    );
    finish(p, r, fake).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn failing_refills_never_fail_a_run_and_back_off() {
    let fake = fake().await;
    let cp = plane(&fake);
    let r = reaper();
    let p = pool(2, pool_config(100, 400));
    let s = spec(EgressPolicy::AllowAll);
    run(&cp, &r, &p, &s, "print(1)").await;
    until(&p, "two ready guests", |s| s.ready == 2).await;

    fake.set_faults("create=503").unwrap();
    let creates_before = requests(&fake, "create");
    for _ in 0..2 {
        let out = run(&cp, &r, &p, &s, "print('warm')").await;
        assert_eq!(out.pool, PoolUse::Hit);
        assert_eq!(out.stdout, "warm\n");
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let tried = requests(&fake, "create") - creates_before;
    let st = p.stats();
    assert!(st.refill_failures >= 2, "{st:?}");
    // One probe at a time, spaced 100 ms doubling to 400 ms (plus jitter): a handful in
    // 1.5 s, not a storm.
    assert!((2..=10).contains(&tried), "{tried} creates in 1.5 s");
    assert_eq!(st.ready, 0);

    // The control plane recovers: so does the pool, within its largest backoff.
    fake.set_faults("").unwrap();
    until(&p, "recovered", |s| s.ready == 2).await;
    let out = run(&cp, &r, &p, &s, "print('again')").await;
    assert_eq!(out.pool, PoolUse::Hit);
    finish(p, r, fake).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refill_declined_with_retry_after_waits_at_least_that_long() {
    let fake = fake().await;
    let cp = plane(&fake);
    let r = reaper();
    let p = pool(1, pool_config(50, 200));
    let s = spec(EgressPolicy::AllowAll);
    fake.set_faults("create=429+ra=2").unwrap();
    let cx = GuestContext::new(cp.clone(), r.clone(), Redactor::new(KEY), quick());
    assert!(p.take(&cx, &s.guest_spec(), BACKEND_PREFIX).is_none());
    until(&p, "the declined refill", |s| s.refill_failures >= 1).await;
    let first = requests(&fake, "create");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // The pool's own backoff (50 ms doubling to 200 ms) would have probed about seven times
    // by now; the server asked for 2 s.
    assert_eq!(
        requests(&fake, "create"),
        first,
        "probed before Retry-After"
    );
    fake.set_faults("").unwrap();
    until(&p, "recovered after the Retry-After", |s| s.ready == 1).await;
    finish(p, r, fake).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_declined_warm_exec_is_retried_on_the_same_pooled_guest() {
    for faults in [
        "exec_stream=429#1",
        "exec_stream=503+ra=none#1",
        "exec_stream=429+ra=1#1",
    ] {
        let fake = fake().await;
        let cp = plane(&fake);
        let r = reaper();
        let p = pool(1, pool_config(50, 200));
        let s = spec(EgressPolicy::AllowAll);
        run(&cp, &r, &p, &s, "print(1)").await;
        until(&p, "a ready guest", |s| s.ready == 1).await;
        let execs = requests(&fake, "exec_stream");
        let created = fake.stats().created;
        fake.set_faults(faults).unwrap();
        let out = run(&cp, &r, &p, &s, "print('warm')").await;
        // Declined means not started: the same pooled guest gets the program again.
        assert_eq!(out.pool, PoolUse::Hit, "{faults}");
        assert_eq!(out.stdout, "warm\n", "{faults}");
        assert_eq!(out.timings.requests, Some(2), "{faults}: {:?}", out.timings);
        assert_eq!(requests(&fake, "exec_stream"), execs + 2, "{faults}");
        assert_eq!(p.stats().discarded, 0, "{faults}");
        // No guest was created for the run (the refill's may have started).
        assert!(fake.stats().created <= created + 1, "{faults}");
        finish(p, r, fake).await;
    }
}

/// A warmer that takes `idle` before or after one accepted exec (`exec_first`).
async fn slow_warm(g: &Guest, exec_first: bool, idle: Duration) -> Result<(), String> {
    if !exec_first {
        tokio::time::sleep(idle).await;
    }
    let limits = ExecLimits {
        budget: Duration::from_secs(5),
        kill_after: Duration::from_millis(500),
        host_grace: Duration::from_millis(1500),
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let run = g
        .exec(
            &Command::shell("true"),
            &limits,
            &ExecInput::default(),
            deadline,
        )
        .await
        .map_err(|e| e.to_string())?;
    g.capture(run, &limits, 1024)
        .await
        .map_err(|e| e.to_string())?;
    if exec_first {
        tokio::time::sleep(idle).await;
    }
    Ok(())
}

/// A pool of one whose guests may idle 3 s, prepared by a warmer that spends 4 s before or
/// after its one exec.
fn slow_pool(exec_first: bool) -> WarmPool {
    let warmer: Warmer =
        Arc::new(move |g: &Guest| Box::pin(slow_warm(g, exec_first, Duration::from_secs(4))));
    let p = WarmPool::with_warmer(
        PoolConfig {
            max_idle: Some(Duration::from_secs(3)),
            ..pool_config(2000, 4000)
        },
        warmer,
    );
    p.set_size(1);
    p
}

#[tokio::test(flavor = "multi_thread")]
async fn a_guest_idle_through_its_preparation_is_never_pooled() {
    // Its last accepted call (the warmer's exec) was 4 s before it was ready: with 3 s of
    // idle allowed, the control plane may pause it any moment, so it must not be listed ready.
    let fake = fake().await;
    let cp = plane(&fake);
    let r = reaper();
    let p = slow_pool(true);
    let s = spec(EgressPolicy::AllowAll);
    assert_eq!(run(&cp, &r, &p, &s, "print(1)").await.pool, PoolUse::Miss);
    let st = until(&p, "the prepared guest", |s| {
        s.ready == 1 || s.discarded >= 1
    })
    .await;
    assert_eq!(
        st.ready, 0,
        "a guest idle past its limit is listed ready: {st:?}"
    );
    assert_eq!(st.refill_failures, 1, "{st:?}");
    let out = run(&cp, &r, &p, &s, "print(2)").await;
    assert_eq!(out.pool, PoolUse::Miss);
    finish(p, r, fake).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_counts_from_the_guests_last_accepted_call() {
    // The warmer's exec came 4 s after the create, at the end of the preparation: the idle
    // clock restarted there, so the guest is pooled and handed out (measured from its create,
    // it would have been past its 3 s limit).
    let fake = fake().await;
    let cp = plane(&fake);
    let r = reaper();
    let p = slow_pool(false);
    let s = spec(EgressPolicy::AllowAll);
    assert_eq!(run(&cp, &r, &p, &s, "print(1)").await.pool, PoolUse::Miss);
    let st = until(&p, "the prepared guest", |s| {
        s.ready == 1 || s.discarded >= 1
    })
    .await;
    assert_eq!((st.ready, st.discarded), (1, 0), "{st:?}");
    let out = run(&cp, &r, &p, &s, "print(2)").await;
    assert_eq!(out.pool, PoolUse::Hit);
    assert_eq!(out.stdout, "2\n");
    finish(p, r, fake).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refill_whose_create_stalls_ends_within_the_pool_budget() {
    // Each request may take 10 s; the pool's budget is 1 s: the stalled create is cut there,
    // counted as a failure, and its name stays with the reaper (the guest may exist).
    let fake = fake().await;
    let cp: Arc<dyn ControlPlane> = Arc::new(
        CreateOsControlPlane::new(
            &SecretString::from(KEY),
            &fake.url(),
            Duration::from_secs(10),
        )
        .unwrap(),
    );
    let r = reaper();
    let config = PoolConfig {
        backoff: Backoff {
            base: Duration::from_secs(5),
            max: Duration::from_secs(5),
            budget: Duration::from_secs(1),
        },
        max_idle: None,
    };
    let p = pool(1, config);
    fake.set_faults("create=stall").unwrap();
    let cx = GuestContext::new(cp.clone(), r.clone(), Redactor::new(KEY), quick());
    let t0 = tokio::time::Instant::now();
    assert!(
        p.take(
            &cx,
            &spec(EgressPolicy::AllowAll).guest_spec(),
            BACKEND_PREFIX
        )
        .is_none()
    );
    while p.stats().refill_failures == 0 && t0.elapsed() < Duration::from_secs(8) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = t0.elapsed();
    assert_eq!(p.stats().refill_failures, 1, "{:?}", p.stats());
    assert!(
        took < Duration::from_millis(2500),
        "the refill took {took:?} against a 1 s budget"
    );
    fake.set_faults("").unwrap();
    finish(p, r, fake).await;
}
