//! The deployment's admission store: caps on live guests that hold across every worker process
//! and host of one Langflow deployment, kept in the Redis or PostgreSQL it already runs.
//!
//! This module holds the settings, the [`LeaseStore`] trait and the process's side of it
//! ([`Deployment`]: held leases, the renewer, the waiting line, `doctor`'s lines). The wire
//! clients (Redis, PostgreSQL, their TLS) are a [`StoreDriver`] outside the core, the
//! `sandbox-store` crate, installed once by the place that assembles the process
//! ([`install_driver`]); a build without one refuses every run while a store is set.
//!
//! A place under a deployment-wide cap is a **lease**: a row (PostgreSQL) or a sorted-set member
//! (Redis) under the cap's key, with an expiry set by the store's own clock (so the workers'
//! clocks do not matter). Taking one is one atomic step in the store: drop the expired leases of
//! the key, count the rest, add ours only if the count is under the cap. A lease is never
//! counted twice (its id is unique and the add is conditional) and never lost while its holder
//! lives: one background task per process renews all the leases it holds every third of the
//! lease time, in one round trip per period. A worker killed with SIGKILL renews nothing, so its
//! leases expire and are dropped by the next acquire: its places come back within one lease
//! time ([`ENV_ADMISSION_LEASE`], default 30 s).
//!
//! Runs waiting at a cap wait in one line for the whole deployment, kept in the store beside
//! the leases: a run refused at the cap takes a ticket (its lease id, stamped with the store's
//! time of its first refusal) and keeps it by asking again at every poll; a place is granted
//! only to a run with fewer tickets ahead of it than places free. So the places go first come,
//! first served across every worker, and a worker that keeps asking cannot starve another's
//! runs. A ticket not asked with for [`WAIT_TICKET`] (1 s: its run gave up or died) leaves
//! the line.
//!
//! A lease given back lingers in its process: [`RELEASE_LINGER_QUIET`] (250 ms) while nobody
//! waits in its key's line, [`RELEASE_LINGER`] (5 ms) while runs do; every acquire's answer
//! says how many wait. While nobody waits, and the store answered the process's last call, the
//! process's next run under the same key (within [`WAIT_TICKET`] of the store's last answer
//! there) takes the lease over with no store call: the place passes from the run that ended to
//! the one starting, the count does not change, so the cap holds however full the deployment is
//! (the lease was renewed within a third of its time, so the store still counts it for at least
//! two thirds). Otherwise the process's next acquire removes it in the same atomic step, or it
//! is sent on its own when its linger ends; [`Deployment::flush`] sends what lingers at
//! shutdown. A worker thus pays the store nothing for a run that follows another within the
//! linger while nobody waits (one acquire a second at most), and one round trip (not two) for
//! any other.

//! The store failing (unreachable, slow, refusing) is handled by [`OnFailure`]: refuse the run
//! (the default: fail closed, naming the store and [`ENV_ADMISSION_STORE_ON_FAILURE`]) or fall
//! back to the per-process cap, with a warning and a counter. Every store call is bounded by
//! [`STORE_CALL_TIMEOUT`] and by what is left of the run's own admission wait.
//!
//! The store URL carries a password more often than not: it is held as a secret and shown only
//! as its driver describes it ([`StoreUrl::shown`]: a clean URL rebuilt without its secrets,
//! anything else named, never echoed), in every error, log, `Debug` and `doctor` line; what a store
//! replies is masked, cut and escaped ([`crate::error::outside_text`]) before it enters any.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use sha2::{Digest, Sha256};
use tokio::time::Instant;

use crate::LOG_TARGET;
use crate::error::{ErrorKind, SandboxError};
use crate::vars::non_blank;

/// `CREATEOS_ADMISSION_STORE`: where the deployment-wide caps are held: a `redis://` URL or a
/// `postgres://` / `postgresql://` URL, or `langflow-redis` / `langflow-database` to use
/// Langflow's own [`ENV_LANGFLOW_REDIS_URL`] / [`ENV_LANGFLOW_DATABASE_URL`]. Unset: the caps
/// are per process.
pub const ENV_ADMISSION_STORE: &str = "CREATEOS_ADMISSION_STORE";
/// `CREATEOS_ADMISSION_STORE_ON_FAILURE`: `refuse` (default) or `local` (see [`OnFailure`]).
pub const ENV_ADMISSION_STORE_ON_FAILURE: &str = "CREATEOS_ADMISSION_STORE_ON_FAILURE";
/// `CREATEOS_ADMISSION_LEASE_SECONDS`: how long a lease lives unrenewed (default 30, from 3 to
/// 600): the longest a killed worker's places stay taken.
pub const ENV_ADMISSION_LEASE: &str = "CREATEOS_ADMISSION_LEASE_SECONDS";
/// `CREATEOS_ADMISSION_NAMESPACE`: the prefix of this deployment's keys in the store (default
/// `createos`), so two deployments can share one Redis or one database.
pub const ENV_ADMISSION_NAMESPACE: &str = "CREATEOS_ADMISSION_NAMESPACE";
pub use crate::vars::{ENV_HOST_ID, host_name};
/// Langflow's Redis and database settings, used when [`ENV_ADMISSION_STORE`] is
/// `langflow-redis` / `langflow-database`; spelled in [`crate::withheld`], which withholds them.
pub use crate::withheld::{ENV_LANGFLOW_DATABASE_URL, ENV_LANGFLOW_REDIS_URL};
/// The default of [`ENV_ADMISSION_LEASE`].
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// The default of [`ENV_ADMISSION_NAMESPACE`].
pub const DEFAULT_NAMESPACE: &str = "createos";
/// The longest one store call may take (cut shorter by the run's own wait).
pub const STORE_CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// The PostgreSQL table of the leases (created if missing).
pub const PG_TABLE: &str = "createos_admission_leases";
/// The PostgreSQL table of the runs waiting at a cap, in line (created if missing).
pub const PG_LINE: &str = "createos_admission_line";
/// How long a run waiting at a cap keeps its place in the deployment's line without asking
/// again. A waiting run asks at every poll (at most 375 ms apart), so it keeps its place while
/// it waits; one that gave up or died leaves the line within this.
pub const WAIT_TICKET: Duration = Duration::from_secs(1);

const MIN_LEASE_SECONDS: f64 = 3.0;
const MAX_LEASE_SECONDS: f64 = 600.0;

/// Which kind of store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    /// Redis (one sorted set per key, a Lua script per step).
    Redis,
    /// PostgreSQL (one table, an advisory lock per key).
    Postgres,
}

impl StoreKind {
    /// `redis` or `postgres`.
    pub fn as_str(self) -> &'static str {
        match self {
            StoreKind::Redis => "redis",
            StoreKind::Postgres => "postgres",
        }
    }
}

/// What a run does when the store cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnFailure {
    /// Refuse the run, nothing having run (fail closed). The default.
    Refuse,
    /// Admit the run under the per-process cap alone, with a warning and a counter.
    Local,
}

/// The store setting of a process, validated. Interned ([`StoreConfig::intern`]) so a run's
/// [`crate::admission::Caps`] stay `Copy`.
pub struct StoreConfig {
    /// Redis or PostgreSQL.
    pub kind: StoreKind,
    url: SecretString,
    /// The URL given to the client crate: the TLS parameters taken out.
    connect_url: SecretString,
    /// The TLS its URL asks for.
    pub tls: tls::StoreTls,
    /// The URL as it may be shown ([`StoreUrl::shown`]).
    pub shown: String,
    /// The secrets the URL holds (its password, unknown query values): masked in every error.
    secrets: crate::error::Redactor,
    /// The variable the URL came from ([`ENV_ADMISSION_STORE`] or Langflow's).
    pub source: &'static str,
    /// [`ENV_ADMISSION_STORE_ON_FAILURE`].
    pub on_failure: OnFailure,
    /// [`ENV_ADMISSION_LEASE`].
    pub lease: Duration,
    /// [`ENV_ADMISSION_NAMESPACE`].
    pub namespace: String,
}

impl fmt::Debug for StoreConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreConfig")
            .field("kind", &self.kind)
            .field("url", &self.shown)
            .field("tls", &self.tls)
            .field("source", &self.source)
            .field("on_failure", &self.on_failure)
            .field("lease", &self.lease)
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl Eq for StoreConfig {}

impl PartialEq for StoreConfig {
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind
            && self.url.expose_secret() == other.url.expose_secret()
            && self.tls == other.tls
            && self.source == other.source
            && self.on_failure == other.on_failure
            && self.lease == other.lease
            && self.namespace == other.namespace
    }
}

static INTERNED: Mutex<Vec<&'static StoreConfig>> = Mutex::new(Vec::new());

impl StoreConfig {
    /// Reads the store settings through `lookup`: `None` when [`ENV_ADMISSION_STORE`] is unset
    /// (the per-process caps). A bad value is a refusal naming its variable.
    pub fn from_lookup(
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<&'static StoreConfig>, SandboxError> {
        let Some(raw) = non_blank(lookup, ENV_ADMISSION_STORE) else {
            return Ok(None);
        };
        let (source, url) = match raw.to_ascii_lowercase().as_str() {
            "langflow-redis" => (ENV_LANGFLOW_REDIS_URL, lookup(ENV_LANGFLOW_REDIS_URL)),
            "langflow-database" => (ENV_LANGFLOW_DATABASE_URL, lookup(ENV_LANGFLOW_DATABASE_URL)),
            _ => (ENV_ADMISSION_STORE, Some(raw.clone())),
        };
        let url = url.map(|u| u.trim().to_owned()).filter(|u| !u.is_empty());
        let Some(url) = url else {
            return Err(SandboxError::refused(format!(
                "{ENV_ADMISSION_STORE}={raw} asks for Langflow's own store, but {source} is \
                 unset; set {source}, or set {ENV_ADMISSION_STORE} to a redis:// or \
                 postgres:// URL"
            )));
        };
        let Some(driver) = driver() else {
            return Err(SandboxError::refused(no_driver()));
        };
        let read = driver.read_url(source, &url)?;
        let on_failure = match non_blank(lookup, ENV_ADMISSION_STORE_ON_FAILURE)
            .map(|v| v.to_ascii_lowercase())
            .as_deref()
        {
            None | Some("refuse") => OnFailure::Refuse,
            Some("local") => OnFailure::Local,
            Some(other) => {
                return Err(SandboxError::refused(format!(
                    "{ENV_ADMISSION_STORE_ON_FAILURE}={other:?} is not refuse or local; set it \
                     to refuse (a run is refused while the admission store fails, the default) \
                     or local (it falls back to this process's own cap)"
                )));
            }
        };
        let lease = match non_blank(lookup, ENV_ADMISSION_LEASE) {
            None => DEFAULT_LEASE,
            Some(v) => match v.trim().parse::<f64>() {
                Ok(s) if (MIN_LEASE_SECONDS..=MAX_LEASE_SECONDS).contains(&s) => {
                    Duration::from_secs_f64(s)
                }
                _ => {
                    return Err(SandboxError::refused(format!(
                        "{ENV_ADMISSION_LEASE}={v:?} is not a number of seconds from 3 to 600; \
                         set how long a worker's places outlive it when it is killed (default \
                         30)"
                    )));
                }
            },
        };
        let namespace = match non_blank(lookup, ENV_ADMISSION_NAMESPACE) {
            None => DEFAULT_NAMESPACE.to_owned(),
            Some(ns)
                if ns.len() <= 64
                    && ns
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) =>
            {
                ns
            }
            Some(ns) => {
                return Err(SandboxError::refused(format!(
                    "{ENV_ADMISSION_NAMESPACE}={ns:?} is not a namespace (letters, digits, '-', \
                     '_' and '.', at most 64); set it to a name for this deployment, e.g. \
                     langflow-prod"
                )));
            }
        };
        Ok(Some(Self::intern(StoreConfig {
            kind: read.kind,
            secrets: read.secrets,
            url: SecretString::from(url),
            connect_url: read.connect_url,
            tls: read.tls,
            shown: read.shown,
            source,
            on_failure,
            lease,
            namespace,
        })))
    }

    /// The one `'static` copy of `config` (kept for the life of the process; one per distinct
    /// setting, so bounded by how often an operator changes it).
    pub fn intern(config: StoreConfig) -> &'static StoreConfig {
        let mut list = INTERNED.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(found) = list.iter().find(|c| ***c == config) {
            return found;
        }
        let leaked: &'static StoreConfig = Box::leak(Box::new(config));
        list.push(leaked);
        leaked
    }

    /// `e` with the URL's password masked (a client's message should never hold it; this makes
    /// sure).
    pub fn scrub(&self, mut e: StoreError) -> StoreError {
        e.0 = self.secrets.apply(&e.0);
        e
    }

    /// `text`, a store's reply or a client's message quoting one, as it may enter an error:
    /// the URL's secrets masked, cut and escaped ([`crate::error::outside_text`]).
    pub fn outside(&self, text: &str) -> String {
        crate::error::outside_text(text, &self.secrets)
    }

    /// How the store is named in messages: kind, redacted URL and the variable.
    pub fn describe(&self) -> String {
        format!(
            "the admission store {} ({}, {})",
            self.shown,
            self.kind.as_str(),
            self.source
        )
    }

    /// The URL the store's client connects with ([`StoreUrl::connect_url`]; a secret: it may
    /// hold a password, so it is for the driver's client alone).
    pub fn connect_url(&self) -> &str {
        self.connect_url.expose_secret()
    }

    /// The secrets the URL holds ([`StoreUrl::secrets`]), for a driver's own messages.
    pub fn secrets(&self) -> &crate::error::Redactor {
        &self.secrets
    }

    /// The key of the deployment-wide guest cap.
    pub fn guests_key(&self) -> String {
        format!("{}:guests", self.namespace)
    }

    /// The key of one flow's cap (the flow id hashed: any string is a safe key).
    pub fn flow_key(&self, flow: &str) -> String {
        format!("{}:flow:{}", self.namespace, short_hash(flow))
    }

    /// The key of the create lock of a kept guest.
    pub fn create_lock_key(&self, guest: &str) -> String {
        format!("{}:create:{}", self.namespace, short_hash(guest))
    }
}

fn short_hash(s: &str) -> String {
    let d = Sha256::digest(s.as_bytes());
    d.iter().take(12).fold(String::new(), |mut out, b| {
        use std::fmt::Write as _;
        let _ = write!(out, "{b:02x}");
        out
    })
}

/// A store call that failed (its text never holds the URL's password).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreError(pub String);

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What an acquire found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acquired {
    /// Whether the lease was added.
    pub granted: bool,
    /// Unexpired leases under the key after the step (ours included when granted).
    pub live: u64,
    /// Runs waiting in the key's line after the step (this one included when it joined).
    pub waiting: u64,
}

/// One acquire's question (see [`LeaseStore::try_acquire`]).
#[derive(Debug, Clone, Copy)]
pub struct Ask<'a> {
    /// The cap's key.
    pub key: &'a str,
    /// The cap (`None`: no cap).
    pub cap: Option<usize>,
    /// The lease's id; also the run's ticket in the key's line while it waits.
    pub id: &'a str,
    /// Who holds it ([`Holder`]'s text).
    pub holder: &'a str,
    /// How long the lease lives unrenewed.
    pub ttl: Duration,
    /// Refused, the run joins the key's line (or keeps its place there) for [`WAIT_TICKET`]:
    /// a run that will ask again. `false` for a single try (a warm pool's refill).
    pub queue: bool,
}

/// A boxed future of a store call.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// `(key, lease id)` pairs.
pub type Leases = [(String, String)];

/// A store of leases under keys, each key with a cap (see the module docs).
pub trait LeaseStore: Send + Sync {
    /// Removes the leases of `release` (given back since the last call; gone ones are no
    /// error), drops the expired leases and line tickets of `ask.key`, then adds lease
    /// `ask.id` (held by `ask.holder`, expiring `ask.ttl` from now by the store's clock) if
    /// fewer than `ask.cap` remain (`None`: no cap) and fewer runs wait ahead of it in the
    /// key's line than places are free: first come, first served across the deployment.
    /// Refused, it joins the line when `ask.queue`. One round trip, one step for the store.
    fn try_acquire<'a>(&'a self, ask: Ask<'a>, release: &'a Leases) -> StoreFuture<'a, Acquired>;
    /// Pushes the expiry of each unexpired `(key, id)` to `ttl` from now; returns the ids that
    /// were not there any more (expired or released: lost).
    fn renew<'a>(&'a self, leases: &'a Leases, ttl: Duration) -> StoreFuture<'a, Vec<String>>;
    /// Removes the leases of `leases` (no error for those gone already).
    fn release<'a>(&'a self, leases: &'a Leases) -> StoreFuture<'a, ()>;
    /// Takes ticket `id` out of `key`'s line (no error when it is not there).
    fn leave_line<'a>(&'a self, key: &'a str, id: &'a str) -> StoreFuture<'a, ()>;
    /// Unexpired leases under `key`.
    fn count<'a>(&'a self, key: &'a str) -> StoreFuture<'a, u64>;
    /// What the store's last connection negotiated (`None`: not connected yet, or a store
    /// that does not say).
    fn transport(&self) -> Option<tls::Transport> {
        None
    }
}

pub mod tls;

/// A store URL as the store's driver read it ([`StoreDriver::read_url`]).
pub struct StoreUrl {
    /// Redis or PostgreSQL.
    pub kind: StoreKind,
    /// The URL the driver's client connects with: the TLS parameters it reads itself taken
    /// out (a secret: it may hold a password).
    pub connect_url: SecretString,
    /// The TLS the URL asks for.
    pub tls: tls::StoreTls,
    /// The URL as it may be shown in every error, log line, `Debug` and `doctor` line: rebuilt
    /// without its secrets, or named, never echoed.
    pub shown: String,
    /// The secrets the URL holds (its password, unknown query values): masked in every error.
    pub secrets: crate::error::Redactor,
}

/// The admission store's driver: reads a store URL and opens the store it names. The wire
/// clients (Redis, PostgreSQL, their TLS) live outside the core, in the `sandbox-store` crate,
/// which the one place that assembles a process installs ([`install_driver`]); the core reads
/// the other settings, holds the leases and the waiting line, and never names a driver.
pub trait StoreDriver: Send + Sync {
    /// Reads `url`, the value of `source` (a redacted refusal naming [`ENV_ADMISSION_STORE`]
    /// and the fix when it cannot be used).
    fn read_url(&self, source: &'static str, url: &str) -> Result<StoreUrl, SandboxError>;
    /// The store of `config` (connects on first use).
    fn open(&self, config: &StoreConfig) -> Result<Arc<dyn LeaseStore>, StoreError>;
}

static DRIVER: OnceLock<&'static dyn StoreDriver> = OnceLock::new();

/// Installs the process's admission store driver (the first one installed stays; installing
/// it again is harmless). Without one, a set [`ENV_ADMISSION_STORE`] refuses every run, naming
/// the setting: the caps never silently fall back to per process.
pub fn install_driver(driver: &'static dyn StoreDriver) {
    let _ = DRIVER.set(driver);
}

/// The installed admission store driver (`None`: this build has none).
pub fn driver() -> Option<&'static dyn StoreDriver> {
    DRIVER.get().copied()
}

/// Why a set store cannot be used in a build without a driver.
fn no_driver() -> String {
    format!(
        "{ENV_ADMISSION_STORE} is set, but this build has no admission store driver (the \
         sandbox-store crate is not built in), so no deployment-wide cap can be held and every \
         run is refused; unset {ENV_ADMISSION_STORE} for per-process caps, or use a build with \
         the store (py-bindings' default `store` feature)"
    )
}

/// The store of `config`, opened by the installed driver ([`StoreDriver::open`]).
pub fn open_store(config: &StoreConfig) -> Result<Arc<dyn LeaseStore>, StoreError> {
    match driver() {
        Some(driver) => driver.open(config),
        None => Err(StoreError(no_driver())),
    }
}

// ---------------------------------------------------------------------------------------------
// The process's side: held leases, the renewer, the counters.

/// Who holds a lease: the host ([`ENV_HOST_ID`] or the machine's name) and the process id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// The host name.
    pub host: String,
    /// The process id.
    pub pid: u32,
}

impl Holder {
    /// This process, read now (a forked child is its own holder).
    pub fn current() -> Self {
        Self {
            host: host_name(),
            pid: std::process::id(),
        }
    }
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.host, self.pid)
    }
}

/// What a [`Deployment`] counted so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeploymentStats {
    /// Leases this process holds now.
    pub held: usize,
    /// Store calls that failed or timed out.
    pub store_errors: u64,
    /// Runs admitted under the per-process cap because the store failed (`local`).
    pub fallbacks: u64,
    /// Leases found gone at renewal (expired while their holder lived: the store was away
    /// longer than a lease).
    pub lost: u64,
    /// Runs refused at a deployment-wide cap.
    pub refusals: u64,
}

/// A lease given back, waiting to be removed from the store.
struct Given {
    key: String,
    id: String,
    /// Given back by its holder, so in the store and renewed within a third of a lease: an
    /// acquire of its key may take it over as it is. `false`: a failed call's lease, which may
    /// or may not be in the store (only removed).
    reusable: bool,
    /// When its linger ends and it is sent on its own.
    due: Instant,
}

/// The leases given back and not yet removed, and when the flusher task that sends them
/// wakes next (`None`: no flusher runs).
#[derive(Default)]
struct Pending {
    given: Vec<Given>,
    flusher: Option<Instant>,
}

struct DeploymentInner {
    config: &'static StoreConfig,
    store: Arc<dyn LeaseStore>,
    holder: Holder,
    holder_text: String,
    /// Lease id → key, of every lease held.
    held: Mutex<HashMap<String, String>>,
    /// Leases given back and not yet removed from the store, and whether a flusher runs.
    pending: Mutex<Pending>,
    /// Wakes the flusher early: a lease due before its wake-up was given back.
    flush_sooner: tokio::sync::Notify,
    /// What the last acquire under each key found (bounded: cleared past [`MAX_KEY_STATES`]).
    keys: Mutex<HashMap<String, KeyState>>,
    /// Whether the store answered the last call made to it (acquire, renewal or release):
    /// a lease is taken over only then, never while the store may have lost it.
    healthy: AtomicBool,
    next: AtomicU64,
    renewer: AtomicBool,
    runtime: Option<tokio::runtime::Handle>,
    store_errors: AtomicU64,
    fallbacks: AtomicU64,
    lost: AtomicU64,
    refusals: AtomicU64,
    /// Where errors, fallbacks and lost leases are counted for the exporters.
    obs: Option<crate::observe::Observation>,
}

/// One process's use of the deployment's store (see the module docs). Cheap to clone.
#[derive(Clone)]
pub struct Deployment {
    inner: Arc<DeploymentInner>,
}

impl fmt::Debug for Deployment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Deployment")
            .field("store", &self.inner.config)
            .field("holder", &self.inner.holder_text)
            .finish_non_exhaustive()
    }
}

/// Why a deployment-wide place was not had.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denied {
    /// The cap was reached for the whole wait; the deployment's live count last seen.
    AtCap {
        /// Leases under the key when last asked.
        live: u64,
    },
    /// The store failed (or did not answer in time).
    Store(StoreError),
}

/// A held lease: renewed by the process's renewer until dropped. Dropping it stops its renewal
/// at once and gives it back to the store with the process's next acquire, or after
/// [`RELEASE_LINGER`] / [`RELEASE_LINGER_QUIET`] when no acquire comes first (best effort: its
/// expiry is the backstop).
pub struct StoreLease {
    dep: Deployment,
    key: String,
    id: String,
}

impl fmt::Debug for StoreLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreLease")
            .field("key", &self.key)
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl StoreLease {
    /// The lease's id in the store.
    pub fn id(&self) -> &str {
        &self.id
    }
}

impl Drop for StoreLease {
    fn drop(&mut self) {
        let inner = &self.dep.inner;
        inner
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.id);
        let lease = (std::mem::take(&mut self.key), std::mem::take(&mut self.id));
        self.dep.give_back(vec![lease], true);
    }
}

/// How long a given-back lease waits for the process's next acquire to carry it to the store
/// before it is sent on its own, while runs wait in its key's line (as the process's last
/// acquire there found, or it was refused). A busy process's runs thus cost the store one
/// round trip each instead of two; a place waits at most this long to be free for the runs
/// waiting for it.
pub const RELEASE_LINGER: Duration = Duration::from_millis(5);

/// [`RELEASE_LINGER`] while nobody waits in the key's line (the process's last acquire there
/// was granted with the line empty), however full the deployment. Long enough for a worker
/// serving one run at a time to hand each run's place to its next run with no store call. A
/// run that comes to a full deployment meanwhile may wait this much longer for a place given
/// back idle; and a process hands places on like this for at most [`WAIT_TICKET`] after the
/// store last answered it, so it learns of a run waiting elsewhere within that.
pub const RELEASE_LINGER_QUIET: Duration = Duration::from_millis(250);

/// The most keys whose last answer a process keeps (one per flow with its own cap, and the
/// deployment's): past it they are forgotten, and the next run under each asks the store.
const MAX_KEY_STATES: usize = 4096;

/// What the process's last acquire under one key found.
#[derive(Debug, Clone, Copy)]
struct KeyState {
    /// Leases under the key after it (ours included when granted).
    live: u64,
    /// Granted with nobody waiting in the key's line ([`Acquired::waiting`] 0).
    quiet: bool,
    /// When the store answered.
    at: Instant,
}

/// The most given-back leases one acquire carries (the flusher sends the rest).
const RELEASES_PER_ACQUIRE: usize = 256;

impl Deployment {
    /// This process's use of the store of `config` (connects on first use).
    pub fn new(config: &'static StoreConfig) -> Result<Self, SandboxError> {
        Self::observed(config, None)
    }

    /// [`Deployment::new`], counting store errors, fallbacks and lost leases in `obs`
    /// ([`crate::observe::Event::AdmissionStore`]).
    pub fn observed(
        config: &'static StoreConfig,
        obs: Option<crate::observe::Observation>,
    ) -> Result<Self, SandboxError> {
        let store = open_store(config).map_err(|e| {
            SandboxError::refused(format!("{} cannot be used: {e}", config.describe()))
        })?;
        Ok(Self::build(config, store, obs))
    }

    /// This process's use of `store` under `config` (tests hand their own store).
    pub fn with_store(config: &'static StoreConfig, store: Arc<dyn LeaseStore>) -> Self {
        Self::build(config, store, None)
    }

    fn build(
        config: &'static StoreConfig,
        store: Arc<dyn LeaseStore>,
        obs: Option<crate::observe::Observation>,
    ) -> Self {
        let holder = Holder::current();
        let holder_text = holder.to_string();
        Self {
            inner: Arc::new(DeploymentInner {
                config,
                store,
                holder,
                holder_text,
                held: Mutex::new(HashMap::new()),
                pending: Mutex::new(Pending::default()),
                flush_sooner: tokio::sync::Notify::new(),
                healthy: AtomicBool::new(false),
                keys: Mutex::new(HashMap::new()),
                next: AtomicU64::new(0),
                renewer: AtomicBool::new(false),
                runtime: tokio::runtime::Handle::try_current().ok(),
                store_errors: AtomicU64::new(0),
                fallbacks: AtomicU64::new(0),
                lost: AtomicU64::new(0),
                refusals: AtomicU64::new(0),
                obs,
            }),
        }
    }

    /// The store's settings.
    pub fn config(&self) -> &'static StoreConfig {
        self.inner.config
    }

    /// The store itself.
    pub fn store(&self) -> &Arc<dyn LeaseStore> {
        &self.inner.store
    }

    /// What the store's last connection negotiated: the TLS version and cipher, plain TCP, or
    /// a Unix socket (`None` until a call has connected).
    pub fn transport(&self) -> Option<tls::Transport> {
        self.inner.store.transport()
    }

    /// The live leases under `key` as the store last reported them to this process (`None`:
    /// no acquire under it answered yet, or it was forgotten).
    pub fn last_live(&self, key: &str) -> Option<u64> {
        self.inner
            .keys
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .map(|k| k.live)
    }

    /// This process as a lease holder.
    pub fn holder(&self) -> &Holder {
        &self.inner.holder
    }

    /// What it counted so far.
    pub fn stats(&self) -> DeploymentStats {
        let i = &self.inner;
        DeploymentStats {
            held: i.held.lock().unwrap_or_else(PoisonError::into_inner).len(),
            store_errors: i.store_errors.load(Ordering::Relaxed),
            fallbacks: i.fallbacks.load(Ordering::Relaxed),
            lost: i.lost.load(Ordering::Relaxed),
            refusals: i.refusals.load(Ordering::Relaxed),
        }
    }

    fn emit(&self, what: crate::observe::StoreEvent) {
        if let Some(obs) = &self.inner.obs {
            obs.emit(&crate::observe::Event::AdmissionStore(what));
        }
    }

    fn note_error(&self, e: &StoreError, during: &str) {
        self.inner.healthy.store(false, Ordering::SeqCst);
        let e = &self.inner.config.scrub(e.clone());
        self.inner.store_errors.fetch_add(1, Ordering::Relaxed);
        self.emit(crate::observe::StoreEvent::Error);
        tracing::warn!(
            target: LOG_TARGET,
            store = %self.inner.config.shown,
            error = %e,
            "admission store: {during} failed"
        );
    }

    /// Counts a run admitted under the per-process cap because the store failed, and warns.
    pub fn note_fallback(&self, e: &StoreError) {
        self.inner.fallbacks.fetch_add(1, Ordering::Relaxed);
        self.emit(crate::observe::StoreEvent::Fallback);
        tracing::warn!(
            target: LOG_TARGET,
            store = %self.inner.config.shown,
            error = %e,
            "admission store failed: the run is admitted under this process's own cap \
             ({ENV_ADMISSION_STORE_ON_FAILURE}=local); the deployment-wide cap does not hold \
             until the store answers again"
        );
    }

    /// Counts a run refused at a deployment-wide cap.
    pub fn note_refusal(&self) {
        self.inner.refusals.fetch_add(1, Ordering::Relaxed);
    }

    /// Queues `leases` for removal from the store and makes sure a flusher will send them
    /// when their linger ends; `reusable`: they are known to be in the store (see [`Given`]).
    fn give_back(&self, leases: Vec<(String, String)>, reusable: bool) {
        let inner = &self.inner;
        // While runs wait at a key's cap, its places go back at once (almost) and are never
        // taken over: the waiting runs get them.
        let now = Instant::now();
        let given: Vec<Given> = {
            let keys = inner.keys.lock().unwrap_or_else(PoisonError::into_inner);
            leases
                .into_iter()
                .map(|(key, id)| {
                    let quiet = keys.get(&key).is_some_and(|k| k.quiet);
                    let linger = if quiet {
                        RELEASE_LINGER_QUIET
                    } else {
                        RELEASE_LINGER
                    };
                    Given {
                        key,
                        id,
                        reusable: reusable && quiet,
                        due: now + linger,
                    }
                })
                .collect()
        };
        let Some(due) = given.iter().map(|g| g.due).min() else {
            return;
        };
        let mut pending = inner.pending.lock().unwrap_or_else(PoisonError::into_inner);
        pending.given.extend(given);
        if let Some(wakes) = pending.flusher {
            if due < wakes {
                pending.flusher = Some(due);
                inner.flush_sooner.notify_one();
            }
            return;
        }
        // No runtime to send them from: the next acquire carries them, or they expire.
        let Some(rt) = tokio::runtime::Handle::try_current()
            .ok()
            .or_else(|| inner.runtime.clone())
        else {
            return;
        };
        pending.flusher = Some(due);
        let dep = self.clone();
        rt.spawn(async move {
            let mut until = due;
            loop {
                tokio::select! {
                    () = tokio::time::sleep_until(until) => {}
                    () = dep.inner.flush_sooner.notified() => {
                        // A lease due sooner came in: its due is the wake-up now.
                        let pending = dep.inner.pending.lock().unwrap_or_else(PoisonError::into_inner);
                        until = pending.flusher.unwrap_or(until).min(until);
                        continue;
                    }
                }
                let (batch, next) = {
                    let mut pending = dep
                        .inner
                        .pending
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner);
                    let now = Instant::now();
                    let (batch, left): (Vec<Given>, Vec<Given>) =
                        pending.given.drain(..).partition(|g| g.due <= now);
                    pending.given = left;
                    let next = pending.given.iter().map(|g| g.due).min();
                    // Cleared under the lock: a lease given back from here on starts another.
                    pending.flusher = next;
                    (batch, next)
                };
                if !batch.is_empty() {
                    let batch: Vec<(String, String)> =
                        batch.into_iter().map(|g| (g.key, g.id)).collect();
                    let store = &dep.inner.store;
                    match tokio::time::timeout(STORE_CALL_TIMEOUT, store.release(&batch)).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => dep.note_error(&e, "release"),
                        Err(_) => {
                            dep.note_error(&StoreError("no answer in time".into()), "release");
                        }
                    }
                }
                match next {
                    Some(next) => until = next,
                    None => return,
                }
            }
        });
    }

    /// Sends every given-back lease now (a process's shutdown: what lingers would otherwise
    /// hold its place until it expires). Bounded by [`STORE_CALL_TIMEOUT`].
    pub async fn flush(&self) {
        let batch = self.take_pending(usize::MAX);
        if batch.is_empty() {
            return;
        }
        let until = Instant::now() + STORE_CALL_TIMEOUT;
        if let Err(e) = self.bounded(until, self.inner.store.release(&batch)).await {
            self.note_error(&e, "release");
        }
    }

    /// Up to `most` given-back leases, lingering or not, to be removed from the store.
    fn take_pending(&self, most: usize) -> Vec<(String, String)> {
        let mut pending = self
            .inner
            .pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let n = pending.given.len().min(most);
        pending.given.drain(..n).map(|g| (g.key, g.id)).collect()
    }

    /// A lease of `key` its holder gave back and that is still in the store, taken over: the
    /// place it holds passes from the run that ended to the one starting, with no store call
    /// (the deployment's count does not change, so the cap holds as it did).
    fn take_over(&self, key: &str) -> Option<String> {
        let mut pending = self
            .inner
            .pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let at = pending
            .given
            .iter()
            .rposition(|g| g.reusable && g.key == key)?;
        Some(pending.given.swap_remove(at).id)
    }

    fn mint_id(&self) -> String {
        let n = self.inner.next.fetch_add(1, Ordering::Relaxed);
        let r: u32 = rand::random();
        format!("{}/{n}-{r:08x}", self.inner.holder_text)
    }

    /// One store call, bounded by [`STORE_CALL_TIMEOUT`] and by `until`.
    async fn bounded<T>(&self, until: Instant, call: StoreFuture<'_, T>) -> Result<T, StoreError> {
        let left = until.saturating_duration_since(Instant::now());
        // A call always gets a few milliseconds: a wait of 0 still asks once.
        let limit = left.max(Duration::from_millis(50)).min(STORE_CALL_TIMEOUT);
        match tokio::time::timeout(limit, call).await {
            Ok(r) => r.map_err(|e| self.inner.config.scrub(e)),
            Err(_) => Err(StoreError(format!(
                "no answer within {} ms",
                limit.as_millis()
            ))),
        }
    }

    /// One try at a lease under `key` with `cap` (no waiting, no place in the line):
    /// `Ok(None)` at the cap, or when runs wait in line for every free place.
    pub async fn try_lease(
        &self,
        key: &str,
        cap: Option<usize>,
        until: Instant,
    ) -> Result<(Option<StoreLease>, u64), StoreError> {
        let id = self.mint_id();
        self.attempt(key, cap, until, id, false).await
    }

    /// One try at lease `id` (a run's id for all its tries: its ticket in the line) under
    /// `key` with `cap`; refused, it joins or keeps its place in the line when `queue`.
    async fn attempt(
        &self,
        key: &str,
        cap: Option<usize>,
        until: Instant,
        id: String,
        queue: bool,
    ) -> Result<(Option<StoreLease>, u64), StoreError> {
        // A given-back lease of this key is taken over when the store's last answer under it
        // (at most WAIT_TICKET old) had nobody waiting and left the key within this run's cap
        // (the run's setting, which may have been lowered since), and the store has answered
        // since: a store that failed may have lost the lease, and the run must then ask it.
        let last = self
            .inner
            .keys
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .copied();
        if let Some(last) = last
            && last.quiet
            && last.at.elapsed() <= WAIT_TICKET
            && cap.is_none_or(|c| last.live <= c as u64)
            && self.inner.healthy.load(Ordering::SeqCst)
            && let Some(id) = self.take_over(key)
        {
            return Ok((Some(self.hold(key, id)), last.live));
        }
        let ask = Ask {
            key,
            cap,
            id: &id,
            holder: &self.inner.holder_text,
            ttl: self.inner.config.lease,
            queue,
        };
        let release = self.take_pending(RELEASES_PER_ACQUIRE);
        let call = self.inner.store.try_acquire(ask, &release);
        let got = match self.bounded(until, call).await {
            Ok(got) => got,
            Err(e) => {
                self.note_error(&e, "acquire");
                // The add may have been applied before the answer was lost: give it back (by
                // id, harmless when it was not), with the releases this call carried (removing
                // one twice is no error); the flusher tries once more, expiry being the backstop.
                let mut back = release;
                back.push((key.to_owned(), id));
                self.give_back(back, false);
                return Err(e);
            }
        };
        self.inner.healthy.store(true, Ordering::SeqCst);
        {
            let mut keys = self
                .inner
                .keys
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if keys.len() >= MAX_KEY_STATES && !keys.contains_key(key) {
                keys.clear();
            }
            keys.insert(
                key.to_owned(),
                KeyState {
                    live: got.live,
                    quiet: got.granted && got.waiting == 0,
                    at: Instant::now(),
                },
            );
        }
        if !got.granted {
            return Ok((None, got.live));
        }
        Ok((Some(self.hold(key, id)), got.live))
    }

    /// Lease `id` of `key`, held (and renewed) from now on.
    fn hold(&self, key: &str, id: String) -> StoreLease {
        self.inner
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id.clone(), key.to_owned());
        self.start_renewer();
        StoreLease {
            dep: self.clone(),
            key: key.to_owned(),
            id,
        }
    }

    /// A lease under `key` with `cap`, polling with short jittered backoff until `until` while
    /// the cap is reached; `on_wait` is called once, when the first try finds the cap reached.
    pub async fn lease(
        &self,
        key: &str,
        cap: Option<usize>,
        until: Instant,
        mut on_wait: impl FnMut(),
    ) -> Result<StoreLease, Denied> {
        let mut delay = Duration::from_millis(10);
        let mut first = true;
        // The live count the store last answered with while this run waited.
        let mut seen = None;
        // One id for every try: the run's ticket in the line while it waits.
        let id = self.mint_id();
        loop {
            match self.attempt(key, cap, until, id.clone(), true).await {
                Ok((Some(lease), _)) => return Ok(lease),
                Ok((None, live)) => {
                    seen = Some(live);
                    if first {
                        on_wait();
                        first = false;
                    }
                    let now = Instant::now();
                    if now >= until {
                        self.leave_line(key, id);
                        return Err(Denied::AtCap { live });
                    }
                    let jitter = rand::random_range(0.5..1.5);
                    let sleep = delay.mul_f64(jitter).min(until - now);
                    tokio::time::sleep(sleep).await;
                    delay = (delay * 2).min(Duration::from_millis(250));
                }
                Err(e) => {
                    // The last poll of a run that waited its whole wait at the cap, cut short
                    // by that wait's end (a call gets at least 50 ms): refused at the cap.
                    if let Some(live) = seen
                        && Instant::now() >= until
                    {
                        self.leave_line(key, id);
                        return Err(Denied::AtCap { live });
                    }
                    return Err(Denied::Store(e));
                }
            }
        }
    }

    /// Takes ticket `id` out of `key`'s line now, in the background (a run that gave up:
    /// otherwise it would stand ahead of the others until [`WAIT_TICKET`] ends).
    fn leave_line(&self, key: &str, id: String) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (dep, key) = (self.clone(), key.to_owned());
        rt.spawn(async move {
            let call = dep.inner.store.leave_line(&key, &id);
            if let Err(e) = dep.bounded(Instant::now() + STORE_CALL_TIMEOUT, call).await {
                dep.note_error(&e, "leaving the line");
            }
        });
    }

    /// The unexpired leases under `key`, bounded by [`STORE_CALL_TIMEOUT`].
    pub async fn count(&self, key: &str) -> Result<u64, StoreError> {
        let until = Instant::now() + STORE_CALL_TIMEOUT;
        self.bounded(until, self.inner.store.count(key)).await
    }

    /// Renews every lease held now, once (the renewer's step; tests call it directly).
    pub async fn renew_now(&self) -> Result<(), StoreError> {
        let leases: Vec<(String, String)> = self
            .inner
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(id, key)| (key.clone(), id.clone()))
            .collect();
        if leases.is_empty() {
            return Ok(());
        }
        let until = Instant::now() + STORE_CALL_TIMEOUT;
        let call = self.inner.store.renew(&leases, self.inner.config.lease);
        let answer = self.bounded(until, call).await;
        self.inner.healthy.store(answer.is_ok(), Ordering::SeqCst);
        let lost = answer?;
        if !lost.is_empty() {
            let still: usize = {
                let held = self
                    .inner
                    .held
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                lost.iter().filter(|id| held.contains_key(*id)).count()
            };
            if still > 0 {
                self.inner.lost.fetch_add(still as u64, Ordering::Relaxed);
                for _ in 0..still {
                    self.emit(crate::observe::StoreEvent::LeaseLost);
                }
                tracing::warn!(
                    target: LOG_TARGET,
                    store = %self.inner.config.shown,
                    lost = still,
                    "admission store: {still} lease(s) of live guests expired before they could \
                     be renewed (the store was away longer than {ENV_ADMISSION_LEASE}); the runs \
                     go on, but the deployment may hold more guests than its cap until they end"
                );
            }
        }
        Ok(())
    }

    fn start_renewer(&self) {
        if self.inner.renewer.swap(true, Ordering::SeqCst) {
            return;
        }
        let Some(rt) = tokio::runtime::Handle::try_current()
            .ok()
            .or_else(|| self.inner.runtime.clone())
        else {
            self.inner.renewer.store(false, Ordering::SeqCst);
            return;
        };
        // Held weakly: a dropped deployment stops its renewer.
        let weak = Arc::downgrade(&self.inner);
        let period = self.inner.config.lease / 3;
        rt.spawn(async move {
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                let dep = Deployment { inner };
                if let Err(e) = dep.renew_now().await {
                    dep.note_error(&e, "renewal");
                }
            }
        });
    }

    /// The refusal of a run under [`OnFailure::Refuse`] while the store fails.
    pub fn store_refusal(&self, e: &StoreError) -> SandboxError {
        let c = self.inner.config;
        SandboxError::new(
            ErrorKind::Refused,
            format!(
                "{} failed ({e}), and {ENV_ADMISSION_STORE_ON_FAILURE} is refuse, so the run is \
                 refused and nothing ran; bring the store back or fix what the error names, or \
                 set {ENV_ADMISSION_STORE_ON_FAILURE}=local to admit runs under each process's \
                 own cap while it fails",
                c.describe()
            ),
        )
    }
}

/// What `doctor` learns about the admission store ([`check_store`]).
#[derive(Debug, Clone)]
pub enum StoreCheck {
    /// [`ENV_ADMISSION_STORE`] is unset: the caps hold per process.
    Unset,
    /// The setting is refused: every run is refused with this message (it names the variable
    /// and the fix, never the password).
    Refused(String),
    /// The store as set, and what asking it found.
    Asked {
        /// The store's settings: [`StoreConfig::shown`] (the URL as it may be shown),
        /// [`StoreConfig::kind`], [`StoreConfig::source`], [`StoreConfig::tls`] (what the URL
        /// asks for), [`StoreConfig::on_failure`], [`StoreConfig::lease`],
        /// [`StoreConfig::namespace`].
        config: &'static StoreConfig,
        /// What the store answered, or why it could not be used (the error every run gets
        /// meanwhile, masked, cut and escaped).
        answer: Result<StoreAnswer, String>,
    },
}

/// A store that answered `doctor`'s count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreAnswer {
    /// How long the count took (the connection included, the first time).
    pub latency: Duration,
    /// What the connection negotiated: the TLS version and cipher, plain TCP, or a Unix
    /// socket.
    pub transport: Option<tls::Transport>,
    /// The deployment's live guests (unexpired leases under the guests' key).
    pub live: u64,
    /// [`crate::vars::ENV_MAX_LIVE_GUESTS`] as set (`None`: unset, or a value that the
    /// shared settings refuse).
    pub cap: Option<usize>,
}

impl StoreCheck {
    /// Whether every run is refused because of the store now: the setting is refused, or the
    /// store cannot be used under [`OnFailure::Refuse`].
    pub fn refuses_runs(&self) -> bool {
        match self {
            StoreCheck::Unset => false,
            StoreCheck::Refused(_) => true,
            StoreCheck::Asked { config, answer } => {
                answer.is_err() && config.on_failure == OnFailure::Refuse
            }
        }
    }

    /// Whether a store is set and could not be used (under `local` too, where runs go on
    /// under each process's own cap).
    pub fn is_unreachable(&self) -> bool {
        matches!(self, StoreCheck::Asked { answer: Err(_), .. })
    }

    /// `doctor`'s lines (`Ok`: a finding; `Err`: a refusal every run gets): the store (kind,
    /// URL as it may be shown, the variable, the TLS asked for, on failure, lease, namespace),
    /// whether it answered, over what and how fast, and the deployment's live guests against
    /// its cap. Each line is one line of text, with no password in it.
    pub fn lines(&self) -> Vec<Result<String, String>> {
        let config = match self {
            StoreCheck::Unset => {
                return vec![Ok(format!(
                    "admission store: none ({ENV_ADMISSION_STORE} unset): the caps hold per \
                     process; set it to the deployment's Redis or PostgreSQL for one cap across \
                     every worker and host"
                ))];
            }
            StoreCheck::Refused(e) => return vec![Err(e.clone())],
            StoreCheck::Asked { config, .. } => *config,
        };
        let mut lines = vec![Ok(format!(
            "admission store: {} {} ({}); asks for {}; on failure: {} \
             ({ENV_ADMISSION_STORE_ON_FAILURE}); lease {} s ({ENV_ADMISSION_LEASE}); namespace \
             {:?}",
            config.kind.as_str(),
            config.shown,
            config.source,
            config.tls.describe(),
            match config.on_failure {
                OnFailure::Refuse => "refuse runs",
                OnFailure::Local => "fall back to each process's own cap",
            },
            config.lease.as_secs_f64(),
            config.namespace,
        ))];
        let StoreCheck::Asked { answer, .. } = self else {
            return lines;
        };
        match answer {
            Ok(a) => {
                let over = a
                    .transport
                    .as_ref()
                    .map_or_else(String::new, |t| format!(" over {t}"));
                lines.push(Ok(format!(
                    "admission store: reachable{over}, answered in {:.1} ms",
                    a.latency.as_secs_f64() * 1000.0
                )));
                let max = crate::vars::ENV_MAX_LIVE_GUESTS;
                lines.push(Ok(match a.cap {
                    Some(cap) => format!(
                        "deployment: {} guest(s) live of the deployment-wide cap {max}={cap}",
                        a.live
                    ),
                    None => format!("deployment: {} guest(s) live, no cap ({max} unset)", a.live),
                }));
            }
            Err(e) => {
                let text = format!("admission store: cannot be used ({e})");
                lines.push(match config.on_failure {
                    OnFailure::Refuse => Err(format!(
                        "{text}: every run is refused while it is \
                         ({ENV_ADMISSION_STORE_ON_FAILURE}=refuse); bring it back or fix {}",
                        config.source
                    )),
                    OnFailure::Local => Ok(format!(
                        "{text}: runs fall back to each process's own cap \
                         ({ENV_ADMISSION_STORE_ON_FAILURE}=local)"
                    )),
                });
            }
        }
        lines
    }
}

/// What `doctor` learns about the admission store, read through `lookup`: whether one is set,
/// whether its setting is refused, and if not, one count of the deployment's live guests
/// (bounded by [`STORE_CALL_TIMEOUT`]) with what the connection negotiated. Render it with
/// [`StoreCheck::lines`], or read its fields (a `--json` report).
pub async fn check_store(lookup: &dyn Fn(&str) -> Option<String>) -> StoreCheck {
    let config = match StoreConfig::from_lookup(lookup) {
        Ok(None) => return StoreCheck::Unset,
        Ok(Some(c)) => c,
        Err(e) => return StoreCheck::Refused(e.message().to_owned()),
    };
    let dep = match Deployment::new(config) {
        Ok(d) => d,
        Err(e) => {
            return StoreCheck::Asked {
                config,
                answer: Err(e.message().to_owned()),
            };
        }
    };
    let t0 = Instant::now();
    let answer = match dep.count(&config.guests_key()).await {
        Ok(live) => Ok(StoreAnswer {
            latency: t0.elapsed(),
            transport: dep.transport(),
            live,
            cap: non_blank(lookup, crate::vars::ENV_MAX_LIVE_GUESTS).and_then(|raw| {
                crate::vars::parse_cap(crate::vars::ENV_MAX_LIVE_GUESTS, &raw).ok()
            }),
        }),
        Err(e) => Err(e.0),
    };
    StoreCheck::Asked { config, answer }
}

/// What `doctor` says about the admission store, read through `lookup`, one line each (`Ok`:
/// a finding; `Err`: a refusal every run gets): [`check_store`] rendered by
/// [`StoreCheck::lines`].
pub async fn doctor_lines(lookup: &dyn Fn(&str) -> Option<String>) -> Vec<Result<String, String>> {
    check_store(lookup).await.lines()
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::vars::fixed_lookup as env;

    #[test]
    fn unset_is_per_process() {
        assert!(StoreConfig::from_lookup(&env(&[])).unwrap().is_none());
    }

    /// No driver is ever installed in these tests: a set store refuses, naming the setting,
    /// never its value, and `doctor` says so.
    #[tokio::test]
    async fn a_store_set_in_a_build_without_a_driver_is_refused_naming_it() {
        let lookup = env(&[(ENV_ADMISSION_STORE, "redis://:pw-secret@cache:6379/0")]);
        let e = StoreConfig::from_lookup(&lookup).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Refused);
        assert!(
            e.message().contains(ENV_ADMISSION_STORE) && e.message().contains("sandbox-store"),
            "{e}"
        );
        assert!(!e.message().contains("pw-secret"), "{e}");
        let check = check_store(&lookup).await;
        assert!(check.refuses_runs());
        assert!(check.lines().iter().all(Result::is_err));
    }
}
