//! One session layer for every surface of a process: a control plane per account (one
//! connection pool), its credential check and its shape catalog, each fetched once and shared,
//! and the account's one background orphan sweep.
//!
//! An account is a (key, base URL) pair; the key is held only as a SHA-256 digest in the
//! cache's key. The session also holds the process's [`Admission`] (the caps on live guests).
//! A child process after `fork()` builds its own session (connection pools and counts are per
//! process).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures::future::BoxFuture;
use secrecy::ExposeSecret;
use sha2::{Digest, Sha256};
use tokio::sync::OnceCell;

use crate::LOG_TARGET;
use crate::admission::Admission;
use crate::classify;
use crate::control::DEFAULT_REQUEST_TIMEOUT;
use crate::control::{CallError, CallFailure, ControlPlane};
use crate::error::{Redactor, SandboxError};
use crate::observe::{Event, Observation};
use crate::observed::{Observed, ObservedProvider};
use crate::orphans::{SweepConfig, sweep_provider};
use crate::provider::createos::CreateOs;
use crate::provider::{Provider, ProviderKind};
use crate::retry::{Backoff, retry_until};
use crate::settings::{ENV_BASE_URL, ENV_CONTROL_PLANE_RETRY, Settings};
use crate::shapes::Shape;

/// Builds a control plane from settings (the default, [`http_connector`], talks HTTP to
/// CreateOS); the duration is the timeout of each control call.
pub type Connector =
    Arc<dyn Fn(&Settings, Duration) -> Result<Arc<dyn ControlPlane>, SandboxError> + Send + Sync>;

/// Builds any provider from settings (e.g. an OpenSandbox server's, which reads its own
/// settings); the duration is the timeout of each control call. See
/// [`Session::with_provider_connector`].
pub type ProviderConnector =
    Arc<dyn Fn(&Settings, Duration) -> Result<Arc<dyn Provider>, SandboxError> + Send + Sync>;

/// How a session builds its accounts.
#[derive(Clone)]
enum Connect {
    /// CreateOS's control plane, wrapped in [`CreateOs`] (and counted).
    ControlPlane(Connector),
    /// Any provider.
    Provider(ProviderConnector),
}

/// The process's CreateOS control-plane connector, installed by the place that assembles a
/// process ([`install_connector`]; `sandbox_createos::install()`).
static HTTP_CONNECTOR: OnceLock<Connector> = OnceLock::new();

/// Installs the connector that talks HTTP to the CreateOS control plane of the settings (the
/// `sandbox-createos` crate's, over `createos-api`): what [`http_connector`] and every default
/// [`Session`] use. The first one installed stays; installing again is harmless. The core
/// itself holds no control-plane client.
pub fn install_connector(connector: Connector) {
    let _ = HTTP_CONNECTOR.set(connector);
}

/// The connector that talks HTTP to the CreateOS control plane of the settings: the installed
/// one ([`install_connector`]), looked up when an account is built. In a build that installed
/// none every account is refused, saying so.
pub fn http_connector() -> Connector {
    Arc::new(
        |s: &Settings, timeout: Duration| match HTTP_CONNECTOR.get() {
            Some(connect) => connect(s, timeout),
            None => Err(SandboxError::refused(
                "this build has no CreateOS control-plane client installed (the sandbox-createos \
             crate's install() was not called), so no CreateOS guest can be created",
            )),
        },
    )
}

/// One account's shared state.
pub struct Account {
    cp: Arc<dyn ControlPlane>,
    provider: Arc<dyn Provider>,
    /// Where the account's calls go, as logs and errors show it.
    endpoint: Place,
    credential: OnceCell<String>,
    shapes: OnceCell<Vec<Shape>>,
    orphan_sweep: AtomicBool,
    obs: Observation,
}

impl std::fmt::Debug for Account {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Account")
            .field("credential_checked", &self.credential.initialized())
            .field("catalog_cached", &self.shapes.initialized())
            .finish_non_exhaustive()
    }
}

impl Account {
    /// The account's CreateOS control plane (templates, `doctor`'s CreateOS checks). On an
    /// account of another provider every call of it fails with a [`CallFailure::Config`] error
    /// that names the provider; use [`Account::provider`].
    pub fn control_plane(&self) -> &Arc<dyn ControlPlane> {
        &self.cp
    }

    /// The account's provider: every guest lifecycle goes through it.
    pub fn provider(&self) -> &Arc<dyn Provider> {
        &self.provider
    }

    /// The credential check (`whoami`), once per account per process: the account label.
    /// Transient failures are retried with `backoff` inside its budget; a failure is not
    /// cached, so the next call tries again.
    pub async fn credential(
        &self,
        backoff: &Backoff,
        redactor: &Redactor,
    ) -> Result<String, SandboxError> {
        let provider = self.provider.clone();
        cached(
            &self.credential,
            "credential check",
            (backoff, &self.endpoint),
            redactor,
            move || {
                let provider = provider.clone();
                Box::pin(async move { provider.check().await })
            },
        )
        .await
    }

    /// The shape catalog, once per account per process (retried like
    /// [`Account::credential`]).
    pub async fn shapes(
        &self,
        backoff: &Backoff,
        redactor: &Redactor,
    ) -> Result<Vec<Shape>, SandboxError> {
        let provider = self.provider.clone();
        cached(
            &self.shapes,
            "shape catalog",
            (backoff, &self.endpoint),
            redactor,
            move || {
                let provider = provider.clone();
                Box::pin(async move {
                    let sizes = provider.sizes().await?;
                    Ok(sizes
                        .into_iter()
                        .map(|z| Shape {
                            id: z.id,
                            vcpu: z.vcpu,
                            mem_mib: z.mem_mib,
                        })
                        .collect())
                })
            },
        )
        .await
    }

    /// The credential check and the catalog, concurrently.
    pub async fn preflight(
        &self,
        backoff: &Backoff,
        redactor: &Redactor,
    ) -> (
        Result<String, SandboxError>,
        Result<Vec<Shape>, SandboxError>,
    ) {
        tokio::join!(
            self.credential(backoff, redactor),
            self.shapes(backoff, redactor)
        )
    }

    /// Starts the background sweep of this account's orphans ([`crate::orphans`]), the first
    /// time only in this process. Never waits for it: it runs on the current tokio runtime,
    /// bounded by its deadline, and logs its count at info (or why it failed at warn).
    pub fn start_orphan_sweep(&self, config: SweepConfig) {
        if self.orphan_sweep.swap(true, Ordering::SeqCst) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::debug!(target: LOG_TARGET, "no async runtime: orphan sweep skipped");
            return;
        };
        let provider = Arc::clone(&self.provider);
        let obs = self.obs.clone();
        runtime.spawn(async move {
            match sweep_provider(provider.as_ref(), false, &config).await {
                Ok(report) => {
                    obs.emit(&Event::OrphansReaped {
                        count: report.deleted.len() as u64,
                    });
                    tracing::info!(
                    target: LOG_TARGET,
                    deleted = report.deleted.len(),
                    failed = report.failed.len(),
                    examined = report.examined,
                    "orphan sweep: {} paused one-shot guest(s) of earlier processes deleted",
                    report.deleted.len()
                    );
                }
                Err(e) => tracing::warn!(
                    target: LOG_TARGET,
                    error = %e.message,
                    "orphan sweep failed; orphans stay paused until the next process or \
                     `python -m langflow_sandbox_createos reap`"
                ),
            }
        });
    }
}

/// The process that last said it is retrying an unanswering control plane
/// ([`say_retrying_once`]); a child after `fork()` says it again, once.
static SAID_RETRYING: AtomicU32 = AtomicU32::new(0);

/// Where an account's calls go, as logs and errors name it.
#[derive(Debug, Clone)]
struct Place {
    /// The URL ([`crate::error::redact_url`]) or the provider's name.
    endpoint: String,
    /// The place in a sentence, with the setting that decides it: `control plane at URL
    /// (CREATEOS_SANDBOX_BASE_URL)`.
    described: String,
    /// Who runs it, before [`Place::described`] in the log line (`CreateOS `, or nothing).
    owner: &'static str,
    /// The provider, as errors name it.
    kind: ProviderKind,
}

impl Place {
    fn createos(base_url: &str) -> Self {
        let endpoint = crate::error::redact_url(base_url);
        Place {
            described: format!("control plane at {endpoint} ({ENV_BASE_URL})"),
            endpoint,
            owner: "CreateOS ",
            kind: ProviderKind::CreateOs,
        }
    }

    fn provider(kind: ProviderKind) -> Self {
        Place {
            endpoint: kind.as_str().to_owned(),
            described: format!("{kind} server (set by the {kind} provider's settings)"),
            owner: "",
            kind,
        }
    }
}

/// Logs, once per process, that a run's first calls to the control plane at `place` fail
/// and are being retried: where, for how long, and which settings decide both.
fn say_retrying_once(place: &Place, what: &str, budget: Duration, e: &CallError) {
    let pid = std::process::id();
    if SAID_RETRYING.swap(pid, Ordering::SeqCst) == pid {
        return;
    }
    let how = if unanswered(e) {
        "did not answer"
    } else {
        "failed"
    };
    tracing::warn!(
        target: LOG_TARGET,
        endpoint = %place.endpoint,
        operation = what,
        error = %e,
        "the {}{} {how} the {what}; retrying for up to {} s ({ENV_CONTROL_PLANE_RETRY}) before \
         the run fails (said once per process)",
        place.owner,
        place.described,
        budget.as_secs_f64()
    );
}

/// Whether `e` means the control plane could not be reached at all (no answer), rather than
/// answered with a failure.
fn unanswered(e: &CallError) -> bool {
    matches!(e.failure, CallFailure::Transport | CallFailure::Timeout)
}

async fn cached<T: Clone>(
    cell: &OnceCell<T>,
    what: &str,
    (backoff, place): (&Backoff, &Place),
    redactor: &Redactor,
    op: impl Fn() -> BoxFuture<'static, Result<T, CallError>>,
) -> Result<T, SandboxError> {
    let deadline = tokio::time::Instant::now() + backoff.budget;
    cell.get_or_try_init(|| async {
        let (res, _) = retry_until(backoff, deadline, what, CallError::is_transient, |_| {
            let attempt = op();
            async move {
                let res = attempt.await;
                if let Err(e) = &res
                    && e.is_transient()
                {
                    say_retrying_once(place, what, backoff.budget, e);
                }
                res
            }
        })
        .await;
        res.map_err(|e| {
            let err = classify::before_dispatch(place.kind, what, &e, false, redactor);
            if !unanswered(&e) {
                return err;
            }
            // Where, and which two settings decide where and for how long.
            SandboxError::new(
                err.kind(),
                format!(
                    "{} The {} did not answer within {} s of retries \
                     ({ENV_CONTROL_PLANE_RETRY}); check the URL and this host's network and \
                     proxy.",
                    err.message(),
                    place.described,
                    backoff.budget.as_secs_f64()
                ),
            )
        })
    })
    .await
    .cloned()
}

/// The accounts of a process. Cheap to clone (shared state); give every surface of a process
/// the same session.
#[derive(Clone)]
pub struct Session {
    inner: Arc<Inner>,
}

/// Accounts by (SHA-256 of the key, base URL).
type Accounts = HashMap<(Vec<u8>, String), Arc<Account>>;

struct Inner {
    connector: Connect,
    request_timeout: Duration,
    accounts: Mutex<Accounts>,
    admission: Admission,
    observation: Observation,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("request_timeout", &self.inner.request_timeout)
            .field("accounts", &self.lock().len())
            .field("admission", &self.inner.admission)
            .finish_non_exhaustive()
    }
}

impl Default for Session {
    fn default() -> Self {
        Self::new(http_connector(), DEFAULT_REQUEST_TIMEOUT)
    }
}

impl Session {
    /// A session whose accounts are built by `connector`, each control call bounded by
    /// `request_timeout`.
    pub fn new(connector: Connector, request_timeout: Duration) -> Self {
        Self::connecting(Connect::ControlPlane(connector), request_timeout)
    }

    /// A session whose accounts run on the providers `connector` builds (any provider, e.g.
    /// an OpenSandbox server), each control call bounded by `request_timeout`. Unlike
    /// [`Session::new`], an account does not need a CreateOS key: the connector reads and
    /// checks its provider's own settings.
    pub fn with_provider_connector(
        connector: ProviderConnector,
        request_timeout: Duration,
    ) -> Self {
        Self::connecting(Connect::Provider(connector), request_timeout)
    }

    /// A session whose accounts run on the providers `connector` builds, as
    /// [`Session::with_provider_connector`], that shares `base`'s admission (its caps and its
    /// line: a process's guests are admitted in one place whatever their provider) and
    /// `base`'s observation, its events tagged as `provider`'s (so the totals and usage
    /// records say which provider ran each guest).
    pub fn with_provider_connector_sharing(
        connector: ProviderConnector,
        request_timeout: Duration,
        base: &Session,
        provider: crate::provider::ProviderKind,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                connector: Connect::Provider(connector),
                request_timeout,
                accounts: Mutex::new(HashMap::new()),
                admission: base.admission().clone(),
                observation: base.observation().for_provider(provider),
            }),
        }
    }

    fn connecting(connector: Connect, request_timeout: Duration) -> Self {
        let admission = Admission::new();
        let observation = Observation::new();
        admission.observe_with(&observation);
        Self {
            inner: Arc::new(Inner {
                connector,
                request_timeout,
                accounts: Mutex::new(HashMap::new()),
                admission,
                observation,
            }),
        }
    }

    /// The process's admission control, shared by every surface and warm pool on this session
    /// (see [`crate::admission`]).
    pub fn admission(&self) -> &Admission {
        &self.inner.admission
    }

    /// The process's observation (native counters and the registered observer), shared by
    /// every surface on this session; every control-plane call of its accounts is counted
    /// there (see [`crate::observe`]).
    pub fn observation(&self) -> &Observation {
        &self.inner.observation
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Accounts> {
        self.inner
            .accounts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The account of `settings`' key and base URL, built on first use. On CreateOS
    /// ([`Session::new`]) refused without a key.
    pub fn account(&self, settings: &Settings) -> Result<Arc<Account>, SandboxError> {
        let key = match &self.inner.connector {
            Connect::ControlPlane(_) => Some(settings.require_key()?),
            Connect::Provider(_) => settings.require_key().ok(),
        };
        let digest = key.map_or_else(Vec::new, |k| {
            Sha256::digest(k.expose_secret().as_bytes()).to_vec()
        });
        let id = (digest, settings.base_url.clone());
        let mut map = self.lock();
        if let Some(a) = map.get(&id) {
            return Ok(a.clone());
        }
        let timeout = self.inner.request_timeout;
        let (cp, provider, endpoint) = match &self.inner.connector {
            Connect::ControlPlane(connect) => {
                let cp =
                    Observed::wrap(connect(settings, timeout)?, self.inner.observation.clone());
                let provider: Arc<dyn Provider> = Arc::new(CreateOs::new(cp.clone()));
                (cp, provider, Place::createos(&settings.base_url))
            }
            Connect::Provider(connect) => {
                let provider = connect(settings, timeout)?;
                // Its calls count under its own provider, apart from CreateOS's.
                let obs = self.inner.observation.for_provider(provider.kind());
                let provider = ObservedProvider::wrap(provider, obs);
                let cp: Arc<dyn ControlPlane> = Arc::new(NotCreateOs(provider.kind()));
                let place = Place::provider(provider.kind());
                (cp, provider, place)
            }
        };
        let a = Arc::new(Account {
            cp,
            provider,
            endpoint,
            obs: self.inner.observation.clone(),
            credential: OnceCell::new(),
            shapes: OnceCell::new(),
            orphan_sweep: AtomicBool::new(false),
        });
        map.insert(id, a.clone());
        Ok(a)
    }
}

/// The control plane of an account whose provider is not CreateOS: every call fails, naming
/// the provider ([`Account::control_plane`]).
struct NotCreateOs(ProviderKind);

impl NotCreateOs {
    fn refuse<T: Send + 'static>(&self, what: &str) -> BoxFuture<'static, Result<T, CallError>> {
        let e = CallError::new(
            CallFailure::Config,
            format!(
                "{what} is CreateOS's, but this account runs on the {} provider",
                self.0
            ),
        );
        Box::pin(futures::future::ready(Err(e)))
    }
}

impl ControlPlane for NotCreateOs {
    fn check_credential(&self) -> BoxFuture<'_, Result<String, CallError>> {
        self.refuse("the CreateOS credential check")
    }
    fn list_shapes(&self) -> BoxFuture<'_, Result<Vec<Shape>, CallError>> {
        self.refuse("the shape catalog")
    }
    fn create(
        &self,
        req: crate::control::CreateGuest,
    ) -> BoxFuture<'_, Result<crate::control::GuestInfo, CallError>> {
        self.refuse(&format!("a CreateOS create ({})", req.name))
    }
    fn find_by_name(
        &self,
        _: String,
    ) -> BoxFuture<'_, Result<Option<crate::control::GuestInfo>, CallError>> {
        self.refuse("a CreateOS lookup")
    }
    fn egress(&self, _: String) -> BoxFuture<'_, Result<Option<Vec<String>>, CallError>> {
        self.refuse("a CreateOS egress read")
    }
    fn upload(
        &self,
        _: String,
        _: String,
        _: bytes::Bytes,
    ) -> BoxFuture<'_, Result<(), CallError>> {
        self.refuse("a CreateOS upload")
    }
    fn exec_stream(
        &self,
        _: String,
        _: crate::control::ExecRequest,
    ) -> BoxFuture<'_, Result<crate::control::ExecStream, CallError>> {
        self.refuse("a CreateOS exec")
    }
    fn destroy(&self, _: String) -> BoxFuture<'_, Result<(), CallError>> {
        self.refuse("a CreateOS destroy")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of `name` (labels ignored, summed) in `counters`.
    fn total(counters: &crate::observe::Counters, name: &str) -> f64 {
        counters
            .snapshot()
            .into_iter()
            .filter(|s| s.name == name)
            .map(|s| s.value)
            .sum()
    }

    #[test]
    fn a_sharing_session_counts_in_the_base_sessions_totals_as_its_providers() {
        use crate::observe::Event;
        use crate::provider::ProviderKind;
        let base = Session::default();
        let connector: ProviderConnector = Arc::new(|_, _| {
            Err(SandboxError::new(
                crate::error::ErrorKind::Refused,
                "no provider in this test",
            ))
        });
        let other = Session::with_provider_connector_sharing(
            connector,
            DEFAULT_REQUEST_TIMEOUT,
            &base,
            ProviderKind::OpenSandbox,
        );
        other.observation().emit(&Event::GuestCreated {
            surface: crate::surface::SurfaceKind::Executor,
            shape: "4096Mi",
        });
        let obs = base.observation();
        let created = |c| total(c, "createos_guests_created_total");
        assert!((created(obs.counters_of(ProviderKind::OpenSandbox)) - 1.0).abs() < 1e-9);
        assert!(
            created(obs.counters()).abs() < 1e-9,
            "CreateOS's totals moved"
        );
        // One admission: a guest slot taken on the OpenSandbox session is live on the base.
        let slot = other.admission().try_guest_slot();
        assert!(slot.is_some());
        assert_eq!(base.admission().stats().live, 1);
        drop(slot);
        assert_eq!(base.admission().stats().live, 0);
    }
}
