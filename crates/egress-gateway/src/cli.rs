//! The command line shared by the `egress-gateway` binary and
//! `python -m langflow_sandbox_createos gateway`: one definition of the options, so both accept
//! exactly the same ones.

use std::future::Future;
use std::io::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use clap::Parser;
use tokio::net::TcpListener;
use tracing_subscriber::filter::LevelFilter;

use crate::config::GatewayConfig;
use crate::server::serve_until;
use crate::token::{SECRET_ENV, Secret};

/// Filtering egress gateway for CreateOS guests: an HTTP forward proxy that admits only the
/// host names the caller's signed credential lists. The shared secret is read from
/// `CREATEOS_GATEWAY_SECRET` (at least 32 bytes) and never printed.
#[derive(Debug, Clone, Parser)]
#[command(name = "egress-gateway", version)]
pub struct Args {
    /// Address and port to listen on (e.g. 0.0.0.0:3128; port 0 picks a free one). The
    /// first line on stdout is `listening on ADDR:PORT`.
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: SocketAddr,
    /// Connections one credential (one guest's run) may have open at once.
    #[arg(long, default_value_t = 64, value_name = "N")]
    pub max_connections_per_credential: u32,
    /// Connections served at once, all credentials together (at most what the open-files limit
    /// allows, 3 each). When all are taken, a new connection closes the one that has waited
    /// longest without sending its request head; with none such, it waits to be accepted.
    #[arg(long, default_value_t = 4096, value_name = "N")]
    pub max_connections: usize,
    /// Bytes one credential may move, both directions, all its connections together
    /// (a number, or with a suffix K, M, G, T: powers of 1024).
    #[arg(long, default_value = "8G", value_parser = parse_bytes, value_name = "BYTES")]
    pub max_bytes_per_credential: u64,
    /// Seconds without a byte in either direction before a connection is closed.
    #[arg(long, default_value_t = 60, value_name = "SECONDS")]
    pub idle_timeout: u64,
    /// Seconds a connection may stay open at most.
    #[arg(long, default_value_t = 3600, value_name = "SECONDS")]
    pub max_connection_lifetime: u64,
    /// Seconds a client has to send its request head, then its TLS `ClientHello`.
    #[arg(long, default_value_t = 10, value_name = "SECONDS")]
    pub handshake_timeout: u64,
    /// Seconds resolving a name and connecting to it may take.
    #[arg(long, default_value_t = 10, value_name = "SECONDS")]
    pub connect_timeout: u64,
    /// Largest request head (request line and headers) accepted, in bytes (at least 8192).
    #[arg(long, default_value_t = 16 * 1024, value_name = "BYTES")]
    pub max_request_head_bytes: usize,
    /// FOR TESTS ONLY: resolve NAME to these addresses instead of asking DNS (repeatable).
    /// When given at all, no name is looked up in DNS. Addresses are still checked: private,
    /// loopback, link-local and reserved ones are refused as for any DNS answer.
    #[arg(long = "test-only-resolve", value_name = "NAME=IP[,IP...]")]
    pub test_only_resolve: Vec<String>,
}

/// Parses `8G`, `512M`, `1024`, ... (powers of 1024).
fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let (digits, shift) = match text.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        None => (text, 0),
        Some((at, _)) => {
            let shift = match text[at..].to_ascii_uppercase().as_str() {
                "K" | "KB" | "KIB" => 10,
                "M" | "MB" | "MIB" => 20,
                "G" | "GB" | "GIB" => 30,
                "T" | "TB" | "TIB" => 40,
                other => return Err(format!("unknown size suffix {other:?} (K, M, G or T)")),
            };
            (&text[..at], shift)
        }
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a size"))?;
    n.checked_mul(1 << shift)
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("{text:?} is out of range"))
}

impl Args {
    /// Parses the arguments that follow the program name; `bin_name` is how usage and help
    /// messages name the program (`egress-gateway`, or the Python module's command).
    pub fn parse_args<I, T>(bin_name: &str, args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString>,
    {
        use clap::{CommandFactory as _, FromArgMatches as _};
        let command_line = std::iter::once(std::ffi::OsString::from(bin_name))
            .chain(args.into_iter().map(Into::into));
        let matches = Self::command()
            .bin_name(bin_name.to_owned())
            .try_get_matches_from(command_line)?;
        Self::from_arg_matches(&matches)
    }

    /// The gateway configuration these options describe, with `secret`.
    pub fn config(&self, secret: Secret) -> Result<GatewayConfig, String> {
        let mut config = GatewayConfig::new(secret);
        config.max_connections_per_credential = self.max_connections_per_credential.max(1);
        config.max_connections = self.max_connections.max(1);
        config.max_bytes_per_credential = self.max_bytes_per_credential;
        config.idle_timeout = Duration::from_secs(self.idle_timeout.max(1));
        config.max_connection_lifetime = Duration::from_secs(self.max_connection_lifetime.max(1));
        config.handshake_timeout = Duration::from_secs(self.handshake_timeout.max(1));
        config.connect_timeout = Duration::from_secs(self.connect_timeout.max(1));
        config.max_request_head_bytes = self.max_request_head_bytes.max(8192);
        if !self.test_only_resolve.is_empty() {
            let mut map = Vec::new();
            for entry in &self.test_only_resolve {
                let (name, ips) = entry
                    .split_once('=')
                    .ok_or_else(|| format!("--test-only-resolve {entry:?}: expected NAME=IP"))?;
                let ips = ips
                    .split(',')
                    .map(|ip| ip.trim().parse::<IpAddr>())
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| format!("--test-only-resolve {entry:?}: {e}"))?;
                map.push((name.to_owned(), ips));
            }
            config = config
                .with_test_only_resolver(map)
                .map_err(|e| format!("--test-only-resolve {e}"))?;
        }
        Ok(config)
    }
}

/// Sends the gateway's records (one per connection) to stderr as `key=value` lines, from the
/// level `CREATEOS_GATEWAY_LOG` names up (`error`, `warn`, `info` (default), `debug`, `trace`
/// or `off`). Does nothing if the process already has a subscriber.
pub fn init_logging() {
    let wanted = std::env::var("CREATEOS_GATEWAY_LOG").ok();
    let level = wanted
        .as_deref()
        .map_or(Ok(LevelFilter::INFO), str::parse::<LevelFilter>);
    let installed = tracing_subscriber::fmt()
        .with_max_level(*level.as_ref().unwrap_or(&LevelFilter::INFO))
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init()
        .is_ok();
    if installed && level.is_err() {
        tracing::warn!(
            target: "egress_gateway",
            "CREATEOS_GATEWAY_LOG is not a level (error, warn, info, debug, trace, off): logging at info"
        );
    }
}

/// Reads the secret, binds, prints `listening on ADDR:PORT` and serves until `shutdown`.
/// An error is a message for the operator that names the setting at fault.
pub async fn run<F>(args: &Args, shutdown: F) -> Result<(), String>
where
    F: Future<Output = ()>,
{
    let secret = Secret::from_env().map_err(|e| e.to_string())?;
    let config = args.config(secret)?;
    let listener = TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("cannot read the listening address: {e}"))?;
    {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "listening on {addr}");
        let _ = out.flush();
    }
    if config.uses_test_only_resolver() {
        tracing::warn!(
            target: "egress_gateway",
            "--test-only-resolve is set: names resolve from the command line, not DNS (tests only)"
        );
    }
    tracing::info!(
        target: "egress_gateway",
        listen = %addr,
        secret_from = SECRET_ENV,
        max_connections_per_credential = config.max_connections_per_credential,
        max_connections = config.max_connections,
        max_bytes_per_credential = config.max_bytes_per_credential,
        idle_timeout_s = config.idle_timeout.as_secs(),
        max_connection_lifetime_s = config.max_connection_lifetime.as_secs(),
        "egress gateway started"
    );
    serve_until(listener, config, shutdown).await;
    tracing::info!(target: "egress_gateway", "egress gateway stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_binary_suffixes() {
        assert_eq!(parse_bytes("1024"), Ok(1024));
        assert_eq!(parse_bytes("8G"), Ok(8 << 30));
        assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("3k"), Ok(3 << 10));
        assert!(parse_bytes("0").is_err());
        assert!(parse_bytes("12X").is_err());
        assert!(parse_bytes("99999999999T").is_err());
        assert!(parse_bytes("").is_err());
    }

    #[test]
    fn options_become_the_configuration() {
        let args = Args::parse_args(
            "egress-gateway",
            [
                "--listen",
                "127.0.0.1:0",
                "--max-connections-per-credential",
                "3",
                "--max-bytes-per-credential",
                "1M",
                "--idle-timeout",
                "5",
                "--test-only-resolve",
                "Pkg.Test.=11.0.0.1,2a00::1",
            ],
        )
        .unwrap();
        let secret = Secret::new(vec![7; 32]).unwrap();
        let config = args.config(secret).unwrap();
        assert_eq!(config.max_connections_per_credential, 3);
        assert_eq!(config.max_bytes_per_credential, 1 << 20);
        assert_eq!(config.idle_timeout, Duration::from_secs(5));
        assert!(config.uses_test_only_resolver());
        let Resolver::TestOnly(map) = &config.resolver else {
            panic!("not the test resolver")
        };
        assert_eq!(map["pkg.test"].len(), 2);
        // No flag, no test resolver.
        let plain = Args::parse_args("egress-gateway", ["--listen", "127.0.0.1:0"]).unwrap();
        assert!(
            !plain
                .config(Secret::new(vec![7; 32]).unwrap())
                .unwrap()
                .uses_test_only_resolver()
        );
        let bad = Args::parse_args(
            "egress-gateway",
            ["--listen", "127.0.0.1:0", "--test-only-resolve", "pkg.test"],
        )
        .unwrap();
        // Usage and help name the program as the caller says.
        let help = Args::parse_args("python -m langflow_sandbox_createos gateway", ["--help"])
            .unwrap_err()
            .to_string();
        assert!(
            help.contains("Usage: python -m langflow_sandbox_createos gateway"),
            "{help}"
        );
        assert!(bad.config(Secret::new(vec![7; 32]).unwrap()).is_err());
    }

    use crate::config::Resolver;
}
