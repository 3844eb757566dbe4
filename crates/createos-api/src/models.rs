//! Request and response models for the account and sandbox endpoints.
//!
//! Decoding is lenient: unknown enum values land in an `Unknown(String)` variant, absent or
//! `null` optional fields take their default, and unknown keys are kept in `extra` where the
//! type has one. Serialization of requests leaves out empty values exactly as the contract says.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

use crate::wire_enum::{lenient_enum, nullable};

lenient_enum! {
    /// Lifecycle status of a sandbox.
    pub enum SandboxStatus {
        /// Being created.
        Creating => "creating",
        /// Running.
        Running => "running",
        /// Being snapshotted and paused.
        Pausing => "pausing",
        /// Paused (snapshot held).
        Paused => "paused",
        /// Being resumed from its snapshot.
        Resuming => "resuming",
        /// Being forked.
        Forking => "forking",
        /// Errored.
        Error => "error",
        /// Being destroyed (the name stays taken until `destroyed`).
        Destroying => "destroying",
        /// Destroyed.
        Destroyed => "destroyed",
        /// Failed.
        Failed => "failed",
    }
}

impl SandboxStatus {
    /// `creating`, `pausing`, `resuming`, `forking` or `destroying`.
    pub fn is_transitional(&self) -> bool {
        matches!(
            self,
            Self::Creating | Self::Pausing | Self::Resuming | Self::Forking | Self::Destroying
        )
    }

    /// `destroyed`, `failed` or `error`: nothing more will happen to the sandbox.
    pub fn is_terminal(&self) -> bool {
        matches!(self, Self::Destroyed | Self::Failed | Self::Error)
    }
}

/// `GET /healthz`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct Health {
    /// Whether the control plane is up.
    #[serde(deserialize_with = "nullable")]
    pub up: bool,
}

/// `GET /readyz`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct Readiness {
    /// Whether the scheduler is ready (`true` iff HTTP 200 when the body is not JSend).
    #[serde(deserialize_with = "nullable")]
    pub ready: bool,
    /// Why not, when not ready.
    #[serde(deserialize_with = "nullable")]
    pub reason: String,
    /// Milliseconds since the scheduler last reported healthy.
    pub scheduler_last_ok_ms_ago: Option<u64>,
    /// The HTTP status of the readiness answer.
    #[serde(skip)]
    pub http_status: u16,
}

/// Per-account sandbox counts in [`WhoAmI`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct SandboxStats {
    /// Running sandboxes.
    #[serde(deserialize_with = "nullable")]
    pub running: u64,
    /// Paused sandboxes.
    #[serde(deserialize_with = "nullable")]
    pub paused: u64,
    /// Sandboxes in any other state.
    #[serde(deserialize_with = "nullable")]
    pub other: u64,
    /// All non-destroyed sandboxes.
    #[serde(deserialize_with = "nullable")]
    pub total: u64,
}

/// `GET /v1/whoami`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct WhoAmI {
    /// The account's user id.
    #[serde(deserialize_with = "nullable")]
    pub user_id: String,
    /// Sandbox counts.
    #[serde(deserialize_with = "nullable")]
    pub stats: SandboxStats,
}

/// One row of `GET /v1/shapes`: a fixed vCPU + memory combination.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct Shape {
    /// Shape id, e.g. `s-2vcpu-4gb`.
    #[serde(deserialize_with = "nullable")]
    pub id: String,
    /// Virtual CPUs.
    #[serde(deserialize_with = "nullable")]
    pub vcpu: u32,
    /// Memory in MiB.
    #[serde(deserialize_with = "nullable")]
    pub mem_mib: u64,
    /// Disk used when create omits `disk_mib`.
    #[serde(deserialize_with = "nullable")]
    pub default_disk_mib: u64,
    /// CPU quota as a percentage of one CPU, when the server states one.
    pub cpu_quota_pct: Option<f64>,
}

/// One entry of the rootfs catalog.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct RootFsEntry {
    /// Catalog name, e.g. `devbox:1`.
    #[serde(deserialize_with = "nullable")]
    pub name: String,
    /// Description.
    pub description: Option<String>,
    /// Whether it is deprecated.
    #[serde(deserialize_with = "nullable")]
    pub deprecated: bool,
    /// The replacement of a deprecated entry.
    pub successor: Option<String>,
}

/// `GET /v1/rootfs`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct RootFsCatalog {
    /// Available names.
    #[serde(deserialize_with = "nullable")]
    pub rootfs: Vec<String>,
    /// The server default.
    #[serde(deserialize_with = "nullable")]
    pub default: String,
    /// Detailed entries.
    #[serde(deserialize_with = "nullable")]
    pub entries: Vec<RootFsEntry>,
}

/// Environment variable names of a sandbox projection: accepted as a list of names or,
/// leniently, as a map (only its keys are kept; values are never returned by the server).
fn env_names<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    Ok(match Option::<Value>::deserialize(d)? {
        Some(Value::Array(items)) => items
            .into_iter()
            .filter_map(|v| match v {
                Value::String(s) => Some(s),
                _ => None,
            })
            .collect(),
        Some(Value::Object(map)) => map.into_iter().map(|(k, _)| k).collect(),
        _ => Vec::new(),
    })
}

/// The server's projection of a sandbox (GET, list, PATCH, pause, resume, fork, create).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SandboxInfo {
    /// Sandbox id (required).
    pub id: String,
    /// Lifecycle status (required: an absent key fails; `null` reads as `Unknown("")`).
    #[serde(deserialize_with = "SandboxStatus::deserialize")]
    pub status: SandboxStatus,
    /// Name, when one was given.
    #[serde(default)]
    pub name: Option<String>,
    /// Private IP (absent while `creating`).
    #[serde(default)]
    pub ip: Option<String>,
    /// Virtual CPUs.
    #[serde(default)]
    pub vcpu: Option<u32>,
    /// Memory in MiB.
    #[serde(default)]
    pub mem_mib: Option<u64>,
    /// Overlay disk size in MiB.
    #[serde(default)]
    pub disk_mib: Option<u64>,
    /// Shape id.
    #[serde(default)]
    pub shape: Option<String>,
    /// Root filesystem (catalog name or template id).
    #[serde(default)]
    pub rootfs: Option<String>,
    /// Region.
    #[serde(default)]
    pub region: Option<String>,
    /// Creator.
    #[serde(default)]
    pub created_by: Option<String>,
    /// RFC 3339 creation time.
    #[serde(default)]
    pub created_at: Option<String>,
    /// RFC 3339 time it first ran.
    #[serde(default)]
    pub running_at: Option<String>,
    /// RFC 3339 time it was paused.
    #[serde(default)]
    pub paused_at: Option<String>,
    /// RFC 3339 time it was last resumed.
    #[serde(default)]
    pub last_resumed_at: Option<String>,
    /// RFC 3339 time it was destroyed.
    #[serde(default)]
    pub destroyed_at: Option<String>,
    /// Boot time in milliseconds.
    #[serde(default)]
    pub spawn_ms: Option<f64>,
    /// Whether public ingress is enabled.
    #[serde(default, deserialize_with = "nullable")]
    pub ingress_enabled: bool,
    /// Preview URL template containing the literal `<port>`.
    #[serde(default)]
    pub ingress_url_template: Option<String>,
    /// Egress allowlist; absent or empty means allow-all.
    #[serde(default)]
    pub egress: Option<Vec<String>>,
    /// Names of the persistent environment variables (values are never returned).
    #[serde(default, deserialize_with = "env_names")]
    pub envs: Vec<String>,
    /// Authorized SSH public keys.
    #[serde(default, deserialize_with = "nullable")]
    pub ssh_pubkeys: Vec<String>,
    /// Ingress bytes observed.
    #[serde(default)]
    pub bandwidth_ingress_bytes: Option<u64>,
    /// Egress quota in bytes (-1 = unmetered).
    #[serde(default)]
    pub bandwidth_quota_bytes: Option<i64>,
    /// Source sandbox of a fork.
    #[serde(default)]
    pub forked_from: Option<String>,
    /// Idle seconds before auto-pause; `None` = disabled.
    #[serde(default)]
    pub auto_pause_after_seconds: Option<u64>,
    /// Keys this client version does not model.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl SandboxInfo {
    /// A projection that only knows its id (status `Unknown("")`).
    pub fn unfetched(id: impl Into<String>) -> Self {
        SandboxInfo {
            id: id.into(),
            status: SandboxStatus::Unknown(String::new()),
            name: None,
            ip: None,
            vcpu: None,
            mem_mib: None,
            disk_mib: None,
            shape: None,
            rootfs: None,
            region: None,
            created_by: None,
            created_at: None,
            running_at: None,
            paused_at: None,
            last_resumed_at: None,
            destroyed_at: None,
            spawn_ms: None,
            ingress_enabled: false,
            ingress_url_template: None,
            egress: None,
            envs: Vec::new(),
            ssh_pubkeys: Vec::new(),
            bandwidth_ingress_bytes: None,
            bandwidth_quota_bytes: None,
            forked_from: None,
            auto_pause_after_seconds: None,
            extra: Map::new(),
        }
    }
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
fn is_false(b: &bool) -> bool {
    !*b
}
#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A network to join at create time.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkRef {
    /// Network id.
    pub id: String,
}

/// A disk to mount at create time.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskMountRequest {
    /// Disk id or name.
    pub disk_id: String,
    /// Absolute mount path in the guest.
    pub mount_path: String,
    /// Sub-path inside the bucket (omitted when empty).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sub_path: String,
}

/// `POST /v1/sandboxes` body. Empty, zero and false fields are left out of the JSON.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CreateSandboxRequest {
    /// Shape id (always sent).
    pub shape: String,
    /// Catalog rootfs name or template id; empty = server default.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub rootfs: String,
    /// Name (at most 22 characters, unique among non-terminal sandboxes).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Overlay networks to join.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub networks: Vec<NetworkRef>,
    /// Overlay disk size in MiB; 0 = shape default.
    #[serde(skip_serializing_if = "is_zero")]
    pub disk_mib: u64,
    /// Egress allowlist (`["240.0.0.0/4"]` denies everything routable).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<String>,
    /// Persistent environment; must declare every key a later exec uses.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub envs: BTreeMap<String, String>,
    /// SSH public keys.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ssh_pubkeys: Vec<String>,
    /// Pin to a host.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub host_id: String,
    /// Placement labels.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Enable public ingress.
    #[serde(skip_serializing_if = "is_false")]
    pub ingress_enabled: bool,
    /// Disks to mount.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub disks: Vec<DiskMountRequest>,
    /// Region (must equal the server's).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub region: String,
    /// Idle seconds before auto-pause (minimum 60); 0 = not set.
    #[serde(skip_serializing_if = "is_zero")]
    pub auto_pause_after_seconds: u64,
}

impl CreateSandboxRequest {
    /// A request for `shape` with every other field at its default.
    pub fn new(shape: impl Into<String>) -> Self {
        Self {
            shape: shape.into(),
            ..Self::default()
        }
    }

    /// Set the rootfs.
    #[must_use]
    pub fn rootfs(mut self, rootfs: impl Into<String>) -> Self {
        self.rootfs = rootfs.into();
        self
    }

    /// Set the name.
    #[must_use]
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Enable or disable ingress.
    #[must_use]
    pub fn ingress_enabled(mut self, enabled: bool) -> Self {
        self.ingress_enabled = enabled;
        self
    }

    /// Set the egress allowlist.
    #[must_use]
    pub fn egress<I: IntoIterator<Item = S>, S: Into<String>>(mut self, rules: I) -> Self {
        self.egress = rules.into_iter().map(Into::into).collect();
        self
    }

    /// Add a persistent environment variable.
    #[must_use]
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.envs.insert(key.into(), value.into());
        self
    }

    /// Set the auto-pause window in seconds.
    #[must_use]
    pub fn auto_pause_after_seconds(mut self, secs: u64) -> Self {
        self.auto_pause_after_seconds = secs;
        self
    }

    /// Set the disk size in MiB.
    #[must_use]
    pub fn disk_mib(mut self, mib: u64) -> Self {
        self.disk_mib = mib;
        self
    }
}

/// `POST /v1/sandboxes/{id}/fork` body. `None` fields are left out; an explicit
/// `Some(false)` is sent as `false`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ForkSandboxRequest {
    /// Keep the fork paused (omitted when false).
    #[serde(skip_serializing_if = "is_false")]
    pub start_paused: bool,
    /// Replace the SSH keys.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ssh_pubkeys: Option<Vec<String>>,
    /// Replace the egress allowlist.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub egress: Option<Vec<String>>,
    /// Set ingress on the fork.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ingress_enabled: Option<bool>,
    /// Replace the persistent environment.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub envs: Option<BTreeMap<String, String>>,
    /// Egress quota for the fork.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bandwidth_quota_bytes: Option<i64>,
}

impl ForkSandboxRequest {
    /// A fork request with `start_paused` set.
    pub fn start_paused(start_paused: bool) -> Self {
        Self {
            start_paused,
            ..Self::default()
        }
    }

    /// Set ingress on the fork.
    #[must_use]
    pub fn with_ingress(mut self, enabled: bool) -> Self {
        self.ingress_enabled = Some(enabled);
        self
    }
}

/// Options of `Client::list_sandboxes`.
#[derive(Debug, Clone, Default)]
pub struct ListSandboxesOptions {
    /// Only sandboxes in this status.
    pub status: Option<SandboxStatus>,
    /// Page size (default 100, at most 500). The stream still walks every page.
    pub limit: Option<u32>,
    /// First row to return.
    pub offset: Option<u32>,
    /// Per-request options applied to every page.
    pub request: crate::RequestOptions,
}

impl ListSandboxesOptions {
    /// Only sandboxes in `status`.
    pub fn status(status: SandboxStatus) -> Self {
        Self {
            status: Some(status),
            ..Self::default()
        }
    }
}

/// Limit/offset options for list endpoints.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PaginationOptions {
    /// Page size (default 100, at most 500).
    pub limit: Option<u32>,
    /// First row.
    pub offset: Option<u32>,
}

impl PaginationOptions {
    /// The query pairs (`limit`, `offset`) for [`crate::transport::paginate`].
    #[allow(dead_code)] // used by extension modules
    pub(crate) fn query(self) -> Vec<(&'static str, String)> {
        let mut q = Vec::new();
        if let Some(l) = self.limit {
            q.push(("limit", l.to_string()));
        }
        if let Some(o) = self.offset {
            q.push(("offset", o.to_string()));
        }
        q
    }
}

/// `GET/POST …/bandwidth`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct Bandwidth {
    /// Sandbox id.
    #[serde(deserialize_with = "nullable")]
    pub id: String,
    /// Quota in bytes (-1 = unmetered).
    #[serde(deserialize_with = "nullable")]
    pub quota_bytes: i64,
    /// Egress bytes used.
    #[serde(deserialize_with = "nullable")]
    pub used_bytes: i64,
    /// Ingress bytes observed (never enforced).
    #[serde(deserialize_with = "nullable")]
    pub ingress_bytes: i64,
    /// Bytes left.
    #[serde(deserialize_with = "nullable")]
    pub remaining_bytes: i64,
    /// Whether egress is capped now.
    #[serde(deserialize_with = "nullable")]
    pub capped: bool,
}

/// `POST …/resize` answer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct ResizeResult {
    /// Sandbox id.
    #[serde(deserialize_with = "nullable")]
    pub id: String,
    /// New disk size in MiB.
    #[serde(deserialize_with = "nullable")]
    pub disk_mib: u64,
}
