//! The [`Client`] and the lifecycle calls (`/v1/sandboxes`, `/v1/snapshots`).

use std::sync::Arc;
use std::time::Duration;

use reqwest::header::HeaderValue;
use secrecy::{ExposeSecret, SecretString};

use reqwest::Method;
use serde::de::DeserializeOwned;
use serde_json::json;
use time::OffsetDateTime;

use crate::config::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_DOMAIN, DEFAULT_TIMEOUT, DEFAULT_USER_AGENT, ENV_API_KEY,
    ENV_DOMAIN, base_url, is_loopback, shown_domain,
};
use crate::error::{Error, Result};
use crate::models::{
    CreateSandbox, Deletion, Endpoint, NetworkPolicy, NetworkRule, PolicyStatus, Renewal,
    SandboxFilter, SandboxInfo, SandboxPage, SandboxState, Snapshot, SnapshotFilter, SnapshotPage,
};
use crate::retry::RetryPolicy;
use crate::transport::{Call, Replay, Transport};
use crate::wire::format_timestamp;

/// How much longer than one buffered request (the client's timeout) a create may take: a
/// Kubernetes server holds the create until the pod runs (`sandbox_create_timeout_seconds`, 60 s
/// by default), and a Docker server pulls a missing image inside it.
pub const CREATE_EXTRA_TIME: Duration = Duration::from_secs(90);
/// The most pages [`Client::list_all_sandboxes`] walks (a server that always says "next page"
/// cannot keep it busy forever).
pub const MAX_PAGES: u32 = 1000;

/// An environment lookup given to [`ClientBuilder::env_lookup`].
type EnvLookup = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// Builds a [`Client`]. Explicit settings win over the environment.
#[derive(Default)]
pub struct ClientBuilder {
    domain: Option<String>,
    api_key: Option<SecretString>,
    timeout: Option<Duration>,
    connect_timeout: Option<Duration>,
    retry: Option<RetryPolicy>,
    user_agent: Option<String>,
    allow_insecure_http: bool,
    ca_pem: Option<Vec<u8>>,
    env: Option<EnvLookup>,
}

impl std::fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientBuilder")
            .field("domain", &self.domain.as_deref().map(shown_domain))
            .field("api_key", &self.api_key.as_ref().map(|_| "[REDACTED]"))
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("retry", &self.retry)
            .field("allow_insecure_http", &self.allow_insecure_http)
            .field("ca_pem", &self.ca_pem.as_ref().map(Vec::len))
            .finish_non_exhaustive()
    }
}

impl ClientBuilder {
    /// The server: a `host[:port]` (taken as plain `http://`, as the SDK does) or an
    /// `http(s)://` URL, optionally with a path prefix. `/v1` is appended unless the path
    /// already ends with it. Overrides [`ENV_DOMAIN`].
    #[must_use]
    pub fn domain(mut self, domain: impl Into<String>) -> Self {
        self.domain = Some(domain.into());
        self
    }

    /// The API key (trimmed). Overrides [`ENV_API_KEY`].
    #[must_use]
    pub fn api_key(mut self, key: impl Into<SecretString>) -> Self {
        self.api_key = Some(key.into());
        self
    }

    /// The timeout of one buffered request, body included (default 30 s). Streams and
    /// downloads use it for the wait for the answer's headers and then for each idle gap.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// The timeout to open a connection (default 10 s).
    #[must_use]
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = Some(timeout);
        self
    }

    /// The retry policy (see [`RetryPolicy`]).
    #[must_use]
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = Some(retry);
        self
    }

    /// The `User-Agent` header.
    #[must_use]
    pub fn user_agent(mut self, user_agent: impl Into<String>) -> Self {
        self.user_agent = Some(user_agent.into());
        self
    }

    /// Allow sending the key over plain `http` to a host that is not loopback. Off by default:
    /// without it a non-loopback `http` domain is refused at [`ClientBuilder::build`]. Only
    /// `localhost`, `127.0.0.0/8` and `::1` count as loopback.
    #[must_use]
    pub fn allow_insecure_http(mut self, allow: bool) -> Self {
        self.allow_insecure_http = allow;
        self
    }

    /// Trust the CA certificates in `pem` (one or more `-----BEGIN CERTIFICATE-----` blocks)
    /// for an `https://` server, in addition to the system's roots: a server behind a reverse
    /// proxy whose certificate a private CA signed. Give the CA that signed the server's
    /// certificate, not the server's certificate itself. Text without a certificate, or a
    /// certificate that cannot be parsed, is an [`Error::Config`] at [`ClientBuilder::build`].
    #[must_use]
    pub fn ca_certificates_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca_pem = Some(pem.into());
        self
    }

    /// Read [`ENV_DOMAIN`] and [`ENV_API_KEY`] through `lookup` instead of the process
    /// environment (for tests and embedders).
    #[must_use]
    pub fn env_lookup(
        mut self,
        lookup: impl Fn(&str) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.env = Some(Arc::new(lookup));
        self
    }

    /// Check every setting and build the client. The domain and key fall back to
    /// [`ENV_DOMAIN`] (then [`DEFAULT_DOMAIN`]) and [`ENV_API_KEY`]; a missing or blank key,
    /// an unusable domain, a zero timeout or an invalid retry policy is an [`Error::Config`].
    pub fn build(self) -> Result<Client> {
        let env = |name: &str| -> Option<String> {
            let value = match &self.env {
                Some(lookup) => lookup(name),
                None => std::env::var(name).ok(),
            };
            value.filter(|v| !v.trim().is_empty())
        };
        let domain = self
            .domain
            .clone()
            .or_else(|| env(ENV_DOMAIN))
            .unwrap_or_else(|| DEFAULT_DOMAIN.to_owned());
        let base = base_url(&domain)?;
        if base.scheme() == "http" && !self.allow_insecure_http && !is_loopback(&base) {
            return Err(Error::Config(format!(
                "refusing to send the API key over plain http to {}: set {ENV_DOMAIN} to an \
                 https:// URL (a private CA's server: ClientBuilder::ca_certificates_pem), or \
                 opt in with ClientBuilder::allow_insecure_http(true)",
                base.host_str().unwrap_or_default()
            )));
        }
        let key = self
            .api_key
            .clone()
            .or_else(|| env(ENV_API_KEY).map(SecretString::from))
            .ok_or_else(|| {
                Error::Config(format!(
                    "no API key: set {ENV_API_KEY} or pass ClientBuilder::api_key"
                ))
            })?;
        let key = SecretString::from(key.expose_secret().trim().to_owned());
        if key.expose_secret().is_empty() {
            return Err(Error::Config(format!(
                "the API key ({ENV_API_KEY}) is blank"
            )));
        }
        if HeaderValue::from_str(key.expose_secret()).is_err() {
            return Err(Error::Config(format!(
                "the API key ({ENV_API_KEY}) contains characters a header cannot carry"
            )));
        }
        let timeout = self.timeout.unwrap_or(DEFAULT_TIMEOUT);
        let connect_timeout = self.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT);
        if timeout.is_zero() || connect_timeout.is_zero() {
            return Err(Error::Config("timeouts must be > 0".into()));
        }
        let retry = self.retry.unwrap_or_default();
        retry.check()?;
        let user_agent =
            HeaderValue::from_str(self.user_agent.as_deref().unwrap_or(DEFAULT_USER_AGENT))
                .map_err(|_| Error::Config("the user agent is not a valid header value".into()))?;
        // No redirects (a `Location` could carry the key elsewhere) and no proxy from the
        // environment (`HTTP_PROXY` would see the key of a plain-http server).
        let mut http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .connect_timeout(connect_timeout);
        if let Some(pem) = &self.ca_pem {
            http = http.tls_certs_merge(ca_certificates(pem)?);
        }
        let http = http
            .build()
            .map_err(|e| Error::Config(format!("cannot build the HTTP client: {e}")))?;
        let transport = Transport::new(http, base, key, timeout, retry, user_agent);
        Ok(Client::from_transport(transport))
    }
}

/// The certificates of a PEM text given to [`ClientBuilder::ca_certificates_pem`]: at least
/// one, each parsed.
fn ca_certificates(pem: &[u8]) -> Result<Vec<reqwest::Certificate>> {
    use rustls::pki_types::pem::PemObject as _;
    let mut certs = Vec::new();
    // Each one must make a trust anchor: a PEM block of garbage is refused here, by name,
    // rather than as a bare "builder error" of the HTTP client.
    let mut check = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(pem) {
        let cert =
            cert.map_err(|e| Error::Config(format!("the CA certificates are not PEM: {e}")))?;
        check
            .add(cert.clone())
            .map_err(|e| Error::Config(format!("a CA certificate is unusable as a root: {e}")))?;
        certs.push(
            reqwest::Certificate::from_der(&cert)
                .map_err(|e| Error::Config(format!("a CA certificate is unusable: {e}")))?,
        );
    }
    if certs.is_empty() {
        return Err(Error::Config(
            "the CA certificates hold no PEM certificate (-----BEGIN CERTIFICATE-----)".into(),
        ));
    }
    Ok(certs)
}

/// The answer of `renew-expiration`.
#[derive(serde::Deserialize)]
struct RenewAnswer {
    #[serde(rename = "expiresAt", default)]
    expires_at: Option<String>,
}

/// An OpenSandbox client: cheap to clone, safe to share between tasks.
///
/// Lifecycle calls are methods of the client; execd calls go through [`Client::execd`].
#[derive(Clone, Debug)]
pub struct Client {
    t: Arc<Transport>,
}

impl Client {
    /// A builder (see [`ClientBuilder`]).
    pub fn builder() -> ClientBuilder {
        ClientBuilder::default()
    }

    /// A client from `OPEN_SANDBOX_DOMAIN` and `OPEN_SANDBOX_API_KEY`, with default timeouts
    /// and retry policy.
    pub fn from_env() -> Result<Client> {
        ClientBuilder::default().build()
    }

    pub(crate) fn from_transport(t: Transport) -> Client {
        Client { t: Arc::new(t) }
    }

    pub(crate) fn transport(&self) -> &Arc<Transport> {
        &self.t
    }

    /// The API base URL (`…/v1`).
    pub fn base_url(&self) -> &str {
        self.t.base_url().as_str()
    }

    async fn call<T: DeserializeOwned>(&self, call: Call) -> Result<T> {
        self.t.json(&call).await
    }

    /// `POST /v1/sandboxes`. Sent exactly once, never repeated: a create whose answer is lost
    /// (a timeout, a reset) may still have created a sandbox. Put a nonce in the metadata and
    /// look for it with [`Client::find_by_metadata`] after such a failure.
    ///
    /// Docker answers with `Running` once the container started (execd may not be up yet:
    /// wait with [`crate::Execd::wait_until_ready`]); Kubernetes answers `Pending` (wait with
    /// [`Client::wait_until_running`]).
    ///
    /// The create may take [`CREATE_EXTRA_TIME`] longer than the client's timeout: a Kubernetes
    /// server answers it only once the pod runs (within its `sandbox_create_timeout_seconds`,
    /// 60 s by default), and Docker pulls an image it does not hold inside it. Cut short at the
    /// client's timeout, such a create would still make its sandbox after the client gave up.
    pub async fn create_sandbox(&self, request: &CreateSandbox) -> Result<SandboxInfo> {
        let (body, secrets) = request.to_wire()?;
        let mut call = Call::new(Method::POST, &["sandboxes"], Replay::Never)?.json(&body)?;
        call.secrets = secrets;
        call.timeout = Some(self.transport().timeout + CREATE_EXTRA_TIME);
        self.call(call).await
    }

    /// `GET /v1/sandboxes/{id}`.
    pub async fn get_sandbox(&self, id: &str) -> Result<SandboxInfo> {
        self.call(Call::get(&["sandboxes", id])?).await
    }

    /// `GET /v1/sandboxes`: page `page` (1-based) of the sandboxes matching `filter`.
    pub async fn list_sandboxes(&self, filter: &SandboxFilter, page: u32) -> Result<SandboxPage> {
        let mut call = Call::get(&["sandboxes"])?;
        call.query = filter.query(page.max(1));
        self.call(call).await
    }

    /// Every sandbox matching `filter`, page after page (at most [`MAX_PAGES`]).
    pub async fn list_all_sandboxes(&self, filter: &SandboxFilter) -> Result<Vec<SandboxInfo>> {
        let mut all = Vec::new();
        for page in 1..=MAX_PAGES {
            let answer = self.list_sandboxes(filter, page).await?;
            let empty = answer.items.is_empty();
            all.extend(answer.items);
            if !answer.pagination.has_next_page || empty {
                return Ok(all);
            }
        }
        Err(Error::protocol(format!(
            "GET /sandboxes: still a next page after {MAX_PAGES} pages"
        )))
    }

    /// The sandboxes (in any state) whose metadata has `key` = `value`: the building block
    /// for creating without duplicates. Before [`Client::create_sandbox`], put a fresh nonce in
    /// the metadata (`.metadata("lf-nonce", nonce)`); when the create fails in a way that may
    /// have reached the server (a timeout, a reset, a 5xx), call this with the nonce, then
    /// adopt what it finds or delete it.
    pub async fn find_by_metadata(&self, key: &str, value: &str) -> Result<Vec<SandboxInfo>> {
        self.list_all_sandboxes(&SandboxFilter::metadata(key, value))
            .await
    }

    /// `DELETE /v1/sandboxes/{id}`. Repeated on transport errors and 5xx (a paused gVisor
    /// sandbox fails its first delete with 500); a 404 is [`Deletion::AlreadyGone`].
    pub async fn delete_sandbox(&self, id: &str) -> Result<Deletion> {
        self.delete(&["sandboxes", id]).await
    }

    async fn delete(&self, segments: &[&str]) -> Result<Deletion> {
        let call = Call::new(Method::DELETE, segments, Replay::Safe)?;
        match self.t.send(&call, 64 * 1024).await {
            Ok(_) => Ok(Deletion::Deleted),
            Err(e) if e.status().is_some_and(|s| s.as_u16() == 404) => Ok(Deletion::AlreadyGone),
            Err(e) => Err(e),
        }
    }

    /// `PATCH /v1/sandboxes/{id}/metadata`: a JSON merge patch (RFC 7396): `Some(value)` sets
    /// a key, `None` removes it, absent keys stay. Answers the whole sandbox.
    pub async fn patch_metadata<'a, I>(&self, id: &str, patch: I) -> Result<SandboxInfo>
    where
        I: IntoIterator<Item = (&'a str, Option<&'a str>)>,
    {
        let body: serde_json::Map<String, serde_json::Value> = patch
            .into_iter()
            .map(|(k, v)| {
                (
                    k.to_owned(),
                    v.map_or(serde_json::Value::Null, |v| json!(v)),
                )
            })
            .collect();
        // Sent as `application/json`, as the SDK does; the server applies merge semantics.
        let call =
            Call::new(Method::PATCH, &["sandboxes", id, "metadata"], Replay::Safe)?.json(&body)?;
        self.call(call).await
    }

    /// `POST /v1/sandboxes/{id}/renew-expiration`, asking for expiry `extend_by` from now, cut
    /// down to `max_from_now`: the server accepts any time, shorter or beyond its own maximum,
    /// so the bound is the caller's.
    pub async fn renew_expiration(
        &self,
        id: &str,
        extend_by: Duration,
        max_from_now: Duration,
    ) -> Result<Renewal> {
        if extend_by.is_zero() || max_from_now.is_zero() {
            return Err(Error::InvalidArgument(
                "a renewal needs a positive duration and maximum".into(),
            ));
        }
        let clamped = extend_by > max_from_now;
        let wanted = extend_by.min(max_from_now);
        let wanted = time::Duration::try_from(wanted)
            .map_err(|_| Error::InvalidArgument("renewal duration out of range".into()))?;
        let at = OffsetDateTime::now_utc()
            .checked_add(wanted)
            .ok_or_else(|| Error::InvalidArgument("renewal time out of range".into()))?;
        let requested = format_timestamp(at);
        let call = Call::new(
            Method::POST,
            &["sandboxes", id, "renew-expiration"],
            Replay::Safe,
        )?
        .json(&json!({ "expiresAt": requested }))?;
        let answer: RenewAnswer = self.call(call).await?;
        Ok(Renewal {
            requested,
            clamped,
            expires_at: answer.expires_at.unwrap_or_default(),
        })
    }

    async fn accepted(&self, segments: &[&str]) -> Result<()> {
        let call = Call::new(Method::POST, segments, Replay::Never)?;
        self.t.send(&call, 64 * 1024).await.map(|_| ())
    }

    /// `POST /v1/sandboxes/{id}/pause` (asynchronous: poll for `Paused`). Never repeated; a
    /// second pause answers 409.
    pub async fn pause_sandbox(&self, id: &str) -> Result<()> {
        self.accepted(&["sandboxes", id, "pause"]).await
    }

    /// `POST /v1/sandboxes/{id}/resume` (asynchronous: poll for `Running`). Never repeated.
    pub async fn resume_sandbox(&self, id: &str) -> Result<()> {
        self.accepted(&["sandboxes", id, "resume"]).await
    }

    /// Polls [`Client::get_sandbox`] every `interval` until the sandbox is `Running`. A
    /// `Failed`, `Terminated` or `Stopping` sandbox is an [`Error::UnexpectedState`] at once;
    /// past `budget` an [`Error::WaitExpired`].
    pub async fn wait_until_running(
        &self,
        id: &str,
        budget: Duration,
        interval: Duration,
    ) -> Result<SandboxInfo> {
        let deadline = tokio::time::Instant::now() + budget;
        loop {
            let info = self.get_sandbox(id).await?;
            match info.state() {
                SandboxState::Running => return Ok(info),
                SandboxState::Failed | SandboxState::Terminated | SandboxState::Stopping => {
                    return Err(Error::UnexpectedState {
                        id: id.to_owned(),
                        state: info.status.state.to_string(),
                        wanted: SandboxState::Running.to_string(),
                    });
                }
                _ => {}
            }
            if tokio::time::Instant::now() + interval > deadline {
                return Err(Error::WaitExpired {
                    what: format!("sandbox {id} Running (last {})", info.status.state),
                    after: budget,
                    last: None,
                });
            }
            tokio::time::sleep(interval).await;
        }
    }

    /// `POST /v1/sandboxes/{id}/snapshots` (a disk capture; poll for `Ready`). Never repeated.
    pub async fn create_snapshot(&self, id: &str, name: Option<&str>) -> Result<Snapshot> {
        let body = match name {
            Some(n) => json!({ "name": n }),
            None => json!({}),
        };
        let call =
            Call::new(Method::POST, &["sandboxes", id, "snapshots"], Replay::Never)?.json(&body)?;
        self.call(call).await
    }

    /// `GET /v1/snapshots/{id}`.
    pub async fn get_snapshot(&self, snapshot_id: &str) -> Result<Snapshot> {
        self.call(Call::get(&["snapshots", snapshot_id])?).await
    }

    /// `GET /v1/snapshots`: one page.
    pub async fn list_snapshots(&self, filter: &SnapshotFilter) -> Result<SnapshotPage> {
        let mut call = Call::get(&["snapshots"])?;
        if let Some(id) = &filter.sandbox_id {
            call = call.query("sandboxId", id);
        }
        for state in &filter.states {
            call = call.query("state", state.as_str());
        }
        call = call.query("page", filter.page.unwrap_or(1).to_string());
        if let Some(size) = filter.page_size {
            call = call.query("pageSize", size.to_string());
        }
        self.call(call).await
    }

    /// `DELETE /v1/snapshots/{id}`; a 404 is [`Deletion::AlreadyGone`].
    pub async fn delete_snapshot(&self, snapshot_id: &str) -> Result<Deletion> {
        self.delete(&["snapshots", snapshot_id]).await
    }

    /// `GET /v1/sandboxes/{id}/networkpolicy`: the egress sidecar's own account of what it
    /// enforces. With no sidecar the server answers 502 (`BACKEND_CONNECTION_FAILED`) or 404:
    /// treat either as "not enforced".
    pub async fn get_network_policy(&self, id: &str) -> Result<PolicyStatus> {
        self.call(Call::get(&["sandboxes", id, "networkpolicy"])?)
            .await
    }

    /// `PUT /v1/sandboxes/{id}/networkpolicy`: replace the policy. Read it back afterwards:
    /// the answer is the sidecar's, and a runtime change is lost if the sandbox is recreated.
    pub async fn replace_network_policy(
        &self,
        id: &str,
        policy: &NetworkPolicy,
    ) -> Result<PolicyStatus> {
        let call = Call::new(
            Method::PUT,
            &["sandboxes", id, "networkpolicy"],
            Replay::Safe,
        )?
        .json(policy)?;
        self.call(call).await
    }

    /// `PATCH /v1/sandboxes/{id}/networkpolicy`: merge `rules` (a rule replaces one with the
    /// same target; the default action stays).
    pub async fn patch_network_policy(
        &self,
        id: &str,
        rules: &[NetworkRule],
    ) -> Result<PolicyStatus> {
        if rules.is_empty() {
            return Err(Error::InvalidArgument(
                "a network policy patch needs at least one rule".into(),
            ));
        }
        let call = Call::new(
            Method::PATCH,
            &["sandboxes", id, "networkpolicy"],
            Replay::Safe,
        )?
        .json(&rules)?;
        self.call(call).await
    }

    /// `GET /v1/sandboxes/{id}/endpoints/{port}`; `use_server_proxy` asks for the server's
    /// proxy URL instead of the sandbox's own address. A host-network Docker server answers
    /// `127.0.0.1:<port>` for every sandbox.
    pub async fn get_endpoint(
        &self,
        id: &str,
        port: u16,
        use_server_proxy: bool,
    ) -> Result<Endpoint> {
        if port == 0 {
            return Err(Error::InvalidArgument("port must be 1..=65535".into()));
        }
        let port = port.to_string();
        let mut call = Call::get(&["sandboxes", id, "endpoints", &port])?;
        if use_server_proxy {
            call = call.query("use_server_proxy", "true");
        }
        self.call(call).await
    }
}
