//! `createos-live-check`: checks a CreateOS control plane against every fact this project
//! relies on (`docs/createos-api.md`), one line per fact with the expected and measured values,
//! and names the fake control plane's file that encodes a fact the service disagrees with.
//!
//! The target is `CREATEOS_LIVE_BASE_URL` (default the production API) with the key in
//! `CREATEOS_LIVE_API_KEY`. Exit status: 0 every check passed (skips allowed), 1 some check
//! failed (or a guest may be left behind), 2 bad usage or configuration, 3 no key given
//! (nothing was checked), 130/143 stopped by SIGINT/SIGTERM (after destroying the suite's
//! guests).
//!
//! Every guest is named `<prefix>-...`, is registered the moment its create is answered, and is
//! destroyed on every path; the run ends by listing the prefix and deleting anything left.

mod facts;
mod registry;
mod report;
mod suite;

use std::net::IpAddr;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser;
use createos_api::{Client, ListSandboxesOptions, SandboxStatus, SecretString};
use futures::TryStreamExt;
use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::registry::Registry;
use crate::report::Report;
use crate::suite::{Ctx, describe};

/// Environment variable holding the key of the target.
const ENV_KEY: &str = "CREATEOS_LIVE_API_KEY";
/// Exit status when some check failed.
const EXIT_FAILED: u8 = 1;
/// Exit status for bad usage or configuration.
const EXIT_USAGE: u8 = 2;
/// Exit status when no key was given: nothing was checked.
const EXIT_NO_KEY: u8 = 3;
/// How long cleanup waits for creates in flight (a create may hold until the guest runs).
const CREATE_WAIT: Duration = Duration::from_secs(120);

/// Command line (the key is read from the environment only, never from a flag).
#[derive(Debug, Parser)]
#[command(
    name = "createos-live-check",
    about = "Check a CreateOS control plane against every fact this project relies on",
    after_help = "The key is read from CREATEOS_LIVE_API_KEY. Exit status: 0 all checks \
                  passed, 1 some check failed or a guest may be left, 2 usage or configuration error, 3 no key given, \
                  130/143 interrupted (the suite's guests are destroyed first)."
)]
struct Args {
    /// Control plane to check.
    #[arg(long, env = "CREATEOS_LIVE_BASE_URL", default_value = createos_api::DEFAULT_BASE_URL)]
    base_url: String,
    /// Name prefix of every guest (lower-case letters, digits, '-'; 3 to 12 characters).
    /// Default: `lc-` and six random hex digits.
    #[arg(long)]
    prefix: Option<String>,
    /// Shape of the guests (default: the smallest in the catalog).
    #[arg(long)]
    shape: Option<String>,
    /// Rootfs of the guests (it needs bash, coreutils and GNU timeout).
    #[arg(long, default_value = "devbox:1")]
    rootfs: String,
    /// Seconds of silence in the heartbeat check (the contract's period is 5 s).
    #[arg(long, default_value_t = 7)]
    quiet_secs: u64,
}

/// Whether the URL's host is loopback (`localhost`, 127.0.0.0/8, `::1`).
fn is_loopback(base_url: &str) -> Result<bool, String> {
    let url = url::Url::parse(base_url).map_err(|e| format!("invalid base URL: {e}"))?;
    Ok(match url.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => IpAddr::V4(ip).is_loopback(),
        Some(url::Host::Ipv6(ip)) => IpAddr::V6(ip).is_loopback(),
        None => false,
    })
}

fn valid_prefix(p: &str) -> bool {
    (3..=12).contains(&p.len())
        && p.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && p.as_bytes()[0].is_ascii_lowercase()
}

/// SIGINT and SIGTERM, registered before the first guest can exist (so neither can kill the
/// process with a guest left behind).
struct Signals {
    int: Signal,
    term: Signal,
}

impl Signals {
    fn new() -> std::io::Result<Self> {
        Ok(Self {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
        })
    }

    /// The next signal: `(name, exit status)`.
    async fn next(&mut self) -> (&'static str, u8) {
        tokio::select! {
            _ = self.int.recv() => ("SIGINT", 130),
            _ = self.term.recv() => ("SIGTERM", 143),
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let Some(key) = std::env::var(ENV_KEY)
        .ok()
        .map(|k| k.trim().to_owned())
        .filter(|k| !k.is_empty())
    else {
        eprintln!(
            "createos-live-check: no key given: set {ENV_KEY} to check {} (nothing was checked)",
            args.base_url
        );
        return ExitCode::from(EXIT_NO_KEY);
    };
    let loopback = match is_loopback(&args.base_url) {
        Ok(l) => l,
        Err(m) => {
            eprintln!("createos-live-check: {m}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let prefix = args
        .prefix
        .clone()
        .unwrap_or_else(|| format!("lc-{:06x}", rand::random::<u32>() & 0x00ff_ffff));
    if !valid_prefix(&prefix) {
        eprintln!(
            "createos-live-check: --prefix must be 3 to 12 of [a-z0-9-], starting with a letter"
        );
        return ExitCode::from(EXIT_USAGE);
    }
    let client = match Client::builder()
        .api_key(SecretString::from(key))
        .base_url(&args.base_url)
        .timeout(Duration::from_secs(60))
        .build()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("createos-live-check: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let mut signals = match Signals::new() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("createos-live-check: cannot handle signals: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };

    println!("createos-live-check: {}", client.base_url());
    if loopback {
        println!("target is loopback (the fake): egress enforcement probes are skipped");
    }
    println!("guest names start with {prefix}-");
    let ctx = Ctx {
        client,
        base_url: args.base_url.clone(),
        loopback,
        prefix,
        rootfs: args.rootfs.clone(),
        shape: args.shape.clone(),
        quiet: Duration::from_secs(args.quiet_secs),
        registry: Arc::new(Registry::default()),
        report: Arc::new(Mutex::new(Report::default())),
    };

    let interrupted = tokio::select! {
        () = suite::run(&ctx) => None,
        sig = signals.next() => Some(sig),
    };
    if let Some((name, _)) = interrupted {
        println!("\n{name}: stopping the suite and destroying its guests");
    }

    // Cleanup runs on every path; a second signal cuts it short and says what may be left.
    let cleaned = tokio::select! {
        clean = cleanup(&ctx) => clean,
        (name, _) = signals.next() => {
            let left: Vec<String> = ctx.registry.live().into_iter().map(|(id, n)| format!("{id} ({n})")).collect();
            println!("{name} again: cleanup cut short; guests possibly left: {left:?}");
            false
        }
    };

    let totals = ctx
        .report
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .finish(
            interrupted
                .map(|(n, _)| format!("interrupted by {n}"))
                .as_deref(),
        );
    let (created, destroyed, secs) = ctx.registry.totals();
    println!(
        "\nchecks: {} passed, {} failed, {} skipped",
        totals.passed, totals.failed, totals.skipped
    );
    println!("created {created}, destroyed {destroyed}, guest-seconds {secs:.1}");

    if let Some((_, code)) = interrupted {
        return ExitCode::from(code);
    }
    if totals.failed > 0 || !cleaned {
        return ExitCode::from(EXIT_FAILED);
    }
    ExitCode::SUCCESS
}

/// Waits (bounded) for creates still in flight, destroys every registered guest, then lists the
/// prefix and deletes whatever is left (say, a guest whose create answer never arrived).
/// Returns whether no guest is known to be left.
async fn cleanup(ctx: &Ctx) -> bool {
    let n = ctx.registry.inflight();
    if n > 0 {
        println!("cleanup: waiting for {n} create(s) in flight to be answered");
        let deadline = tokio::time::Instant::now() + CREATE_WAIT;
        while ctx.registry.inflight() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    for (id, name) in ctx.registry.live() {
        let sb = ctx.client.sandbox_handle(&id);
        match sb.destroy().await {
            Ok(_) => ctx.registry.destroyed(&id),
            Err(e) if e.status().is_some_and(|s| s.as_u16() == 404) => {
                ctx.registry.destroyed(&id);
            }
            Err(e) => println!("cleanup: DELETE {id} ({name}) failed: {}", describe(&e)),
        }
    }
    let head = format!("{}-", ctx.prefix);
    let listed: Result<Vec<_>, _> = ctx
        .client
        .list_sandboxes(ListSandboxesOptions {
            limit: Some(500),
            ..ListSandboxesOptions::default()
        })
        .try_collect()
        .await;
    let rows = match listed {
        Ok(rows) => rows,
        Err(e) => {
            println!("sweep: cannot list guests: {}", describe(&e));
            return false;
        }
    };
    let mut left = 0;
    for sb in rows {
        let Some(name) = sb.name().filter(|n| n.starts_with(&head)) else {
            continue;
        };
        if sb.status().is_terminal() || sb.status() == SandboxStatus::Destroying {
            continue;
        }
        left += 1;
        ctx.registry.created(sb.id(), &name);
        match sb.destroy().await {
            Ok(_) => ctx.registry.destroyed(sb.id()),
            Err(e) => println!(
                "sweep: DELETE {} ({name}) failed: {}",
                sb.id(),
                describe(&e)
            ),
        }
    }
    println!("sweep: {left} leftover guest(s) under {head}");
    let still = ctx.registry.live();
    if !still.is_empty() {
        println!("cleanup: guests possibly left: {still:?}");
    }
    still.is_empty()
}

#[cfg(test)]
mod tests {
    use super::{is_loopback, valid_prefix};

    #[test]
    fn loopback_targets() {
        assert_eq!(is_loopback("http://127.0.0.1:8080"), Ok(true));
        assert_eq!(is_loopback("http://127.9.9.9"), Ok(true));
        assert_eq!(is_loopback("http://[::1]:1/api"), Ok(true));
        assert_eq!(is_loopback("http://localhost:3000"), Ok(true));
        assert_eq!(is_loopback("https://api.sb.createos.sh"), Ok(false));
        assert_eq!(is_loopback("http://10.0.0.1"), Ok(false));
        assert!(is_loopback("not a url").is_err());
    }

    #[test]
    fn prefixes() {
        assert!(valid_prefix("lc-a1b2c3"));
        assert!(!valid_prefix("LC-1"));
        assert!(!valid_prefix("lc"));
        assert!(!valid_prefix("1c-abc"));
        assert!(!valid_prefix("lc-abcdefghij"));
    }
}
