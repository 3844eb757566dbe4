//! Benchmark (not a test): stream a large file out of a sandbox and report throughput and
//! peak RSS. Point it at a local fake:
//!
//! ```text
//! cargo run --release -p createos-fake -- --port 8080 &
//! CREATEOS_SANDBOX_BASE_URL=http://127.0.0.1:8080 CREATEOS_API_KEY=test-key \
//!   cargo run --release -p createos-api --example bench_download -- 256
//! ```

use std::time::{Duration, Instant};

use createos_api::{Client, CreateSandboxRequest, DownloadOptions, ExecOptions, RequestOptions};
use futures::StreamExt;

fn vm_hwm_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mib: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(256);
    let client = Client::from_env()?;
    let shape = std::env::var("CREATEOS_SHAPE").unwrap_or_else(|_| "s-2vcpu-4gb".to_owned());
    let sandbox = client
        .create_sandbox_with(
            CreateSandboxRequest::new(shape),
            &RequestOptions::with_timeout(Duration::from_secs(120)),
        )
        .await?;
    let result = async {
        sandbox
            .shell(
                format!("head -c {} /dev/urandom > /tmp/bench.bin", mib << 20),
                ExecOptions::timeout(Duration::from_secs(600)),
            )
            .await?;
        let before = vm_hwm_kib();
        let started = Instant::now();
        let opts = DownloadOptions {
            max_bytes: Some((mib << 20) + 1),
            request: RequestOptions::with_timeout(Duration::from_secs(600)),
        };
        let mut dl = sandbox.files().download("/tmp/bench.bin", opts).await?;
        let mut total = 0u64;
        while let Some(chunk) = dl.next().await {
            total += chunk?.len() as u64;
        }
        let secs = started.elapsed().as_secs_f64();
        Ok::<_, createos_api::Error>((total, secs, before))
    }
    .await;
    sandbox.destroy().await?;
    let (total, secs, before) = result?;
    let peak = vm_hwm_kib();
    #[allow(clippy::cast_precision_loss)] // display only
    let mib_s = total as f64 / (1024.0 * 1024.0) / secs;
    println!(
        "downloaded {total} bytes in {secs:.2} s = {mib_s:.1} MiB/s; VmHWM before download {} KiB, peak {} KiB",
        before.unwrap_or(0),
        peak.unwrap_or(0)
    );
    Ok(())
}
