//! Shared server state: sandboxes, snapshots, counters, and the background clock that moves
//! sandboxes between states and deletes them when their `timeout` expires.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, NetworkMode, PolicyDrift, Runtime};
use crate::execd::{Guest, Host};
use crate::faults::Faults;
use crate::util::rfc3339;

/// A sandbox's lifecycle state (the `status.state` strings).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    Pending,
    Running,
    Pausing,
    Paused,
    Resuming,
    /// Docker, after the expiry killed the container and before it is removed.
    Failed,
}

impl State {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::Running => "Running",
            Self::Pausing => "Pausing",
            Self::Paused => "Paused",
            Self::Resuming => "Resuming",
            Self::Failed => "Failed",
        }
    }
}

/// A sandbox's egress sidecar: its auth token and the policy it holds.
#[derive(Debug, Clone)]
pub(crate) struct Sidecar {
    pub token: String,
    /// `{defaultAction, egress: [{action, target}]}`.
    pub policy: Value,
}

impl Sidecar {
    /// The sidecar's `mode`: `allow_all`, `deny_all` or `enforcing`.
    pub(crate) fn mode_of(policy: &Value) -> &'static str {
        let allow = policy.get("defaultAction").and_then(Value::as_str) == Some("allow");
        let empty = policy
            .get("egress")
            .and_then(Value::as_array)
            .is_none_or(Vec::is_empty);
        match (allow, empty) {
            (true, true) => "allow_all",
            (false, true) => "deny_all",
            _ => "enforcing",
        }
    }

    /// The policy as the sidecar reports it, with the configured drift applied.
    pub(crate) fn reported(&self, drift: PolicyDrift) -> Value {
        let mut p = self.policy.clone();
        match drift {
            PolicyDrift::None => {}
            PolicyDrift::DefaultAllow => {
                p["defaultAction"] = json!("allow");
            }
            PolicyDrift::ExtraRule => {
                if let Some(rules) = p.get_mut("egress").and_then(Value::as_array_mut) {
                    rules.push(json!({"action": "allow", "target": "*"}));
                }
            }
            PolicyDrift::DropRules => {
                p["egress"] = json!([]);
            }
        }
        p
    }
}

/// One sandbox.
#[derive(Debug)]
pub(crate) struct Sandbox {
    pub id: String,
    pub state: State,
    pub reason: String,
    pub message: String,
    pub last_transition_at: OffsetDateTime,
    /// When the current transitional state (`Pending`, `Pausing`, `Resuming`) ends, or when
    /// a `Failed` (expired) sandbox is removed.
    pub transition_due: Option<Instant>,
    pub image: Option<String>,
    pub snapshot_id: Option<String>,
    pub entrypoint: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub metadata: BTreeMap<String, String>,
    pub extensions: BTreeMap<String, String>,
    pub platform: Option<Value>,
    pub resource_limits: BTreeMap<String, String>,
    pub created_at: OffsetDateTime,
    pub expires_at: Option<OffsetDateTime>,
    pub sidecar: Option<Sidecar>,
    pub guest: Arc<Guest>,
}

impl Sandbox {
    /// Moves to `state` now.
    pub(crate) fn set_state(&mut self, state: State, reason: &str, message: &str) {
        self.state = state;
        reason.clone_into(&mut self.reason);
        message.clone_into(&mut self.message);
        self.last_transition_at = OffsetDateTime::now_utc();
    }

    fn status_json(&self) -> Value {
        json!({
            "state": self.state.as_str(),
            "reason": self.reason,
            "message": self.message,
            "lastTransitionAt": rfc3339(self.last_transition_at),
        })
    }

    fn common(&self) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("id".into(), json!(self.id));
        m.insert("status".into(), self.status_json());
        m.insert("metadata".into(), json!(self.metadata));
        if !self.extensions.is_empty() {
            m.insert("extensions".into(), json!(self.extensions));
        }
        if let Some(p) = &self.platform {
            m.insert("platform".into(), p.clone());
        }
        if let Some(e) = self.expires_at {
            m.insert("expiresAt".into(), json!(rfc3339(e)));
        }
        m.insert("createdAt".into(), json!(rfc3339(self.created_at)));
        m.insert("entrypoint".into(), json!(self.entrypoint));
        m
    }

    /// The `Sandbox` object of get, list and patch.
    pub(crate) fn to_json(&self) -> Value {
        let mut m = self.common();
        if let Some(i) = &self.image {
            m.insert("image".into(), json!({"uri": i}));
        }
        if let Some(s) = &self.snapshot_id {
            m.insert("snapshotId".into(), json!(s));
        }
        Value::Object(m)
    }

    /// The `CreateSandboxResponse` object (no image, no snapshot id).
    pub(crate) fn to_create_json(&self) -> Value {
        Value::Object(self.common())
    }
}

/// A snapshot's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SnapState {
    Creating,
    Ready,
}

/// A disk snapshot of a sandbox.
#[derive(Debug)]
pub(crate) struct Snapshot {
    pub id: String,
    pub sandbox_id: String,
    pub name: Option<String>,
    pub state: SnapState,
    pub created_at: OffsetDateTime,
    pub last_transition_at: OffsetDateTime,
    pub ready_due: Instant,
    /// A copy of the sandbox's directory at the time of the snapshot.
    pub dir: PathBuf,
    pub entrypoint: Vec<String>,
}

impl Snapshot {
    /// The `Snapshot` object.
    pub(crate) fn to_json(&self) -> Value {
        let (state, reason, message) = match self.state {
            SnapState::Creating => (
                "Creating",
                "snapshot_accepted",
                "Snapshot creation accepted.",
            ),
            SnapState::Ready => ("Ready", "snapshot_ready", "Snapshot is ready."),
        };
        let mut v = json!({
            "id": self.id,
            "sandboxId": self.sandbox_id,
            "status": {
                "state": state,
                "reason": reason,
                "message": message,
                "lastTransitionAt": rfc3339(self.last_transition_at),
            },
            "createdAt": rfc3339(self.created_at),
        });
        if let (Some(n), Some(o)) = (&self.name, v.as_object_mut()) {
            o.insert("name".into(), json!(n));
        }
        v
    }
}

/// Counters.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub created: u64,
    pub deleted: u64,
    pub expired: u64,
    pub peak_live: u64,
    pub commands: u64,
    pub requests: BTreeMap<String, u64>,
    /// The policy each sandbox's sidecar took at create, newest last (at most
    /// [`crate::MAX_POLICIES`]).
    pub policies: std::collections::VecDeque<serde_json::Value>,
}

/// Everything behind the server's lock.
#[derive(Debug, Default)]
pub(crate) struct Inner {
    /// Oldest first.
    pub sandboxes: Vec<Sandbox>,
    pub snapshots: Vec<Snapshot>,
    pub counters: Counters,
}

impl Inner {
    pub(crate) fn find(&self, id: &str) -> Option<&Sandbox> {
        self.sandboxes.iter().find(|s| s.id == id)
    }

    pub(crate) fn find_mut(&mut self, id: &str) -> Option<&mut Sandbox> {
        self.sandboxes.iter_mut().find(|s| s.id == id)
    }

    /// Removes a sandbox; its guest is destroyed and its directory removed in the background.
    pub(crate) fn remove(&mut self, id: &str) -> Option<Sandbox> {
        let pos = self.sandboxes.iter().position(|s| s.id == id)?;
        let sb = self.sandboxes.remove(pos);
        sb.guest.destroy();
        let dir = sb.guest.root.clone();
        std::thread::spawn(move || {
            let _ = std::fs::remove_dir_all(dir);
        });
        Some(sb)
    }
}

/// The server.
#[derive(Debug)]
pub(crate) struct App {
    pub api_key: String,
    pub host: Arc<Host>,
    pub state_root: PathBuf,
    pub addr: SocketAddr,
    pub inner: Mutex<Inner>,
    pub faults: Mutex<Faults>,
    pub initial_faults: String,
    pub initial_config: Config,
    pub shutdown: CancellationToken,
    pub request_log: Option<Mutex<std::fs::File>>,
    pub request_seq: AtomicU64,
}

impl App {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn faults(&self) -> MutexGuard<'_, Faults> {
        self.faults
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A copy of the current configuration.
    pub(crate) fn config(&self) -> Config {
        self.host.config().clone()
    }

    /// The guest that answers execd traffic for sandbox `id`: itself, or on a host-mode Docker
    /// server the oldest live sandbox (the one whose execd holds port 44772).
    pub(crate) fn execd_target(&self, inner: &Inner, id: &str) -> Option<Arc<Guest>> {
        let c = self.host.config();
        if c.runtime == Runtime::Docker && c.network_mode == NetworkMode::Host {
            return inner.sandboxes.first().map(|s| s.guest.clone());
        }
        inner.find(id).map(|s| s.guest.clone())
    }

    /// One step of the clock: finishes due transitions and expires sandboxes. On Docker an
    /// expired sandbox is killed first and shows `Failed` (`CONTAINER_EXITED_ERROR`, exit 137)
    /// for [`Config::expiry_failed_ms`] before it is removed, as the real server's expiry
    /// (`container.kill()`, then `remove`) shows it in between; on Kubernetes it goes at once.
    pub(crate) fn tick(&self) {
        let now = Instant::now();
        let wall = OffsetDateTime::now_utc();
        let cfg = self.host.config().clone();
        let ready_ms = cfg.execd_ready_ms;
        let mut inner = self.lock();
        let mut removed: Vec<String> = Vec::new();
        for sb in &mut inner.sandboxes {
            if sb.transition_due.is_some_and(|t| t <= now) {
                sb.transition_due = None;
                match sb.state {
                    State::Pending => {
                        sb.set_state(State::Running, "POD_READY", "Pod is running.");
                        sb.guest
                            .not_ready_until(Some(now + Duration::from_millis(ready_ms)));
                    }
                    State::Pausing => {
                        // A Kubernetes pause commits the root file system and releases the pod:
                        // the processes (memory) are gone.
                        sb.guest.kill_all();
                        sb.set_state(State::Paused, "SANDBOX_PAUSED", "Sandbox is paused.");
                    }
                    State::Resuming => {
                        sb.guest.thaw();
                        sb.set_state(State::Running, "POD_READY", "Pod is running.");
                        sb.guest
                            .not_ready_until(Some(now + Duration::from_millis(ready_ms)));
                    }
                    State::Failed => removed.push(sb.id.clone()),
                    State::Running | State::Paused => {}
                }
            }
        }
        for snap in &mut inner.snapshots {
            if snap.state == SnapState::Creating && snap.ready_due <= now {
                snap.state = SnapState::Ready;
                snap.last_transition_at = wall;
            }
        }
        let linger = (cfg.runtime == Runtime::Docker && cfg.expiry_failed_ms > 0)
            .then(|| Duration::from_millis(cfg.expiry_failed_ms));
        for sb in &mut inner.sandboxes {
            if sb.state == State::Failed || sb.expires_at.is_none_or(|e| e > wall) {
                continue;
            }
            match linger {
                Some(linger) => {
                    // The container is killed: every command ends, the proxy finds no execd.
                    sb.guest.destroy();
                    sb.set_state(
                        State::Failed,
                        "CONTAINER_EXITED_ERROR",
                        "Sandbox container exited with code 137.",
                    );
                    sb.transition_due = Some(now + linger);
                }
                None => removed.push(sb.id.clone()),
            }
        }
        for id in removed {
            if inner.remove(&id).is_some() {
                inner.counters.expired += 1;
            }
        }
    }

    /// Kills every guest process and drops every sandbox and snapshot.
    pub(crate) fn drop_everything(&self) {
        let mut inner = self.lock();
        let ids: Vec<String> = inner.sandboxes.iter().map(|s| s.id.clone()).collect();
        for id in ids {
            inner.remove(&id);
        }
        for snap in inner.snapshots.drain(..) {
            let _ = std::fs::remove_dir_all(&snap.dir);
        }
    }
}
