//! `opensandbox-fake`: run the fake `OpenSandbox` server (or only its execd) on this machine.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use opensandbox_fake::{
    Config, DEFAULT_IMAGES, EgressMode, ExecdOptions, ExecdServer, FakeOptions, FakeServer,
    NetworkMode, OutputFraming, PolicyDrift, Runtime, SecureRuntime,
};
use tokio::signal::unix::{SignalKind, signal};

/// A fake `OpenSandbox` 1.1.1 server. Guests are local directories and their commands run as
/// ordinary local processes: it gives NO isolation.
#[derive(Debug, Parser)]
#[command(
    name = "opensandbox-fake",
    version,
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    /// Port on 127.0.0.1 (0 picks a free one).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// The key clients must send in OPEN-SANDBOX-API-KEY.
    #[arg(
        long,
        env = "OPENSANDBOX_FAKE_API_KEY",
        default_value = "test-key",
        hide_env_values = true
    )]
    api_key: String,
    /// Fault rules: ROUTE=ACTION[@PROB][#COUNT][>SKIP] separated by ';' (ACTION: a status, reset,
    /// reset-after, stall, stall-mid).
    #[arg(long, default_value = "")]
    faults: String,
    /// Directories put in front of the guests' PATH (':'-separated), e.g. a venv's bin.
    #[arg(long)]
    guest_path: Option<String>,
    /// Keep guest directories here instead of a temporary directory.
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Append every request (route, method, path, query, body; no header) to this file.
    #[arg(long)]
    request_log: Option<PathBuf>,
    /// docker or kubernetes.
    #[arg(long, value_parser = enum_arg::<Runtime>, default_value = "docker")]
    runtime: Runtime,
    /// bridge or host (Docker).
    #[arg(long, value_parser = enum_arg::<NetworkMode>, default_value = "bridge")]
    network_mode: NetworkMode,
    /// dns, dns+nft, or none (no egress image: networkPolicy is refused).
    #[arg(long, value_parser = enum_arg::<EgressMode>, default_value = "dns+nft")]
    egress_mode: EgressMode,
    /// Sandboxes get no running egress sidecar (networkpolicy answers 502).
    #[arg(long)]
    sidecar_absent: bool,
    /// none, default-allow, extra-rule or drop-rules: how the policy read-back differs.
    #[arg(long, value_parser = enum_arg::<PolicyDrift>, default_value = "none")]
    policy_drift: PolicyDrift,
    /// none, gvisor, kata or firecracker (Kubernetes only).
    #[arg(long, value_parser = enum_arg::<SecureRuntime>, default_value = "none")]
    secure_runtime: SecureRuntime,
    /// The `RuntimeClass` inspect prints on Kubernetes (default: the secure runtime's).
    #[arg(long)]
    runtime_class: Option<String>,
    /// The kernel release Kata/Firecracker guests report.
    #[arg(long, default_value = "6.1.62-kata")]
    guest_kernel: String,
    /// `server.max_sandbox_timeout_seconds` (0: no maximum).
    #[arg(long, default_value_t = 3600)]
    max_timeout_seconds: u64,
    /// Kubernetes: milliseconds in Pending (and Pausing/Resuming).
    #[arg(long, default_value_t = 1000)]
    pending_ms: u64,
    /// Milliseconds after Running during which execd does not answer.
    #[arg(long, default_value_t = 0)]
    execd_ready_ms: u64,
    /// Command stream ping period in milliseconds.
    #[arg(long, default_value_t = 3000)]
    ping_ms: u64,
    /// How long the proxy waits on a paused sandbox before 504, in milliseconds.
    #[arg(long, default_value_t = 180_000)]
    proxy_timeout_ms: u64,
    /// Milliseconds a snapshot stays Creating.
    #[arg(long, default_value_t = 200)]
    snapshot_ms: u64,
    /// Docker: milliseconds an expired sandbox shows Failed before it is gone (0: at once).
    #[arg(long, default_value_t = 300)]
    expiry_failed_ms: u64,
    /// lines (a frame per line) or chunks.
    #[arg(long, value_parser = enum_arg::<OutputFraming>, default_value = "lines")]
    output_framing: OutputFraming,
    /// The images the server holds, comma-separated (`*`: any); creating from another one
    /// fails as an image pull does (default: the provider's default image).
    #[arg(long, value_delimiter = ',', default_values_t = DEFAULT_IMAGES.iter().map(|i| (*i).to_owned()).collect::<Vec<String>>())]
    images: Vec<String>,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run only the execd double, on the machine's own file system (for a container image
    /// standing in for `OpenSandbox`'s execd).
    Execd {
        /// Address to listen on.
        #[arg(long, default_value = "0.0.0.0:44772")]
        listen: SocketAddr,
        /// Directory commands start in when a request has no cwd.
        #[arg(long)]
        root: Option<PathBuf>,
        /// Command stream ping period in milliseconds.
        #[arg(long, default_value_t = 3000)]
        ping_ms: u64,
        /// lines or chunks.
        #[arg(long, value_parser = enum_arg::<OutputFraming>, default_value = "lines")]
        output_framing: OutputFraming,
    },
}

fn enum_arg<T: serde::de::DeserializeOwned>(s: &str) -> Result<T, String> {
    serde_json::from_value(serde_json::Value::String(s.to_owned())).map_err(|e| e.to_string())
}

fn signals() -> (tokio::signal::unix::Signal, tokio::signal::unix::Signal) {
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(t), Ok(i)) => (t, i),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("opensandbox-fake: cannot install the SIGTERM/SIGINT handlers: {e}");
            std::process::exit(2);
        }
    }
}

fn announce(url: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "listening on {url}");
    let _ = writeln!(
        out,
        "WARNING: opensandbox-fake gives NO isolation: guest commands run as local processes of this user"
    );
    let _ = out.flush();
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    let (mut term, mut int) = signals();
    if let Some(Cmd::Execd {
        listen,
        root,
        ping_ms,
        output_framing,
    }) = cli.cmd
    {
        if let Some(r) = root
            && let Err(e) = std::env::set_current_dir(&r)
        {
            eprintln!(
                "opensandbox-fake execd: cannot enter --root {}: {e}",
                r.display()
            );
            std::process::exit(2);
        }
        let server = match ExecdServer::start(ExecdOptions {
            listen,
            ping: Duration::from_millis(ping_ms.max(1)),
            framing: output_framing,
        })
        .await
        {
            Ok(s) => s,
            Err(e) => {
                eprintln!("opensandbox-fake execd: cannot listen on {listen}: {e}");
                std::process::exit(2);
            }
        };
        announce(&format!("http://{}", server.addr()));
        tokio::select! {
            _ = term.recv() => {},
            _ = int.recv() => {},
        }
        server.shutdown().await;
        return;
    }
    let config = Config {
        runtime: cli.runtime,
        network_mode: cli.network_mode,
        egress_mode: cli.egress_mode,
        sidecar_absent: cli.sidecar_absent,
        policy_drift: cli.policy_drift,
        secure_runtime: cli.secure_runtime,
        runtime_class: cli.runtime_class,
        guest_kernel: cli.guest_kernel,
        max_timeout_seconds: cli.max_timeout_seconds,
        pending_ms: cli.pending_ms,
        execd_ready_ms: cli.execd_ready_ms,
        ping_ms: cli.ping_ms,
        proxy_timeout_ms: cli.proxy_timeout_ms,
        snapshot_ms: cli.snapshot_ms,
        expiry_failed_ms: cli.expiry_failed_ms,
        output_framing: cli.output_framing,
        images: cli.images,
    };
    let opts = FakeOptions {
        api_key: cli.api_key,
        config,
        faults: cli.faults,
        guest_path: cli
            .guest_path
            .map(|p| std::env::split_paths(&p).collect())
            .unwrap_or_default(),
        state_dir: cli.state_dir,
        request_log: cli.request_log,
    };
    let server = match FakeServer::start_on(opts, cli.port).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("opensandbox-fake: cannot start: {e}");
            std::process::exit(2);
        }
    };
    announce(&server.url());
    eprintln!(
        "opensandbox-fake: NO isolation; for tests and demos only. SIGTERM or Ctrl-C stops it."
    );
    tokio::select! {
        _ = term.recv() => {},
        _ = int.recv() => {},
    }
    server.shutdown().await;
    eprintln!("opensandbox-fake: stopped; every guest process was killed");
}
