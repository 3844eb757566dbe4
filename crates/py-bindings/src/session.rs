//! What every surface of this process shares: the session (one control plane and connection
//! pool per account, one credential check and one shape-catalog fetch, the admission state and
//! the observation), the options every surface is built with, the shutdown budget, and what
//! Python reads of them (`counters()`, `enable_events()`).

use std::time::Duration;

use std::sync::Arc;

use sandbox_core::control::DEFAULT_REQUEST_TIMEOUT;
use sandbox_core::provider::{Provider, ProviderKind};
use sandbox_core::session::{ProviderConnector, Session};
use sandbox_core::surface::SurfaceOptions;
use sandbox_opensandbox::{OpenSandbox, OpenSandboxSettings};

use crate::events;
use crate::perprocess::{PerProcess, forked};

/// Time allowed for a shutdown to destroy every live guest.
pub const SHUTDOWN_BUDGET: Duration = Duration::from_secs(30);

/// The options every surface of this process is built with: the process's session, and the
/// fork rule applied when this process was forked.
pub fn surface_options() -> SurfaceOptions {
    SurfaceOptions {
        session: Some(session()),
        ..SurfaceOptions::default()
    }
    .for_process(forked())
}

/// The options the OpenSandbox executor is built with: the same as [`surface_options`] but on
/// [`opensandbox_session`].
pub fn opensandbox_surface_options() -> SurfaceOptions {
    SurfaceOptions {
        session: Some(opensandbox_session()),
        ..SurfaceOptions::default()
    }
    .for_process(forked())
}

/// The session of this process's surfaces that run on an OpenSandbox server.
static OPENSANDBOX_SESSION: PerProcess<Session> = PerProcess::new();

/// This process's OpenSandbox session, built on first use: its accounts hold the OpenSandbox
/// provider over the `OPEN_SANDBOX_*` settings (read when the first run opens it; a missing
/// key or a bad value refuses that run, naming the setting). It shares [`session`]'s
/// admission and observation, so the process's caps count every guest whatever its provider,
/// and its guests' totals and usage records are OpenSandbox's.
pub fn opensandbox_session() -> Session {
    OPENSANDBOX_SESSION.get_or_init(|| {
        let connector: ProviderConnector = Arc::new(|_, _| {
            let settings = OpenSandboxSettings::from_env()?;
            Ok(Arc::new(OpenSandbox::new(settings)?) as Arc<dyn Provider>)
        });
        Session::with_provider_connector_sharing(
            connector,
            DEFAULT_REQUEST_TIMEOUT,
            &session(),
            ProviderKind::OpenSandbox,
        )
    })
}

/// The session (one control plane and connection pool per account, one credential check and
/// one shape-catalog fetch) that every surface of this process shares.
static SESSION: PerProcess<Session> = PerProcess::new();

/// This process's session, built on first use (a child after `fork()` builds its own).
pub fn session() -> Session {
    SESSION.get_or_init(|| {
        let session = Session::default();
        events::observe_session(&session);
        session
    })
}

/// This process's session, if it built one already.
pub fn current_session() -> Option<Session> {
    SESSION.current()
}

/// Starts queueing this process's events (and its forked children's) for
/// [`events::drain_events`]. Idempotent; no thread, no I/O (a session not built yet gets the
/// queue when it is).
#[pyo3::pyfunction]
pub fn enable_events() {
    events::enable();
    if let Some(session) = current_session() {
        events::observe_session(&session);
    }
}

/// The prefix of the families of every provider but CreateOS (whose `createos_…` families
/// predate the `provider` label and stay as they are): `langflow_sandbox_…{provider=…}`.
pub const PROVIDER_FAMILY_PREFIX: &str = "langflow_sandbox_";

/// The provider-labelled name of the `createos_…` family `name`.
pub fn provider_family(name: &str) -> String {
    format!(
        "{PROVIDER_FAMILY_PREFIX}{}",
        name.strip_prefix("createos_").unwrap_or(name)
    )
}

/// One native total: its family name (`createos_…`), its labels, its value.
pub type Sample = (String, std::collections::BTreeMap<String, String>, f64);

/// This process's native totals (see `sandbox_core::observe::Counters::snapshot`): CreateOS's
/// guests' as `createos_…`, another provider's as `langflow_sandbox_…` with a `provider`
/// label (e.g. `langflow_sandbox_runs_total{provider="opensandbox"}`); with the
/// admission state now: `createos_admission_live` (guests holding a slot) and
/// `createos_admission_waiting` (runs in line for one), and, once a run named an admission
/// store, the leases it holds (`createos_admission_store_leases_held`) and the runs refused at
/// a deployment-wide cap (`createos_admission_deployment_refusals_total`); the store's errors,
/// fallbacks and lost leases are among the native totals.
/// A forked child's are its own. No I/O;
/// never a key, code or output.
#[pyo3::pyfunction]
pub fn counters() -> Vec<Sample> {
    let session = session();
    let adm = session.admission().stats();
    let obs = session.observation();
    let mut out: Vec<Sample> = Vec::new();
    for provider in ProviderKind::ALL {
        // CreateOS's families as they always were; another provider's under the
        // provider-labelled `langflow_sandbox_…` names.
        let other = provider != ProviderKind::CreateOs;
        out.extend(obs.counters_of(provider).snapshot().into_iter().map(|s| {
            let mut labels: std::collections::BTreeMap<String, String> = s
                .labels
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect();
            let name = if other {
                labels.insert("provider".to_owned(), provider.as_str().to_owned());
                provider_family(s.name)
            } else {
                s.name.to_owned()
            };
            (name, labels, s.value)
        }));
    }
    #[allow(clippy::cast_precision_loss)] // counts far below 2^52
    for (name, value) in [
        ("createos_admission_live", adm.live as f64),
        (
            "createos_admission_waiting",
            (adm.waiting + adm.waiting_per_flow) as f64,
        ),
    ] {
        out.push((name.to_owned(), std::collections::BTreeMap::new(), value));
    }
    // The deployment's store, once a run named one: this process's side of it.
    if let Some(d) = adm.deployment {
        #[allow(clippy::cast_precision_loss)] // counts far below 2^52
        for (name, value) in [
            ("createos_admission_store_leases_held", d.held as f64),
            (
                "createos_admission_deployment_refusals_total",
                d.refusals as f64,
            ),
        ] {
            out.push((name.to_owned(), std::collections::BTreeMap::new(), value));
        }
    }
    out
}
