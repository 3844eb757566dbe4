//! Test-only, never shipped: the gateway's private test network (`tests/common/mod.rs`) as a
//! process, for the Python end-to-end suite (`tests/e2e/test_gateway_flow.py`), which runs a
//! real lfx flow through it.
//!
//! ```sh
//! cargo build -p egress-gateway --example egress-testnet        # target/debug/examples/
//! egress-testnet [--guest-path DIRS] [-- GATEWAY-COMMAND...]    # as root, with ip and nft
//! ```
//!
//! It builds the namespaces (hub, gateway, test "internet" serving `pkg.test`/`api.test` over
//! HTTPS with a CA made at start, and a package index holding `tinypkg`), starts the gateway in
//! its namespace (`GATEWAY-COMMAND`, e.g. the wheel's `python -m langflow_sandbox_createos
//! gateway`; by default the `egress-gateway` binary of the same Cargo profile) and the fake
//! control plane in its enforcing mode (on 127.0.0.1, guests linked to the hub), then prints one
//! line, `ready {JSON}`: the fake's URL and API key, the gateway's URL and secret as a plugin
//! is configured with them, the CA (PEM), the index URL and the address of the test server
//! behind `pkg.test`. The gateway's log lines (one record per connection) follow on stderr.
//!
//! Everything is torn down (guest processes and namespaces, the gateway, the network) when
//! stdin closes, so a test that dies takes it down with it, and on SIGTERM or SIGINT. If this
//! process itself is killed outright, the gateway dies with it (`setpriv --pdeathsig`, where
//! util-linux is installed) and the next start removes the namespaces it left (their names carry
//! its pid). When the machine cannot build the network it prints `unsupported: REASON` and exits
//! 0, so the caller can skip with the reason.

#[path = "../tests/common/mod.rs"]
mod common;

use std::ffi::OsString;
use std::io::Read as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use common::{GW_IP, Gateway, Guests, NAMES, Net, SECRET};
use tokio::signal::unix::{SignalKind, signal};

/// The gateway's test network, until stdin closes (test-only).
#[derive(Debug, Parser)]
#[command(name = "egress-testnet")]
struct Cli {
    /// Directories put first on the guests' `PATH` (':'-separated): whose `python3` they run.
    #[arg(long)]
    guest_path: Option<OsString>,
    /// The gateway to run, program and arguments (the network adds `--listen` and the test
    /// resolver). Default: `egress-gateway` from the directory above this example's.
    #[arg(last = true)]
    gateway: Vec<OsString>,
}

/// The `egress-gateway` binary built with this example, if it was built.
fn default_gateway() -> Result<OsString, String> {
    let bin = common::gateway_bin();
    if !bin.is_file() {
        return Err(format!(
            "no {}: build it with `cargo build -p egress-gateway --bin egress-gateway`, or name a gateway command after `--`",
            bin.display()
        ));
    }
    Ok(bin.into_os_string())
}

/// `command` run through util-linux's `setpriv --pdeathsig KILL`, when it is installed: the
/// gateway then dies with this process even when this one is killed outright (it is spawned from
/// the main thread, which lives as long as the process). Without `setpriv` it is left as is.
fn with_parent_death_signal(command: Vec<OsString>) -> Vec<OsString> {
    let setpriv = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain(["/usr/bin", "/bin"].map(PathBuf::from))
        .map(|dir| dir.join("setpriv"))
        .find(|p| p.is_file());
    match setpriv {
        Some(setpriv) => [setpriv.into_os_string()]
            .into_iter()
            .chain(["--pdeathsig", "KILL", "--"].map(OsString::from))
            .chain(command)
            .collect(),
        None => command,
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(why) = common::unsupported() {
        println!("unsupported: {why}");
        return ExitCode::SUCCESS;
    }
    let gateway = if cli.gateway.is_empty() {
        match default_gateway() {
            Ok(bin) => vec![bin],
            Err(why) => {
                eprintln!("egress-testnet: {why}");
                return ExitCode::from(2);
            }
        }
    } else {
        cli.gateway
    };
    let gateway = with_parent_death_signal(gateway);
    let guest_path: Vec<PathBuf> = cli
        .guest_path
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("egress-testnet: cannot start a runtime: {e}");
            return ExitCode::from(2);
        }
    };
    runtime.block_on(serve(&gateway, guest_path))
}

async fn serve(gateway: &[OsString], guest_path: Vec<PathBuf>) -> ExitCode {
    // Installed before anything is built: a SIGTERM that arrives during setup still tears down.
    let (mut term, mut int) = match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(t), Ok(i)) => (t, i),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("egress-testnet: cannot install the SIGTERM/SIGINT handlers: {e}");
            return ExitCode::from(2);
        }
    };
    // stdin is read on a thread of its own (a blocking read), which reports its end.
    let (closed_tx, closed) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let mut sink = [0_u8; 256];
        let mut stdin = std::io::stdin().lock();
        while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
        let _ = closed_tx.send(());
    });

    let Some(net) = Net::setup() else {
        // `unsupported()` said yes a moment ago; `setup` said why it changed its mind.
        return ExitCode::from(2);
    };
    let gw = Gateway::start_command(&net, gateway, &[], true);
    let guests = Guests::start_with(&net, guest_path).await;
    let ready = serde_json::json!({
        "fake_url": guests.fake.url(),
        "api_key": guests.fake.api_key(),
        "gateway_url": format!("http://{}", gw.addr),
        "gateway_ip": GW_IP,
        "gateway_secret": String::from_utf8_lossy(SECRET),
        "ca_pem": net.ca_pem,
        "index_url": "https://pkg.test/simple/",
        "names": NAMES.iter().copied().collect::<std::collections::BTreeMap<_, _>>(),
    });
    println!("ready {ready}");

    let why = tokio::select! {
        _ = closed => "stdin closed",
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    };
    guests.fake.shutdown().await;
    drop(gw);
    drop(net);
    eprintln!("egress-testnet: {why}: guests, gateway and namespaces removed");
    ExitCode::SUCCESS
}
