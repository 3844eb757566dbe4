//! The backend with `CREATEOS_SANDBOX_WARM_POOL` against the fake control plane: off by
//! default (today's requests exactly), a warm run is a single exec request, the
//! pool shows in `doctor`, invalid sizes are refused before any guest exists, and shutdown
//! leaves no guest alive.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use createos_fake::{FakeOptions, FakeServer};
use langflow_backend::SurfaceOptions;
use langflow_backend::{
    Backend, BackendError, BackendOptions, DoctorLevel, LfxPolicy, PoolStats, PoolUse,
};
use sandbox_core::pool::PoolConfig;
use sandbox_core::reaper::ReaperConfig;
use sandbox_core::retry::Backoff;

const KEY: &str = "lf-pool-fake-key-3e8b41c0";
const VAR: &str = "CREATEOS_SANDBOX_WARM_POOL";

async fn fake() -> FakeServer {
    FakeServer::start(FakeOptions {
        api_key: KEY.to_owned(),
        heartbeat: Duration::from_millis(500),
        ..FakeOptions::default()
    })
    .await
    .expect("fake control plane starts")
}

fn backend(fake: &FakeServer, pool: Option<&str>) -> Backend {
    Backend::with_options(options(fake, pool))
}

fn options(fake: &FakeServer, pool: Option<&str>) -> BackendOptions {
    let mut env: HashMap<String, String> = HashMap::new();
    env.insert("CREATEOS_SANDBOX_API_KEY".into(), KEY.into());
    env.insert("CREATEOS_SANDBOX_BASE_URL".into(), fake.url());
    env.insert(
        "LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS".into(),
        "true".into(),
    );
    if let Some(n) = pool {
        env.insert(VAR.into(), n.into());
    }
    let quick = Backoff {
        base: Duration::from_millis(20),
        max: Duration::from_millis(200),
        budget: Duration::from_secs(4),
    };
    BackendOptions {
        surface: SurfaceOptions {
            env: Arc::new(move |k| env.get(k).cloned()),
            request_timeout: Duration::from_secs(1),
            backoff: quick,
            kill_after: Duration::from_millis(500),
            host_grace: Duration::from_millis(1500),
            shutdown_timeout: Duration::from_secs(5),
            reaper: ReaperConfig {
                backoff: quick,
                lookup_patience: Duration::from_millis(300),
            },
            pool: PoolConfig {
                backoff: quick,
                max_idle: None,
            },
            orphan_sweep: false,
            ..SurfaceOptions::default()
        },
    }
}

fn policy() -> LfxPolicy {
    LfxPolicy {
        timeout_seconds: 10,
        ..LfxPolicy::default()
    }
}

async fn until(b: &Backend, what: &str, done: impl Fn(&PoolStats) -> bool) {
    for _ in 0..250 {
        if done(&b.warm_pool()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for {what}: {:?}", b.warm_pool());
}

async fn finish(b: Backend, fake: FakeServer) {
    b.shutdown().await;
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

fn doctor_line(report: &langflow_backend::DoctorReport) -> String {
    report
        .lines
        .iter()
        .find(|l| l.text.starts_with("warm pool:"))
        .map(|l| l.text.clone())
        .expect("a warm pool line")
}

#[tokio::test(flavor = "multi_thread")]
async fn off_by_default_changes_nothing() {
    let fake = fake().await;
    for setting in [None, Some("0"), Some(" ")] {
        let b = backend(&fake, setting);
        let out = b.run("print(1)", None, &policy()).await.unwrap();
        assert_eq!(out.pool, PoolUse::Off);
        // create, then the exec with the program (the create response showed the egress).
        assert_eq!(out.timings.requests, Some(2), "{setting:?}");
        assert_eq!(b.warm_pool(), PoolStats::default());
        assert!(doctor_line(&b.doctor(&policy()).await).contains("off"));
        b.shutdown().await;
    }
    // One guest per run, none ahead of time.
    assert_eq!(fake.stats().created, 3);
    finish(backend(&fake, None), fake).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_warm_run_is_one_exec_request() {
    let fake = fake().await;
    let b = backend(&fake, Some("2"));
    let cold = b.run("print(1)", None, &policy()).await.unwrap();
    assert_eq!(cold.pool, PoolUse::Miss);
    assert_eq!(cold.timings.requests, Some(2));
    until(&b, "two ready guests", |s| s.ready == 2).await;
    // The pool's idle guests belong to no run: a forked worker settling its run's guest
    // does not wait for them.
    for _ in 0..100 {
        if b.unpooled_guests() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(b.unpooled_guests(), 0);
    assert_eq!(b.registered_guests(), 2);

    let warm = b.run("print('warm')", None, &policy()).await.unwrap();
    assert_eq!(warm.pool, PoolUse::Hit);
    assert_eq!(warm.stdout, "warm\n");
    // The pooled guest was verified when it was pooled; the program rides in the exec.
    assert_eq!(warm.timings.requests, Some(1), "{:?}", warm.timings);
    assert_ne!(warm.guest, cold.guest);

    // Another policy (network on) is a miss, served as without a pool.
    let open = LfxPolicy {
        allow_network: true,
        ..policy()
    };
    let other = b.run("print('open')", None, &open).await.unwrap();
    assert_eq!(other.pool, PoolUse::Miss);
    assert_eq!(other.timings.requests, Some(2));

    let line = doctor_line(&b.doctor(&policy()).await);
    assert!(line.contains("2 guest(s)") && line.contains(VAR), "{line}");
    assert!(
        line.contains("1 hit(s)") && line.contains("2 miss(es)"),
        "{line}"
    );
    // Shutdown destroys the whole pool.
    finish(b, fake).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn invalid_sizes_are_refused_before_any_guest_exists() {
    let fake = fake().await;
    for bad in ["-1", "four", "65", "100000000000000000000", "2.5"] {
        let b = backend(&fake, Some(bad));
        let e = b.run("print(1)", None, &policy()).await.unwrap_err();
        let BackendError::Unavailable(msg) = &e else {
            panic!("{bad}: {e:?}");
        };
        assert!(msg.contains(VAR) && msg.contains("64"), "{bad}: {msg}");
        assert!(!msg.contains(KEY));
        let report = b.doctor(&policy()).await;
        assert!(!report.ok);
        assert!(
            report
                .lines
                .iter()
                .any(|l| l.level == DoctorLevel::Refused && l.text.contains(VAR)),
            "{bad}: {report}"
        );
    }
    assert_eq!(fake.stats().created, 0);
    finish(backend(&fake, None), fake).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_backend_without_pool_permission_keeps_no_idle_guest() {
    let fake = fake().await;
    // What a forked worker gets: it may end with `os._exit`, so it must hold no idle guest.
    let b = Backend::with_options(BackendOptions {
        surface: SurfaceOptions {
            pool_allowed: false,
            ..options(&fake, Some("4")).surface
        },
    });
    for _ in 0..2 {
        let out = b.run("print(1)", None, &policy()).await.unwrap();
        assert_eq!(out.pool, PoolUse::Off);
        assert_eq!(out.timings.requests, Some(2));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(fake.stats().created, 2, "guests were created ahead of time");
    let line = doctor_line(&b.doctor(&policy()).await);
    assert!(line.contains("forked"), "{line}");
    finish(b, fake).await;
}
