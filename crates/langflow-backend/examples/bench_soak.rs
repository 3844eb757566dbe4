//! Soak benchmark (not a test): many backend runs from many concurrent callers while the fake
//! control plane injects a random fault into about 5% of all requests.
//!
//! ```text
//! cargo run --release -p langflow-backend --example bench_soak -- [RUNS] [CALLERS]
//! ```
//!
//! Defaults: 1,000 runs from 16 concurrent callers. Prints a Markdown table: runs by outcome
//! class, control-plane requests per run, leaked guests (must be 0) and fail-open runs (must
//! be 0). A fail-open run is one that returned a program result that is not what the program
//! printed (a wrong success), or more successful results than the fake ever ran programs.
//! Exits non-zero when either must-be-zero figure is not.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use createos_fake::{FakeOptions, FakeServer};
use langflow_backend::SurfaceOptions;
use langflow_backend::{Backend, BackendError, BackendOptions, LfxPolicy, RunOutput};
use sandbox_core::reaper::ReaperConfig;
use sandbox_core::retry::Backoff;

const KEY: &str = "soak-key-4f0e1d2c3b4a5968";

/// One rule per fault kind, 1% each: about 5% of requests get one (evaluated in order).
const FAULTS: &str = "*=500@0.01;*=503+ra=0@0.01;*=reset@0.01;*=reset-after@0.01;*=stall@0.01";

fn class(res: &Result<RunOutput, BackendError>) -> &'static str {
    match res {
        Ok(o) if o.exit_code == 0 && o.stdout == "1\n" => "ran",
        Ok(o) if o.exit_code == -1 => "timed out",
        Ok(_) => "FAIL-OPEN (wrong result)",
        Err(BackendError::Unavailable(_)) => "unavailable",
        Err(BackendError::Execution(m)) if m.contains("not started") => "not started",
        Err(BackendError::Execution(m)) if m.contains("may have run") => "may have run",
        Err(BackendError::Execution(_)) => "execution error (other)",
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let runs: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1000);
    let callers: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(16);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("runtime");
    let failed = rt.block_on(soak(runs, callers));
    std::process::exit(i32::from(failed));
}

async fn soak(runs: usize, callers: usize) -> bool {
    let fake = FakeServer::start(FakeOptions {
        api_key: KEY.to_owned(),
        faults: FAULTS.to_owned(),
        heartbeat: Duration::from_millis(500),
        destroy_delay: Duration::from_millis(10),
        ..FakeOptions::default()
    })
    .await
    .expect("fake starts");
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
    // Production backoff shape, scaled down so a stalled request costs seconds, not minutes.
    let backoff = Backoff {
        base: Duration::from_millis(100),
        max: Duration::from_secs(1),
        budget: Duration::from_secs(10),
    };
    let b = Arc::new(Backend::with_options(BackendOptions {
        surface: SurfaceOptions {
            env: Arc::new(move |k| env.get(k).cloned()),
            request_timeout: Duration::from_secs(2),
            backoff,
            host_grace: Duration::from_secs(3),
            shutdown_timeout: Duration::from_secs(60),
            reaper: ReaperConfig {
                backoff: Backoff {
                    budget: Duration::from_secs(120),
                    ..backoff
                },
                lookup_patience: Duration::from_secs(10),
            },
            ..SurfaceOptions::default()
        },
    }));
    let policy = LfxPolicy {
        timeout_seconds: 10,
        ..LfxPolicy::default()
    };
    let next = Arc::new(AtomicUsize::new(0));
    let outcomes: Arc<Mutex<BTreeMap<&'static str, usize>>> = Arc::default();
    let t0 = Instant::now();
    let workers: Vec<_> = (0..callers)
        .map(|_| {
            let (b, next, outcomes, policy) =
                (b.clone(), next.clone(), outcomes.clone(), policy.clone());
            tokio::spawn(async move {
                while next.fetch_add(1, Ordering::SeqCst) < runs {
                    let res = b.run("print(1)", None, &policy).await;
                    if let Err(e) = &res
                        && e.to_string().contains(KEY)
                    {
                        panic!("the key leaked into an error: {e}");
                    }
                    *outcomes.lock().unwrap().entry(class(&res)).or_default() += 1;
                }
            })
        })
        .collect();
    for w in workers {
        w.await.expect("worker");
    }
    let elapsed = t0.elapsed();
    // Let background destroys finish, then exit the way a process does.
    for _ in 0..600 {
        if fake.stats().live == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    b.shutdown().await;
    let stats = fake.stats();
    let outcomes = outcomes.lock().unwrap().clone();
    let requests: u64 = stats.requests.values().sum();
    let execs = stats.requests.get("exec_stream").copied().unwrap_or(0);
    let ran = outcomes.get("ran").copied().unwrap_or(0);
    let wrong = outcomes
        .get("FAIL-OPEN (wrong result)")
        .copied()
        .unwrap_or(0);
    let fail_open =
        wrong + usize::try_from(u64::try_from(ran).unwrap_or(0).saturating_sub(execs)).unwrap_or(0);

    println!("| measure | result |");
    println!("|---|---|");
    println!(
        "| runs | {runs} from {callers} concurrent callers in {:.1} s |",
        elapsed.as_secs_f64()
    );
    for (k, v) in &outcomes {
        #[allow(clippy::cast_precision_loss)]
        let pct = *v as f64 * 100.0 / runs as f64;
        println!("| outcome: {k} | {v} ({pct:.1}%) |");
    }
    #[allow(clippy::cast_precision_loss)]
    let per_run = requests as f64 / runs as f64;
    println!(
        "| control-plane requests per run (all, retries and destroys included) | {per_run:.2} |"
    );
    println!("| requests by route | {:?} |", stats.requests);
    println!(
        "| guests created / destroyed | {} / {} |",
        stats.created, stats.destroyed
    );
    println!("| leaked guests (live after shutdown) | {} |", stats.live);
    println!("| fail-open runs | {fail_open} |");
    fake.shutdown().await;
    stats.live != 0 || fail_open != 0
}
