//! Benchmark of the sandbox backend against the fake control plane (20 ms per request).
//!
//! ```text
//! cargo run --release -p langflow-backend --example bench_backend
//! ```
//!
//! The fake runs in a child process (this binary with `--serve-fake`), so the host's RSS figure
//! measures the backend alone. Prints a Markdown table.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use createos_fake::{FakeOptions, FakeServer};
use langflow_backend::SurfaceOptions;
use langflow_backend::{Backend, BackendOptions, LfxPolicy};

const KEY: &str = "bench-key-0123456789";
const LATENCY_MS: u64 = 20;

fn serve_fake() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let fake = FakeServer::start(FakeOptions {
            api_key: KEY.to_owned(),
            latency: Duration::from_millis(LATENCY_MS),
            destroy_delay: Duration::from_millis(10),
            ..FakeOptions::default()
        })
        .await
        .expect("fake starts");
        println!("{}", fake.url());
        std::io::stdout().flush().ok();
        // Serve until the parent closes our stdin.
        tokio::task::spawn_blocking(|| {
            let mut sink = Vec::new();
            let _ = std::io::stdin().read_to_end(&mut sink);
        })
        .await
        .ok();
        let stats = fake.stats();
        eprintln!(
            "fake: created={} destroyed={} live={}",
            stats.created, stats.destroyed, stats.live
        );
        fake.shutdown().await;
    });
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn pct(v: &[f64], p: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let i = ((s.len() as f64 - 1.0) * p).round() as usize;
    s[i]
}

#[allow(clippy::cast_precision_loss)]
fn main() {
    if std::env::args().any(|a| a == "--serve-fake") {
        serve_fake();
        return;
    }
    let me = std::env::current_exe().expect("current exe");
    let mut child = Command::new(me)
        .arg("--serve-fake")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the fake");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("fake url");
    let url = line.trim().to_owned();

    let cap: usize = std::env::var("CREATEOS_SANDBOX_MAX_OUTPUT_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(sandbox_core::settings::DEFAULT_MAX_OUTPUT_BYTES);
    let env: HashMap<String, String> = [
        ("CREATEOS_SANDBOX_API_KEY", KEY.to_owned()),
        ("CREATEOS_SANDBOX_BASE_URL", url),
        (
            "LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS",
            "true".to_owned(),
        ),
        ("CREATEOS_SANDBOX_MAX_OUTPUT_BYTES", cap.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let backend = Arc::new(Backend::with_options(BackendOptions {
        surface: SurfaceOptions {
            env: Arc::new(move |k| env.get(k).cloned()),
            ..SurfaceOptions::default()
        },
    }));
    let policy = LfxPolicy {
        timeout_seconds: 120,
        ..LfxPolicy::default()
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");

    rt.block_on(async {
        // Warm-up: the once-per-process credential check and shape catalog.
        let first = backend.run("print(1)", None, &policy).await.expect("warm-up run");
        println!(
            "first run (includes credential check + catalog): {} ms, {} requests",
            first.timings.total_ms.unwrap_or_default(),
            first.timings.requests.unwrap_or_default()
        );

        // 1. Peak RSS growth while the guest prints 200 MiB (measured first, on a quiet heap).
        let baseline = rss_kib();
        let peak = Arc::new(AtomicU64::new(baseline));
        let stop = Arc::new(AtomicBool::new(false));
        let sampler = {
            let (peak, stop) = (peak.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    peak.fetch_max(rss_kib(), Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(2));
                }
            })
        };
        let big = "import sys\nchunk = 'x' * 1023 + '\\n'\nw = sys.stdout.write\n\
                   for _ in range(200 * 1024):\n    w(chunk)\nprint('THE END')";
        let t = Instant::now();
        let out = backend.run(big, None, &policy).await.expect("200 MiB run");
        let big_secs = t.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        sampler.join().ok();
        let growth_kib = peak.load(Ordering::Relaxed).saturating_sub(baseline);
        assert!(out.stdout_truncated && out.stdout.to_string().ends_with("THE END\n"));
        println!(
            "200 MiB run: {big_secs:.1} s, stdout kept {} bytes, truncated={}",
            out.stdout.len(),
            out.stdout_truncated
        );

        // 2. Median latency of print(1), sequential.
        let mut lat = Vec::new();
        let mut crit = Vec::new();
        for _ in 0..40 {
            let t = Instant::now();
            let o = backend.run("print(1)", None, &policy).await.expect("run");
            lat.push(t.elapsed().as_secs_f64() * 1000.0);
            crit.push(o.timings.requests.unwrap_or_default());
            assert_eq!(o.stdout, "1\n");
        }
        let p90 = pct(&lat, 0.9);
        let med = median(&mut lat);
        crit.sort_unstable();
        let crit_req = crit[crit.len() / 2];

        // 3. Throughput with 32 concurrent runs.
        let per_task = 4;
        let t = Instant::now();
        let tasks: Vec<_> = (0..32)
            .map(|_| {
                let b = backend.clone();
                let p = policy.clone();
                tokio::spawn(async move {
                    for _ in 0..per_task {
                        let o = b.run("print(1)", None, &p).await.expect("run");
                        assert_eq!(o.stdout, "1\n");
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.expect("task");
        }
        let secs = t.elapsed().as_secs_f64();
        let runs = f64::from(32 * per_task);
        let rps = runs / secs;

        backend.shutdown().await;

        println!();
        println!("| metric | value |");
        println!("|---|---|");
        println!("| fake control-plane latency | {LATENCY_MS} ms per request |");
        println!("| median latency of `print(1)` (40 sequential runs) | {med:.0} ms (p90 {p90:.0} ms) |");
        println!(
            "| requests on the critical path | {crit_req} (create, upload ∥ egress read-back, exec: 3 sequential round trips; destroy runs after the result) |"
        );
        println!("| runs/s at 32 concurrent runs ({} runs) | {rps:.1} |", 32 * per_task);
        println!(
            "| host peak RSS growth, guest prints 200 MiB | {:.2} MiB (cap {:.2} MiB per stream; limit 2× = {:.2} MiB) |",
            growth_kib as f64 / 1024.0,
            cap as f64 / 1_048_576.0,
            2.0 * cap as f64 / 1_048_576.0
        );
    });
    drop(child.stdin.take());
    let _ = child.wait();
}
