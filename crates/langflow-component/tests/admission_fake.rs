//! Admission control against the fake, with the process's surfaces sharing one session (as the
//! Python package's do): the cap on live guests holds across the backend, its warm pool and the
//! component (the fake's own peak of live guests proves it); the per-flow cap; a run that
//! waits in vain is refused naming the cap, the live count and the setting; a waiting run that
//! is cancelled frees its place; a create the account's quota declines (429) waits inside the
//! run's admission wait and then succeeds; the native counters see it all.

#![allow(clippy::too_many_lines, clippy::float_cmp)] // whole counts, exact in f64

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use createos_fake::{FakeOptions, FakeServer};
use langflow_backend::{Backend, BackendError, BackendOptions, LfxPolicy};
use langflow_component::{
    ComponentInputs, ComponentOptions, Reuse, SandboxComponent, SurfaceOptions,
};
use sandbox_core::ErrorKind;
use sandbox_core::pool::PoolConfig;
use sandbox_core::reaper::ReaperConfig;
use sandbox_core::retry::Backoff;
use sandbox_core::session::{Session, http_connector};

const KEY: &str = "adm-fake-key-7c1e90d4b2";

fn quick() -> Backoff {
    Backoff {
        base: Duration::from_millis(20),
        max: Duration::from_millis(200),
        budget: Duration::from_secs(8),
    }
}

async fn fake(opts: FakeOptions) -> FakeServer {
    FakeServer::start(FakeOptions {
        api_key: KEY.to_owned(),
        heartbeat: Duration::from_millis(300),
        ..opts
    })
    .await
    .expect("fake control plane starts")
}

fn surface(fake: &FakeServer, session: &Session, env: &[(&str, &str)]) -> SurfaceOptions {
    let mut map: HashMap<String, String> = HashMap::new();
    map.insert("CREATEOS_SANDBOX_API_KEY".into(), KEY.into());
    map.insert("CREATEOS_SANDBOX_BASE_URL".into(), fake.url());
    map.insert(
        "LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS".into(),
        "true".into(),
    );
    for (k, v) in env {
        map.insert((*k).into(), (*v).into());
    }
    SurfaceOptions {
        env: Arc::new(move |k| map.get(k).cloned()),
        session: Some(session.clone()),
        backoff: quick(),
        kill_after: Duration::from_millis(300),
        host_grace: Duration::from_millis(1500),
        reaper: ReaperConfig {
            backoff: quick(),
            lookup_patience: Duration::from_millis(500),
        },
        pool: PoolConfig {
            backoff: quick(),
            max_idle: None,
        },
        shutdown_timeout: Duration::from_secs(5),
        orphan_sweep: false,
        ..SurfaceOptions::default()
    }
}

fn session() -> Session {
    Session::new(http_connector(), Duration::from_secs(2))
}

fn backend(fake: &FakeServer, session: &Session, env: &[(&str, &str)]) -> Backend {
    Backend::with_options(BackendOptions {
        surface: surface(fake, session, env),
    })
}

fn component(fake: &FakeServer, session: &Session, env: &[(&str, &str)]) -> SandboxComponent {
    SandboxComponent::with_options(ComponentOptions {
        surface: surface(fake, session, env),
        ..ComponentOptions::default()
    })
}

fn policy() -> LfxPolicy {
    LfxPolicy {
        timeout_seconds: 20,
        ..LfxPolicy::default()
    }
}

fn inputs(flow: &str, code: &str) -> ComponentInputs {
    ComponentInputs {
        flow_id: flow.into(),
        component_id: "CreateOSSandbox-adm01".into(),
        python_code: code.into(),
        reuse: Reuse::Off,
        timeout_seconds: 20,
        ..ComponentInputs::default()
    }
}

const NAP: &str = "import time\ntime.sleep(0.4)\nprint('ok')\n";

/// The value of one native counter of `session`.
fn counter(session: &Session, name: &str, labels: &[(&str, &str)]) -> f64 {
    session
        .observation()
        .counters()
        .value(name, labels)
        .unwrap_or(-1.0)
}

async fn settled(fake: &FakeServer) -> createos_fake::Stats {
    for _ in 0..100 {
        let s = fake.stats();
        if s.live == 0 {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    fake.stats()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cap_holds_across_surfaces_and_the_warm_pool() {
    let fake = fake(FakeOptions::default()).await;
    let s = session();
    let env = [
        ("CREATEOS_MAX_LIVE_GUESTS", "3"),
        ("CREATEOS_SANDBOX_WARM_POOL", "2"),
    ];
    let b = Arc::new(backend(&fake, &s, &env));
    let c = Arc::new(component(&fake, &s, &env));
    let mut runs = Vec::new();
    for i in 0..6 {
        let b = Arc::clone(&b);
        runs.push(tokio::spawn(async move {
            b.run(NAP, None, &policy())
                .await
                .map(|o| o.stdout.to_string())
                .map_err(|e| e.to_string())
        }));
        let c = Arc::clone(&c);
        let flow = format!("flow-{i}");
        runs.push(tokio::spawn(async move {
            c.run(&inputs(&flow, NAP))
                .await
                .map(|o| o.result)
                .map_err(|e| e.to_string())
        }));
    }
    for r in runs {
        let out = r
            .await
            .unwrap()
            .expect("every run is served within its wait");
        assert!(out.contains("ok"), "{out}");
    }
    let peak = fake.stats().peak_live;
    assert!(
        peak <= 3,
        "the fake saw {peak} guests live at once under a cap of 3"
    );
    assert!(peak >= 2, "the runs did overlap (peak {peak})");
    assert_eq!(
        counter(
            &s,
            "createos_runs_total",
            &[("surface", "backend"), ("outcome", "ok")]
        ),
        6.0
    );
    assert_eq!(
        counter(
            &s,
            "createos_runs_total",
            &[("surface", "component"), ("outcome", "ok")]
        ),
        6.0
    );
    assert!(
        counter(
            &s,
            "createos_admission_waits_total",
            &[("surface", "backend")]
        ) + counter(
            &s,
            "createos_admission_waits_total",
            &[("surface", "component")]
        ) > 0.0,
        "twelve runs under a cap of three waited"
    );
    b.shutdown().await;
    c.shutdown().await;
    let stats = settled(&fake).await;
    assert_eq!(stats.live, 0, "{stats:?}");
    // Every guest created was reported destroyed once, whoever destroyed it.
    let created: f64 = ["backend", "component"]
        .iter()
        .map(|k| counter(&s, "createos_guests_created_total", &[("surface", k)]))
        .sum();
    let live: f64 = ["backend", "component"]
        .iter()
        .map(|k| counter(&s, "createos_guests_live", &[("surface", k)]))
        .sum();
    #[allow(clippy::cast_precision_loss)]
    let fake_created = stats.created as f64;
    assert_eq!(created, fake_created);
    assert_eq!(live, 0.0);
    assert!(
        counter(
            &s,
            "createos_control_requests_total",
            &[("route", "create"), ("status_class", "2xx")]
        ) >= 1.0
    );
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_waits_in_vain_is_refused_naming_the_cap_the_count_and_the_setting() {
    let fake = fake(FakeOptions::default()).await;
    let s = session();
    let env = [
        ("CREATEOS_MAX_LIVE_GUESTS", "1"),
        ("CREATEOS_ADMISSION_WAIT_SECONDS", "0.5"),
    ];
    let b = Arc::new(backend(&fake, &s, &env));
    let holder = {
        let b = Arc::clone(&b);
        tokio::spawn(async move {
            b.run(
                "import time\ntime.sleep(4)\nprint('held')\n",
                None,
                &policy(),
            )
            .await
        })
    };
    while fake.stats().live == 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let refused = b.run("print(1)", None, &policy()).await.unwrap_err();
    let BackendError::Unavailable(text) = &refused else {
        panic!("an at-capacity refusal is unavailable: {refused:?}");
    };
    for want in [
        "at capacity",
        "1 guest(s) are live",
        "CREATEOS_MAX_LIVE_GUESTS=1",
        "CREATEOS_ADMISSION_WAIT_SECONDS",
        "nothing ran",
    ] {
        assert!(text.contains(want), "{want:?} not in {text}");
    }
    assert_eq!(holder.await.unwrap().unwrap().stdout, "held\n");
    assert_eq!(fake.stats().created, 1, "the refused run created nothing");
    assert_eq!(
        counter(
            &s,
            "createos_admission_refusals_total",
            &[("surface", "backend")]
        ),
        1.0
    );
    assert_eq!(
        counter(
            &s,
            "createos_runs_total",
            &[("surface", "backend"), ("outcome", "unavailable")]
        ),
        1.0
    );
    b.shutdown().await;
    assert_eq!(settled(&fake).await.live, 0);
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_per_flow_cap_holds_one_flow_back_and_not_another() {
    let fake = fake(FakeOptions::default()).await;
    let s = session();
    let env = [
        ("CREATEOS_MAX_LIVE_GUESTS_PER_FLOW", "1"),
        ("CREATEOS_ADMISSION_WAIT_SECONDS", "0.5"),
    ];
    let c = Arc::new(component(&fake, &s, &env));
    let slow = "import time\ntime.sleep(4)\nprint('first')\n";
    let first = {
        let c = Arc::clone(&c);
        tokio::spawn(async move { c.run(&inputs("flow-a", slow)).await })
    };
    while fake.stats().live == 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let same = c.run(&inputs("flow-a", "print(2)")).await.unwrap_err();
    assert_eq!(same.kind(), ErrorKind::AtCapacity);
    let text = same.to_string();
    assert!(
        text.contains("\"flow-a\"") && text.contains("CREATEOS_MAX_LIVE_GUESTS_PER_FLOW=1"),
        "{text}"
    );
    let other = c.run(&inputs("flow-b", "print('other')")).await.unwrap();
    assert_eq!(other.result.trim(), "other");
    assert_eq!(first.await.unwrap().unwrap().result.trim(), "first");
    c.shutdown().await;
    assert_eq!(settled(&fake).await.live, 0);
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_waiting_run_frees_its_place() {
    let fake = fake(FakeOptions::default()).await;
    let s = session();
    let env = [("CREATEOS_MAX_LIVE_GUESTS", "1")];
    let b = Arc::new(backend(&fake, &s, &env));
    let run = |code: &'static str| {
        let b = Arc::clone(&b);
        tokio::spawn(async move { b.run(code, None, &policy()).await })
    };
    let holder = run("import time\ntime.sleep(1.5)\nprint('held')\n");
    while fake.stats().live == 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cancelled = run("print('never')");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let next = run("print('next')");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(s.admission().stats().waiting, 2);
    cancelled.abort();
    let _ = cancelled.await;
    assert_eq!(
        s.admission().stats().waiting,
        1,
        "the cancelled run left the queue"
    );
    assert_eq!(holder.await.unwrap().unwrap().stdout, "held\n");
    assert_eq!(next.await.unwrap().unwrap().stdout, "next\n");
    let stats = fake.stats();
    assert_eq!((stats.created, stats.peak_live), (2, 1), "{stats:?}");
    b.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_the_quota_declines_waits_within_the_budget_then_succeeds() {
    // The account allows one live sandbox; this process has no cap of its own.
    let fake = fake(FakeOptions {
        max_live: 1,
        ..FakeOptions::default()
    })
    .await;
    let s = session();
    let b = Arc::new(backend(&fake, &s, &[]));
    let holder = {
        let b = Arc::clone(&b);
        tokio::spawn(async move {
            b.run(
                "import time\ntime.sleep(1)\nprint('held')\n",
                None,
                &policy(),
            )
            .await
        })
    };
    while fake.stats().live == 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let waited = b.run("print('after')", None, &policy()).await.unwrap();
    assert_eq!(waited.stdout, "after\n");
    assert_eq!(holder.await.unwrap().unwrap().stdout, "held\n");
    let stats = fake.stats();
    assert!(stats.quota_refusals >= 1, "{stats:?}");
    assert_eq!(stats.peak_live, 1);
    assert!(
        counter(
            &s,
            "createos_admission_waits_total",
            &[("surface", "backend")]
        ) >= 1.0
    );
    assert!(
        counter(
            &s,
            "createos_control_requests_total",
            &[("route", "create"), ("status_class", "4xx")]
        ) >= 1.0
    );
    // And a 429 without Retry-After, twice, then room.
    fake.set_faults("create=429+ra=none#2").unwrap();
    let again = b.run("print('again')", None, &policy()).await.unwrap();
    assert_eq!(again.stdout, "again\n");
    b.shutdown().await;
    assert_eq!(settled(&fake).await.live, 0);
    fake.shutdown().await;
}
