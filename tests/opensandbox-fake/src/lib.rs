//! An `OpenSandbox` 1.1.1-compatible fake server for tests: the lifecycle API, the server proxy,
//! execd (bare-JSON command frames, files, directories) and the egress sidecar.
//!
//! A guest is a directory on the host and its commands run as real local subprocesses, so this
//! server gives **no isolation at all**. It is an independent reading of the contract described
//! in the crate README; it shares no types with any client crate.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! let fake = opensandbox_fake::FakeServer::start(opensandbox_fake::FakeOptions::default()).await?;
//! println!("{} (key {})", fake.url(), fake.api_key());
//! fake.shutdown().await;
//! # Ok(()) }
//! ```

mod config;
mod egress;
mod execd;
mod faults;
mod http;
mod lifecycle;
mod server;
mod state;
mod util;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use config::{
    Config, DEFAULT_IMAGES, EgressMode, NetworkMode, OutputFraming, PolicyDrift, Runtime,
    SecureRuntime,
};
pub use faults::ROUTE_NAMES;

use crate::execd::{Guest, Host};
use crate::faults::Faults;
use crate::state::{App, Inner};

/// The `OpenSandbox` server version this fake speaks (`GET /version`).
pub const SERVER_VERSION: &str = "1.1.1";

/// How to start a [`FakeServer`].
#[derive(Clone)]
pub struct FakeOptions {
    /// The key clients must send in `OPEN-SANDBOX-API-KEY` (default `test-key`).
    pub api_key: String,
    /// The simulated server's modes (runtime, network mode, egress, delays, ...).
    pub config: Config,
    /// Fault rules, `ROUTE=ACTION[@PROB][#COUNT][>SKIP]` separated by `;` (default none).
    pub faults: String,
    /// Directories put in front of the guests' `PATH` (e.g. a virtualenv's `bin`, so `python3`
    /// in a guest is that virtualenv's).
    pub guest_path: Vec<PathBuf>,
    /// Where guest directories live (default: a temporary directory removed on shutdown).
    pub state_dir: Option<PathBuf>,
    /// Append every request (route, method, path, query, body; never a header) to this file as
    /// a JSON line.
    pub request_log: Option<PathBuf>,
}

impl Default for FakeOptions {
    fn default() -> Self {
        Self {
            api_key: "test-key".to_owned(),
            config: Config::default(),
            faults: String::new(),
            guest_path: Vec::new(),
            state_dir: None,
            request_log: None,
        }
    }
}

impl std::fmt::Debug for FakeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeOptions")
            .field("api_key", &"<redacted>")
            .field("config", &self.config)
            .field("faults", &self.faults)
            .field("guest_path", &self.guest_path)
            .field("state_dir", &self.state_dir)
            .field("request_log", &self.request_log)
            .finish()
    }
}

/// Counters exposed by [`FakeServer::stats`] and `GET /_fake/stats`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// Sandboxes created (restores from snapshots included).
    pub created: u64,
    /// Sandboxes removed by `DELETE`.
    pub deleted: u64,
    /// Sandboxes removed because their `timeout` (or renewed expiry) passed.
    pub expired: u64,
    /// Sandboxes that exist now.
    pub live: u64,
    /// The most sandboxes that existed at once.
    pub peak_live: u64,
    /// `POST /command` requests that reached execd.
    pub commands: u64,
    /// Requests per route name (see [`ROUTE_NAMES`]); a proxied request counts under `proxy`
    /// and under its execd or sidecar route.
    pub requests: BTreeMap<String, u64>,
    /// The egress policy each sandbox's sidecar took at create, in creation order (the last
    /// [`MAX_POLICIES`]): `{defaultAction, egress: [{action, target}]}` as the sidecar holds
    /// it (before any `policy_drift` of its read-back), `null` for a sandbox created without a
    /// `networkPolicy` or whose sidecar is absent. It outlives the sandbox, so a test can check
    /// what a run asked for once the run has deleted it.
    #[serde(default)]
    pub policies: Vec<serde_json::Value>,
}

/// How many created sandboxes' policies [`Stats::policies`] keeps.
pub const MAX_POLICIES: usize = 64;

/// A running fake server, bound to `127.0.0.1` unless started with [`FakeServer::start_at`].
pub struct FakeServer {
    app: Arc<App>,
    tasks: Vec<JoinHandle<()>>,
    _temp: Option<tempfile::TempDir>,
}

impl std::fmt::Debug for FakeServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeServer")
            .field("url", &self.url())
            .finish_non_exhaustive()
    }
}

impl FakeServer {
    /// Starts a server on `127.0.0.1` with a free port.
    pub async fn start(opts: FakeOptions) -> std::io::Result<FakeServer> {
        Self::start_on(opts, 0).await
    }

    /// Starts a server on `127.0.0.1:port` (`0` picks a free port).
    pub async fn start_on(opts: FakeOptions, port: u16) -> std::io::Result<FakeServer> {
        Self::start_at(opts, SocketAddr::from(([127, 0, 0, 1], port))).await
    }

    /// Starts a server on `addr` (port `0` picks a free port): `0.0.0.0` lets a test reach it
    /// by an address that is not loopback. [`FakeServer::url`] names the bound address.
    pub async fn start_at(opts: FakeOptions, addr: SocketAddr) -> std::io::Result<FakeServer> {
        let invalid = |e: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, e);
        opts.config.validate().map_err(invalid)?;
        let faults = Faults::parse(&opts.faults).map_err(invalid)?;
        let (temp, state_root) = if let Some(d) = &opts.state_dir {
            std::fs::create_dir_all(d)?;
            (None, d.clone())
        } else {
            let t = tempfile::Builder::new()
                .prefix("opensandbox-fake-")
                .tempdir()?;
            let p = t.path().to_path_buf();
            (Some(t), p)
        };
        let request_log = match &opts.request_log {
            Some(p) => Some(Mutex::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)?,
            )),
            None => None,
        };
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let host = Arc::new(Host {
            config: Mutex::new(opts.config.clone()),
            guest_path: opts.guest_path.clone(),
            shim_root: Some(state_root.join("shims")),
        });
        let app = Arc::new(App {
            api_key: opts.api_key.clone(),
            host,
            state_root,
            addr,
            inner: Mutex::new(Inner::default()),
            faults: Mutex::new(faults),
            initial_faults: opts.faults.clone(),
            initial_config: opts.config.clone(),
            shutdown: CancellationToken::new(),
            request_log,
            request_seq: AtomicU64::new(0),
        });
        let serve_app = app.clone();
        let serve = tokio::spawn(server::accept_loop(
            listener,
            app.shutdown.clone(),
            move |kill, req| server::handle(serve_app.clone(), kill, req),
        ));
        let tick_app = app.clone();
        let clock = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(50));
            loop {
                tokio::select! {
                    () = tick_app.shutdown.cancelled() => return,
                    _ = tick.tick() => tick_app.tick(),
                }
            }
        });
        Ok(FakeServer {
            app,
            tasks: vec![serve, clock],
            _temp: temp,
        })
    }

    /// `http://127.0.0.1:PORT`, or the address given to [`FakeServer::start_at`] (the API is
    /// under `/v1` and at the root).
    pub fn url(&self) -> String {
        format!("http://{}", self.app.addr)
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.app.addr
    }

    /// The API key.
    pub fn api_key(&self) -> &str {
        &self.app.api_key
    }

    /// The counters (same data as `GET /_fake/stats`).
    pub fn stats(&self) -> Stats {
        stats_of(&self.app)
    }

    /// The current configuration.
    pub fn config(&self) -> Config {
        self.app.config()
    }

    /// Replaces the configuration (same as `POST /_fake/config` with every field).
    pub fn set_config(&self, config: Config) -> Result<(), String> {
        config.validate()?;
        *self.app.host.config() = config;
        Ok(())
    }

    /// Replaces the fault rules.
    pub fn set_faults(&self, spec: &str) -> Result<(), String> {
        *self.app.faults() = Faults::parse(spec)?;
        Ok(())
    }

    /// Drops every sandbox and snapshot, zeroes the counters and restores the start-up
    /// configuration and faults (same as `POST /_fake/reset`).
    pub fn reset(&self) {
        reset(&self.app);
    }

    /// Stops serving, kills every guest process and removes temporary state.
    pub async fn shutdown(mut self) {
        self.app.shutdown.cancel();
        self.app.drop_everything();
        for t in self.tasks.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(2), t).await;
        }
    }

    /// A token cancelled when the server stops.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.app.shutdown.clone()
    }
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.app.shutdown.cancel();
        self.app.drop_everything();
        for t in &self.tasks {
            t.abort();
        }
    }
}

pub(crate) fn stats_of(app: &App) -> Stats {
    let inner = app.lock();
    Stats {
        created: inner.counters.created,
        deleted: inner.counters.deleted,
        expired: inner.counters.expired,
        live: inner.sandboxes.len() as u64,
        peak_live: inner.counters.peak_live,
        commands: inner.counters.commands,
        requests: inner.counters.requests.clone(),
        policies: inner.counters.policies.iter().cloned().collect(),
    }
}

pub(crate) fn reset(app: &App) {
    app.drop_everything();
    app.lock().counters = state::Counters::default();
    *app.faults() = Faults::parse(&app.initial_faults).unwrap_or_default();
    *app.host.config() = app.initial_config.clone();
}

/// How to start an [`ExecdServer`].
#[derive(Debug, Clone)]
pub struct ExecdOptions {
    /// The address to listen on (e.g. `0.0.0.0:44772` inside a container).
    pub listen: SocketAddr,
    /// The keep-alive `ping` period of command streams (default 3 s).
    pub ping: Duration,
    /// How command output is framed (default: a frame per line).
    pub framing: OutputFraming,
}

impl Default for ExecdOptions {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 44772)),
            ping: Duration::from_secs(3),
            framing: OutputFraming::Lines,
        }
    }
}

/// The execd double on its own: the machine's file system is the guest's (nothing is
/// rewritten) and commands inherit the daemon's environment, as the real execd does inside a
/// sandbox. A harness runs it inside a container as a stand-in for `OpenSandbox`'s execd.
pub struct ExecdServer {
    addr: SocketAddr,
    stop: CancellationToken,
    guest: Arc<Guest>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for ExecdServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecdServer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl ExecdServer {
    /// Starts serving.
    pub async fn start(opts: ExecdOptions) -> std::io::Result<ExecdServer> {
        let listener = TcpListener::bind(opts.listen).await?;
        let addr = listener.local_addr()?;
        let host = server::standalone_host(opts.ping, opts.framing);
        let guest = Arc::new(Guest::new_unmapped(host));
        let stop = CancellationToken::new();
        let g = guest.clone();
        let task = tokio::spawn(server::accept_loop(
            listener,
            stop.clone(),
            move |_kill, req| server::handle_execd(g.clone(), req),
        ));
        Ok(ExecdServer {
            addr,
            stop,
            guest,
            task,
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops serving and kills every command still running.
    pub async fn shutdown(self) {
        self.stop.cancel();
        self.guest.destroy();
        let _ = tokio::time::timeout(Duration::from_secs(2), self.task).await;
    }
}
