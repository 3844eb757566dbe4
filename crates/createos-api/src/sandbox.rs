//! The [`Sandbox`] handle: lifecycle, settings and waits, with a cached projection.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use reqwest::Method;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::error::{Error, Result};
use crate::models::{Bandwidth, ForkSandboxRequest, ResizeResult, SandboxInfo, SandboxStatus};
use crate::options::{RequestOptions, RetryOptions};
use crate::transport::{Transport, seg};
use crate::wire_enum::nullable;

/// Options of the `wait_until_*` pollers.
#[derive(Debug, Clone)]
pub struct WaitOptions {
    /// The polling budget (default 120 s). Zero checks once.
    pub timeout: Duration,
    /// Delay between polls (default 0.5 s, shortened to the remaining budget).
    pub interval: Duration,
    /// Options for each `GET`.
    pub request: RequestOptions,
}

impl Default for WaitOptions {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(120),
            interval: Duration::from_millis(500),
            request: RequestOptions::default(),
        }
    }
}

impl WaitOptions {
    /// Options with a budget.
    pub fn timeout(timeout: Duration) -> Self {
        Self {
            timeout,
            ..Self::default()
        }
    }

    /// Set the poll interval.
    #[must_use]
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }
}

/// A handle on one sandbox. It caches the last server projection, which every lifecycle
/// call and [`Sandbox::refresh`] updates. Clones share the cache.
#[derive(Clone)]
pub struct Sandbox {
    t: Arc<Transport>,
    id: String,
    info: Arc<Mutex<SandboxInfo>>,
}

impl fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sandbox")
            .field("id", &self.id)
            .field("status", &self.status())
            .field("transport", &self.t)
            .finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
struct DestroyAnswer {
    #[serde(default)]
    status: Option<SandboxStatus>,
}

#[derive(Deserialize)]
struct EgressAnswer {
    #[serde(default, deserialize_with = "nullable")]
    egress: Vec<String>,
}

#[derive(Deserialize)]
struct CountAnswer {
    #[serde(default, deserialize_with = "nullable")]
    count: u64,
}

impl Sandbox {
    pub(crate) fn from_info(t: Arc<Transport>, info: SandboxInfo) -> Sandbox {
        Sandbox {
            t,
            id: info.id.clone(),
            info: Arc::new(Mutex::new(info)),
        }
    }

    /// A handle for the same sandbox using another transport (e.g. a delegated token),
    /// starting from a copy of this handle's projection.
    #[allow(dead_code)] // used by extension modules (delegated tokens)
    pub(crate) fn with_transport(&self, t: Arc<Transport>) -> Sandbox {
        Sandbox::from_info(t, self.info())
    }

    pub(crate) fn transport(&self) -> &Arc<Transport> {
        &self.t
    }

    /// A handle on the same sandbox (sharing the cached projection and the connection pool)
    /// whose calls use another default timeout, e.g. a long one for a big transfer.
    #[must_use]
    pub fn with_timeout(&self, timeout: Duration) -> Sandbox {
        Sandbox {
            t: Arc::new(self.t.with_settings(Some(timeout), None)),
            id: self.id.clone(),
            info: Arc::clone(&self.info),
        }
    }

    /// A handle on the same sandbox (sharing the cached projection and the connection pool)
    /// whose calls use another retry policy, e.g. [`RetryOptions::none`] around a call the
    /// caller retries itself. Fails with [`ErrorKind::Config`](crate::ErrorKind::Config) for
    /// an invalid policy, like [`Client::with_retry`](crate::Client::with_retry).
    pub fn with_retry(&self, retry: RetryOptions) -> Result<Sandbox> {
        retry.validate()?;
        Ok(Sandbox {
            t: Arc::new(self.t.with_settings(None, Some(retry))),
            id: self.id.clone(),
            info: Arc::clone(&self.info),
        })
    }

    /// The sandbox id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// A copy of the cached projection.
    pub fn info(&self) -> SandboxInfo {
        self.lock().clone()
    }

    /// The cached status.
    pub fn status(&self) -> SandboxStatus {
        self.lock().status.clone()
    }

    /// The cached name.
    pub fn name(&self) -> Option<String> {
        self.lock().name.clone()
    }

    /// The cached private IP.
    pub fn ip_address(&self) -> Option<String> {
        self.lock().ip.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SandboxInfo> {
        self.info.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn path(&self, suffix: &str) -> String {
        format!("/v1/sandboxes/{}{suffix}", seg(&self.id))
    }

    fn store(&self, info: SandboxInfo) -> SandboxInfo {
        *self.lock() = info.clone();
        info
    }

    /// Decode a projection and cache it.
    async fn project(
        &self,
        method: Method,
        suffix: &str,
        body: Option<Value>,
        opts: &RequestOptions,
    ) -> Result<SandboxInfo> {
        let info: SandboxInfo = self
            .t
            .json(method, &self.path(suffix), &[], body, opts)
            .await?;
        Ok(self.store(info))
    }

    /// A JSend call on this sandbox's path plus `suffix`, with the default request options.
    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        suffix: &str,
        body: Option<Value>,
    ) -> Result<T> {
        let opts = RequestOptions::default();
        self.t
            .json(method, &self.path(suffix), &[], body, &opts)
            .await
    }

    /// `GET /v1/sandboxes/{id}`; updates the cache.
    pub async fn refresh(&self) -> Result<SandboxInfo> {
        self.refresh_with(&RequestOptions::default()).await
    }

    /// [`Sandbox::refresh`] with per-request options.
    pub async fn refresh_with(&self, opts: &RequestOptions) -> Result<SandboxInfo> {
        self.project(Method::GET, "", None, opts).await
    }

    /// `POST …/pause`: snapshot and pause (the answer may still say `pausing`).
    pub async fn pause(&self) -> Result<SandboxInfo> {
        self.project(Method::POST, "/pause", None, &RequestOptions::default())
            .await
    }

    /// `POST …/resume`: the answer usually says `resuming`; follow with
    /// [`Sandbox::wait_until_running`].
    pub async fn resume(&self) -> Result<SandboxInfo> {
        self.project(Method::POST, "/resume", None, &RequestOptions::default())
            .await
    }

    /// `POST …/fork`: a new sandbox cloned from this one (pause it first).
    pub async fn fork(&self, req: ForkSandboxRequest) -> Result<Sandbox> {
        let body = serde_json::to_value(&req).map_err(|e| Error::InvalidArgument(e.to_string()))?;
        let info: SandboxInfo = self.call(Method::POST, "/fork", Some(body)).await?;
        Ok(Sandbox::from_info(Arc::clone(&self.t), info))
    }

    /// `DELETE /v1/sandboxes/{id}`; caches and returns the answered status
    /// (`destroying` or `destroyed`). An answer without a status is a protocol error
    /// and leaves the cache untouched.
    pub async fn destroy(&self) -> Result<SandboxStatus> {
        self.destroy_with(&RequestOptions::default()).await
    }

    /// [`Sandbox::destroy`] with per-request options.
    pub async fn destroy_with(&self, opts: &RequestOptions) -> Result<SandboxStatus> {
        let ans: DestroyAnswer = self
            .t
            .json(Method::DELETE, &self.path(""), &[], None, opts)
            .await?;
        let Some(status) = ans.status.filter(|s| !s.as_str().is_empty()) else {
            return Err(Error::protocol("destroy response lacks `status`"));
        };
        self.lock().status = status.clone();
        Ok(status)
    }

    /// `POST …/resize` (grow only); updates the cached `disk_mib`.
    pub async fn resize(&self, disk_mib: u64) -> Result<ResizeResult> {
        let r: ResizeResult = self
            .call(
                Method::POST,
                "/resize",
                Some(json!({ "disk_mib": disk_mib })),
            )
            .await?;
        self.lock().disk_mib = Some(r.disk_mib);
        Ok(r)
    }

    /// `PATCH {ingress_enabled}`; the answer adds or drops `ingress_url_template`.
    pub async fn set_ingress(&self, enabled: bool) -> Result<SandboxInfo> {
        self.project(
            Method::PATCH,
            "",
            Some(json!({ "ingress_enabled": enabled })),
            &RequestOptions::default(),
        )
        .await
    }

    /// `PATCH` the idle auto-pause window: whole seconds 60..=86400, or `None` to disable.
    pub async fn set_auto_pause(&self, after: Option<Duration>) -> Result<SandboxInfo> {
        let body = match after {
            None => json!({ "disable_auto_pause": true }),
            Some(d) => {
                let secs = d.as_secs();
                if d.subsec_nanos() != 0 || !(60..=86_400).contains(&secs) {
                    return Err(Error::InvalidArgument(
                        "auto-pause must be whole seconds from 60 to 86400".into(),
                    ));
                }
                json!({ "auto_pause_after_seconds": secs })
            }
        };
        self.project(Method::PATCH, "", Some(body), &RequestOptions::default())
            .await
    }

    /// `POST …/ssh-pubkeys`; returns the number of keys after de-duplication.
    pub async fn add_ssh_public_keys<I: IntoIterator<Item = S>, S: Into<String>>(
        &self,
        keys: I,
    ) -> Result<u64> {
        let keys: Vec<String> = keys.into_iter().map(Into::into).collect();
        let ans: CountAnswer = self
            .call(Method::POST, "/ssh-pubkeys", Some(json!({ "keys": keys })))
            .await?;
        Ok(ans.count)
    }

    /// `GET …/egress`: the stored allowlist (empty = allow-all).
    pub async fn egress(&self) -> Result<Vec<String>> {
        let ans: EgressAnswer = self.call(Method::GET, "/egress", None).await?;
        Ok(ans.egress)
    }

    /// `PUT …/egress`: replace the allowlist; returns the stored list and updates the cache.
    pub async fn set_egress<I: IntoIterator<Item = S>, S: Into<String>>(
        &self,
        rules: I,
    ) -> Result<Vec<String>> {
        let rules: Vec<String> = rules.into_iter().map(Into::into).collect();
        let ans: EgressAnswer = self
            .call(Method::PUT, "/egress", Some(json!({ "egress": rules })))
            .await?;
        self.lock().egress = Some(ans.egress.clone());
        Ok(ans.egress)
    }

    /// `GET …/bandwidth`.
    pub async fn bandwidth(&self) -> Result<Bandwidth> {
        self.call(Method::GET, "/bandwidth", None).await
    }

    /// `POST …/bandwidth/recharge`.
    pub async fn recharge_bandwidth(&self, add_bytes: u64) -> Result<Bandwidth> {
        self.call(
            Method::POST,
            "/bandwidth/recharge",
            Some(json!({ "add_bytes": add_bytes })),
        )
        .await
    }

    /// The public URL of `port`: `ingress_url_template` with `<port>` substituted.
    /// Fails unless the cached projection has ingress enabled and a template.
    pub fn preview_url(&self, port: u16) -> Result<String> {
        let info = self.lock();
        match (&info.ingress_url_template, info.ingress_enabled) {
            (Some(t), true) if t.contains("<port>") => Ok(t.replace("<port>", &port.to_string())),
            _ => Err(Error::InvalidArgument(format!(
                "sandbox {} has no ingress URL template (create it with ingress_enabled or call set_ingress(true))",
                self.id
            ))),
        }
    }

    /// The states from which a sandbox never becomes `running` or `paused`.
    const GONE_OR_FAILED: &[SandboxStatus] = &[
        SandboxStatus::Error,
        SandboxStatus::Failed,
        SandboxStatus::Destroying,
        SandboxStatus::Destroyed,
    ];

    /// Poll until `running`; fails on `error`, `failed`, `destroying`, `destroyed`.
    pub async fn wait_until_running(&self, opts: WaitOptions) -> Result<SandboxInfo> {
        self.wait_for(SandboxStatus::Running, Self::GONE_OR_FAILED, opts)
            .await
    }

    /// Poll until `paused`; fails on `error`, `failed`, `destroying`, `destroyed`.
    pub async fn wait_until_paused(&self, opts: WaitOptions) -> Result<SandboxInfo> {
        self.wait_for(SandboxStatus::Paused, Self::GONE_OR_FAILED, opts)
            .await
    }

    /// Poll until `destroyed` (a 404 also counts); fails on `error`, `failed`.
    pub async fn wait_until_destroyed(&self, opts: WaitOptions) -> Result<SandboxInfo> {
        self.wait_for(
            SandboxStatus::Destroyed,
            &[SandboxStatus::Error, SandboxStatus::Failed],
            opts,
        )
        .await
    }

    async fn wait_for(
        &self,
        want: SandboxStatus,
        abort: &[SandboxStatus],
        opts: WaitOptions,
    ) -> Result<SandboxInfo> {
        let deadline = tokio::time::Instant::now() + opts.timeout;
        loop {
            let info = match self.refresh_with(&opts.request).await {
                Ok(info) => info,
                Err(Error::Api(api))
                    if want == SandboxStatus::Destroyed && api.status.as_u16() == 404 =>
                {
                    let mut info = self.lock();
                    info.status = SandboxStatus::Destroyed;
                    return Ok(info.clone());
                }
                Err(e) => return Err(e),
            };
            if info.status == want {
                return Ok(info);
            }
            if abort.contains(&info.status) {
                return Err(Error::UnexpectedState {
                    id: self.id.clone(),
                    status: info.status,
                    wanted: want,
                });
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Err(Error::OperationTimeout {
                    operation: format!(
                        "sandbox {} to become {want} (last status {})",
                        self.id, info.status
                    ),
                    after: opts.timeout,
                });
            }
            tokio::time::sleep(opts.interval.min(deadline - now)).await;
        }
    }
}
