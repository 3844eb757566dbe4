//! The lifecycle API's requests and answers (`/v1/sandboxes`, `/v1/snapshots`, network
//! policy, endpoints).
//!
//! Answers decode leniently: unknown enum values are kept in `Other`, absent or `null`
//! optional fields take their defaults, and unknown keys are kept in `extra`. Only an `id`
//! is required of a sandbox or a snapshot.

use std::collections::BTreeMap;
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use time::OffsetDateTime;

use crate::error::{Error, Result};
use crate::wire::{open_enum, or_default, parse_timestamp};

/// The shortest lifetime the server accepts (60 s).
pub const MIN_TIMEOUT: Duration = Duration::from_secs(60);
/// The lifetime a [`CreateSandbox`] gets unless told otherwise (10 minutes, as the SDK).
pub const DEFAULT_LIFETIME: Duration = Duration::from_secs(600);

open_enum! {
    /// The lifecycle state of a sandbox.
    SandboxState {
        /// Being provisioned (Kubernetes answers a create with it).
        Pending = "Pending",
        /// Running. execd may still be starting: poll `/ping`.
        Running = "Running",
        /// Pausing.
        Pausing = "Pausing",
        /// Paused (Docker: frozen, memory kept; Kubernetes: committed to a registry).
        Paused = "Paused",
        /// Resuming.
        Resuming = "Resuming",
        /// Being deleted.
        Stopping = "Stopping",
        /// Deleted or expired.
        Terminated = "Terminated",
        /// Failed.
        Failed = "Failed",
    }
}

open_enum! {
    /// The lifecycle state of a snapshot.
    SnapshotState {
        /// Being captured.
        Creating = "Creating",
        /// Usable to create sandboxes from.
        Ready = "Ready",
        /// Capture failed.
        Failed = "Failed",
        /// Being deleted.
        Deleting = "Deleting",
    }
}

open_enum! {
    /// What an egress rule (or a policy's default) does.
    PolicyAction {
        /// Let the traffic through.
        Allow = "allow",
        /// Block it.
        Deny = "deny",
    }
}

open_enum! {
    /// How the egress sidecar enforces its policy (`[egress] mode` of the server).
    EnforcementMode {
        /// Name resolution only: connections to IP addresses pass (the server's default).
        Dns = "dns",
        /// Name resolution and nftables at the address layer.
        DnsNft = "dns+nft",
    }
}

open_enum! {
    /// The sidecar's summary of its current policy.
    PolicyMode {
        /// Deny by default, no rules.
        DenyAll = "deny_all",
        /// Allow by default, no rules.
        AllowAll = "allow_all",
        /// A default plus rules.
        Enforcing = "enforcing",
    }
}

/// Where a new sandbox comes from.
#[derive(Debug, Clone)]
enum Source {
    Image {
        uri: String,
        auth: Option<(String, SecretString)>,
    },
    Snapshot(String),
}

/// How long a new sandbox lives before the server deletes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifetime {
    /// Deleted this long after creation (at least [`MIN_TIMEOUT`]; the server also has a
    /// maximum, `max_sandbox_timeout_seconds`). Sent in whole seconds, rounded up.
    After(Duration),
    /// Never expires: sent as `"timeout": null`. Only where the runtime supports it; such a
    /// sandbox leaks unless someone deletes it.
    ManualCleanup,
}

/// Target platform of a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Platform {
    /// `linux` or `windows`.
    #[serde(default, deserialize_with = "or_default")]
    pub os: String,
    /// `amd64` or `arm64`.
    #[serde(default, deserialize_with = "or_default")]
    pub arch: String,
}

/// One egress rule: an FQDN or `*.wildcard` and what to do with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkRule {
    /// Allow or deny.
    pub action: PolicyAction,
    /// `pypi.org`, `*.example.com`.
    #[serde(default, deserialize_with = "or_default")]
    pub target: String,
}

/// An egress policy: a default action and ordered rules.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkPolicy {
    /// What happens to traffic no rule matches (the sidecar's default, when absent, is deny).
    #[serde(rename = "defaultAction", default = "deny")]
    pub default_action: PolicyAction,
    /// Rules, first match wins.
    #[serde(default, deserialize_with = "or_default")]
    pub egress: Vec<NetworkRule>,
}

fn deny() -> PolicyAction {
    PolicyAction::Deny
}

impl NetworkPolicy {
    /// Deny everything; add [`NetworkPolicy::allow`] rules for what may pass.
    pub fn deny_all() -> Self {
        NetworkPolicy {
            default_action: PolicyAction::Deny,
            egress: Vec::new(),
        }
    }

    /// This policy with a rule allowing `target`.
    #[must_use]
    pub fn allow(mut self, target: impl Into<String>) -> Self {
        self.egress.push(NetworkRule {
            action: PolicyAction::Allow,
            target: target.into(),
        });
        self
    }

    /// This policy with a rule denying `target`.
    #[must_use]
    pub fn deny(mut self, target: impl Into<String>) -> Self {
        self.egress.push(NetworkRule {
            action: PolicyAction::Deny,
            target: target.into(),
        });
        self
    }
}

/// `POST /v1/sandboxes`: what to create. Build it with [`CreateSandbox::from_image`] or
/// [`CreateSandbox::from_snapshot`] and the setters.
///
/// Create is not idempotent (the server has no unique name): put a nonce in
/// [`CreateSandbox::metadata`] before sending, so a sandbox whose create answer was lost can
/// be found with [`crate::Client::find_by_metadata`] and adopted or deleted.
#[derive(Debug, Clone)]
pub struct CreateSandbox {
    source: Source,
    /// The entry process (`["tail", "-f", "/dev/null"]`); required with an image.
    pub entrypoint: Vec<String>,
    /// The lifetime (default [`DEFAULT_LIFETIME`]).
    pub lifetime: Lifetime,
    /// `resourceLimits`: `cpu` (`"500m"`), `memory` (`"512Mi"`), `gpu` ...
    pub resource_limits: BTreeMap<String, String>,
    /// Environment of the sandbox. For a value that is a secret use
    /// [`CreateSandbox::secret_env`].
    pub env: BTreeMap<String, String>,
    /// Environment values that are secrets: never in `Debug`, scrubbed from errors.
    secret_env: BTreeMap<String, SecretString>,
    /// Metadata: Kubernetes label rules apply (values up to 63 characters; the
    /// `opensandbox.io/` prefix is reserved).
    pub metadata: BTreeMap<String, String>,
    /// The egress policy; none means the server starts no sidecar (allow-all).
    pub network_policy: Option<NetworkPolicy>,
    /// Opaque `extensions` (`access.renew.extend.seconds`, `poolRef` ...).
    pub extensions: BTreeMap<String, String>,
    /// A platform constraint.
    pub platform: Option<Platform>,
}

impl CreateSandbox {
    /// A sandbox from a container image, running `entrypoint`.
    pub fn from_image<I, S>(uri: impl Into<String>, entrypoint: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::with_source(
            Source::Image {
                uri: uri.into(),
                auth: None,
            },
            entrypoint.into_iter().map(Into::into).collect(),
        )
    }

    /// A sandbox restored from a snapshot (disk only; it starts from its entrypoint).
    pub fn from_snapshot(snapshot_id: impl Into<String>) -> Self {
        Self::with_source(Source::Snapshot(snapshot_id.into()), Vec::new())
    }

    fn with_source(source: Source, entrypoint: Vec<String>) -> Self {
        CreateSandbox {
            source,
            entrypoint,
            lifetime: Lifetime::After(DEFAULT_LIFETIME),
            resource_limits: BTreeMap::new(),
            env: BTreeMap::new(),
            secret_env: BTreeMap::new(),
            metadata: BTreeMap::new(),
            network_policy: None,
            extensions: BTreeMap::new(),
            platform: None,
        }
    }

    /// Registry credentials for the image. The password is never shown in `Debug` or in an
    /// error, also when the server echoes the request body.
    #[must_use]
    pub fn image_auth(
        mut self,
        username: impl Into<String>,
        password: impl Into<SecretString>,
    ) -> Self {
        if let Source::Image { auth, .. } = &mut self.source {
            *auth = Some((username.into(), password.into()));
        }
        self
    }

    /// The lifetime.
    #[must_use]
    pub fn lifetime(mut self, lifetime: Lifetime) -> Self {
        self.lifetime = lifetime;
        self
    }

    /// The entrypoint.
    #[must_use]
    pub fn entrypoint<I: IntoIterator<Item = S>, S: Into<String>>(mut self, argv: I) -> Self {
        self.entrypoint = argv.into_iter().map(Into::into).collect();
        self
    }

    /// One resource limit (`cpu`, `memory`, `gpu` ...).
    #[must_use]
    pub fn resource(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.resource_limits.insert(name.into(), value.into());
        self
    }

    /// One environment variable.
    #[must_use]
    pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(name.into(), value.into());
        self
    }

    /// One environment variable whose value is a secret (a credential): it is sent like
    /// [`CreateSandbox::env`], but never shown in `Debug` and removed from the errors of the
    /// create, also when the server echoes the request.
    #[must_use]
    pub fn secret_env(mut self, name: impl Into<String>, value: impl Into<SecretString>) -> Self {
        self.secret_env.insert(name.into(), value.into());
        self
    }

    /// One metadata label.
    #[must_use]
    pub fn metadata(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.metadata.insert(key.into(), value.into());
        self
    }

    /// The egress policy.
    #[must_use]
    pub fn network_policy(mut self, policy: NetworkPolicy) -> Self {
        self.network_policy = Some(policy);
        self
    }

    /// One `extensions` entry.
    #[must_use]
    pub fn extension(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.extensions.insert(key.into(), value.into());
        self
    }

    /// A platform constraint.
    #[must_use]
    pub fn platform(mut self, os: impl Into<String>, arch: impl Into<String>) -> Self {
        self.platform = Some(Platform {
            os: os.into(),
            arch: arch.into(),
        });
        self
    }

    /// The request body, and the secrets it carries (to scrub from errors). Refuses what the
    /// server would refuse anyway, before anything is sent.
    pub(crate) fn to_wire(&self) -> Result<(Value, Vec<SecretString>)> {
        let mut body = Map::new();
        let mut secrets = Vec::new();
        match &self.source {
            Source::Image { uri, auth } => {
                if uri.trim().is_empty() {
                    return Err(Error::InvalidArgument("the image URI is empty".into()));
                }
                if self.entrypoint.is_empty() {
                    return Err(Error::InvalidArgument(
                        "a sandbox from an image needs an entrypoint".into(),
                    ));
                }
                let mut image = json!({ "uri": uri });
                if let Some((username, password)) = auth {
                    image["auth"] = json!({
                        "username": username,
                        "password": password.expose_secret(),
                    });
                    secrets.push(password.clone());
                }
                body.insert("image".into(), image);
            }
            Source::Snapshot(id) => {
                if id.trim().is_empty() {
                    return Err(Error::InvalidArgument("the snapshot id is empty".into()));
                }
                body.insert("snapshotId".into(), json!(id));
            }
        }
        if !self.entrypoint.is_empty() {
            body.insert("entrypoint".into(), json!(self.entrypoint));
        }
        let timeout = match self.lifetime {
            Lifetime::After(d) => {
                let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
                if secs < MIN_TIMEOUT.as_secs() {
                    return Err(Error::InvalidArgument(format!(
                        "a sandbox lifetime must be at least {} s (got {d:?})",
                        MIN_TIMEOUT.as_secs()
                    )));
                }
                json!(secs)
            }
            Lifetime::ManualCleanup => Value::Null,
        };
        body.insert("timeout".into(), timeout);
        let mut env = self.env.clone();
        for (name, value) in &self.secret_env {
            env.insert(name.clone(), value.expose_secret().to_owned());
            secrets.push(value.clone());
        }
        let maps = [
            ("resourceLimits", &self.resource_limits),
            ("env", &env),
            ("metadata", &self.metadata),
            ("extensions", &self.extensions),
        ];
        for (name, map) in maps {
            if !map.is_empty() {
                body.insert(name.into(), json!(map));
            }
        }
        if let Some(policy) = &self.network_policy {
            body.insert("networkPolicy".into(), json!(policy));
        }
        if let Some(platform) = &self.platform {
            body.insert("platform".into(), json!(platform));
        }
        Ok((Value::Object(body), secrets))
    }
}

/// The status of a sandbox.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
#[non_exhaustive]
pub struct SandboxStatus {
    /// The state.
    #[serde(deserialize_with = "or_default")]
    pub state: SandboxState,
    /// A machine-readable reason (`user_delete`, `ttl_expiry` ...).
    pub reason: Option<String>,
    /// A human message.
    pub message: Option<String>,
    /// When the state last changed (RFC 3339).
    pub last_transition_at: Option<String>,
}

impl Default for SandboxState {
    fn default() -> Self {
        SandboxState::Other(String::new())
    }
}

/// The image a sandbox was created from, as answered (credentials are never returned).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct ImageRef {
    /// The image URI.
    #[serde(deserialize_with = "or_default")]
    pub uri: String,
}

/// A sandbox as the lifecycle API answers it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct SandboxInfo {
    /// The id (checked on arrival: see [`crate::MAX_ID_BYTES`]).
    #[serde(deserialize_with = "crate::wire::server_id")]
    pub id: String,
    /// The status.
    #[serde(default, deserialize_with = "or_default")]
    pub status: SandboxStatus,
    /// The image (absent in a create answer and for snapshot restores).
    #[serde(default)]
    pub image: Option<ImageRef>,
    /// The snapshot restored from.
    #[serde(default)]
    pub snapshot_id: Option<String>,
    /// The platform constraint.
    #[serde(default)]
    pub platform: Option<Platform>,
    /// Metadata.
    #[serde(default, deserialize_with = "or_default")]
    pub metadata: BTreeMap<String, String>,
    /// The entry process.
    #[serde(default, deserialize_with = "or_default")]
    pub entrypoint: Vec<String>,
    /// When the server deletes it (RFC 3339); absent with manual cleanup.
    #[serde(default)]
    pub expires_at: Option<String>,
    /// When it was created (RFC 3339).
    #[serde(default)]
    pub created_at: Option<String>,
    /// Fields this client does not know.
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

impl SandboxInfo {
    /// [`SandboxInfo::created_at`] parsed (a timestamp without offset is read as UTC).
    pub fn created(&self) -> Option<OffsetDateTime> {
        self.created_at.as_deref().and_then(parse_timestamp)
    }

    /// [`SandboxInfo::expires_at`] parsed.
    pub fn expires(&self) -> Option<OffsetDateTime> {
        self.expires_at.as_deref().and_then(parse_timestamp)
    }

    /// The state.
    pub fn state(&self) -> &SandboxState {
        &self.status.state
    }
}

/// Paging of a list answer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
#[non_exhaustive]
pub struct Pagination {
    /// This page (1-based).
    #[serde(deserialize_with = "or_default")]
    pub page: u32,
    /// Items per page.
    #[serde(deserialize_with = "or_default")]
    pub page_size: u32,
    /// Items matching the filter.
    #[serde(deserialize_with = "or_default")]
    pub total_items: u64,
    /// Pages.
    #[serde(deserialize_with = "or_default")]
    pub total_pages: u32,
    /// Whether a later page exists.
    #[serde(deserialize_with = "or_default")]
    pub has_next_page: bool,
}

/// One page of `GET /v1/sandboxes`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct SandboxPage {
    /// The sandboxes.
    #[serde(deserialize_with = "or_default")]
    pub items: Vec<SandboxInfo>,
    /// Paging.
    #[serde(deserialize_with = "or_default")]
    pub pagination: Pagination,
}

/// A filter of `GET /v1/sandboxes`: every metadata pair must match (AND); any of the states
/// may (OR).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxFilter {
    /// States, any of which may match; empty: every state.
    pub states: Vec<SandboxState>,
    /// Metadata pairs, all of which must match.
    pub metadata: BTreeMap<String, String>,
    /// Items per page (the server allows 1 to 200; default 20).
    pub page_size: Option<u32>,
}

impl SandboxFilter {
    /// Sandboxes whose metadata has `key` = `value`.
    pub fn metadata(key: impl Into<String>, value: impl Into<String>) -> Self {
        SandboxFilter::default().and_metadata(key, value)
    }

    /// This filter, also requiring `key` = `value`.
    #[must_use]
    pub fn and_metadata(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.metadata.insert(key.into(), value.into());
        self
    }

    /// This filter, also accepting `state`.
    #[must_use]
    pub fn state(mut self, state: SandboxState) -> Self {
        self.states.push(state);
        self
    }

    /// The query of page `page`: `state` repeated, `metadata` as one value holding the
    /// URL-encoded `k=v&k2=v2` (encoded again as a query value), `page`, `pageSize`.
    pub(crate) fn query(&self, page: u32) -> Vec<(&'static str, String)> {
        let mut q: Vec<(&'static str, String)> = self
            .states
            .iter()
            .map(|s| ("state", s.as_str().to_owned()))
            .collect();
        if !self.metadata.is_empty() {
            let pairs = url::form_urlencoded::Serializer::new(String::new())
                .extend_pairs(&self.metadata)
                .finish();
            q.push(("metadata", pairs));
        }
        q.push(("page", page.to_string()));
        if let Some(size) = self.page_size {
            q.push(("pageSize", size.to_string()));
        }
        q
    }
}

/// What a delete found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deletion {
    /// The server deleted it now.
    Deleted,
    /// The server answered 404: it was already gone (deleted, expired, or deleted by an
    /// earlier attempt whose answer was lost).
    AlreadyGone,
}

/// The outcome of [`crate::Client::renew_expiration`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Renewal {
    /// The expiry sent (after clamping), RFC 3339 in UTC.
    pub requested: String,
    /// Whether the caller's wish was cut down to its maximum.
    pub clamped: bool,
    /// The expiry the server answered.
    pub expires_at: String,
}

/// The status of a snapshot.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
#[non_exhaustive]
pub struct SnapshotStatus {
    /// The state.
    #[serde(deserialize_with = "or_default")]
    pub state: SnapshotState,
    /// A machine-readable reason.
    pub reason: Option<String>,
    /// A human message.
    pub message: Option<String>,
    /// When the state last changed.
    pub last_transition_at: Option<String>,
}

impl Default for SnapshotState {
    fn default() -> Self {
        SnapshotState::Other(String::new())
    }
}

/// A snapshot (a disk capture of a sandbox; no memory or processes).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct Snapshot {
    /// The id (pass it to [`CreateSandbox::from_snapshot`]; checked on arrival: see
    /// [`crate::wire::MAX_ID_BYTES`]).
    #[serde(deserialize_with = "crate::wire::server_id")]
    pub id: String,
    /// The sandbox captured.
    #[serde(default, deserialize_with = "or_default")]
    pub sandbox_id: String,
    /// The name given at creation.
    #[serde(default)]
    pub name: Option<String>,
    /// The status.
    #[serde(default, deserialize_with = "or_default")]
    pub status: SnapshotStatus,
    /// When it was created.
    #[serde(default)]
    pub created_at: Option<String>,
    /// Fields this client does not know.
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

/// One page of `GET /v1/snapshots`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct SnapshotPage {
    /// The snapshots.
    #[serde(deserialize_with = "or_default")]
    pub items: Vec<Snapshot>,
    /// Paging.
    #[serde(deserialize_with = "or_default")]
    pub pagination: Pagination,
}

/// A filter of `GET /v1/snapshots`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SnapshotFilter {
    /// Only snapshots of this sandbox.
    pub sandbox_id: Option<String>,
    /// States, any of which may match.
    pub states: Vec<SnapshotState>,
    /// The page (1-based; default 1).
    pub page: Option<u32>,
    /// Items per page.
    pub page_size: Option<u32>,
}

/// `GET /v1/sandboxes/{id}/networkpolicy`: what the egress sidecar enforces, as it says.
/// `enforcement_mode` is kept (the official SDK drops it): only [`EnforcementMode::DnsNft`]
/// blocks connections to IP addresses.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
#[non_exhaustive]
pub struct PolicyStatus {
    /// The sidecar's status word (`ok`).
    pub status: Option<String>,
    /// Its summary of the policy.
    #[serde(deserialize_with = "or_default")]
    pub mode: PolicyMode,
    /// How it enforces it.
    #[serde(deserialize_with = "or_default")]
    pub enforcement_mode: EnforcementMode,
    /// Extra context.
    pub reason: Option<String>,
    /// The policy itself.
    pub policy: Option<NetworkPolicy>,
    /// Fields this client does not know.
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

impl Default for PolicyMode {
    fn default() -> Self {
        PolicyMode::Other(String::new())
    }
}

impl Default for EnforcementMode {
    fn default() -> Self {
        EnforcementMode::Other(String::new())
    }
}

/// `GET /v1/sandboxes/{id}/endpoints/{port}`: where a port of the sandbox is reachable, and
/// the headers a request to it must carry. `Debug` shows the header names only (a secured
/// endpoint's header is a credential).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Endpoint {
    /// `host:port[/path]`, usually without a scheme.
    #[serde(default, deserialize_with = "or_default")]
    pub endpoint: String,
    /// Headers to send.
    #[serde(default, deserialize_with = "or_default")]
    pub headers: BTreeMap<String, String>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("endpoint", &self.endpoint)
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_bodies_carry_every_field_in_wire_spelling() {
        let req = CreateSandbox::from_image("python:3.11", ["tail", "-f", "/dev/null"])
            .image_auth("bot", "hunter2-registry")
            .lifetime(Lifetime::After(Duration::from_millis(90_500)))
            .resource("cpu", "500m")
            .resource("memory", "512Mi")
            .env("A", "1")
            .secret_env("GATEWAY_TOKEN", "gw-secret-token-1")
            .metadata("created-by", "langflow")
            .network_policy(NetworkPolicy::deny_all().allow("pypi.org"))
            .extension("access.renew.extend.seconds", "300")
            .platform("linux", "amd64");
        let (body, secrets) = req.to_wire().unwrap();
        assert_eq!(
            body,
            json!({
                "image": {"uri": "python:3.11", "auth": {"username": "bot", "password": "hunter2-registry"}},
                "entrypoint": ["tail", "-f", "/dev/null"],
                "timeout": 91,
                "resourceLimits": {"cpu": "500m", "memory": "512Mi"},
                "env": {"A": "1", "GATEWAY_TOKEN": "gw-secret-token-1"},
                "metadata": {"created-by": "langflow"},
                "networkPolicy": {"defaultAction": "deny", "egress": [{"action": "allow", "target": "pypi.org"}]},
                "extensions": {"access.renew.extend.seconds": "300"},
                "platform": {"os": "linux", "arch": "amd64"},
            })
        );
        assert_eq!(secrets.len(), 2);
        let shown = format!("{req:?}");
        assert!(
            !shown.contains("hunter2") && !shown.contains("gw-secret"),
            "{shown}"
        );
    }

    #[test]
    fn refused_before_sending() {
        let short = CreateSandbox::from_image("img", ["sh"])
            .lifetime(Lifetime::After(Duration::from_secs(59)));
        assert!(short.to_wire().is_err());
        assert!(
            CreateSandbox::from_image("img", Vec::<String>::new())
                .to_wire()
                .is_err()
        );
        let (body, _) = CreateSandbox::from_snapshot("snap-1")
            .lifetime(Lifetime::ManualCleanup)
            .to_wire()
            .unwrap();
        assert_eq!(body, json!({"snapshotId": "snap-1", "timeout": null}));
    }

    #[test]
    fn metadata_filters_are_encoded_twice() {
        let f = SandboxFilter::metadata("created-by", "langflow")
            .and_metadata("note", "a b&c")
            .state(SandboxState::Running)
            .state(SandboxState::Paused);
        let q = f.query(2);
        assert_eq!(
            q,
            vec![
                ("state", "Running".to_owned()),
                ("state", "Paused".to_owned()),
                ("metadata", "created-by=langflow&note=a+b%26c".to_owned()),
                ("page", "2".to_owned()),
            ]
        );
    }

    #[test]
    fn answers_decode_leniently() {
        let s: SandboxInfo = serde_json::from_value(json!({
            "id": "sb-1",
            "status": {"state": "Hibernating", "reason": null},
            "metadata": null,
            "entrypoint": null,
            "createdAt": "2026-12-04T10:00:00Z",
            "newField": {"x": 1}
        }))
        .unwrap();
        assert_eq!(s.status.state, SandboxState::Other("Hibernating".into()));
        assert!(s.metadata.is_empty());
        assert_eq!(s.extra["newField"], json!({"x": 1}));
        assert!(s.created().is_some());
        assert!(serde_json::from_value::<SandboxInfo>(json!({"status": {}})).is_err());

        let p: PolicyStatus = serde_json::from_value(json!({
            "status": "ok", "mode": "deny_all", "enforcementMode": "dns+nft",
            "policy": {"defaultAction": "deny", "egress": [{"action": "allow", "target": "pypi.org"}]}
        }))
        .unwrap();
        assert_eq!(p.enforcement_mode, EnforcementMode::DnsNft);
        assert_eq!(p.mode, PolicyMode::DenyAll);
        assert_eq!(p.policy, Some(NetworkPolicy::deny_all().allow("pypi.org")));
        let p: PolicyStatus = serde_json::from_value(json!({"enforcementMode": "ebpf"})).unwrap();
        assert_eq!(p.enforcement_mode, EnforcementMode::Other("ebpf".into()));
        assert_eq!(p.policy, None);
    }

    #[test]
    fn endpoint_debug_hides_header_values() {
        let e = Endpoint {
            endpoint: "gw/sandboxes/x/port/80".into(),
            headers: BTreeMap::from([("X-Access".to_owned(), "tok-secret-1".to_owned())]),
        };
        let shown = format!("{e:?}");
        assert!(shown.contains("X-Access") && !shown.contains("tok-secret-1"));
    }
}
