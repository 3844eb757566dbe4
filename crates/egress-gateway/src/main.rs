//! `egress-gateway`: the filtering egress proxy as a plain binary (the wheel ships the same
//! gateway as `python -m langflow_sandbox_createos gateway`).

use std::process::ExitCode;

use egress_gateway::cli::{Args, init_logging, run};

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
        let stop = stop_signal().map_err(|e| e.to_string())?;
        run(&args, stop).await
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

/// Resolves at SIGTERM or SIGINT (Ctrl-C); its handlers are installed when this returns.
#[cfg(unix)]
fn stop_signal() -> std::io::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let (mut term, mut int) = (
        signal(SignalKind::terminate())?,
        signal(SignalKind::interrupt())?,
    );
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {},
            _ = int.recv() => {},
        }
    })
}

/// Resolves at Ctrl-C (or Ctrl-Break), the console's stop; Windows has no SIGTERM to catch.
/// The handler is installed before this returns, as on Unix.
#[cfg(windows)]
fn stop_signal() -> std::io::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::windows::{ctrl_break, ctrl_c};
    let (mut c, mut brk) = (ctrl_c()?, ctrl_break()?);
    Ok(async move {
        tokio::select! {
            _ = c.recv() => {},
            _ = brk.recv() => {},
        }
    })
}
