//! Shared server state: the guests, the account resources, counters and the clock.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::desktop::Desktop;
use crate::egress::{Enforcer, GuestNet};
use crate::faults::Faults;
use crate::managed_proc::ManagedProc;
use crate::util::{now_rfc3339, signal_groups};

/// Sandbox status values (exactly the contract's enum).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    Creating,
    Running,
    Pausing,
    Paused,
    Resuming,
    Forking,
    Error,
    Destroying,
    Destroyed,
}

impl Status {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Creating => "creating",
            Self::Running => "running",
            Self::Pausing => "pausing",
            Self::Paused => "paused",
            Self::Resuming => "resuming",
            Self::Forking => "forking",
            Self::Error => "error",
            Self::Destroying => "destroying",
            Self::Destroyed => "destroyed",
        }
    }

    /// Parses a list filter value; `failed` is accepted as a filter but never produced.
    pub(crate) fn parse_filter(s: &str) -> Option<&'static str> {
        [
            "creating",
            "running",
            "pausing",
            "paused",
            "resuming",
            "forking",
            "error",
            "destroying",
            "destroyed",
            "failed",
        ]
        .into_iter()
        .find(|v| *v == s)
    }

    /// No DELETE accepted yet.
    pub(crate) fn is_live(self) -> bool {
        !matches!(self, Self::Destroying | Self::Destroyed)
    }

    /// Holds its name (everything but `destroyed`, `error`).
    pub(crate) fn holds_name(self) -> bool {
        !matches!(self, Self::Destroyed | Self::Error)
    }
}

/// One access token's metadata.
#[derive(Debug, Clone)]
pub(crate) struct Token {
    pub value: String,
    pub enabled: bool,
    pub created_at: String,
    pub rotated_at: Option<String>,
}

/// One mounted disk on a sandbox.
#[derive(Debug, Clone)]
pub(crate) struct Mount {
    pub disk_id: String,
    pub target: String,
    pub sub_path: String,
}

/// A guest.
#[derive(Debug)]
pub(crate) struct Sandbox {
    pub id: String,
    pub name: Option<String>,
    pub status: Status,
    pub shape: String,
    pub vcpu: u64,
    pub mem_mib: u64,
    pub disk_mib: u64,
    pub rootfs: String,
    pub ip: String,
    pub created_at: String,
    pub running_at: Option<String>,
    pub paused_at: Option<String>,
    pub last_resumed_at: Option<String>,
    pub destroyed_at: Option<String>,
    pub ingress_enabled: bool,
    pub egress: Vec<String>,
    pub envs: BTreeMap<String, String>,
    pub ssh_pubkeys: Vec<String>,
    pub forked_from: Option<String>,
    pub auto_pause: Option<u64>,
    /// Injectable-clock time of the last accepted exec (or create/resume).
    pub last_activity: Duration,
    pub dir: PathBuf,
    /// Process groups started in this guest.
    pub pgids: Vec<i32>,
    pub bandwidth_quota: i64,
    pub bandwidth_used: u64,
    pub bandwidth_ingress: u64,
    pub networks: Vec<String>,
    pub mounts: Vec<Mount>,
    pub token: Option<Token>,
    pub processes: BTreeMap<String, Arc<ManagedProc>>,
    /// The simulated desktop (`desktop:1` guests only), started on the first computer call.
    pub desktop: Option<Desktop>,
    /// Bumped on every state change so delayed transitions can tell they are stale.
    pub epoch: u64,
    /// The guest's network namespace and firewall (enforcing mode only); deleted with it.
    pub net: Option<GuestNet>,
}

impl Sandbox {
    /// The wire projection.
    pub(crate) fn to_json(&self) -> Value {
        let mut v = json!({
            "id": self.id,
            "status": self.status.as_str(),
            "vcpu": self.vcpu,
            "mem_mib": self.mem_mib,
            "disk_mib": self.disk_mib,
            "shape": self.shape,
            "rootfs": self.rootfs,
            "region": "fake-local",
            "created_by": "usr_fake",
            "created_at": self.created_at,
            "ingress_enabled": self.ingress_enabled,
            "spawn_ms": 1,
            "egress": self.egress,
            "envs": self.envs.keys().collect::<Vec<_>>(),
            "ssh_pubkeys": self.ssh_pubkeys,
            "bandwidth_ingress_bytes": self.bandwidth_ingress,
            "bandwidth_quota_bytes": self.bandwidth_quota,
        });
        let o = v.as_object_mut().expect("object");
        if self.status != Status::Creating {
            o.insert("ip".into(), json!(self.ip));
        }
        if let Some(n) = &self.name {
            o.insert("name".into(), json!(n));
        }
        for (k, val) in [
            ("running_at", &self.running_at),
            ("paused_at", &self.paused_at),
            ("last_resumed_at", &self.last_resumed_at),
            ("destroyed_at", &self.destroyed_at),
            ("forked_from", &self.forked_from),
        ] {
            if let Some(val) = val {
                o.insert(k.into(), json!(val));
            }
        }
        if self.ingress_enabled {
            o.insert(
                "ingress_url_template".into(),
                json!(format!("https://<port>-{}.fake.localhost", self.id)),
            );
        }
        if let Some(s) = self.auto_pause {
            o.insert("auto_pause_after_seconds".into(), json!(s));
        }
        v
    }

    /// The network namespace guest commands run in (enforcing mode).
    pub(crate) fn netns(&self) -> Option<String> {
        self.net.as_ref().map(|n| n.name().to_owned())
    }

    /// Sends `sig` to every process group of this guest (errors ignored).
    pub(crate) fn signal_all(&self, sig: Signal) {
        signal_groups(&self.pgids, sig);
        for p in self.processes.values() {
            p.signal_group(sig);
        }
    }
}

/// An account template.
#[derive(Debug, Clone)]
pub(crate) struct Template {
    pub id: String,
    pub name: String,
    pub base: String,
    pub dockerfile: String,
    pub status: &'static str,
    pub created_at: String,
    pub built_at: Option<String>,
    pub logs: Vec<String>,
}

impl Template {
    pub(crate) fn to_json(&self, include_dockerfile: bool) -> Value {
        let mut v = json!({
            "id": self.id,
            "name": self.name,
            "base": self.base,
            "status": self.status,
            "ext4_size_bytes": if self.status == "ready" { 536_870_912_u64 } else { 0 },
            "created_at": self.created_at,
        });
        let o = v.as_object_mut().expect("object");
        if let Some(b) = &self.built_at {
            o.insert("built_at".into(), json!(b));
        }
        if include_dockerfile {
            o.insert("dockerfile".into(), json!(self.dockerfile));
        }
        v
    }
}

/// An overlay network.
#[derive(Debug, Clone)]
pub(crate) struct Network {
    pub id: String,
    pub name: String,
    pub created_at: String,
}

/// A persistent disk definition.
#[derive(Debug, Clone)]
pub(crate) struct Disk {
    pub id: String,
    pub name: String,
    pub config: Value,
    pub created_at: String,
    pub access_key: String,
}

impl Disk {
    pub(crate) fn to_json(&self) -> Value {
        json!({
            "id": self.id,
            "name": self.name,
            "kind": "s3",
            "config": self.config,
            "created_at": self.created_at,
        })
    }
}

/// All mutable state behind one lock.
#[derive(Debug, Default)]
pub(crate) struct Inner {
    pub sandboxes: Vec<Sandbox>,
    pub next_seq: u64,
    pub created: u64,
    pub destroyed: u64,
    pub requests: BTreeMap<String, u64>,
    /// Delegated token value -> sandbox id.
    pub tokens: HashMap<String, String>,
    pub templates: Vec<Template>,
    pub networks: Vec<Network>,
    pub disks: Vec<Disk>,
    /// Requests that arrived as to a proxy (see `Stats::proxied_requests`).
    pub proxied_requests: u64,
    /// Of those, how many carried an `X-Api-Key` header.
    pub proxied_with_api_key: u64,
    /// `CONNECT` requests (see `Stats::connect_requests`).
    pub connect_requests: u64,
    /// The most sandboxes live at once (see `Stats::peak_live`).
    pub peak_live: u64,
    /// Creates refused for the quota (see `Stats::quota_refusals`).
    pub quota_refusals: u64,
}

impl Inner {
    pub(crate) fn sandbox(&self, id: &str) -> Option<&Sandbox> {
        self.sandboxes.iter().find(|s| s.id == id)
    }

    pub(crate) fn sandbox_mut(&mut self, id: &str) -> Option<&mut Sandbox> {
        self.sandboxes.iter_mut().find(|s| s.id == id)
    }

    /// Sandboxes for which no DELETE has been accepted yet.
    pub(crate) fn live(&self) -> u64 {
        self.sandboxes.iter().filter(|s| s.status.is_live()).count() as u64
    }

    /// Counts a sandbox just added: the created total and the peak of live ones.
    pub(crate) fn note_created(&mut self) {
        self.created += 1;
        self.peak_live = self.peak_live.max(self.live());
    }
}

/// A string whose `Debug` never shows its value.
pub(crate) struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// The settings the server was started with plus its live state.
#[derive(Debug)]
pub(crate) struct App {
    pub api_key: Secret,
    pub base_path: String,
    pub latency: Duration,
    pub guest_path: Vec<PathBuf>,
    pub resume_delay: Duration,
    pub destroy_delay: Duration,
    pub create_delay: Duration,
    pub pause_delay: Duration,
    pub fork_delay: Duration,
    pub heartbeat: Duration,
    pub sse: bool,
    pub state_root: PathBuf,
    pub initial_faults: String,
    pub faults: Mutex<Faults>,
    pub inner: Mutex<Inner>,
    pub clock_offset_ms: AtomicU64,
    pub started: Instant,
    pub request_seq: AtomicU64,
    pub execs_now: AtomicU64,
    pub peak_execs: AtomicU64,
    /// The account's quota of live sandboxes (0: none).
    pub max_live: AtomicU64,
    pub shutdown: CancellationToken,
    /// The enforcing mode (`--enforce-egress`): guest networks and their firewalls.
    pub enforcer: Option<Enforcer>,
    /// `--request-log`: every API request is appended here as a JSON line.
    pub request_log: Option<Mutex<std::fs::File>>,
}

impl App {
    /// Locks the state (a poisoned lock is recovered: the state stays usable).
    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Locks the fault rules.
    pub(crate) fn faults(&self) -> MutexGuard<'_, Faults> {
        self.faults
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The injectable clock: real time since start plus every `advance_clock`.
    pub(crate) fn now(&self) -> Duration {
        self.started.elapsed() + Duration::from_millis(self.clock_offset_ms.load(Ordering::SeqCst))
    }

    /// Counts one exec in flight until the guard drops, tracking the peak.
    pub(crate) fn exec_started(self: &Arc<Self>) -> ExecCount {
        let now = self.execs_now.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak_execs.fetch_max(now, Ordering::SeqCst);
        ExecCount(self.clone())
    }

    /// Kills every process of every guest (used at shutdown and reset).
    pub(crate) fn kill_everything(&self) {
        let inner = self.lock();
        for sb in &inner.sandboxes {
            sb.signal_all(Signal::SIGCONT);
            sb.signal_all(Signal::SIGKILL);
        }
    }

    /// Deletes every guest's network namespace (at shutdown), outside the state lock.
    pub(crate) fn drop_networks(&self) {
        let nets: Vec<_> = self
            .lock()
            .sandboxes
            .iter_mut()
            .filter_map(|sb| sb.net.take())
            .collect();
        drop(nets);
    }

    /// Pauses every running guest whose last activity is older than its auto-pause window.
    pub(crate) fn auto_pause_sweep(&self) {
        let now = self.now();
        let mut inner = self.lock();
        for sb in &mut inner.sandboxes {
            if sb.status != Status::Running {
                continue;
            }
            let Some(window) = sb.auto_pause else {
                continue;
            };
            if now.saturating_sub(sb.last_activity) >= Duration::from_secs(window) {
                pause_now(sb);
            }
        }
    }
}

/// Moves a guest to `paused`, freezing its processes.
pub(crate) fn pause_now(sb: &mut Sandbox) {
    sb.signal_all(Signal::SIGSTOP);
    sb.status = Status::Paused;
    sb.paused_at = Some(now_rfc3339());
    sb.epoch += 1;
}

/// Decrements the in-flight exec count when dropped.
#[derive(Debug)]
pub(crate) struct ExecCount(Arc<App>);

impl Drop for ExecCount {
    fn drop(&mut self) {
        self.0.execs_now.fetch_sub(1, Ordering::SeqCst);
    }
}
