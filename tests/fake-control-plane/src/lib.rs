//! A CreateOS-compatible fake control plane for tests, benchmarks and offline demos.
//!
//! A guest is a directory on the host and its commands run as real local subprocesses, so this
//! server gives **no isolation at all**. It speaks the REST contract of the CreateOS sandbox
//! control plane (`JSend` envelopes, `X-Api-Key`, the sandbox state machine, exec buffered and
//! streaming, files, managed processes, tokens, templates, networks, disks, a simulated desktop
//! for computer use) and adds latency and fault injection, an injectable clock and counters for
//! tests.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! let fake = createos_fake::FakeServer::start(createos_fake::FakeOptions::default()).await?;
//! println!("{}", fake.url());
//! fake.shutdown().await;
//! # Ok(()) }
//! ```

mod computer;
mod desktop;
mod egress;
mod exec;
mod extra;
mod faults;
mod guest;
mod handlers;
mod jsend;
mod managed_proc;
pub mod netns;
mod procs;
mod request;
mod server;
mod state;
mod util;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use faults::ROUTE_NAMES;

use crate::faults::Faults;
use crate::state::{App, Inner, Secret};

/// How to start a [`FakeServer`].
#[derive(Clone)]
pub struct FakeOptions {
    /// The owner API key clients must send in `X-Api-Key` (default `test-key`).
    pub api_key: String,
    /// A path prefix for every API route, e.g. `/api` serves `/api/v1/...` (default none).
    pub base_path: String,
    /// Added to every API request before it is handled (default 0).
    pub latency: Duration,
    /// Fault rules, `ROUTE=ACTION[+ra=VALUE][@PROB][#COUNT]` separated by `;` (default
    /// none); see the crate README.
    pub faults: String,
    /// Directories prepended to the guest `PATH` (e.g. a virtualenv's `bin`).
    pub guest_path: Vec<PathBuf>,
    /// How long a resumed guest stays `resuming` before it is `running` (default 300 ms).
    pub resume_delay: Duration,
    /// How long a deleted guest stays `destroying` before it is `destroyed` (default 200 ms).
    pub destroy_delay: Duration,
    /// How long a new guest stays `creating` (without an `ip`) before it is `running`
    /// (default 0: create answers `running` at once).
    pub create_delay: Duration,
    /// How long a paused guest stays `pausing` before it is `paused` (default 0: pause answers
    /// `paused` at once).
    pub pause_delay: Duration,
    /// How long a fork stays `forking` before it is `running` (or `paused` with `start_paused`)
    /// (default 0: fork answers the final state at once).
    pub fork_delay: Duration,
    /// Heartbeat period of exec streams (default 5 s).
    pub heartbeat: Duration,
    /// Frame exec and process streams as SSE `data: {...}` lines instead of NDJSON.
    pub sse: bool,
    /// Where guest directories live (default: a fresh temporary directory removed on shutdown).
    pub state_dir: Option<PathBuf>,
    /// The account's quota of live sandboxes: a create while this many are live is answered
    /// 429 (`error`, `Retry-After: 0` like every 429 of the fake), as CreateOS answers an account at its quota (default 0:
    /// no quota).
    pub max_live: u64,
    /// Enforce each guest's egress rules as CreateOS does: its commands run in a network
    /// namespace of their own whose firewall allows only its address rules (see the crate
    /// README). Needs root, `ip` and `nft`; starting fails with the reason otherwise.
    pub enforce_egress: bool,
    /// With `enforce_egress`: the network namespace guests are linked to (default: the fake's
    /// own). Tests put their "internet" and gateway behind such a namespace.
    pub egress_uplink_netns: Option<String>,
    /// Append every API request (route, method, path, query and body, never a header) to this
    /// file as a JSON line, so a test can prove what a client did or did not send (default
    /// none).
    pub request_log: Option<PathBuf>,
}

impl Default for FakeOptions {
    fn default() -> Self {
        Self {
            api_key: "test-key".to_owned(),
            base_path: String::new(),
            latency: Duration::ZERO,
            faults: String::new(),
            guest_path: Vec::new(),
            resume_delay: Duration::from_millis(300),
            destroy_delay: Duration::from_millis(200),
            create_delay: Duration::ZERO,
            pause_delay: Duration::ZERO,
            fork_delay: Duration::ZERO,
            heartbeat: Duration::from_secs(5),
            sse: false,
            state_dir: None,
            max_live: 0,
            enforce_egress: false,
            egress_uplink_netns: None,
            request_log: None,
        }
    }
}

impl std::fmt::Debug for FakeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeOptions")
            .field("api_key", &"<redacted>")
            .field("base_path", &self.base_path)
            .field("latency", &self.latency)
            .field("faults", &self.faults)
            .field("guest_path", &self.guest_path)
            .field("resume_delay", &self.resume_delay)
            .field("destroy_delay", &self.destroy_delay)
            .field("create_delay", &self.create_delay)
            .field("pause_delay", &self.pause_delay)
            .field("fork_delay", &self.fork_delay)
            .field("heartbeat", &self.heartbeat)
            .field("sse", &self.sse)
            .field("state_dir", &self.state_dir)
            .field("max_live", &self.max_live)
            .field("enforce_egress", &self.enforce_egress)
            .field("egress_uplink_netns", &self.egress_uplink_netns)
            .field("request_log", &self.request_log)
            .finish()
    }
}

/// Counters exposed by [`FakeServer::stats`] and `GET /_fake/stats`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// Sandboxes created (forks included).
    pub created: u64,
    /// Sandboxes that reached `destroyed`.
    pub destroyed: u64,
    /// Sandboxes for which no DELETE has been accepted yet.
    pub live: u64,
    /// Requests per route name (see [`ROUTE_NAMES`]).
    pub requests: BTreeMap<String, u64>,
    /// The most execs (buffered or streaming) ever in flight at once.
    pub peak_concurrent_execs: u64,
    /// The most sandboxes ever live at once (see [`Stats::live`]).
    #[serde(default)]
    pub peak_live: u64,
    /// Creates answered 429 because the account was at its quota (`FakeOptions::max_live`).
    #[serde(default)]
    pub quota_refusals: u64,
    /// Requests received in absolute form (`GET http://other-host/v1/...`), i.e. sent to
    /// this server as to a plain-HTTP proxy. Each is answered 502 and never served.
    #[serde(default)]
    pub proxied_requests: u64,
    /// Of [`Stats::proxied_requests`], how many carried an `X-Api-Key` header: a key that
    /// crossed a proxy unencrypted.
    #[serde(default)]
    pub proxied_with_api_key: u64,
    /// `CONNECT host:port` requests (an `https` client tunnelling through this server as
    /// its proxy). Each is answered 502: no tunnel is opened.
    #[serde(default)]
    pub connect_requests: u64,
}

/// A running fake control plane bound to `127.0.0.1`.
pub struct FakeServer {
    app: Arc<App>,
    addr: SocketAddr,
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
        let faults = Faults::parse(&opts.faults)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        let enforcer = if opts.enforce_egress {
            let uplink = opts.egress_uplink_netns.clone();
            let made = tokio::task::spawn_blocking(move || egress::Enforcer::new(uplink))
                .await
                .map_err(std::io::Error::other)?;
            Some(made.map_err(|e| std::io::Error::new(std::io::ErrorKind::Unsupported, e))?)
        } else {
            None
        };
        let (temp, state_root) = if let Some(d) = &opts.state_dir {
            std::fs::create_dir_all(d)?;
            (None, d.clone())
        } else {
            let t = tempfile::Builder::new()
                .prefix("createos-fake-")
                .tempdir()?;
            let p = t.path().to_path_buf();
            (Some(t), p)
        };
        let request_log = match &opts.request_log {
            Some(path) => Some(Mutex::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)?,
            )),
            None => None,
        };
        let listener = TcpListener::bind(("127.0.0.1", port)).await?;
        let addr = listener.local_addr()?;
        let mut base = opts.base_path.trim().trim_end_matches('/').to_owned();
        if !base.is_empty() && !base.starts_with('/') {
            base.insert(0, '/');
        }
        let app = Arc::new(App {
            api_key: Secret(opts.api_key.clone()),
            base_path: base,
            latency: opts.latency,
            guest_path: opts.guest_path.clone(),
            resume_delay: opts.resume_delay,
            destroy_delay: opts.destroy_delay,
            create_delay: opts.create_delay,
            pause_delay: opts.pause_delay,
            fork_delay: opts.fork_delay,
            heartbeat: if opts.heartbeat.is_zero() {
                Duration::from_secs(5)
            } else {
                opts.heartbeat
            },
            sse: opts.sse,
            state_root,
            initial_faults: opts.faults.clone(),
            faults: Mutex::new(faults),
            inner: Mutex::new(Inner::default()),
            clock_offset_ms: AtomicU64::new(0),
            started: Instant::now(),
            request_seq: AtomicU64::new(1),
            execs_now: AtomicU64::new(0),
            peak_execs: AtomicU64::new(0),
            max_live: AtomicU64::new(opts.max_live),
            shutdown: CancellationToken::new(),
            enforcer,
            request_log,
        });
        let serve = tokio::spawn(server::accept_loop(app.clone(), listener));
        let sweep_app = app.clone();
        let sweeper = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(250));
            loop {
                tokio::select! {
                    () = sweep_app.shutdown.cancelled() => return,
                    _ = tick.tick() => sweep_app.auto_pause_sweep(),
                }
            }
        });
        Ok(FakeServer {
            app,
            addr,
            tasks: vec![serve, sweeper],
            _temp: temp,
        })
    }

    /// `http://127.0.0.1:PORT` plus the base path, without a trailing slash.
    pub fn url(&self) -> String {
        format!("http://{}{}", self.addr, self.app.base_path)
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The owner API key.
    pub fn api_key(&self) -> &str {
        &self.app.api_key.0
    }

    /// Replaces the active fault rules.
    pub fn set_faults(&self, spec: &str) -> Result<(), String> {
        let parsed = Faults::parse(spec)?;
        *self.app.faults() = parsed;
        Ok(())
    }

    /// Sets the account's quota of live sandboxes (0: none); see [`FakeOptions::max_live`].
    pub fn set_max_live(&self, max: u64) {
        self.app.max_live.store(max, Ordering::SeqCst);
    }

    /// Moves the injectable clock forward and runs the auto-pause sweep.
    pub fn advance_clock(&self, by: Duration) {
        advance(&self.app, by);
    }

    /// The counters (same data as `GET /_fake/stats`).
    pub fn stats(&self) -> Stats {
        stats_of(&self.app)
    }

    /// The ids of the guests whose status is `status` (`running`, `paused`, ...), oldest first.
    pub fn guest_ids(&self, status: &str) -> Vec<String> {
        self.app
            .lock()
            .sandboxes
            .iter()
            .filter(|sb| sb.status.as_str() == status)
            .map(|sb| sb.id.clone())
            .collect()
    }

    /// Drops every guest and resource and zeroes the counters (same as `POST /_fake/reset`).
    pub fn reset(&self) {
        reset(&self.app);
    }

    /// Stops serving, kills every guest process and removes temporary state.
    pub async fn shutdown(mut self) {
        self.app.shutdown.cancel();
        self.app.kill_everything();
        self.app.drop_networks();
        for t in self.tasks.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(2), t).await;
        }
    }

    /// Waits until the server is asked to stop (by [`FakeServer::shutdown`] or a signal).
    pub fn shutdown_token(&self) -> CancellationToken {
        self.app.shutdown.clone()
    }
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.app.shutdown.cancel();
        self.app.kill_everything();
        self.app.drop_networks();
        for t in &self.tasks {
            t.abort();
        }
    }
}

pub(crate) fn stats_of(app: &App) -> Stats {
    let inner = app.lock();
    Stats {
        created: inner.created,
        destroyed: inner.destroyed,
        live: inner
            .sandboxes
            .iter()
            .filter(|s| s.status.is_live())
            .count() as u64,
        requests: inner.requests.clone(),
        peak_concurrent_execs: app.peak_execs.load(Ordering::SeqCst),
        peak_live: inner.peak_live,
        quota_refusals: inner.quota_refusals,
        proxied_requests: inner.proxied_requests,
        proxied_with_api_key: inner.proxied_with_api_key,
        connect_requests: inner.connect_requests,
    }
}

pub(crate) fn advance(app: &App, by: Duration) {
    let ms = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
    app.clock_offset_ms.fetch_add(ms, Ordering::SeqCst);
    app.auto_pause_sweep();
}

pub(crate) fn reset(app: &App) {
    app.kill_everything();
    let dirs: Vec<PathBuf> = {
        let mut inner = app.lock();
        let dirs = inner.sandboxes.iter().map(|s| s.dir.clone()).collect();
        *inner = Inner::default();
        dirs
    };
    for d in dirs {
        let _ = std::fs::remove_dir_all(d);
    }
    *app.faults() = Faults::parse(&app.initial_faults).unwrap_or_default();
    app.clock_offset_ms.store(0, Ordering::SeqCst);
    app.peak_execs
        .store(app.execs_now.load(Ordering::SeqCst), Ordering::SeqCst);
}
