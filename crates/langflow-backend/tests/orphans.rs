//! Orphans against the fake control plane: only paused one-shot guests are swept, a dry run
//! deletes nothing, and a backend sweeps in the background without making a run wait.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use createos_api::{Client, CreateSandboxRequest, RetryOptions, SandboxStatus};
use createos_fake::{FakeOptions, FakeServer};
use langflow_backend::SurfaceOptions;
use langflow_backend::{Backend, BackendError, BackendOptions, LfxPolicy};
use sandbox_core::reaper::ReaperConfig;
use sandbox_core::retry::Backoff;

const KEY: &str = "lf-orphan-key-3c9e2a71d0";

async fn fake_with(faults: &str) -> FakeServer {
    FakeServer::start(FakeOptions {
        api_key: KEY.to_owned(),
        faults: faults.to_owned(),
        ..FakeOptions::default()
    })
    .await
    .expect("fake control plane starts")
}

fn options(fake: &FakeServer, request_timeout: Duration, orphan_sweep: bool) -> BackendOptions {
    let env: HashMap<String, String> = [
        ("CREATEOS_SANDBOX_API_KEY", KEY.to_owned()),
        ("CREATEOS_SANDBOX_BASE_URL", fake.url()),
        (
            "LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS",
            "true".to_owned(),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let quick = Backoff {
        base: Duration::from_millis(20),
        max: Duration::from_millis(200),
        budget: Duration::from_secs(20),
    };
    BackendOptions {
        surface: SurfaceOptions {
            env: Arc::new(move |k| env.get(k).cloned()),
            request_timeout,
            backoff: quick,
            shutdown_timeout: Duration::from_secs(5),
            reaper: ReaperConfig {
                backoff: quick,
                lookup_patience: Duration::from_millis(300),
            },
            orphan_sweep,
            ..SurfaceOptions::default()
        },
    }
}

fn client(fake: &FakeServer) -> Client {
    Client::builder()
        .api_key(secrecy::SecretString::from(KEY))
        .base_url(fake.url())
        .retry(RetryOptions::none())
        .build()
        .unwrap()
}

/// Creates a guest named `name`, paused or not; returns its id.
async fn guest(c: &Client, name: &str, paused: bool) -> String {
    let sb = c
        .create_sandbox(CreateSandboxRequest::new("s-1vcpu-1gb").name(name))
        .await
        .unwrap();
    if paused {
        sb.pause().await.unwrap();
    }
    sb.id().to_owned()
}

/// The guest's status, or `None` once it is destroyed (or being destroyed) or gone.
async fn status(c: &Client, id: &str) -> Option<SandboxStatus> {
    match c.get_sandbox(id).await {
        Ok(sb) => match sb.status() {
            SandboxStatus::Destroying | SandboxStatus::Destroyed => None,
            other => Some(other),
        },
        Err(_) => None,
    }
}

const ORPHAN: &str = "lf-0rphan0000000000000";
const RUNNING: &str = "lf-runn1ng000000000000";
const REUSED: &str = "lf-c-reused00000000000";
const FOREIGN: &str = "build-cache";

#[tokio::test]
async fn only_paused_one_shot_guests_are_swept_and_dry_run_deletes_nothing() {
    let fake = fake_with("").await;
    let c = client(&fake);
    let orphan = guest(&c, ORPHAN, true).await;
    let running = guest(&c, RUNNING, false).await;
    let reused = guest(&c, REUSED, true).await;
    let foreign = guest(&c, FOREIGN, true).await;
    let backend = Backend::with_options(options(&fake, Duration::from_secs(5), false));

    let dry = backend.sweep_orphans(true).await.unwrap();
    assert!(dry.dry_run);
    let names: Vec<_> = dry.deleted.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(names, [ORPHAN]);
    assert_eq!(dry.deleted[0].id, orphan);
    assert_eq!(status(&c, &orphan).await, Some(SandboxStatus::Paused));
    assert_eq!(fake.stats().requests.get("delete"), None);

    let done = backend.sweep_orphans(false).await.unwrap();
    assert!(!done.dry_run);
    assert_eq!(done.deleted.len(), 1);
    assert_eq!(done.deleted[0].name, ORPHAN);
    assert!(done.failed.is_empty());
    assert_eq!(status(&c, &orphan).await, None);
    assert_eq!(status(&c, &running).await, Some(SandboxStatus::Running));
    assert_eq!(status(&c, &reused).await, Some(SandboxStatus::Paused));
    assert_eq!(status(&c, &foreign).await, Some(SandboxStatus::Paused));

    // Nothing left to sweep.
    assert!(
        backend
            .sweep_orphans(false)
            .await
            .unwrap()
            .deleted
            .is_empty()
    );
    backend.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test]
async fn a_listing_that_fails_is_an_error_naming_the_cause() {
    let fake = fake_with("list=401").await;
    let backend = Backend::with_options(options(&fake, Duration::from_secs(5), false));
    let err = backend.sweep_orphans(false).await.unwrap_err();
    let BackendError::Unavailable(msg) = &err else {
        panic!("{err:?}")
    };
    assert!(msg.contains("listing of guests"), "{msg}");
    assert!(msg.contains("CREATEOS_SANDBOX_API_KEY"), "{msg}");
    assert!(!msg.contains(KEY));
    fake.shutdown().await;
}

async fn wait_gone(c: &Client, id: &str) {
    for _ in 0..600 {
        if status(c, id).await.is_none() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("guest {id} was never deleted");
}

fn policy() -> LfxPolicy {
    LfxPolicy {
        timeout_seconds: 10,
        ..LfxPolicy::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_run_sweeps_orphans_in_the_background() {
    let fake = fake_with("").await;
    let c = client(&fake);
    let orphan = guest(&c, ORPHAN, true).await;
    let backend = Backend::with_options(options(&fake, Duration::from_secs(5), true));
    let out = backend.run("print(1)", None, &policy()).await.unwrap();
    assert_eq!(out.exit_code, 0);
    wait_gone(&c, &orphan).await;
    // Once per process per account: a second run lists nothing more.
    let lists = fake.stats().requests.get("list").copied();
    backend.run("print(2)", None, &policy()).await.unwrap();
    assert_eq!(fake.stats().requests.get("list").copied(), lists);
    backend.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_run_does_not_wait_for_a_stalled_sweep() {
    // The sweep's first listing never answers until the request timeout (10 s here); the
    // retry after it succeeds. A run that waited for the sweep would find the orphan gone.
    let fake = fake_with("list=stall#1").await;
    let c = client(&fake);
    let orphan = guest(&c, ORPHAN, true).await;
    let backend = Backend::with_options(options(&fake, Duration::from_secs(10), true));
    let out = backend.run("print(1)", None, &policy()).await.unwrap();
    assert_eq!(out.exit_code, 0);
    assert_eq!(
        status(&c, &orphan).await,
        Some(SandboxStatus::Paused),
        "the run returned only after the sweep"
    );
    wait_gone(&c, &orphan).await;
    backend.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test]
async fn an_operators_sweep_gives_up_on_a_failing_listing_within_the_retry_setting() {
    // The surface's own budget is 20 s; the operator's setting of 1 s is what ends the sweep.
    let fake = fake_with("list=503").await;
    let mut o = options(&fake, Duration::from_secs(1), false);
    let inner = o.surface.env.clone();
    o.surface.env = Arc::new(move |k| {
        if k == "CREATEOS_CONTROL_PLANE_RETRY_SECONDS" {
            Some("1".to_owned())
        } else {
            inner(k)
        }
    });
    let backend = Backend::with_options(o);
    let t0 = std::time::Instant::now();
    let e = backend.sweep_orphans(true).await.unwrap_err();
    let took = t0.elapsed();
    assert!(matches!(e, BackendError::Execution(_)), "{e:?}");
    assert!(
        fake.stats().requests.get("list").copied().unwrap_or(0) >= 2,
        "{:?}",
        fake.stats()
    );
    // Well before the surface's 20 s (a loose bound, not a measurement).
    assert!(took < Duration::from_secs(10), "took {took:?}: {e}");
    backend.shutdown().await;
    fake.shutdown().await;
}
