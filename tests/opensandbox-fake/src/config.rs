//! The server modes a test can choose at start or change later (`POST /_fake/config`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Which runtime the fake server plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Runtime {
    /// `runtime.type = "docker"`: create answers `Running` at once; error codes `DOCKER::...`.
    #[default]
    Docker,
    /// `runtime.type = "kubernetes"`: create answers `Pending`, `Running` after
    /// [`Config::pending_ms`]; inspect prints `Runtime Class:`; error codes `KUBERNETES::...`.
    Kubernetes,
}

/// Docker's `network_mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum NetworkMode {
    /// Each sandbox has its own endpoints; `networkPolicy` is accepted.
    #[default]
    Bridge,
    /// Every sandbox's endpoint is `127.0.0.1:<port>`, `networkPolicy` is refused (400) and
    /// execd traffic for any sandbox reaches the oldest live sandbox (the one holding port
    /// 44772), as on a real host-mode server.
    Host,
}

/// The server's `[egress] mode`, which the sidecar reports as `enforcementMode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum EgressMode {
    /// `dns`: the server default (name resolution filtered only).
    #[serde(rename = "dns")]
    Dns,
    /// `dns+nft`: address-layer enforcement as well.
    #[default]
    #[serde(rename = "dns+nft")]
    DnsNft,
    /// No `[egress] image` configured: a create carrying `networkPolicy` is a 400.
    #[serde(rename = "none")]
    None,
}

impl EgressMode {
    /// The `enforcementMode` string.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Dns => "dns",
            Self::DnsNft => "dns+nft",
            Self::None => "none",
        }
    }
}

/// How the sidecar's read-back differs from the policy it was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyDrift {
    /// It reads back what was sent.
    #[default]
    None,
    /// `defaultAction` reads back `allow`.
    DefaultAllow,
    /// An extra `{"action": "allow", "target": "*"}` rule is reported.
    ExtraRule,
    /// The rules are reported empty.
    DropRules,
}

/// The server's `[secure_runtime] type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum SecureRuntime {
    /// runc: guests see the host's kernel.
    #[default]
    None,
    /// gVisor: `networkPolicy` refused (400); `uname -r` in a guest prints `4.4.0` and `dmesg`
    /// starts with `Starting gVisor...` (a PATH shim).
    Gvisor,
    /// Kata: `uname -r` prints [`Config::guest_kernel`].
    Kata,
    /// Kata with Firecracker (Kubernetes only): like `kata`.
    Firecracker,
}

impl SecureRuntime {
    /// The default Kubernetes `RuntimeClass` of this secure runtime (`None` for runc).
    pub fn default_runtime_class(self) -> Option<&'static str> {
        match self {
            Self::None => None,
            Self::Gvisor => Some("gvisor"),
            Self::Kata => Some("kata-qemu"),
            Self::Firecracker => Some("kata-fc"),
        }
    }
}

/// How command output is cut into `stdout`/`stderr` frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum OutputFraming {
    /// One frame per line without its terminator, a blank line as `"\n"` (execd's log tailer).
    #[default]
    Lines,
    /// Raw chunks carrying their own line endings (the newer form the SDK also accepts).
    Chunks,
}

/// Everything about the simulated server that a test may change while it runs. Every field has
/// a command-line flag of the same name (`--network-mode host`, `--pending-ms 500`, ...) and can
/// be set by `POST /_fake/config` with a JSON object holding any subset of the fields.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Docker or Kubernetes.
    pub runtime: Runtime,
    /// Docker's network mode (ignored on Kubernetes).
    pub network_mode: NetworkMode,
    /// `[egress] mode` (or `none`: no egress image configured).
    pub egress_mode: EgressMode,
    /// Sandboxes created with a `networkPolicy` get no running sidecar: `/networkpolicy` answers
    /// 502 `BACKEND_CONNECTION_FAILED`, as for a sandbox created without one.
    pub sidecar_absent: bool,
    /// How the sidecar's read-back differs from the policy it holds.
    pub policy_drift: PolicyDrift,
    /// `[secure_runtime] type`.
    pub secure_runtime: SecureRuntime,
    /// The `RuntimeClass` printed by inspect on Kubernetes (default: the secure runtime's).
    pub runtime_class: Option<String>,
    /// The kernel release `uname -r` reports in Kata/Firecracker guests.
    pub guest_kernel: String,
    /// `server.max_sandbox_timeout_seconds` (a larger `timeout` is a 400; 0: no maximum).
    pub max_timeout_seconds: u64,
    /// Kubernetes: milliseconds a sandbox stays `Pending` (and `Pausing`/`Resuming`).
    pub pending_ms: u64,
    /// Milliseconds after `Running` during which execd does not answer (the proxy says 502).
    pub execd_ready_ms: u64,
    /// execd's keep-alive `ping` frame period in milliseconds.
    pub ping_ms: u64,
    /// How long the server proxy waits for a frozen (paused) sandbox before 504 (milliseconds).
    pub proxy_timeout_ms: u64,
    /// Milliseconds a snapshot stays `Creating` before `Ready`.
    pub snapshot_ms: u64,
    /// Docker: milliseconds an expired sandbox shows `Failed` (`CONTAINER_EXITED_ERROR`, exit
    /// 137: the server kills the container, then removes it) before it is gone (404). 0:
    /// gone at once. Kubernetes sandboxes are always gone at once.
    pub expiry_failed_ms: u64,
    /// How command output is framed.
    pub output_framing: OutputFraming,
    /// The images the server holds or can pull ([`DEFAULT_IMAGES`] by default; `"*"` accepts
    /// any). Creating from another image fails as on a server whose registry does not have
    /// it: Docker answers 500 `DOCKER::SANDBOX_IMAGE_PULL_FAILED`, Kubernetes 500
    /// `KUBERNETES::POD_FAILED` (`... primary reason=ErrImagePull ...`); nothing is created.
    pub images: Vec<String>,
}

/// The images a default fake holds: the OpenSandbox provider's default image.
pub const DEFAULT_IMAGES: &[&str] = &["python:3.12-slim"];

impl Default for Config {
    fn default() -> Self {
        Self {
            runtime: Runtime::Docker,
            network_mode: NetworkMode::Bridge,
            egress_mode: EgressMode::DnsNft,
            sidecar_absent: false,
            policy_drift: PolicyDrift::None,
            secure_runtime: SecureRuntime::None,
            runtime_class: None,
            guest_kernel: "6.1.62-kata".to_owned(),
            max_timeout_seconds: 3600,
            pending_ms: 1000,
            execd_ready_ms: 0,
            ping_ms: 3000,
            proxy_timeout_ms: 180_000,
            snapshot_ms: 200,
            expiry_failed_ms: 300,
            output_framing: OutputFraming::Lines,
            images: DEFAULT_IMAGES.iter().map(|i| (*i).to_owned()).collect(),
        }
    }
}

impl Config {
    /// Refuses combinations the real server refuses to start with.
    pub fn validate(&self) -> Result<(), String> {
        if self.secure_runtime == SecureRuntime::Firecracker && self.runtime != Runtime::Kubernetes
        {
            return Err(
                "secure_runtime firecracker is Kubernetes-only (set --runtime kubernetes)".into(),
            );
        }
        if self.ping_ms == 0 {
            return Err("ping_ms must be at least 1".into());
        }
        Ok(())
    }

    /// The `RuntimeClass` a Kubernetes pod gets (`None`: no `Runtime Class:` line).
    pub fn effective_runtime_class(&self) -> Option<String> {
        self.runtime_class.clone().or_else(|| {
            self.secure_runtime
                .default_runtime_class()
                .map(str::to_owned)
        })
    }

    /// This configuration with the fields of the JSON object `patch` replaced (the rest kept).
    pub fn merged(&self, patch: &serde_json::Value) -> Result<Config, String> {
        let serde_json::Value::Object(patch) = patch else {
            return Err("the configuration must be a JSON object".into());
        };
        let mut current = serde_json::to_value(self).map_err(|e| e.to_string())?;
        if let serde_json::Value::Object(fields) = &mut current {
            for (k, v) in patch {
                if !fields.contains_key(k) {
                    return Err(format!("unknown configuration field {k:?}"));
                }
                fields.insert(k.clone(), v.clone());
            }
        }
        let merged: Config = serde_json::from_value(current).map_err(|e| e.to_string())?;
        merged.validate()?;
        Ok(merged)
    }

    /// [`Config::ping_ms`] as a duration.
    pub fn ping(&self) -> Duration {
        Duration::from_millis(self.ping_ms.max(1))
    }

    /// Whether the server holds (or can pull) `image`.
    pub fn holds_image(&self, image: &str) -> bool {
        self.images.iter().any(|i| i == "*" || i == image)
    }

    /// The runtime's error-code namespace.
    pub(crate) fn ns(&self) -> &'static str {
        match self.runtime {
            Runtime::Docker => "DOCKER",
            Runtime::Kubernetes => "KUBERNETES",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_updates_keep_the_other_fields() {
        let base = Config {
            pending_ms: 5,
            ..Config::default()
        };
        let c = base
            .merged(&serde_json::json!({"network_mode": "host"}))
            .unwrap();
        assert_eq!(c.network_mode, NetworkMode::Host);
        assert_eq!(c.pending_ms, 5);
        assert!(base.merged(&serde_json::json!({"nope": 1})).is_err());
        assert!(
            base.merged(&serde_json::json!({"egress_mode": "iptables"}))
                .is_err()
        );
        assert!(
            base.merged(&serde_json::json!({"secure_runtime": "firecracker"}))
                .is_err()
        );
    }

    #[test]
    fn partial_json_fills_defaults() {
        let c: Config =
            serde_json::from_str(r#"{"network_mode":"host","egress_mode":"dns"}"#).unwrap();
        assert_eq!(c.network_mode, NetworkMode::Host);
        assert_eq!(c.egress_mode, EgressMode::Dns);
        assert_eq!(c.ping_ms, 3000);
        assert!(serde_json::from_str::<Config>(r#"{"nope":1}"#).is_err());
        let c: Config = serde_json::from_str(r#"{"policy_drift":"default-allow"}"#).unwrap();
        assert_eq!(c.policy_drift, PolicyDrift::DefaultAllow);
        assert!(c.holds_image("python:3.12-slim"));
        assert!(!c.holds_image("devbox:1"));
        let c: Config = serde_json::from_str(r#"{"images":["*"]}"#).unwrap();
        assert!(c.holds_image("devbox:1"));
    }

    #[test]
    fn firecracker_needs_kubernetes() {
        let mut c = Config {
            secure_runtime: SecureRuntime::Firecracker,
            ..Config::default()
        };
        assert!(c.validate().is_err());
        c.runtime = Runtime::Kubernetes;
        assert!(c.validate().is_ok());
        assert_eq!(c.effective_runtime_class().as_deref(), Some("kata-fc"));
    }
}
