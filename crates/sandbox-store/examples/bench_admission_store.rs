//! What a deployment-wide admission store adds to a run: the latency of taking a slot (the
//! run waits for it) and the CPU of taking and giving it back, against the same admission
//! without a store, on Redis and PostgreSQL on loopback.
//!
//! ```text
//! eval "$(bash scripts/stores start)"
//! cargo run --release -p sandbox-store --example bench_admission_store -- [OPS] [GAP_MS] [CAP]
//! ```
//!
//! Reads `CREATEOS_TEST_REDIS_URL` and `CREATEOS_TEST_POSTGRES_URL` (each optional). For each
//! store: `OPS` (default 2000) sequential slots, each taken through `Admission::guest_slot`
//! (the run's path: the local line, then one store round trip) and given back (the release
//! is sent in the background, as a run's is); then the same with 16 runs at once. CPU is this
//! process's (`/proc/self/stat`) and the store server's (every process of its name), per slot.
//! `GAP_MS` (default 0) spaces the sequential slots as runs of that length would: each given-back
//! lease then leaves on its own (nothing follows within the release linger) and the runtime
//! idles in between, as in a worker serving one run at a time. `CAP` (default 10,000: room) is
//! the sequential slots' cap: 1 keeps the deployment at its cap, each slot handing its place
//! to the next while nobody waits (the 16 tasks keep 10,000).

use std::time::{Duration, Instant};

use sandbox_core::admission::{Admission, Caps};
use sandbox_core::lease::{Deployment, ENV_ADMISSION_NAMESPACE, ENV_ADMISSION_STORE, StoreConfig};

fn ticks_of(stat: &str) -> u64 {
    // Fields after the parenthesised name: state is field 3; utime and stime are 14 and 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
}

/// CPU seconds of this process.
fn own_cpu() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    #[allow(clippy::cast_precision_loss)]
    let t = ticks_of(&stat) as f64;
    t / 100.0
}

/// CPU seconds of every process whose name is `comm`.
fn cpu_of(comm: &str) -> f64 {
    let mut ticks = 0;
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let p = e.path();
            if std::fs::read_to_string(p.join("comm")).is_ok_and(|c| c.trim() == comm) {
                ticks += ticks_of(&std::fs::read_to_string(p.join("stat")).unwrap_or_default());
            }
        }
    }
    #[allow(clippy::cast_precision_loss)]
    let t = ticks as f64;
    t / 100.0
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e6
}

/// The cap of the warm-ups and the 16 tasks: room.
const ROOM: usize = 10_000;

fn caps(store: Option<&'static StoreConfig>, cap: usize) -> Caps {
    Caps {
        max_live: Some(cap),
        max_live_per_flow: None,
        wait: Duration::from_secs(10),
        store,
    }
}

/// `ops` slots one after another: the latencies, and CPU seconds (own, server).
async fn sequential(
    adm: &Admission,
    c: Caps,
    ops: usize,
    server: &str,
    gap: Duration,
) -> (Vec<Duration>, f64, f64) {
    let mut lat = Vec::with_capacity(ops);
    let (own0, srv0) = (own_cpu(), cpu_of(server));
    for _ in 0..ops {
        let t0 = Instant::now();
        let slot = adm
            .guest_slot(c, tokio::time::Instant::now() + Duration::from_secs(10))
            .await
            .expect("a slot");
        lat.push(t0.elapsed());
        drop(slot);
        if !gap.is_zero() {
            tokio::time::sleep(gap).await;
        }
    }
    // Let the background releases land before the CPU is read.
    tokio::time::sleep(Duration::from_millis(300)).await;
    lat.sort();
    (lat, own_cpu() - own0, cpu_of(server) - srv0)
}

async fn concurrent(adm: &Admission, c: Caps, ops: usize) -> f64 {
    let t0 = Instant::now();
    let per = ops / 16;
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let adm = adm.clone();
            tokio::spawn(async move {
                for _ in 0..per {
                    let slot = adm
                        .guest_slot(c, tokio::time::Instant::now() + Duration::from_secs(10))
                        .await
                        .expect("a slot");
                    drop(slot);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    #[allow(clippy::cast_precision_loss)]
    let rate = (per * 16) as f64 / t0.elapsed().as_secs_f64();
    rate
}

fn report(name: &str, lat: &[Duration], own: f64, srv: f64, ops: usize, rate: f64) {
    #[allow(clippy::cast_precision_loss)]
    let n = ops as f64;
    println!(
        "{name:<10} acquire p50 {:>7.1} us  p99 {:>7.1} us  | CPU per slot: process {:>6.1} us, \
         server {:>6.1} us | 16 at once: {rate:>7.0} slots/s",
        pct(lat, 0.5),
        pct(lat, 0.99),
        own / n * 1e6,
        srv / n * 1e6,
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    sandbox_store::install();
    let ops: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2000);
    let gap = Duration::from_millis(
        std::env::args()
            .nth(2)
            .and_then(|a| a.parse().ok())
            .unwrap_or(0),
    );
    let cap: usize = std::env::args()
        .nth(3)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000);
    println!(
        "{ops} sequential slots per store (taken and given back, {} ms apart, cap {cap}), then \
         {ops} by 16 tasks",
        gap.as_millis()
    );
    let none = Admission::new();
    let _ = sequential(&none, caps(None, ROOM), 200, "none", Duration::ZERO).await;
    let (lat, own, _) = sequential(&none, caps(None, cap), ops, "none", gap).await;
    let rate = concurrent(&none, caps(None, ROOM), ops).await;
    report("no store", &lat, own, 0.0, ops, rate);
    for (name, var, server) in [
        ("redis", "CREATEOS_TEST_REDIS_URL", "redis-server"),
        ("postgres", "CREATEOS_TEST_POSTGRES_URL", "postgres"),
    ] {
        let Ok(url) = std::env::var(var) else {
            println!("{name:<10} skipped: {var} is unset");
            continue;
        };
        let ns = format!("bench-{}", std::process::id());
        let config = StoreConfig::from_lookup(&|k| match k {
            ENV_ADMISSION_STORE => Some(url.clone()),
            ENV_ADMISSION_NAMESPACE => Some(ns.clone()),
            _ => None,
        })
        .expect("a valid store")
        .expect("a store");
        let adm = Admission::new();
        adm.set_deployment(Deployment::new(config).expect("the store opens"));
        let _ = sequential(&adm, caps(Some(config), ROOM), 200, server, Duration::ZERO).await;
        let (lat, own, srv) = sequential(&adm, caps(Some(config), cap), ops, server, gap).await;
        let rate = concurrent(&adm, caps(Some(config), ROOM), ops).await;
        report(name, &lat, own, srv, ops, rate);
    }
}
