//! The OpenSandbox provider's settings, read through an environment lookup.
//!
//! The SDK's own names where they exist (`OPEN_SANDBOX_DOMAIN`, `OPEN_SANDBOX_API_KEY`), and
//! ours under the same `OPEN_SANDBOX_` prefix, which [`sandbox_core::withheld`] keeps from every
//! guest. A bad value fails closed with an error naming the variable; the key never appears
//! in an error or in `Debug`.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use secrecy::SecretString;

// The settings the checks without I/O name are spelled beside those checks.
pub use crate::gates::{ENV_HOST_KERNEL, ENV_RUNTIME_CLASS, ENV_SERVER_UNREACHABLE};
use sandbox_core::error::SandboxError;
use sandbox_core::vars::{non_blank, read_flag};

/// `OPEN_SANDBOX_DOMAIN`: the server (`host[:port]` or a URL), as the official SDK reads it.
pub const ENV_DOMAIN: &str = opensandbox_api::ENV_DOMAIN;
/// `OPEN_SANDBOX_API_KEY`: the server's API key, as the official SDK reads it.
pub const ENV_API_KEY: &str = opensandbox_api::ENV_API_KEY;
/// `OPEN_SANDBOX_CA_FILE`: a PEM file of CA certificates trusted for an `https://` server in
/// addition to the system's roots (a reverse proxy whose certificate a private CA signed).
pub const ENV_CA_FILE: &str = "OPEN_SANDBOX_CA_FILE";
/// `OPEN_SANDBOX_ALLOW_PLAIN_HTTP`: lets `OPEN_SANDBOX_DOMAIN` be plain `http://` to a host
/// that is not loopback (the 1.1.1 server speaks plain HTTP only). The API key and every
/// program then cross the network in clear; off by default.
pub const ENV_ALLOW_PLAIN_HTTP: &str = "OPEN_SANDBOX_ALLOW_PLAIN_HTTP";
/// `OPEN_SANDBOX_IMAGE`: the sandbox image (needs `python3`, `sh` and `timeout`).
pub const ENV_IMAGE: &str = "OPEN_SANDBOX_IMAGE";
/// `OPEN_SANDBOX_ENTRYPOINT`: the sandbox's entry process, split on spaces.
pub const ENV_ENTRYPOINT: &str = "OPEN_SANDBOX_ENTRYPOINT";
/// `OPEN_SANDBOX_CPU`: the `cpu` resource limit (Kubernetes quantity, e.g. `500m`, `1`).
pub const ENV_CPU: &str = "OPEN_SANDBOX_CPU";
/// `OPEN_SANDBOX_ATTEST_ISOLATION`: the operator's word that the server's secure runtime is a
/// VM (`hardware-virtualized`). Unset: the provider reports container isolation.
pub const ENV_ATTEST_ISOLATION: &str = "OPEN_SANDBOX_ATTEST_ISOLATION";
/// `OPEN_SANDBOX_ALLOW_CONTAINER_ISOLATION`: lets the component and the executor run on a
/// server whose isolation is not attested (containers only). lfx's backend seam refuses such
/// a server whatever this says.
pub const ENV_ALLOW_CONTAINER_ISOLATION: &str = "OPEN_SANDBOX_ALLOW_CONTAINER_ISOLATION";
/// `OPEN_SANDBOX_SANDBOX_TIMEOUT_SECONDS`: the server-side lifetime of every sandbox, the
/// backstop that deletes it if this process dies (must be longer than one run).
pub const ENV_SANDBOX_TIMEOUT: &str = "OPEN_SANDBOX_SANDBOX_TIMEOUT_SECONDS";
/// `OPEN_SANDBOX_MAX_RENEW_SECONDS`: the longest a renewal may push a sandbox's expiry ahead.
pub const ENV_MAX_RENEW: &str = "OPEN_SANDBOX_MAX_RENEW_SECONDS";
/// `OPEN_SANDBOX_READY_SECONDS`: how long a new sandbox may take to be `Running` and have
/// execd answer `/ping`.
pub const ENV_READY: &str = "OPEN_SANDBOX_READY_SECONDS";
/// `OPEN_SANDBOX_IDLE_SECONDS`: a command stream with no frame (execd pings every 3 s) for
/// this long is a stalled or paused sandbox: it is destroyed.
pub const ENV_IDLE: &str = "OPEN_SANDBOX_IDLE_SECONDS";
/// `OPEN_SANDBOX_CREATED_BY`: the `created-by` metadata value that marks this deployment's
/// sandboxes for the orphan sweep.
pub const ENV_CREATED_BY: &str = "OPEN_SANDBOX_CREATED_BY";

/// The default image.
pub const DEFAULT_IMAGE: &str = "python:3.12-slim";
/// The default entry process.
pub const DEFAULT_ENTRYPOINT: &str = "tail -f /dev/null";
/// The default `created-by` value: the one every provider's guests carry
/// ([`sandbox_core::provider::Labels::CREATED_BY_US`]).
pub const DEFAULT_CREATED_BY: &str = sandbox_core::provider::Labels::CREATED_BY_US;
/// The default server-side lifetime (15 minutes).
pub const DEFAULT_SANDBOX_TIMEOUT: Duration = Duration::from_secs(900);
/// The default renewal bound (1 hour, the server's own default maximum lifetime).
pub const DEFAULT_MAX_RENEW: Duration = Duration::from_secs(3600);
/// The default readiness budget.
pub const DEFAULT_READY: Duration = Duration::from_secs(60);
/// The default idle deadline of a command stream (five missed pings).
pub const DEFAULT_IDLE: Duration = Duration::from_secs(15);

/// An environment lookup shared with the client.
type Lookup = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// What the operator attests about the server's isolation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attestation {
    /// Nothing attested: containers (runc, or gVisor, which is not a VM).
    None,
    /// `hardware-virtualized`: Kata or Firecracker-under-Kata.
    HardwareVirtualized,
}

/// The OpenSandbox provider's settings.
#[derive(Clone)]
#[allow(
    clippy::struct_excessive_bools,
    reason = "each flag is an independent operator opt-in named by its own variable"
)]
pub struct OpenSandboxSettings {
    /// `OPEN_SANDBOX_DOMAIN`, when set.
    pub domain: Option<String>,
    /// `OPEN_SANDBOX_API_KEY`, when set.
    pub api_key: Option<SecretString>,
    /// `OPEN_SANDBOX_CA_FILE`, when set (its certificates were read with the settings).
    pub ca_file: Option<PathBuf>,
    /// Whether plain `http://` to a host that is not loopback is accepted
    /// (`OPEN_SANDBOX_ALLOW_PLAIN_HTTP`).
    pub allow_plain_http: bool,
    /// The image.
    pub image: String,
    /// The entry process.
    pub entrypoint: Vec<String>,
    /// The `cpu` limit.
    pub cpu: String,
    /// The isolation attested.
    pub attestation: Attestation,
    /// The expected Kubernetes RuntimeClass.
    pub runtime_class: Option<String>,
    /// Host kernel releases a guest must not report.
    pub host_kernels: Vec<String>,
    /// Whether the component and executor may run with container isolation.
    pub allow_container_isolation: bool,
    /// Whether the operator says no sandbox can route to the server
    /// ([`ENV_SERVER_UNREACHABLE`]).
    pub server_unreachable: bool,
    /// The server-side lifetime of a sandbox.
    pub sandbox_timeout: Duration,
    /// The renewal bound.
    pub max_renew: Duration,
    /// The readiness budget.
    pub ready: Duration,
    /// The command stream's idle deadline.
    pub idle: Duration,
    /// The `created-by` metadata value.
    pub created_by: String,
    /// Whether a host-network-mode server is accepted (only through
    /// [`OpenSandboxSettings::for_single_sandbox_harness`]; no setting turns it on).
    host_network_accepted: bool,
    /// The PEM text of [`OpenSandboxSettings::ca_file`], read when the settings were read.
    ca_pem: Option<Arc<[u8]>>,
    lookup: Lookup,
}

impl fmt::Debug for OpenSandboxSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenSandboxSettings")
            .field("domain", &self.domain)
            .field("api_key", &self.api_key.as_ref().map(|_| "[REDACTED]"))
            .field("ca_file", &self.ca_file)
            .field("allow_plain_http", &self.allow_plain_http)
            .field("image", &self.image)
            .field("entrypoint", &self.entrypoint)
            .field("cpu", &self.cpu)
            .field("attestation", &self.attestation)
            .field("runtime_class", &self.runtime_class)
            .field("host_kernels", &self.host_kernels)
            .field("allow_container_isolation", &self.allow_container_isolation)
            .field("server_unreachable", &self.server_unreachable)
            .field("sandbox_timeout", &self.sandbox_timeout)
            .field("max_renew", &self.max_renew)
            .field("ready", &self.ready)
            .field("idle", &self.idle)
            .field("created_by", &self.created_by)
            .field("host_network_accepted", &self.host_network_accepted)
            .finish_non_exhaustive()
    }
}

fn seconds(
    lookup: &dyn Fn(&str) -> Option<String>,
    name: &str,
    default: Duration,
    min: u64,
    max: u64,
) -> Result<Duration, SandboxError> {
    let Some(raw) = non_blank(lookup, name) else {
        return Ok(default);
    };
    match raw.parse::<u64>() {
        Ok(n) if (min..=max).contains(&n) => Ok(Duration::from_secs(n)),
        _ => Err(SandboxError::refused(format!(
            "{name}={} is not a whole number of seconds from {min} to {max}; set it in that \
             range or unset it for the default ({}s)",
            outside_text::snippet(&raw, 40),
            default.as_secs()
        ))),
    }
}

/// What to change when the TLS handshake with the server failed
/// ([`opensandbox_api::Error::is_tls_failure`]): it names [`ENV_CA_FILE`] and [`ENV_DOMAIN`].
pub const TLS_FAILURE_HINT: &str = "the server's TLS certificate was not accepted: set \
     OPEN_SANDBOX_CA_FILE to a PEM file of the CA that signed it (the CA's certificate, not the \
     server's own), and check that OPEN_SANDBOX_DOMAIN names a host the certificate is for and \
     a port where the server (or its reverse proxy) speaks TLS";

/// The CA file named by [`ENV_CA_FILE`], read: its path and PEM text. A file that cannot be
/// read, is larger than 4 MiB or holds no PEM certificate is a refusal naming the setting.
fn read_ca_file(raw: &str) -> Result<(PathBuf, Arc<[u8]>), SandboxError> {
    let path = Path::new(raw.trim());
    let read = cert_file::read_pem(path, ENV_CA_FILE).map(|pem| (path.to_owned(), pem));
    // Each certificate must also make a trust anchor (a PEM block of garbage reads as PEM).
    let read = read.and_then(|(path, pem)| {
        use rustls::pki_types::pem::PemObject as _;
        let mut store = rustls::RootCertStore::empty();
        for cert in rustls::pki_types::CertificateDer::pem_slice_iter(&pem) {
            let cert =
                cert.map_err(|e| format!("{ENV_CA_FILE}={}: not PEM ({e})", path.display()))?;
            store.add(cert).map_err(|e| {
                format!(
                    "{ENV_CA_FILE}={}: a certificate is unusable ({e})",
                    path.display()
                )
            })?;
        }
        Ok((path, pem))
    });
    match read {
        Ok((path, pem)) => Ok((path, pem.into())),
        Err(e) => Err(SandboxError::refused(format!(
            "{}; set {ENV_CA_FILE} to a PEM file of the CA certificate(s) that signed the \
             server's certificate (-----BEGIN CERTIFICATE-----), or unset it to trust the \
             system's roots only",
            outside_text::snippet(&e, 300)
        ))),
    }
}

/// Kubernetes label values (and so metadata values): 1..=63 of `[A-Za-z0-9._-]`, starting
/// and ending alphanumeric.
pub(crate) fn is_label_value(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= 63
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && v.as_bytes()[0].is_ascii_alphanumeric()
        && v.as_bytes()[v.len() - 1].is_ascii_alphanumeric()
}

/// Whether `v` is a CPU quantity the server takes: a positive whole or decimal number of
/// cores (`1`, `0.5`), or of millicores with `m` (`500m`).
pub(crate) fn is_cpu_quantity(v: &str) -> bool {
    let (number, milli) = v.strip_suffix('m').map_or((v, false), |n| (n, true));
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    let decimal = number.contains('.');
    digits(whole)
        && digits(fraction)
        && !(decimal && (fraction.is_empty() || milli))
        && number.bytes().any(|b| (b'1'..=b'9').contains(&b))
}

impl OpenSandboxSettings {
    /// Reads every setting through `lookup`; a bad value is a refusal naming its variable.
    /// A missing key is not an error here (see [`OpenSandboxSettings::client`]), so `doctor`
    /// can report the rest.
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String> + Send + Sync + 'static,
    ) -> Result<Self, SandboxError> {
        let lookup: Lookup = Arc::new(lookup);
        let l: &dyn Fn(&str) -> Option<String> = &*lookup;
        let attestation = match non_blank(l, ENV_ATTEST_ISOLATION) {
            None => Attestation::None,
            Some(v) if v.eq_ignore_ascii_case("hardware-virtualized") => {
                Attestation::HardwareVirtualized
            }
            Some(v) if v.eq_ignore_ascii_case("none") || v.eq_ignore_ascii_case("container") => {
                Attestation::None
            }
            Some(v) => {
                return Err(SandboxError::refused(format!(
                    "{ENV_ATTEST_ISOLATION}={} is not understood; set it to \
                     hardware-virtualized only if the server's [secure_runtime] is Kata or \
                     Firecracker (gVisor and runc are containers), or unset it",
                    outside_text::snippet(&v, 40)
                )));
            }
        };
        let runtime_class = non_blank(l, ENV_RUNTIME_CLASS);
        if let Some(rc) = runtime_class.as_deref().filter(|rc| !is_label_value(rc)) {
            return Err(SandboxError::refused(format!(
                "{ENV_RUNTIME_CLASS}={} is not a RuntimeClass name; set it to the server's \
                 [secure_runtime] k8s_runtime_class (e.g. kata-fc)",
                outside_text::snippet(rc, 70)
            )));
        }
        let host_kernels = non_blank(l, ENV_HOST_KERNEL)
            .map(|v| {
                v.split(',')
                    .map(|s| s.trim().to_owned())
                    .filter(|s| !s.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        let created_by =
            non_blank(l, ENV_CREATED_BY).unwrap_or_else(|| DEFAULT_CREATED_BY.to_owned());
        if !is_label_value(&created_by) {
            return Err(SandboxError::refused(format!(
                "{ENV_CREATED_BY}={} is not a metadata value; use up to 63 letters, digits, \
                 '-', '_' or '.', starting and ending with a letter or digit",
                outside_text::snippet(&created_by, 70)
            )));
        }
        let entrypoint: Vec<String> = non_blank(l, ENV_ENTRYPOINT)
            .unwrap_or_else(|| DEFAULT_ENTRYPOINT.to_owned())
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        let sandbox_timeout = seconds(l, ENV_SANDBOX_TIMEOUT, DEFAULT_SANDBOX_TIMEOUT, 60, 86_400)?;
        let cpu = non_blank(l, ENV_CPU).unwrap_or_else(|| "1".to_owned());
        if !is_cpu_quantity(&cpu) {
            return Err(SandboxError::refused(format!(
                "{ENV_CPU}={} is not a CPU quantity; set it to a number of cores (1, 0.5) or \
                 millicores (500m), or unset it for 1",
                outside_text::snippet(&cpu, 40)
            )));
        }
        let (ca_file, ca_pem) = match non_blank(l, ENV_CA_FILE) {
            Some(raw) => {
                let (path, pem) = read_ca_file(&raw)?;
                (Some(path), Some(pem))
            }
            None => (None, None),
        };
        Ok(OpenSandboxSettings {
            domain: non_blank(l, ENV_DOMAIN),
            api_key: non_blank(l, ENV_API_KEY).map(SecretString::from),
            ca_file,
            allow_plain_http: read_flag(l, ENV_ALLOW_PLAIN_HTTP)?,
            image: non_blank(l, ENV_IMAGE).unwrap_or_else(|| DEFAULT_IMAGE.to_owned()),
            entrypoint,
            cpu,
            attestation,
            runtime_class,
            host_kernels,
            allow_container_isolation: read_flag(l, ENV_ALLOW_CONTAINER_ISOLATION)?,
            server_unreachable: read_flag(l, ENV_SERVER_UNREACHABLE)?,
            sandbox_timeout,
            max_renew: seconds(l, ENV_MAX_RENEW, DEFAULT_MAX_RENEW, 60, 86_400)?,
            ready: seconds(l, ENV_READY, DEFAULT_READY, 1, 3600)?,
            idle: seconds(l, ENV_IDLE, DEFAULT_IDLE, 4, 3600)?,
            created_by,
            host_network_accepted: false,
            ca_pem,
            lookup,
        })
    }

    /// The same settings for a test harness that runs one sandbox at a time on a Docker server
    /// in host network mode (`scripts/opensandbox-harness`): the check that refuses such a
    /// server by its shared execd endpoint (`127.0.0.1:44772` for every sandbox) is skipped.
    /// The identity canary still runs on every sandbox before any user code, so a command
    /// routed into another sandbox is still refused. Nothing an operator sets reaches this:
    /// it exists so that the harness can drive the provider on the only server this machine
    /// can run, and is never called by a surface.
    #[must_use]
    pub fn for_single_sandbox_harness(mut self) -> Self {
        self.host_network_accepted = true;
        self
    }

    /// Whether a host-network-mode server is accepted (see
    /// [`OpenSandboxSettings::for_single_sandbox_harness`]); false for every setting an
    /// operator can make.
    pub fn host_network_accepted(&self) -> bool {
        self.host_network_accepted
    }

    /// Reads the process environment.
    pub fn from_env() -> Result<Self, SandboxError> {
        Self::from_lookup(sandbox_core::vars::process_env)
    }

    /// The isolation lfx's dispatcher is told: `hardware-virtualized` only when attested,
    /// `container` otherwise (which lfx refuses).
    pub fn declared_isolation(&self) -> &'static str {
        match self.attestation {
            Attestation::HardwareVirtualized => "hardware-virtualized",
            Attestation::None => "container",
        }
    }

    /// For the component and the executor, which have no dispatcher of their own: refused
    /// unless the isolation is attested or the operator opted into containers.
    pub fn require_isolation_for(&self, surface: &str) -> Result<(), SandboxError> {
        if self.attestation == Attestation::HardwareVirtualized || self.allow_container_isolation {
            return Ok(());
        }
        Err(SandboxError::refused(format!(
            "the {surface} refuses the OpenSandbox server: its isolation is not attested. If \
             the server's [secure_runtime] is Kata or Firecracker, set \
             {ENV_ATTEST_ISOLATION}=hardware-virtualized (and {ENV_RUNTIME_CLASS} on \
             Kubernetes); to accept container isolation knowingly, set \
             {ENV_ALLOW_CONTAINER_ISOLATION}=true"
        )))
    }

    /// Whether the server is reached over plain `http://` on a host that is not loopback, accepted
    /// by [`ENV_ALLOW_PLAIN_HTTP`]: the API key and every program cross the network in clear.
    /// False when the domain does not read.
    pub fn plain_http_in_use(&self) -> bool {
        self.allow_plain_http
            && opensandbox_api::is_plain_http_off_loopback(self.domain_or_default())
                .unwrap_or(false)
    }

    /// What every egress policy must keep guests from: the server `OPEN_SANDBOX_DOMAIN` names
    /// (the SDK's default when unset), unless [`ENV_SERVER_UNREACHABLE`] says no sandbox can
    /// route to it.
    pub fn server_guard(&self) -> crate::gates::ServerGuard {
        let url = opensandbox_api::base_url(self.domain_or_default())
            .map(|u| u.to_string())
            .unwrap_or_default();
        crate::gates::ServerGuard::new(&url, self.server_unreachable)
    }

    fn domain_or_default(&self) -> &str {
        self.domain
            .as_deref()
            .unwrap_or(opensandbox_api::DEFAULT_DOMAIN)
    }

    /// Builds the HTTP client, trusting the CA file's certificates besides the system's roots.
    /// A missing key or an unusable domain is a refusal naming the variable (the client's own
    /// message never carries the key; plain `http://` to a host that is not loopback names
    /// [`ENV_CA_FILE`]'s route and [`ENV_ALLOW_PLAIN_HTTP`]), as is a secret set both as
    /// its variable and its `_FILE`, or a `_FILE` that cannot be used
    /// ([`sandbox_core::vars::check_secret_files`]: here, not when the settings are read, so that the
    /// capabilities lfx asks for stay what the settings say and the run names the problem).
    pub fn client(&self) -> Result<opensandbox_api::Client, SandboxError> {
        sandbox_core::vars::check_secret_files(&*self.lookup)?;
        if self.api_key.is_none() {
            return Err(SandboxError::refused(format!(
                "{ENV_API_KEY} is not set; set it to the server's [server] api_key"
            )));
        }
        let domain = self.domain_or_default();
        if opensandbox_api::is_plain_http_off_loopback(domain).unwrap_or(false) {
            if !self.allow_plain_http {
                return Err(SandboxError::refused(format!(
                    "{ENV_DOMAIN}={} is plain http to another host: the API key and every \
                     program would cross the network in clear. Put TLS in front of the server \
                     (a reverse proxy) and set {ENV_DOMAIN}=https://<host>[:port], with \
                     {ENV_CA_FILE}=<the CA's PEM file> when a private CA signed its \
                     certificate; or, on a network you trust, accept the risk with \
                     {ENV_ALLOW_PLAIN_HTTP}=true",
                    outside_text::snippet(domain, 120)
                )));
            }
            tracing::warn!(
                "{ENV_ALLOW_PLAIN_HTTP}=true: the OpenSandbox API key and every program cross \
                 the network to {} in clear",
                outside_text::snippet(domain, 120)
            );
        }
        let lookup = Arc::clone(&self.lookup);
        let mut builder = opensandbox_api::Client::builder()
            .env_lookup(move |name| lookup(name))
            .allow_insecure_http(self.allow_plain_http)
            .user_agent(concat!(
                "langflow-sandbox-createos/",
                env!("CARGO_PKG_VERSION")
            ));
        if let Some(pem) = &self.ca_pem {
            builder = builder.ca_certificates_pem(pem.to_vec());
        }
        let from = if self.ca_pem.is_some() {
            format!("{ENV_DOMAIN}/{ENV_API_KEY}/{ENV_CA_FILE}")
        } else {
            format!("{ENV_DOMAIN}/{ENV_API_KEY}")
        };
        builder.build().map_err(|e| {
            SandboxError::refused(format!(
                "the OpenSandbox client cannot be built from {from}: {}",
                outside_text::snippet(&e.to_string(), 400)
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(pairs: &[(&str, &str)]) -> Result<OpenSandboxSettings, SandboxError> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        OpenSandboxSettings::from_lookup(move |n| {
            pairs.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone())
        })
    }

    #[test]
    fn defaults_report_container_isolation_and_refuse_surfaces() {
        let s = settings(&[]).unwrap();
        assert_eq!(s.declared_isolation(), "container");
        let e = s.require_isolation_for("executor").unwrap_err();
        assert!(e.message().contains(ENV_ATTEST_ISOLATION), "{e}");
        assert!(e.message().contains(ENV_ALLOW_CONTAINER_ISOLATION), "{e}");
        assert!(s.client().unwrap_err().message().contains(ENV_API_KEY));
        assert_eq!(s.sandbox_timeout, DEFAULT_SANDBOX_TIMEOUT);
        assert_eq!(s.entrypoint, ["tail", "-f", "/dev/null"]);
    }

    #[test]
    fn attestation_and_opt_in() {
        let s = settings(&[(ENV_ATTEST_ISOLATION, "Hardware-Virtualized")]).unwrap();
        assert_eq!(s.declared_isolation(), "hardware-virtualized");
        s.require_isolation_for("component").unwrap();
        let s = settings(&[(ENV_ALLOW_CONTAINER_ISOLATION, "true")]).unwrap();
        assert_eq!(s.declared_isolation(), "container");
        s.require_isolation_for("component").unwrap();
        let e = settings(&[(ENV_ATTEST_ISOLATION, "gvisor")]).unwrap_err();
        assert!(e.message().contains(ENV_ATTEST_ISOLATION));
    }

    #[test]
    fn bad_values_name_their_variable() {
        for (k, v) in [
            (ENV_SANDBOX_TIMEOUT, "30"),
            (ENV_MAX_RENEW, "x"),
            (ENV_IDLE, "1"),
            (ENV_RUNTIME_CLASS, "Kata FC!"),
            (ENV_CREATED_BY, "-bad-"),
            (ENV_ALLOW_CONTAINER_ISOLATION, "maybe"),
            (ENV_CPU, "abc"),
            (ENV_CPU, "0"),
            (ENV_CPU, "-1"),
            (ENV_CPU, "1.5m"),
            (ENV_CPU, "2 cores"),
        ] {
            let e = settings(&[(k, v)]).unwrap_err();
            assert!(e.message().contains(k), "{k}: {e}");
        }
    }

    #[test]
    fn cpu_quantities_the_server_takes_are_accepted() {
        for ok in ["1", "2", "0.5", ".5", "1.25", "500m", "1500m", "10"] {
            assert!(is_cpu_quantity(ok), "{ok}");
            assert_eq!(settings(&[(ENV_CPU, ok)]).unwrap().cpu, ok);
        }
        for bad in [
            "", "m", "0", "0m", "0.0", ".", "1.", "abc", "1.5m", "1e3", "-1",
        ] {
            assert!(!is_cpu_quantity(bad), "{bad}");
        }
    }

    #[test]
    fn the_key_is_never_shown() {
        let s = settings(&[
            (ENV_API_KEY, "sk-very-secret-1234"),
            (ENV_DOMAIN, "ftp://example.com"),
            (ENV_HOST_KERNEL, "6.1.0-18-amd64, 6.18.44"),
        ])
        .unwrap();
        assert!(!format!("{s:?}").contains("sk-very-secret"));
        assert_eq!(s.host_kernels, ["6.1.0-18-amd64", "6.18.44"]);
        let e = s.client().unwrap_err();
        assert!(e.message().contains(ENV_DOMAIN), "{e}");
        assert!(!e.message().contains("sk-very-secret"));
    }

    /// The key comes from `OPEN_SANDBOX_API_KEY_FILE` through sandbox-core's secret-file
    /// reading, and both set is a refusal naming both (moved from sandbox-core's `vars` tests).
    #[test]
    fn the_key_comes_from_its_file_and_both_set_is_a_refusal() {
        use std::io::Write as _;

        use sandbox_core::vars::with_secret_files;

        fn env(pairs: &[(&str, &str)]) -> std::collections::HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        }
        let mut osb = tempfile::NamedTempFile::new().unwrap();
        osb.write_all(b"osb-file-key\n").unwrap();
        let osb_path = osb.path().to_str().unwrap().to_owned();
        let osb_raw = env(&[
            ("OPEN_SANDBOX_API_KEY", "osb-env-key"),
            ("OPEN_SANDBOX_API_KEY_FILE", &osb_path),
        ]);
        let e = OpenSandboxSettings::from_lookup(move |k| {
            with_secret_files(&|n| osb_raw.get(n).cloned(), k)
        })
        .unwrap()
        .client()
        .err()
        .unwrap();
        assert!(
            e.message()
                .contains("OPEN_SANDBOX_API_KEY and OPEN_SANDBOX_API_KEY_FILE"),
            "{e}"
        );
        let osb_raw = env(&[("OPEN_SANDBOX_API_KEY_FILE", &osb_path)]);
        let settings = OpenSandboxSettings::from_lookup(move |k| {
            with_secret_files(&|n| osb_raw.get(n).cloned(), k)
        })
        .unwrap();
        assert_eq!(
            settings
                .api_key
                .as_ref()
                .map(secrecy::ExposeSecret::expose_secret),
            Some("osb-file-key")
        );
    }

    /// sandbox-core's hints name this provider's settings as they are spelled here.
    #[test]
    fn the_core_hints_name_these_settings() {
        use sandbox_core::provider::ProviderKind;
        assert_eq!(ProviderKind::OpenSandbox.key_setting(), ENV_API_KEY);
        assert_eq!(ProviderKind::OpenSandbox.address_setting(), ENV_DOMAIN);
    }
}
