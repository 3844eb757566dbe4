//! The deployment-wide admission store against real servers: Redis at `CREATEOS_TEST_REDIS_URL`
//! and PostgreSQL at `CREATEOS_TEST_POSTGRES_URL` (scripts/test starts both; `scripts/stores`
//! starts them by hand). A test whose server is not given says so and passes.
//!
//! The store failing is a TCP relay in front of the real server that the test cuts (refused
//! connections) or stalls (accepted, never answered), so the shared server is never stopped.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sandbox_core::ErrorKind;
use sandbox_core::admission::{Admission, Caps};
use sandbox_core::lease::{
    Ask, Deployment, ENV_ADMISSION_LEASE, ENV_ADMISSION_NAMESPACE, ENV_ADMISSION_STORE,
    ENV_ADMISSION_STORE_ON_FAILURE, LeaseStore, RELEASE_LINGER, RELEASE_LINGER_QUIET, StoreConfig,
    WAIT_TICKET,
};
use sandbox_store::open_store;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

const REDIS: &str = "CREATEOS_TEST_REDIS_URL";
const POSTGRES: &str = "CREATEOS_TEST_POSTGRES_URL";

fn server(var: &str) -> Option<String> {
    let url = std::env::var(var).ok().filter(|v| !v.is_empty());
    if url.is_none() {
        eprintln!(
            "{var} is unset: this test needs that server (scripts/stores starts one); skipped"
        );
    }
    url
}

fn servers() -> Vec<(&'static str, String)> {
    [("redis", REDIS), ("postgres", POSTGRES)]
        .into_iter()
        .filter_map(|(name, var)| server(var).map(|u| (name, u)))
        .collect()
}

/// A single try's question (the run does not join the line).
fn ask<'a>(
    key: &'a str,
    cap: Option<usize>,
    id: &'a str,
    holder: &'a str,
    ttl: Duration,
) -> Ask<'a> {
    Ask {
        key,
        cap,
        id,
        holder,
        ttl,
        queue: false,
    }
}

/// A config on `url` with a namespace of its own (tests share the servers).
fn config(url: &str, extra: &[(&str, &str)]) -> &'static StoreConfig {
    let ns = format!("t{}-{:08x}", std::process::id(), rand::random::<u32>());
    let mut pairs: Vec<(String, String)> = vec![
        (ENV_ADMISSION_STORE.into(), url.into()),
        (ENV_ADMISSION_NAMESPACE.into(), ns),
    ];
    pairs.extend(extra.iter().map(|(k, v)| ((*k).into(), (*v).into())));
    StoreConfig::from_lookup(&move |k| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
        .unwrap()
        .unwrap()
}

fn caps(max: usize, wait_ms: u64, store: &'static StoreConfig) -> Caps {
    Caps {
        max_live: Some(max),
        max_live_per_flow: Some(max),
        wait: Duration::from_millis(wait_ms),
        store: Some(store),
    }
}

/// "Processes": admissions of their own on one store config.
fn workers(n: usize, store: &'static StoreConfig) -> Vec<Admission> {
    (0..n)
        .map(|_| {
            let a = Admission::new();
            a.set_deployment(Deployment::new(store).unwrap());
            a
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cap_holds_across_workers_and_every_slot_comes_back() {
    sandbox_store::install();
    for (name, url) in servers() {
        let store = config(&url, &[]);
        let ws = workers(3, store);
        let granted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let peak = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for i in 0..60 {
            let a = ws[i % 3].clone();
            let (granted, peak) = (Arc::clone(&granted), Arc::clone(&peak));
            tasks.push(tokio::spawn(async move {
                let until = Instant::now() + Duration::from_secs(20);
                let slot = a.guest_slot(caps(4, 20_000, store), until).await?;
                let now = granted.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
                granted.fetch_sub(1, Ordering::SeqCst);
                drop(slot);
                Ok::<_, sandbox_core::SandboxError>(())
            }));
        }
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        assert!(peak.load(Ordering::SeqCst) <= 4, "{name}: peak {peak:?}");
        // Releases are sent in the background: give them a moment.
        let dep = ws[0].current_deployment().unwrap();
        let mut left = u64::MAX;
        for _ in 0..50 {
            left = dep.count(&store.guests_key()).await.unwrap();
            if left == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(left, 0, "{name}: every slot came back");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_acquires_never_overshoot_and_never_count_twice() {
    sandbox_store::install();
    for (name, url) in servers() {
        let store = config(&url, &[]);
        // Four connections (four "processes"), ten acquires each, all at once.
        let raws: Vec<Arc<dyn LeaseStore>> = (0..4).map(|_| open_store(store).unwrap()).collect();
        let raw = Arc::clone(&raws[0]);
        let key = store.guests_key();
        let results = futures::future::join_all((0..40).map(|i| {
            let (raw, key) = (Arc::clone(&raws[i % 4]), key.clone());
            async move {
                raw.try_acquire(
                    ask(
                        &key,
                        Some(8),
                        &format!("id-{i}"),
                        "h/1",
                        Duration::from_secs(30),
                    ),
                    &[],
                )
                .await
                .unwrap()
            }
        }))
        .await;
        let granted = results.iter().filter(|r| r.granted).count();
        assert_eq!(granted, 8, "{name}");
        assert!(results.iter().all(|r| r.live <= 8), "{name}: {results:?}");
        // The same id again is the same lease (renewed, not counted twice).
        let winner = (0..40)
            .find(|i| results[*i].granted)
            .map(|i| format!("id-{i}"))
            .unwrap();
        let again = raw
            .try_acquire(
                ask(&key, Some(8), &winner, "h/1", Duration::from_secs(30)),
                &[],
            )
            .await
            .unwrap();
        assert!(again.granted && again.live == 8, "{name}: {again:?}");
        assert_eq!(raw.count(&key).await.unwrap(), 8, "{name}");
        let all: Vec<(String, String)> =
            (0..40).map(|i| (key.clone(), format!("id-{i}"))).collect();
        raw.release(&all).await.unwrap();
        assert_eq!(raw.count(&key).await.unwrap(), 0, "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unrenewed_lease_expires_and_a_renewed_one_lives_on() {
    sandbox_store::install();
    for (name, url) in servers() {
        let store = config(&url, &[]);
        let raw = open_store(store).unwrap();
        let key = store.guests_key();
        let ttl = Duration::from_millis(400);
        // A "killed worker": leases nobody renews.
        assert!(
            raw.try_acquire(ask(&key, Some(2), "dead-1", "h/9", ttl), &[])
                .await
                .unwrap()
                .granted
        );
        assert!(
            raw.try_acquire(ask(&key, Some(2), "dead-2", "h/9", ttl), &[])
                .await
                .unwrap()
                .granted
        );
        assert!(
            !raw.try_acquire(ask(&key, Some(2), "live-1", "h/1", ttl), &[])
                .await
                .unwrap()
                .granted
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        let got = raw
            .try_acquire(ask(&key, Some(2), "live-1", "h/1", ttl), &[])
            .await
            .unwrap();
        assert!(
            got.granted && got.live == 1,
            "{name}: the dead worker's places came back: {got:?}"
        );
        // Renewed within its time, a lease outlives it; one expired is reported lost.
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let lost = raw
                .renew(&[(key.clone(), "live-1".into())], ttl)
                .await
                .unwrap();
            assert!(lost.is_empty(), "{name}: {lost:?}");
        }
        assert_eq!(raw.count(&key).await.unwrap(), 1, "{name}");
        tokio::time::sleep(Duration::from_millis(500)).await;
        let lost = raw
            .renew(&[(key.clone(), "live-1".into())], ttl)
            .await
            .unwrap();
        assert_eq!(lost, vec!["live-1".to_owned()], "{name}");
        assert_eq!(raw.count(&key).await.unwrap(), 0, "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_given_back_lease_leaves_with_the_next_acquire_or_on_its_own() {
    sandbox_store::install();
    for (name, url) in servers() {
        let store = config(&url, &[]);
        let raw = open_store(store).unwrap();
        let key = store.guests_key();
        let ttl = Duration::from_secs(30);
        // At the cap, an acquire that carries one of the two leases back removes it first.
        for id in ["a", "b"] {
            assert!(
                raw.try_acquire(ask(&key, Some(2), id, "h/1", ttl), &[])
                    .await
                    .unwrap()
                    .granted
            );
        }
        let got = raw
            .try_acquire(
                ask(&key, Some(2), "c", "h/1", ttl),
                &[(key.clone(), "a".into())],
            )
            .await
            .unwrap();
        assert!(got.granted && got.live == 2, "{name}: {got:?}");
        // Gone ones are no error, and a refused acquire still gives back what it carries.
        let got = raw
            .try_acquire(
                ask(&key, Some(1), "d", "h/1", ttl),
                &[(key.clone(), "a".into())],
            )
            .await
            .unwrap();
        assert!(!got.granted && got.live == 2, "{name}: {got:?}");
        let back = [(key.clone(), "b".into()), (key.clone(), "c".into())];
        let got = raw
            .try_acquire(ask(&key, Some(1), "d", "h/1", ttl), &back)
            .await
            .unwrap();
        assert!(got.granted && got.live == 1, "{name}: {got:?}");
        raw.release(&[(key.clone(), "d".into())]).await.unwrap();
        assert_eq!(raw.count(&key).await.unwrap(), 0, "{name}");

        // (The refusal of "d" above marked the key as waited for: let the mark lapse.)
        tokio::time::sleep(WAIT_TICKET + Duration::from_millis(50)).await;
        // Through a deployment, back-to-back runs each get the place and the count never
        // shows two. While nobody waits, with room (cap 2) or at the cap (1), each run takes
        // the last one's lease over with no store call.
        let dep = Deployment::new(store).unwrap();
        let until = Instant::now() + Duration::from_secs(5);
        for cap in [2, 1] {
            let mut ids = std::collections::HashSet::new();
            for _ in 0..20 {
                let (lease, live) = dep.try_lease(&key, Some(cap), until).await.unwrap();
                let lease = lease.expect("the last run's lease was not given back first");
                assert_eq!(live, 1, "{name}");
                assert_eq!(dep.count(&key).await.unwrap(), 1, "{name}");
                ids.insert(lease.id().to_owned());
            }
            assert_eq!(ids.len(), 1, "{name}, cap {cap}: {ids:?}");
        }
        // Runs wait in one line for the deployment, first come first served: a run refused at
        // the cap ("w", who will ask again) goes ahead of any run that comes after it.
        tokio::time::sleep(WAIT_TICKET + Duration::from_millis(100)).await;
        assert_eq!(
            dep.count(&key).await.unwrap(),
            0,
            "{name}: the lingering lease left"
        );
        let queued = |id| Ask {
            queue: true,
            ..ask(&key, Some(1), id, "h/2", ttl)
        };
        assert!(raw.try_acquire(queued("w0"), &[]).await.unwrap().granted);
        let got = raw.try_acquire(queued("w"), &[]).await.unwrap();
        assert!(!got.granted && got.waiting == 1, "{name}: {got:?}");
        raw.release(&[(key.clone(), "w0".into())]).await.unwrap();
        let (late, live) = dep.try_lease(&key, Some(1), until).await.unwrap();
        assert!(
            late.is_none() && live == 0,
            "{name}: the place is w's, who came first"
        );
        let got = raw.try_acquire(queued("w"), &[]).await.unwrap();
        assert!(got.granted && got.waiting == 0, "{name}: {got:?}");
        raw.release(&[(key.clone(), "w".into())]).await.unwrap();
        // While a run waits, a given-back lease is not taken over (the acquire that learned of
        // the wait carries it away instead) and is sent within RELEASE_LINGER, not the quiet
        // one. Cap 2: "v" waits, two places come free, so one run is granted beside it.
        for id in ["a", "b"] {
            assert!(
                raw.try_acquire(ask(&key, Some(2), id, "h/2", ttl), &[])
                    .await
                    .unwrap()
                    .granted
            );
        }
        let got = raw
            .try_acquire(
                Ask {
                    queue: true,
                    ..ask(&key, Some(2), "v", "h/2", ttl)
                },
                &[],
            )
            .await
            .unwrap();
        assert!(!got.granted && got.waiting == 1, "{name}: {got:?}");
        raw.release(&[(key.clone(), "a".into()), (key.clone(), "b".into())])
            .await
            .unwrap();
        let (first, _) = dep.try_lease(&key, Some(2), until).await.unwrap();
        let first = first
            .expect("one place free beside the waiting run")
            .id()
            .to_owned();
        let (second, live) = dep.try_lease(&key, Some(2), until).await.unwrap();
        let second = second.expect("the acquire carried the last lease away first");
        assert_ne!(
            second.id(),
            first,
            "{name}: not taken over while a run waits"
        );
        assert_eq!(live, 1, "{name}");
        drop(second);
        tokio::time::sleep(RELEASE_LINGER + Duration::from_millis(100)).await;
        assert_eq!(
            dep.count(&key).await.unwrap(),
            0,
            "{name}: sent for the waiting run"
        );
        raw.leave_line(&key, "v").await.unwrap();

        // An acquire under another key carries a given-back lease away in its own step.
        let (lease, _) = dep.try_lease(&key, Some(1), until).await.unwrap();
        drop(lease);
        let other = format!("{key}-other");
        let (held, _) = dep.try_lease(&other, Some(1), until).await.unwrap();
        assert!(held.is_some(), "{name}");
        assert_eq!(
            dep.count(&key).await.unwrap(),
            0,
            "{name}: carried by the acquire"
        );
        drop(held);
        // The last one, with no acquire after it, leaves on its own after the linger.
        let mut left = u64::MAX;
        for _ in 0..50 {
            left = dep.count(&other).await.unwrap();
            if left == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(left, 0, "{name}: the last lease was never sent back");

        // Far from the cap a given-back lease waits longer for a next acquire; a shutdown's
        // flush sends it at once, and without one it still leaves after the longer linger.
        let (lease, _) = dep.try_lease(&key, Some(100), until).await.unwrap();
        drop(lease);
        assert_eq!(dep.count(&key).await.unwrap(), 1, "{name}: it lingers");
        dep.flush().await;
        assert_eq!(dep.count(&key).await.unwrap(), 0, "{name}: flushed");
        let (lease, _) = dep.try_lease(&key, Some(100), until).await.unwrap();
        drop(lease);
        tokio::time::sleep(RELEASE_LINGER_QUIET + Duration::from_millis(200)).await;
        assert_eq!(dep.count(&key).await.unwrap(), 0, "{name}: sent on its own");
        assert_eq!(dep.stats().store_errors, 0, "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_handing_its_place_on_run_after_run_lets_a_waiting_run_in_soon() {
    sandbox_store::install();
    // One worker runs back to back at a cap of 1, each run taking the last one's place over
    // while nobody waits. A second worker's run comes and waits in line: the first learns of
    // it within WAIT_TICKET of its last store answer, its next acquire is refused (the waiting
    // run is ahead), and the waiting run gets the place at its next poll (the bound:
    // WAIT_TICKET and a poll step of at most 375 ms). Never: waiting until the first worker
    // stops.
    for (name, url) in servers() {
        let store = config(&url, &[]);
        let key = store.guests_key();
        let busy = Deployment::new(store).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (s, r, b, k) = (
            Arc::clone(&stop),
            Arc::clone(&runs),
            busy.clone(),
            key.clone(),
        );
        let looping = tokio::spawn(async move {
            while !s.load(Ordering::SeqCst) {
                let until = Instant::now() + Duration::from_secs(2);
                if let Ok((Some(lease), _)) = b.try_lease(&k, Some(1), until).await {
                    r.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    drop(lease);
                } else {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        });
        // The loop holds the place and hands it on.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(runs.load(Ordering::SeqCst) > 10, "{name}: the loop runs");
        let other = Deployment::new(store).unwrap();
        let t0 = Instant::now();
        let got = other
            .lease(&key, Some(1), t0 + Duration::from_secs(5), || {})
            .await;
        let waited = t0.elapsed();
        stop.store(true, Ordering::SeqCst);
        looping.await.unwrap();
        let lease = got.unwrap_or_else(|e| panic!("{name}: never let in: {e:?}"));
        let bound = WAIT_TICKET + Duration::from_millis(375 + 400);
        assert!(
            waited < bound,
            "{name}: waited {waited:?} (bound {bound:?})"
        );
        eprintln!("{name}: the waiting run got the place after {waited:?}");
        drop(lease);
        other.flush().await;
        busy.flush().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_renewer_keeps_a_long_run_counted() {
    sandbox_store::install();
    for (name, url) in servers() {
        let store = config(&url, &[(ENV_ADMISSION_LEASE, "3")]);
        let ws = workers(1, store);
        let slot = ws[0]
            .guest_slot(caps(1, 0, store), Instant::now() + Duration::from_secs(5))
            .await
            .unwrap();
        assert!(slot.is_deployed());
        // Past two lease times: only renewals keep it.
        tokio::time::sleep(Duration::from_millis(6_500)).await;
        let dep = ws[0].current_deployment().unwrap();
        assert_eq!(dep.count(&store.guests_key()).await.unwrap(), 1, "{name}");
        assert_eq!(dep.stats().lost, 0, "{name}");
        drop(slot);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_at_the_deployment_cap_waits_then_is_refused_naming_cap_store_and_setting() {
    sandbox_store::install();
    for (name, url) in servers() {
        let store = config(&url, &[]);
        let ws = workers(2, store);
        let held = ws[0]
            .guest_slot(caps(1, 0, store), Instant::now() + Duration::from_secs(2))
            .await
            .unwrap();
        let t0 = Instant::now();
        let e = ws[1]
            .guest_slot(
                caps(1, 400, store),
                Instant::now() + Duration::from_millis(400),
            )
            .await
            .unwrap_err();
        let took = t0.elapsed();
        assert_eq!(e.kind(), ErrorKind::AtCapacity, "{name}");
        let text = e.to_string();
        for want in [
            "whole deployment",
            "CREATEOS_MAX_LIVE_GUESTS=1",
            "1 guest(s) are live",
            "admission store",
            "nothing ran",
        ] {
            assert!(text.contains(want), "{name}: {want}: {text}");
        }
        assert!(
            took >= Duration::from_millis(350) && took < Duration::from_millis(1500),
            "{name}: {took:?}"
        );
        // A place freed by the other worker is taken by a waiting one.
        let ws1 = ws[1].clone();
        let waiter = tokio::spawn(async move {
            ws1.guest_slot(
                caps(1, 5_000, store),
                Instant::now() + Duration::from_secs(5),
            )
            .await
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(held);
        let got = waiter
            .await
            .unwrap()
            .expect("served once the other worker let go");
        assert!(got.is_deployed());
        // The per-flow cap is deployment-wide too.
        let f = ws[0]
            .flow_slot(
                "flow-x",
                caps(1, 0, store),
                Instant::now() + Duration::from_secs(2),
            )
            .await
            .unwrap();
        let e = ws[1]
            .flow_slot(
                "flow-x",
                caps(1, 100, store),
                Instant::now() + Duration::from_millis(100),
            )
            .await
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("CREATEOS_MAX_LIVE_GUESTS_PER_FLOW=1"),
            "{name}: {e}"
        );
        drop((f, got));
    }
}

/// A TCP relay to `upstream` that the test can cut (connections refused: nothing listens) or
/// stall (accepted, never answered).
struct Relay {
    port: u16,
    stall: Arc<AtomicBool>,
    cut: Arc<AtomicBool>,
}

impl Relay {
    async fn start(upstream: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let stall = Arc::new(AtomicBool::new(false));
        let cut = Arc::new(AtomicBool::new(false));
        let (s, c) = (Arc::clone(&stall), Arc::clone(&cut));
        tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    return;
                };
                let (s, c, upstream) = (Arc::clone(&s), Arc::clone(&c), upstream.clone());
                tokio::spawn(async move {
                    if c.load(Ordering::SeqCst) {
                        let _ = inbound.shutdown().await;
                        return;
                    }
                    let Ok(mut out) = TcpStream::connect(&upstream).await else {
                        return;
                    };
                    let (mut ri, mut wi) = inbound.split();
                    let (mut ro, mut wo) = out.split();
                    // Copy in small steps so a cut or stall applies to an open connection too.
                    let up = relay_half(&mut ri, &mut wo, &s, &c);
                    let down = relay_half(&mut ro, &mut wi, &s, &c);
                    let _ = tokio::join!(up, down);
                });
            }
        });
        Self { port, stall, cut }
    }
}

async fn relay_half(
    from: &mut (impl tokio::io::AsyncRead + Unpin),
    to: &mut (impl tokio::io::AsyncWrite + Unpin),
    stall: &AtomicBool,
    cut: &AtomicBool,
) {
    use tokio::io::AsyncReadExt;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match tokio::time::timeout(Duration::from_millis(50), from.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => return,
            Ok(Ok(n)) => n,
            Err(_) => {
                if cut.load(Ordering::SeqCst) {
                    return;
                }
                continue;
            }
        };
        while stall.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if cut.load(Ordering::SeqCst) || to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

fn via_relay(url: &str, port: u16) -> String {
    let u = url::Url::parse(url).unwrap();
    let mut v = u.clone();
    v.set_port(Some(port)).unwrap();
    let _ = v.set_host(Some("127.0.0.1"));
    v.to_string()
}

fn upstream(url: &str) -> String {
    let u = url::Url::parse(url).unwrap();
    format!(
        "{}:{}",
        u.host_str().unwrap(),
        u.port()
            .unwrap_or(if u.scheme() == "redis" { 6379 } else { 5432 })
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::many_single_char_names)]
async fn a_failing_store_refuses_by_default_and_falls_back_under_local() {
    sandbox_store::install();
    for (name, url) in servers() {
        let relay = Relay::start(upstream(&url)).await;
        let through = via_relay(&url, relay.port);
        let refuse = config(&through, &[]);
        let local = config(&through, &[(ENV_ADMISSION_STORE_ON_FAILURE, "local")]);
        let a = Admission::new();
        // Up: admitted, the lease held.
        let s = a
            .guest_slot(
                caps(4, 1000, refuse),
                Instant::now() + Duration::from_secs(2),
            )
            .await
            .unwrap();
        assert!(s.is_deployed(), "{name}");
        drop(s);
        // Down (refused connections), past the linger of the lease given back above (until
        // then the next run would take its place over, with no store call).
        relay.cut.store(true, Ordering::SeqCst);
        tokio::time::sleep(RELEASE_LINGER_QUIET + Duration::from_millis(120)).await;
        let t0 = Instant::now();
        let e = a
            .guest_slot(
                caps(4, 1000, refuse),
                Instant::now() + Duration::from_secs(1),
            )
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Refused, "{name}: {e}");
        for want in [
            ENV_ADMISSION_STORE_ON_FAILURE,
            "admission store",
            "nothing ran",
            "=local",
        ] {
            assert!(e.to_string().contains(want), "{name}: {want}: {e}");
        }
        assert!(
            t0.elapsed() < Duration::from_millis(1500),
            "{name}: {:?}",
            t0.elapsed()
        );
        assert_eq!(a.stats().live, 0, "{name}: the local place was given back");
        let b = Admission::new();
        let s = b
            .guest_slot(
                caps(4, 1000, local),
                Instant::now() + Duration::from_secs(1),
            )
            .await
            .expect("local: admitted under the process's own cap");
        assert!(!s.is_deployed());
        assert_eq!(b.stats().deployment.unwrap().fallbacks, 1, "{name}");
        drop(s);
        // Slow (accepted, never answered): bounded by the run's own wait.
        relay.cut.store(false, Ordering::SeqCst);
        relay.stall.store(true, Ordering::SeqCst);
        let c = Admission::new();
        let t0 = Instant::now();
        let e = c
            .guest_slot(
                caps(4, 600, refuse),
                Instant::now() + Duration::from_millis(600),
            )
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Refused, "{name}: {e}");
        assert!(
            t0.elapsed() < Duration::from_millis(1200),
            "{name}: a slow store held the run {:?}",
            t0.elapsed()
        );
        relay.stall.store(false, Ordering::SeqCst);
    }
}

#[tokio::test]
async fn without_servers_the_reason_is_said() {
    sandbox_store::install();
    // Always runs: the skip reasons above are printed by `server`, and the settings alone work.
    let c = StoreConfig::from_lookup(&|k| {
        (k == ENV_ADMISSION_STORE).then(|| "redis://127.0.0.1:1/0".to_owned())
    })
    .unwrap()
    .unwrap();
    let a = Admission::new();
    let e = a
        .guest_slot(caps(2, 300, c), Instant::now() + Duration::from_millis(300))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Refused);
    assert!(e.to_string().contains("redis://127.0.0.1:1/0"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_worker_at_a_time_holds_a_kept_guests_create_lock() {
    sandbox_store::install();
    for (name, url) in servers() {
        let store = config(&url, &[]);
        let ws = workers(2, store);
        let c = caps(4, 5_000, store);
        let first = ws[0]
            .create_lock(c, "lf-c-abc", Instant::now() + Duration::from_secs(2))
            .await
            .unwrap()
            .expect("the first worker creates");
        let other = ws[1].clone();
        let t0 = Instant::now();
        let second = tokio::spawn(async move {
            other
                .create_lock(c, "lf-c-abc", Instant::now() + Duration::from_secs(5))
                .await
        });
        // Another guest's lock is its own.
        assert!(
            ws[1]
                .create_lock(c, "lf-c-other", Instant::now() + Duration::from_secs(1))
                .await
                .unwrap()
                .is_some(),
            "{name}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!second.is_finished(), "{name}: the second worker waits");
        drop(first);
        let got = second.await.unwrap().unwrap();
        assert!(
            got.is_some(),
            "{name}: then takes the lock (and finds the guest by name)"
        );
        assert!(t0.elapsed() >= Duration::from_millis(300), "{name}");
        // A lock held past the wait: the run goes on without it (the name is the backstop).
        let e = ws[0]
            .create_lock(c, "lf-c-abc", Instant::now() + Duration::from_millis(100))
            .await
            .unwrap();
        assert!(e.is_none(), "{name}");
    }
}

/// What a hostile store answers: terminal escapes, a bidi override, line separators and 5 MiB.
fn hostile_text() -> String {
    format!(
        "\x1b[2J\x1b]0;owned\x07\x1b[31mCRITICAL fake\u{202e}desrever\u{2066}\u{2028}\u{2029}\u{85}\u{7f}\x08{}",
        "A".repeat(5 << 20)
    )
}

/// The refusal a run gets from a hostile store: bounded, one line, nothing a terminal acts on.
fn assert_contained(e: &sandbox_core::SandboxError) {
    eprintln!("refused as: {e}");
    let text = e.to_string();
    assert_eq!(
        e.kind(),
        ErrorKind::Refused,
        "{}",
        &text[..text.len().min(300)]
    );
    assert!(
        text.chars().count() < 4096,
        "{} characters: {}",
        text.chars().count(),
        &text[..300]
    );
    let bad: Vec<char> = text
        .chars()
        .filter(|c| sandbox_core::error::is_unsafe_outside_char(*c))
        .collect();
    assert!(bad.is_empty(), "{bad:?} in {text}");
    for want in [
        ENV_ADMISSION_STORE_ON_FAILURE,
        "nothing ran",
        "\\x1b[2J",
        "\\u{202e}",
    ] {
        assert!(text.contains(want), "{want}: {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_redis_reply_is_cut_and_escaped_in_the_refusal() {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
    sandbox_store::install();
    // Answers every command (RESP arrays of bulk strings) with one long, hostile error line.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let reply = Arc::new(format!("-ERR {}\r\n", hostile_text()).into_bytes());
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let reply = Arc::clone(&reply);
            tokio::spawn(async move {
                let (r, mut w) = s.into_split();
                let mut r = BufReader::new(r);
                let mut line = String::new();
                loop {
                    line.clear();
                    if r.read_line(&mut line).await.unwrap_or(0) == 0 {
                        return;
                    }
                    let n: usize = line.trim_start_matches('*').trim().parse().unwrap_or(0);
                    for _ in 0..n {
                        line.clear();
                        r.read_line(&mut line).await.unwrap();
                        let len: usize = line.trim_start_matches('$').trim().parse().unwrap();
                        let mut arg = vec![0u8; len + 2];
                        r.read_exact(&mut arg).await.unwrap();
                    }
                    if w.write_all(&reply).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    let c = StoreConfig::from_lookup(&|k| {
        (k == ENV_ADMISSION_STORE).then(|| format!("redis://127.0.0.1:{port}/0"))
    })
    .unwrap()
    .unwrap();
    let e = Admission::new()
        .guest_slot(caps(2, 3000, c), Instant::now() + Duration::from_secs(3))
        .await
        .unwrap_err();
    assert_contained(&e);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_postgres_error_is_cut_and_escaped_in_the_refusal() {
    use tokio::io::AsyncReadExt;
    sandbox_store::install();
    // Answers the startup with an ErrorResponse whose message and detail are hostile, with
    // newlines, which a C string may hold.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let mut len = [0u8; 4];
            if s.read_exact(&mut len).await.is_err() {
                continue;
            }
            let mut startup = vec![0u8; u32::from_be_bytes(len) as usize - 4];
            let _ = s.read_exact(&mut startup).await;
            let hostile = format!("line one\nFATAL: forged\r\n{}", hostile_text());
            let mut fields = Vec::new();
            for (code, value) in [
                (b'S', "FATAL"),
                (b'V', "FATAL"),
                (b'C', "28000"),
                (b'M', hostile.as_str()),
                (b'D', hostile.as_str()),
            ] {
                fields.push(code);
                fields.extend_from_slice(value.as_bytes());
                fields.push(0);
            }
            fields.push(0);
            let mut msg = vec![b'E'];
            msg.extend_from_slice(&u32::try_from(fields.len() + 4).unwrap().to_be_bytes());
            msg.extend_from_slice(&fields);
            let _ = s.write_all(&msg).await;
        }
    });
    let c = StoreConfig::from_lookup(&|k| {
        (k == ENV_ADMISSION_STORE)
            .then(|| format!("postgres://lf@127.0.0.1:{port}/lf?sslmode=disable"))
    })
    .unwrap()
    .unwrap();
    let e = Admission::new()
        .guest_slot(caps(2, 3000, c), Instant::now() + Duration::from_secs(3))
        .await
        .unwrap_err();
    assert_contained(&e);
    assert!(e.to_string().contains("line one\\nFATAL"), "{e}");
}

/// The wait a refusal reports ("The run waited 1.2s for a slot").
fn waited(text: &str) -> Duration {
    let at = text.find("waited ").expect(text) + "waited ".len();
    let secs: f64 = text[at..]
        .split('s')
        .next()
        .and_then(|n| n.parse().ok())
        .expect(text);
    Duration::from_secs_f64(secs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_waiting_on_a_full_deployment_is_told_so_with_its_whole_wait() {
    sandbox_store::install();
    for (name, url) in servers() {
        let store = config(&url, &[]);
        let ws = workers(2, store);
        // Another host holds every place.
        let held: Vec<_> =
            futures::future::join_all((0..2).map(|_| {
                ws[0].guest_slot(caps(2, 0, store), Instant::now() + Duration::from_secs(2))
            }))
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
        // A worker that never had a guest: six runs at once, two of them past its own line
        // and waiting for the deployment's, four in its own line behind them.
        let t0 = Instant::now();
        let refusals = futures::future::join_all(
            (0..6).map(|_| ws[1].guest_slot(caps(2, 800, store), t0 + Duration::from_millis(800))),
        )
        .await;
        for r in refusals {
            let e = r.unwrap_err();
            let text = e.to_string();
            assert_eq!(e.kind(), ErrorKind::AtCapacity, "{name}: {text}");
            for want in [
                "2 guest(s) are live in the whole deployment (the store's last count)",
                "the deployment-wide cap CREATEOS_MAX_LIVE_GUESTS=2",
                &format!("held in the admission store {}", store.shown),
                "nothing ran",
            ] {
                assert!(text.contains(want), "{name}: {want}: {text}");
            }
            assert!(!text.contains("in this process"), "{name}: {text}");
            let w = waited(&text);
            assert!(
                w >= Duration::from_millis(700) && w <= t0.elapsed() + Duration::from_millis(100),
                "{name}: reported {w:?}: {text}"
            );
        }
        // A run refused by its own process's cap keeps that wording.
        let e = ws[0]
            .guest_slot(
                caps(2, 300, store),
                Instant::now() + Duration::from_millis(300),
            )
            .await
            .unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains(
                "2 guest(s) are live in this process, the cap CREATEOS_MAX_LIVE_GUESTS=2"
            ),
            "{name}: {text}"
        );
        drop(held);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_got_its_own_place_late_reports_its_whole_wait() {
    sandbox_store::install();
    // Once, a run that had waited 1 s in its worker's line said it "waited 0.0s": the wait was
    // counted from when it reached the deployment's line, not from when it began.
    for (name, url) in servers() {
        let store = config(&url, &[]);
        let ws = workers(2, store);
        let held = ws[0]
            .guest_slot(caps(1, 0, store), Instant::now() + Duration::from_secs(2))
            .await
            .unwrap();
        let t0 = Instant::now();
        let first = {
            let w = ws[1].clone();
            tokio::spawn(async move {
                w.guest_slot(caps(1, 600, store), t0 + Duration::from_millis(600))
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        // Behind the first in its worker's line; its place there comes as the first gives up,
        // just before its own wait ends.
        let e = ws[1]
            .guest_slot(caps(1, 620, store), t0 + Duration::from_millis(620))
            .await
            .unwrap_err();
        let text = e.to_string();
        assert!(text.contains("in the whole deployment"), "{name}: {text}");
        let w = waited(&text);
        assert!(
            w >= Duration::from_millis(500),
            "{name}: reported {w:?}: {text}"
        );
        first.await.unwrap().unwrap_err();
        drop(held);
    }
}
