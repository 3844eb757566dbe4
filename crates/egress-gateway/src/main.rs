//! `egress-gateway`: the filtering egress proxy as a plain binary (the wheel ships the same
//! gateway as `python -m langflow_sandbox_createos gateway`).

use std::process::ExitCode;

use egress_gateway::cli::{Args, init_logging, run};
use tokio::signal::unix::{SignalKind, signal};

fn main() -> ExitCode {
    let args = match Args::parse_args("egress-gateway", std::env::args_os().skip(1)) {
        Ok(args) => args,
        Err(err) => {
            let _ = err.print();
            return ExitCode::from(u8::try_from(err.exit_code()).unwrap_or(2));
        }
    };
    init_logging();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("egress-gateway: cannot start the runtime: {err}");
            return ExitCode::from(2);
        }
    };
    let result = runtime.block_on(async {
        // Installed before `listening on` is printed: a caller that reads that line and stops
        // the gateway at once still gets a clean stop.
        let (mut term, mut int) = (
            signal(SignalKind::terminate()).map_err(|e| e.to_string())?,
            signal(SignalKind::interrupt()).map_err(|e| e.to_string())?,
        );
        run(&args, async move {
            tokio::select! {
                _ = term.recv() => {},
                _ = int.recv() => {},
            }
        })
        .await
    });
    // Open tunnels are not waited for: a stopped gateway closes them.
    runtime.shutdown_timeout(std::time::Duration::from_millis(200));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("egress-gateway: {msg}");
            ExitCode::from(2)
        }
    }
}
