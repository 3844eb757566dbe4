//! The [`Client`], its builder and the account-level calls.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::BoxStream;
use reqwest::Method;
use reqwest::header::HeaderValue;
use secrecy::SecretString;
use serde_json::Value;
use url::Url;

use crate::error::{Error, Result};
use crate::models::{
    CreateSandboxRequest, Health, ListSandboxesOptions, Readiness, RootFsCatalog, SandboxInfo,
    Shape, WhoAmI,
};
use crate::options::{RequestOptions, RetryOptions};
use crate::sandbox::Sandbox;
use crate::transport::{self, SENSITIVE_HEADERS, Shared, Transport, seg};

/// Production control plane.
pub const DEFAULT_BASE_URL: &str = "https://api.sb.createos.sh";
/// Default per-request timeout (60 s).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// Default `User-Agent`.
pub const DEFAULT_USER_AGENT: &str = concat!("createos-rust/", env!("CARGO_PKG_VERSION"));

/// Largest `/readyz` body [`Client::readiness`] reads (64 KiB).
pub const MAX_READINESS_BODY: usize = 64 * 1024;

/// Environment variable holding the API key (the SDK's name; read after
/// [`ENV_SANDBOX_API_KEY`], see [`api_key_from`]).
pub const ENV_API_KEY: &str = "CREATEOS_API_KEY";
/// Environment variable holding the API key under the Langflow plugin's name; when it is set
/// (and not blank) it wins over [`ENV_API_KEY`] (see [`api_key_from`]).
pub const ENV_SANDBOX_API_KEY: &str = "CREATEOS_SANDBOX_API_KEY";

/// The API key an environment holds and the variable it came from, in the one order every
/// reader of this workspace uses: [`ENV_SANDBOX_API_KEY`] first, then [`ENV_API_KEY`]; a
/// blank value counts as unset. The value is not trimmed or checked here.
///
/// The more specific name wins, so a process that sets both (a Langflow server whose
/// environment also serves the SDK) sends the plugin's key from every surface and from
/// [`ClientBuilder::from_env`] alike.
pub fn api_key_from(
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Option<(SecretString, &'static str)> {
    [ENV_SANDBOX_API_KEY, ENV_API_KEY]
        .into_iter()
        .find_map(|name| {
            lookup(name)
                .filter(|v| !v.trim().is_empty())
                .map(|v| (SecretString::from(v), name))
        })
}
/// Environment variable overriding the base URL.
pub const ENV_BASE_URL: &str = "CREATEOS_SANDBOX_BASE_URL";

/// Builder for [`Client`]. Explicit settings win over the environment.
#[derive(Default)]
pub struct ClientBuilder {
    api_key: Option<SecretString>,
    base_url: Option<String>,
    timeout: Option<Duration>,
    retry: Option<RetryOptions>,
    user_agent: Option<String>,
    http: Option<reqwest::Client>,
    allow_insecure_http: bool,
    from_env: bool,
    env: Option<EnvLookup>,
}

/// An environment lookup given to [`ClientBuilder::env_lookup`].
type EnvLookup = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

impl fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientBuilder")
            .field("api_key", &self.api_key.as_ref().map(|_| "[REDACTED]"))
            .field(
                "base_url",
                &self.base_url.as_deref().map(transport::redact_url),
            )
            .field("timeout", &self.timeout)
            .field("retry", &self.retry)
            .field("user_agent", &self.user_agent)
            .field("http_client_injected", &self.http.is_some())
            .field("allow_insecure_http", &self.allow_insecure_http)
            .field("from_env", &self.from_env)
            .field("env_lookup", &self.env.is_some())
            .finish_non_exhaustive()
    }
}

impl ClientBuilder {
    /// The API key (whitespace is trimmed). Also accepts a [`SecretString`].
    #[must_use]
    pub fn api_key(mut self, key: impl Into<SecretString>) -> Self {
        self.api_key = Some(key.into());
        self
    }

    /// The base URL, e.g. `http://127.0.0.1:8080/api`; a path prefix is kept.
    #[must_use]
    pub fn base_url(mut self, url: impl Into<String>) -> Self {
        self.base_url = Some(url.into());
        self
    }

    /// The default per-request timeout (60 s).
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// The retry policy (default: 2 retries, 0.5 s base, 30 s cap).
    #[must_use]
    pub fn retry(mut self, retry: RetryOptions) -> Self {
        self.retry = Some(retry);
        self
    }

    /// The `User-Agent` header.
    #[must_use]
    pub fn user_agent(mut self, ua: impl Into<String>) -> Self {
        self.user_agent = Some(ua.into());
        self
    }

    /// Use this `reqwest::Client` (proxies, custom roots, pool settings ...). It must be built
    /// with `redirect::Policy::none()`, no cookie store and no credential-bearing default
    /// headers; [`ClientBuilder::build`] refuses it otherwise, since reqwest offers no way to
    /// remove them per request.
    #[must_use]
    pub fn http_client(mut self, http: reqwest::Client) -> Self {
        self.http = Some(http);
        self
    }

    /// Allow sending the key over plain `http` to a non-loopback host (off by default;
    /// loopback hosts are always allowed so local fakes work).
    #[must_use]
    pub fn allow_insecure_http(mut self, allow: bool) -> Self {
        self.allow_insecure_http = allow;
        self
    }

    /// Fill unset key and base URL from the environment: the key from
    /// `CREATEOS_SANDBOX_API_KEY`, else `CREATEOS_API_KEY` (see [`api_key_from`]), the base URL
    /// from `CREATEOS_SANDBOX_BASE_URL`.
    #[must_use]
    pub fn from_env(mut self) -> Self {
        self.from_env = true;
        self
    }

    /// Read environment variables through `lookup` instead of the process environment:
    /// the proxy variables (always; see [`crate::proxy_for`]) and, with
    /// [`ClientBuilder::from_env`], the key and base URL. Lets tests and embedders pass an
    /// environment without mutating the process's.
    #[must_use]
    pub fn env_lookup(
        mut self,
        lookup: impl Fn(&str) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.env = Some(Arc::new(lookup));
        self
    }

    /// Validate everything and build the client. Fails with [`Error::Config`] on a bad
    /// base URL, a blank key, invalid retry options, an unusable proxy setting or an unsafe
    /// injected client.
    pub fn build(mut self) -> Result<Client> {
        match self.env.take() {
            Some(env) => self.build_with_env(&*env),
            None => self.build_with_env(&|name| std::env::var(name).ok()),
        }
    }

    /// [`ClientBuilder::build`] reading the environment through `env` (testable).
    pub(crate) fn build_with_env(self, env: &dyn Fn(&str) -> Option<String>) -> Result<Client> {
        use secrecy::ExposeSecret;
        let mut key = self.api_key;
        let mut base = self.base_url;
        if self.from_env {
            if key.is_none() {
                key = api_key_from(env).map(|(k, _)| k);
            }
            if base.is_none() {
                base = env(ENV_BASE_URL).filter(|v| !v.trim().is_empty());
            }
        }
        let key = match key {
            Some(k) => {
                let trimmed = k.expose_secret().trim();
                if trimmed.is_empty() {
                    return Err(Error::Config("the API key is blank".into()));
                }
                if HeaderValue::from_str(trimmed).is_err() {
                    return Err(Error::Config(
                        "the API key contains invalid header characters".into(),
                    ));
                }
                Some(SecretString::from(trimmed.to_owned()))
            }
            None => None,
        };
        let (base, base_str) = parse_base(base.as_deref().unwrap_or(DEFAULT_BASE_URL))?;
        if key.is_some()
            && base.scheme() == "http"
            && !self.allow_insecure_http
            && !transport::is_loopback_host(&base)
        {
            return Err(Error::Config(format!(
                "refusing to send the API key over plain http to {}; use https or \
                 ClientBuilder::allow_insecure_http(true)",
                base.host_str().unwrap_or_default()
            )));
        }
        let retry = self.retry.unwrap_or_default();
        retry.validate()?;
        let timeout = self.timeout.unwrap_or(DEFAULT_TIMEOUT);
        if timeout.is_zero() {
            return Err(Error::Config("timeout must be > 0".into()));
        }
        let user_agent =
            HeaderValue::from_str(self.user_agent.as_deref().unwrap_or(DEFAULT_USER_AGENT))
                .map_err(|_| Error::Config("invalid user agent".into()))?;
        let (http, proxy) = if let Some(http) = self.http {
            check_injected(&http)?;
            (http, None)
        } else {
            // Proxies are chosen here, explicitly, never by reqwest's defaults (which
            // would send a plain-http request, key included, through HTTP_PROXY).
            let mut b = reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .connect_timeout(timeout)
                .no_proxy();
            let proxy = crate::net::resolve_proxy(&base_str, env);
            if let Some(p) = &proxy {
                let shown = transport::redact_url(p);
                let px = reqwest::Proxy::all(p.as_str()).map_err(|_| {
                    Error::Config(format!(
                        "the proxy {shown} (from HTTPS_PROXY or ALL_PROXY) is not a usable \
                         proxy URL; fix it, or exclude this host with NO_PROXY"
                    ))
                })?;
                b = b.proxy(px);
            }
            let http = b
                .build()
                .map_err(|e| Error::Config(format!("cannot build the HTTP client: {e}")))?;
            (http, proxy.map(|p| transport::redact_url(&p)))
        };
        let shared = Shared {
            http,
            base,
            base_str,
            timeout,
            retry,
            user_agent,
            allow_insecure_http: self.allow_insecure_http,
            proxy,
        };
        Ok(Client {
            t: Arc::new(Transport::new(shared, key)),
        })
    }
}

/// Refuse an injected client that would follow redirects or add credentials we cannot strip.
/// reqwest exposes these settings only through `Debug`, which this inspects (values are never
/// copied or shown).
fn check_injected(http: &reqwest::Client) -> Result<()> {
    let dbg = format!("{http:?}");
    if !dbg.contains("Policy(None)") {
        return Err(Error::Config(
            "the injected reqwest::Client must be built with redirect::Policy::none()".into(),
        ));
    }
    if dbg.contains("cookie_store: true") {
        return Err(Error::Config(
            "the injected reqwest::Client must not have a cookie store".into(),
        ));
    }
    for name in SENSITIVE_HEADERS {
        if dbg.contains(&format!("\"{name}\":")) {
            return Err(Error::Config(format!(
                "the injected reqwest::Client has a default `{name}` header; credentials are \
                 set by this client only"
            )));
        }
    }
    Ok(())
}

/// Whether a client for `base_url` would send the API key over plain `http` to a host that is
/// not this machine: an `http://` URL whose host is not `localhost`, `127.0.0.0/8` or `::1`.
/// That is what [`ClientBuilder::build`] refuses (with a key) unless
/// [`ClientBuilder::allow_insecure_http`] is set, so an application can tell its own users the
/// fix before building a client. `false` for `https` and for a URL that does not parse.
pub fn sends_key_in_clear(base_url: &str) -> bool {
    Url::parse(base_url.trim())
        .is_ok_and(|url| url.scheme() == "http" && !transport::is_loopback_host(&url))
}

fn parse_base(raw: &str) -> Result<(Url, String)> {
    let trimmed = raw.trim().trim_end_matches('/');
    let url = Url::parse(trimmed).map_err(|e| Error::Config(format!("invalid base URL: {e}")))?;
    if url.scheme() != "http" && url.scheme() != "https" {
        return Err(Error::Config(
            "base URL scheme must be http or https".into(),
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(Error::Config("base URL needs a host".into()));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(Error::Config(
            "base URL must not contain credentials".into(),
        ));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(Error::Config(
            "base URL must not contain a query or fragment".into(),
        ));
    }
    let s = url.as_str().trim_end_matches('/').to_owned();
    Ok((url, s))
}

/// A CreateOS client: cheap to clone, safe to share across tasks.
#[derive(Clone)]
pub struct Client {
    t: Arc<Transport>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("transport", &self.t)
            .finish()
    }
}

impl Client {
    /// Start building a client.
    pub fn builder() -> ClientBuilder {
        ClientBuilder::default()
    }

    /// A client configured from `CREATEOS_SANDBOX_API_KEY` (else `CREATEOS_API_KEY`) and
    /// `CREATEOS_SANDBOX_BASE_URL`. A missing key is not an error here: calls that need it
    /// fail with [`Error::Auth`] before sending anything.
    pub fn from_env() -> Result<Client> {
        Client::builder().from_env().build()
    }

    /// A client sharing this one's connection pool and credential, with another default
    /// timeout. Handles created from it inherit the timeout.
    #[must_use]
    pub fn with_timeout(&self, timeout: Duration) -> Client {
        Client {
            t: Arc::new(self.t.with_settings(Some(timeout), None)),
        }
    }

    /// A client sharing this one's connection pool and credential, with another retry policy.
    pub fn with_retry(&self, retry: RetryOptions) -> Result<Client> {
        retry.validate()?;
        Ok(Client {
            t: Arc::new(self.t.with_settings(None, Some(retry))),
        })
    }

    /// The base URL (without a trailing slash).
    pub fn base_url(&self) -> &str {
        self.t.base_url()
    }

    /// The proxy this client's requests go through, for display (userinfo, query and
    /// fragment hidden, see [`crate::redact_url`]); `None` for direct connections. Always
    /// `None` for a plain-`http` base URL (see [`crate::proxy_for`] for the rules), and for
    /// an injected `reqwest::Client`, whose own proxy settings this client cannot see.
    pub fn proxy(&self) -> Option<&str> {
        self.t.proxy()
    }

    /// Whether a credential is configured.
    pub fn has_api_key(&self) -> bool {
        self.t.has_credential()
    }

    #[allow(dead_code)] // used by extension modules
    pub(crate) fn transport(&self) -> &Arc<Transport> {
        &self.t
    }

    /// `GET /healthz` (no key sent).
    pub async fn health(&self) -> Result<Health> {
        self.t
            .json(
                Method::GET,
                "/healthz",
                &[],
                None,
                &RequestOptions::default(),
            )
            .await
    }

    /// `GET /readyz` (no key, never retried). A 503 is an answer, not an error:
    /// the result says `ready: false`. A non-JSend body falls back to `ready = (status == 200)`.
    /// The client's timeout covers reading the body, which may be at most
    /// [`MAX_READINESS_BODY`] bytes (a protocol error beyond).
    pub async fn readiness(&self) -> Result<Readiness> {
        let opts = RequestOptions {
            disable_retry: true,
            ..RequestOptions::default()
        };
        let cap = transport::BodyCap {
            limit: MAX_READINESS_BODY,
            too_large: false,
        };
        match self
            .t
            .fetch(Method::GET, "/readyz", &[], None, &opts, cap)
            .await
        {
            Ok((status, body)) => Ok(readiness_from(status.as_u16(), &body)),
            Err(Error::Api(api)) if api.status.as_u16() == 503 => {
                Ok(readiness_from(503, &api.body))
            }
            Err(e) => Err(e),
        }
    }

    /// `GET /v1/whoami`.
    pub async fn whoami(&self) -> Result<WhoAmI> {
        self.t
            .json(
                Method::GET,
                "/v1/whoami",
                &[],
                None,
                &RequestOptions::default(),
            )
            .await
    }

    /// All shapes (every page; no key needed).
    pub async fn list_shapes(&self) -> Result<Vec<Shape>> {
        use futures::TryStreamExt;
        transport::paginate(
            Arc::clone(&self.t),
            "/v1/shapes".into(),
            vec![("limit", "500".into())],
            Some("shapes"),
            RequestOptions::default(),
        )
        .try_collect()
        .await
    }

    /// `GET /v1/rootfs` (no key needed).
    pub async fn list_root_file_systems(&self) -> Result<RootFsCatalog> {
        self.t
            .json(
                Method::GET,
                "/v1/rootfs",
                &[],
                None,
                &RequestOptions::default(),
            )
            .await
    }

    /// `POST /v1/sandboxes`. The server may answer before the sandbox is `running`;
    /// use [`Sandbox::wait_until_running`] when that matters.
    pub async fn create_sandbox(&self, req: CreateSandboxRequest) -> Result<Sandbox> {
        self.create_sandbox_with(req, &RequestOptions::default())
            .await
    }

    /// [`Client::create_sandbox`] with per-request options.
    pub async fn create_sandbox_with(
        &self,
        req: CreateSandboxRequest,
        opts: &RequestOptions,
    ) -> Result<Sandbox> {
        let body = serde_json::to_value(&req).map_err(|e| Error::InvalidArgument(e.to_string()))?;
        let mut data = self
            .t
            .json_value(Method::POST, "/v1/sandboxes", &[], Some(body), opts)
            .await?;
        if let Value::Object(obj) = &mut data {
            obj.entry("ingress_enabled")
                .or_insert(Value::Bool(req.ingress_enabled));
        }
        let info: SandboxInfo = self.t.decode_data(data, "/v1/sandboxes")?;
        Ok(Sandbox::from_info(Arc::clone(&self.t), info))
    }

    /// `GET /v1/sandboxes/{id}`.
    pub async fn get_sandbox(&self, id: &str) -> Result<Sandbox> {
        let info: SandboxInfo = self
            .t
            .json(
                Method::GET,
                &format!("/v1/sandboxes/{}", seg(id)),
                &[],
                None,
                &RequestOptions::default(),
            )
            .await?;
        Ok(Sandbox::from_info(Arc::clone(&self.t), info))
    }

    /// `GET /v1/sandboxes/by-ip/{ip}`.
    pub async fn get_sandbox_by_ip(&self, ip: &str) -> Result<Sandbox> {
        let info: SandboxInfo = self
            .t
            .json(
                Method::GET,
                &format!("/v1/sandboxes/by-ip/{}", seg(ip)),
                &[],
                None,
                &RequestOptions::default(),
            )
            .await?;
        Ok(Sandbox::from_info(Arc::clone(&self.t), info))
    }

    /// A handle for a known id without fetching it; its cached status is
    /// `Unknown("")` until [`Sandbox::refresh`].
    pub fn sandbox_handle(&self, id: impl Into<String>) -> Sandbox {
        Sandbox::from_info(Arc::clone(&self.t), SandboxInfo::unfetched(id))
    }

    /// Every sandbox, walking limit/offset pages lazily.
    pub fn list_sandboxes(
        &self,
        opts: ListSandboxesOptions,
    ) -> BoxStream<'static, Result<Sandbox>> {
        use futures::StreamExt;
        let mut q: Vec<(&'static str, String)> = Vec::new();
        if let Some(s) = &opts.status {
            q.push(("status", s.as_str().to_owned()));
        }
        if let Some(l) = opts.limit {
            q.push(("limit", l.to_string()));
        }
        if let Some(o) = opts.offset {
            q.push(("offset", o.to_string()));
        }
        let t = Arc::clone(&self.t);
        transport::paginate::<SandboxInfo>(
            Arc::clone(&self.t),
            "/v1/sandboxes".into(),
            q,
            None,
            opts.request,
        )
        .map(move |r| r.map(|info| Sandbox::from_info(Arc::clone(&t), info)))
        .boxed()
    }
}

fn readiness_from(status: u16, body: &[u8]) -> Readiness {
    let parsed = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| match v {
            Value::Object(mut o) if o.contains_key("status") => o.remove("data"),
            _ => None,
        });
    let mut r = parsed
        .and_then(|d| serde_json::from_value::<Readiness>(d).ok())
        .unwrap_or_else(|| Readiness {
            ready: status == 200,
            ..Readiness::default()
        });
    r.http_status = status;
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::env_of;

    #[test]
    fn the_key_goes_in_clear_only_over_http_to_another_machine() {
        for remote in [
            "http://api.example.test",
            "http://10.0.0.5:8080/",
            " http://LOCALHOST.example ",
        ] {
            assert!(sends_key_in_clear(remote), "{remote}");
        }
        for safe in [
            "https://api.example.test",
            "http://localhost:8080",
            "http://127.0.0.1:9",
            "http://[::1]:8080",
            "not a url",
        ] {
            assert!(!sends_key_in_clear(safe), "{safe}");
        }
        // The same rule as the builder's refusal.
        assert!(
            Client::builder()
                .api_key("k-1234567")
                .base_url("http://10.0.0.5:8080")
                .build()
                .is_err()
        );
    }

    #[test]
    fn from_env_reads_key_and_base_url() {
        let c = Client::builder()
            .from_env()
            .build_with_env(&env_of(&[
                (ENV_API_KEY, "  k1  "),
                (ENV_BASE_URL, "http://127.0.0.1:9/api/"),
            ]))
            .unwrap();
        assert!(c.has_api_key());
        assert_eq!(c.base_url(), "http://127.0.0.1:9/api");
    }

    #[test]
    fn the_key_order_is_the_plugin_variable_then_the_sdk_one() {
        use secrecy::ExposeSecret;
        let key = |pairs: &'static [(&'static str, &'static str)]| {
            api_key_from(&env_of(pairs)).map(|(k, from)| (k.expose_secret().to_owned(), from))
        };
        assert_eq!(
            key(&[
                (ENV_API_KEY, "sdk-key-1"),
                (ENV_SANDBOX_API_KEY, "plugin-key-1")
            ]),
            Some(("plugin-key-1".to_owned(), ENV_SANDBOX_API_KEY))
        );
        assert_eq!(
            key(&[(ENV_API_KEY, "sdk-key-1"), (ENV_SANDBOX_API_KEY, "  ")]),
            Some(("sdk-key-1".to_owned(), ENV_API_KEY)),
            "a blank plugin variable falls through to the SDK's"
        );
        assert_eq!(key(&[]), None);
        let c = Client::builder()
            .from_env()
            .build_with_env(&env_of(&[(ENV_SANDBOX_API_KEY, "k2")]))
            .unwrap();
        assert!(c.has_api_key());
        let c = Client::builder()
            .from_env()
            .build_with_env(&env_of(&[(ENV_API_KEY, " "), (ENV_SANDBOX_API_KEY, "k2")]))
            .unwrap();
        assert!(c.has_api_key());
        let c = Client::builder()
            .from_env()
            .build_with_env(&env_of(&[]))
            .unwrap();
        assert!(!c.has_api_key());
        assert_eq!(c.base_url(), DEFAULT_BASE_URL);
    }

    #[test]
    fn explicit_settings_win_over_the_environment() {
        let c = Client::builder()
            .base_url("https://explicit.test")
            .from_env()
            .build_with_env(&env_of(&[(ENV_BASE_URL, "https://env.test")]))
            .unwrap();
        assert_eq!(c.base_url(), "https://explicit.test");
    }

    #[test]
    fn without_from_env_the_environment_is_ignored() {
        let c = Client::builder()
            .build_with_env(&env_of(&[(ENV_API_KEY, "k")]))
            .unwrap();
        assert!(!c.has_api_key());
    }
}
