//! `createos-fake`: run the fake CreateOS control plane on loopback.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use createos_fake::{FakeOptions, FakeServer};
use tokio::signal::unix::{SignalKind, signal};

/// A CreateOS-compatible fake control plane. Guests are local directories and their commands
/// run as ordinary local processes: it gives NO isolation.
#[derive(Debug, Parser)]
#[command(name = "createos-fake", version)]
struct Cli {
    /// Port on 127.0.0.1 (0 picks a free one).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// The owner API key clients must send in X-Api-Key.
    #[arg(
        long,
        env = "CREATEOS_FAKE_API_KEY",
        default_value = "test-key",
        hide_env_values = true
    )]
    api_key: String,
    /// Latency added to every API request, in milliseconds.
    #[arg(long, default_value_t = 0)]
    latency_ms: u64,
    /// Fault rules: ROUTE=ACTION[+ra=VALUE][@PROB][#COUNT] separated by ';'. A status
    /// ACTION (429, 503, ...) may carry `+ra=VALUE`: its Retry-After header, sent verbatim
    /// (`+ra=0`, `+ra=2`, `+ra=garbage`, an HTTP date), or `+ra=none` for no header
    /// (default: `0` on 429 and 503).
    #[arg(long, default_value = "")]
    faults: String,
    /// Directories prepended to the guest PATH (':'-separated).
    #[arg(long)]
    guest_path: Option<String>,
    /// Serve the API under this path prefix (e.g. /api).
    #[arg(long, default_value = "")]
    base_path: String,
    /// Milliseconds a resumed guest stays `resuming`.
    #[arg(long, default_value_t = 300)]
    resume_delay_ms: u64,
    /// Milliseconds a deleted guest stays `destroying`.
    #[arg(long, default_value_t = 200)]
    destroy_delay_ms: u64,
    /// Milliseconds a new guest stays `creating` (0: create answers `running`).
    #[arg(long, default_value_t = 0)]
    create_delay_ms: u64,
    /// Milliseconds a paused guest stays `pausing` (0: pause answers `paused`).
    #[arg(long, default_value_t = 0)]
    pause_delay_ms: u64,
    /// Milliseconds a fork stays `forking` (0: fork answers `running`/`paused`).
    #[arg(long, default_value_t = 0)]
    fork_delay_ms: u64,
    /// Exec stream heartbeat period in milliseconds.
    #[arg(long, default_value_t = 5000)]
    heartbeat_ms: u64,
    /// Frame streams as SSE `data:` lines instead of NDJSON.
    #[arg(long)]
    sse: bool,
    /// Keep guest directories here instead of a temporary directory.
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// The account's quota of live sandboxes: creates beyond it are answered 429 (0: none).
    #[arg(long, default_value_t = 0)]
    max_live: u64,
    /// Enforce egress rules as CreateOS does: each guest runs in its own network namespace
    /// whose nftables firewall allows only its address rules. Needs root, `ip` and `nft`.
    #[arg(long)]
    enforce_egress: bool,
    /// With --enforce-egress: link guests to this network namespace instead of the fake's own.
    #[arg(long, requires = "enforce_egress", value_name = "NAME")]
    egress_uplink_netns: Option<String>,
    /// Append every API request (route, method, path, query, body; no header) to this file as
    /// a JSON line.
    #[arg(long)]
    request_log: Option<PathBuf>,
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    let opts = FakeOptions {
        api_key: cli.api_key,
        base_path: cli.base_path,
        latency: Duration::from_millis(cli.latency_ms),
        faults: cli.faults,
        guest_path: cli
            .guest_path
            .map(|p| std::env::split_paths(&p).collect())
            .unwrap_or_default(),
        resume_delay: Duration::from_millis(cli.resume_delay_ms),
        destroy_delay: Duration::from_millis(cli.destroy_delay_ms),
        create_delay: Duration::from_millis(cli.create_delay_ms),
        pause_delay: Duration::from_millis(cli.pause_delay_ms),
        fork_delay: Duration::from_millis(cli.fork_delay_ms),
        heartbeat: Duration::from_millis(cli.heartbeat_ms),
        sse: cli.sse,
        state_dir: cli.state_dir,
        max_live: cli.max_live,
        enforce_egress: cli.enforce_egress,
        egress_uplink_netns: cli.egress_uplink_netns,
        request_log: cli.request_log,
    };
    // The handlers are installed before the `listening on` line is printed: a caller that
    // reads that line and sends SIGTERM at once still gets a clean stop (guest processes
    // killed, temporary state removed) rather than the default, abrupt termination.
    let (mut term, mut int) = match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(t), Ok(i)) => (t, i),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("createos-fake: cannot install the SIGTERM/SIGINT handlers: {e}");
            std::process::exit(2);
        }
    };
    let server = match FakeServer::start_on(opts, cli.port).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("createos-fake: cannot start: {e}");
            std::process::exit(2);
        }
    };
    {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "listening on {}", server.url());
        let _ = writeln!(
            out,
            "WARNING: createos-fake gives NO isolation: guest commands run as local processes of this user"
        );
        let _ = out.flush();
    }
    eprintln!("createos-fake: NO isolation; for tests and demos only. SIGTERM or Ctrl-C stops it.");
    tokio::select! {
        _ = term.recv() => {},
        _ = int.recv() => {},
    }
    server.shutdown().await;
    eprintln!("createos-fake: stopped; every guest process was killed");
}
