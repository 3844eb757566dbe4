//! `doctor()`: the deployment check behind `python -m langflow_sandbox_createos doctor`.
//!
//! It checks the surfaces that are enabled (the backend by lfx's two switches, the executor by
//! `LANGFLOW_EXECUTOR_KIND`, the component when asked or when nothing else is), and what every
//! surface shares (lfx's settings, the `CREATEOS_*` settings, the control plane, the caps, the
//! admission store, the egress gateway), once each. Every finding is a line with a level and
//! the setting it is about; a problem is a line at level `refused`, and the exit code is 1 when
//! any problem applies to a checked surface. Before each network wait a progress line goes to
//! stderr, so stdout stays the report. The report ends with one verdict line that counts every
//! problem; no line appears twice; the same report is available as JSON with stable keys.
//!
//! No guest is created. The waits are bounded: the control plane
//! ([`langflow_backend::CONTROL_PLANE_CHECK`]), the gateway
//! ([`langflow_backend::GATEWAY_PROBE_TIMEOUT`]), the admission store
//! ([`sandbox_core::lease::STORE_CALL_TIMEOUT`]) and the executor's template lookup
//! ([`TEMPLATE_LOOKUP`]).

use std::collections::HashSet;
use std::io::Write as _;
use std::time::Duration;

use langflow_backend::{
    Backend, BackendOptions, CONTROL_PLANE_CHECK, DoctorLevel, DoctorLine, ENV_LF_PLUGINS,
    ENV_LF_SELECTED, LfxPolicy, PLUGIN_NAME,
};
use langflow_executor::settings::{
    ENV_INSTALL_LFX, ENV_ROOTFS as ENV_EXECUTOR_ROOTFS, ENV_SHAPE as ENV_EXECUTOR_SHAPE,
    ExecutorSettings,
};
use pyo3::prelude::*;
use sandbox_core::SandboxError;
use sandbox_core::control::{CallFailure, TemplateStatus};
use sandbox_core::names::TEMPLATE_PREFIX;
use sandbox_core::plan::{self, Base, NetworkAsk};
use sandbox_core::retry::clipped;
use sandbox_core::settings::{
    DEFAULT_ROOTFS, ENV_API_KEY, ENV_API_KEY_FALLBACK, ENV_BASE_URL, ENV_MAX_OUTPUT_BYTES,
    ENV_ROOTFS, ENV_WARM_POOL, Settings, read_flag,
};
use sandbox_core::shapes::{Pin, Shape, in_catalog, select_shape};
use serde_json::json;

use crate::{backend, errors, logbridge, runtime, session, wait};
use langflow_backend::opensandbox;

/// How long `doctor` waits for the executor's template to be looked up.
pub const TEMPLATE_LOOKUP: Duration = Duration::from_secs(5);

/// lfx's selection of the whole-flow executor.
const ENV_EXECUTOR_KIND: &str = "LANGFLOW_EXECUTOR_KIND";
/// The catalog images known to have no lfx (`GET /v1/rootfs`: Debian with python3, and a
/// desktop for computer use).
const IMAGES_WITHOUT_LFX: &[&str] = &[DEFAULT_ROOTFS, "desktop:1"];

/// A surface doctor can check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Surface {
    /// The sandbox backend (the Python Interpreter's code).
    Backend,
    /// The CreateOS Sandbox component.
    Component,
    /// The whole-flow executor.
    Executor,
    /// The sandbox backend on a self-hosted OpenSandbox server
    /// (`LANGFLOW_SANDBOX_BACKEND=opensandbox`).
    OpenSandbox,
    /// The whole-flow executor on a self-hosted OpenSandbox server
    /// (`LANGFLOW_EXECUTOR_KIND=opensandbox`).
    OpenSandboxExecutor,
}

impl Surface {
    const ALL: [Surface; 5] = [
        Surface::Backend,
        Surface::Component,
        Surface::Executor,
        Surface::OpenSandbox,
        Surface::OpenSandboxExecutor,
    ];

    /// Its name, as `--surface` and the JSON spell it.
    pub fn name(self) -> &'static str {
        match self {
            Surface::Backend => "backend",
            Surface::Component => "component",
            Surface::Executor => "executor",
            Surface::OpenSandbox => "opensandbox",
            Surface::OpenSandboxExecutor => "opensandbox-executor",
        }
    }

    /// Whether it runs on CreateOS (and so is concerned by the `CREATEOS_*` settings and the
    /// control plane; the caps and the admission store concern every surface).
    fn on_createos(self) -> bool {
        !matches!(self, Surface::OpenSandbox | Surface::OpenSandboxExecutor)
    }

    fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.name() == name.trim())
    }
}

/// What a section is about: one surface, or what every surface shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Area {
    Shared,
    Only(Surface),
}

impl Area {
    fn name(self) -> &'static str {
        match self {
            Area::Shared => "shared",
            Area::Only(s) => s.name(),
        }
    }
}

/// Whether a surface is checked, and why (or why not).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Scope {
    surface: Surface,
    checked: bool,
    reason: String,
}

/// One titled group of findings.
#[derive(Debug, Clone)]
struct Section {
    area: Area,
    title: &'static str,
    lines: Vec<DoctorLine>,
}

/// Which surfaces to check: those `asked` (`--surface`), or else the enabled ones, and the
/// component when nothing else is enabled. Each with its reason.
fn scopes(asked: &[Surface], env: &dyn Fn(&str) -> Option<String>) -> Vec<Scope> {
    if !asked.is_empty() {
        let names: Vec<&str> = asked.iter().map(|s| s.name()).collect();
        let asked_for = format!("--surface {}", names.join(","));
        return Surface::ALL
            .into_iter()
            .map(|surface| {
                let checked = asked.contains(&surface);
                Scope {
                    surface,
                    checked,
                    reason: if checked {
                        asked_for.clone()
                    } else {
                        format!("not in {asked_for}")
                    },
                }
            })
            .collect();
    }
    let backend = match (
        langflow_backend::selected(env).as_deref(),
        langflow_backend::trusted(env),
    ) {
        (Some(PLUGIN_NAME), _) => Ok(format!("{ENV_LF_SELECTED}={PLUGIN_NAME}")),
        (None, true) => Ok(format!(
            "{ENV_LF_PLUGINS} lists {PLUGIN_NAME}, though {ENV_LF_SELECTED} is unset"
        )),
        (Some(other), true) => Err(format!(
            "{ENV_LF_SELECTED}={other} selects another backend, although {ENV_LF_PLUGINS} \
             lists {PLUGIN_NAME}"
        )),
        (other, false) => Err(format!(
            "{ENV_LF_SELECTED} is {} and {ENV_LF_PLUGINS} does not list {PLUGIN_NAME}",
            other.map_or_else(|| "unset".to_owned(), |v| format!("{v:?}"))
        )),
    };
    let kind = env(ENV_EXECUTOR_KIND).map(|v| v.trim().to_owned());
    let on_opensandbox = kind.as_deref() == Some(opensandbox::ENTRY_POINT);
    let executor = match kind.as_deref() {
        Some(PLUGIN_NAME) => Ok(format!("{ENV_EXECUTOR_KIND}={PLUGIN_NAME}")),
        Some(_) if on_opensandbox => Err(format!(
            "{ENV_EXECUTOR_KIND}={}: the executor runs on the OpenSandbox server (checked as \
             opensandbox-executor)",
            opensandbox::ENTRY_POINT
        )),
        Some(other) if !other.is_empty() => Err(format!(
            "{ENV_EXECUTOR_KIND}={other}: lfx hands flow runs to another executor"
        )),
        _ => Err(format!(
            "{ENV_EXECUTOR_KIND} is unset: lfx runs flows in-process"
        )),
    };
    let opensandbox_executor = if on_opensandbox {
        Ok(format!("{ENV_EXECUTOR_KIND}={}", opensandbox::ENTRY_POINT))
    } else {
        Err(format!(
            "{ENV_EXECUTOR_KIND} does not select {}",
            opensandbox::ENTRY_POINT
        ))
    };
    let opensandbox = match (selected_opensandbox(env), trusts_opensandbox(env)) {
        (true, _) => Ok(format!("{ENV_LF_SELECTED}={}", opensandbox::ENTRY_POINT)),
        (false, true) if langflow_backend::selected(env).is_none() => Ok(format!(
            "{ENV_LF_PLUGINS} lists {}, though {ENV_LF_SELECTED} is unset",
            opensandbox::ENTRY_POINT
        )),
        _ => Err(format!(
            "{ENV_LF_SELECTED} does not select {} and {ENV_LF_PLUGINS} does not list it alone",
            opensandbox::ENTRY_POINT
        )),
    };
    let nothing_else = backend.is_err()
        && executor.is_err()
        && opensandbox.is_err()
        && opensandbox_executor.is_err();
    let component = if nothing_else {
        Ok(
            "nothing else is enabled; a flow uses it by its node, with no switch to read"
                .to_owned(),
        )
    } else {
        Err(
            "a flow uses it by its node, with no switch to read; `doctor --surface component` \
             checks it"
                .to_owned(),
        )
    };
    [
        (Surface::Backend, backend),
        (Surface::Component, component),
        (Surface::Executor, executor),
        (Surface::OpenSandbox, opensandbox),
        (Surface::OpenSandboxExecutor, opensandbox_executor),
    ]
    .into_iter()
    .map(|(surface, why)| Scope {
        surface,
        checked: why.is_ok(),
        reason: why.unwrap_or_else(|e| e),
    })
    .collect()
}

/// Whether lfx's selection is the OpenSandbox backend.
fn selected_opensandbox(env: &dyn Fn(&str) -> Option<String>) -> bool {
    langflow_backend::selected(env).as_deref() == Some(opensandbox::ENTRY_POINT)
}

/// Whether lfx's trust list names the OpenSandbox backend.
fn trusts_opensandbox(env: &dyn Fn(&str) -> Option<String>) -> bool {
    env(ENV_LF_PLUGINS)
        .unwrap_or_default()
        .split(',')
        .any(|n| n.trim().eq_ignore_ascii_case(opensandbox::ENTRY_POINT))
}

/// The OpenSandbox surface: lfx's two switches, the `OPEN_SANDBOX_*` settings (each bad value
/// named on its own), the server (one listing, [`opensandbox::SERVER_CHECK`]) and the
/// isolation lfx will see. Creates no sandbox.
async fn opensandbox_lines(env: &dyn Fn(&str) -> Option<String>) -> Vec<DoctorLine> {
    let name = opensandbox::ENTRY_POINT;
    let mut lines = vec![
        if trusts_opensandbox(env) {
            DoctorLine::about(
                DoctorLevel::Ok,
                ENV_LF_PLUGINS,
                format!("lfx trusts the backend ({ENV_LF_PLUGINS} lists {name})"),
            )
        } else {
            DoctorLine::about(
                DoctorLevel::Refused,
                ENV_LF_PLUGINS,
                format!(
                    "{ENV_LF_PLUGINS} does not list {name}: lfx will not load this backend (and \
                     refuses to start if {ENV_LF_SELECTED}={name}); add {name} to it"
                ),
            )
        },
        if selected_opensandbox(env) {
            DoctorLine::about(
                DoctorLevel::Ok,
                ENV_LF_SELECTED,
                format!("lfx selects this backend ({ENV_LF_SELECTED}={name})"),
            )
        } else {
            DoctorLine::about(
                DoctorLevel::Refused,
                ENV_LF_SELECTED,
                format!(
                    "{ENV_LF_SELECTED} does not select {name}, so lfx runs the Python \
                     Interpreter's code without it; set {ENV_LF_SELECTED}={name}"
                ),
            )
        },
    ];
    let (settings, server, left_out) = opensandbox_server(env).await;
    lines.extend(server);
    if let Some(settings) = settings {
        lines.extend(opensandbox::isolation_lines(&settings));
        lines.extend(backend_open_egress_refusal(env, &settings));
    }
    without_left_out(lines, &left_out)
}

/// lfx's network settings asking for unrestricted egress (`LANGFLOW_SANDBOX_ALLOW_NETWORK=true`,
/// no domains) on a server that keeps guests from it only by a rule it cannot write (reached
/// over loopback, without `OPEN_SANDBOX_SERVER_UNREACHABLE`): every run is refused, so doctor
/// says so as a problem. lfx's own settings that do not read are reported elsewhere.
fn backend_open_egress_refusal(
    env: &dyn Fn(&str) -> Option<String>,
    settings: &sandbox_opensandbox::OpenSandboxSettings,
) -> Option<DoctorLine> {
    use sandbox_opensandbox::gates::{Egress, policy_for};
    let policy = langflow_backend::LfxPolicy::from_lookup(env).ok()?;
    if opensandbox::egress_of(&policy) != Egress::Unrestricted {
        return None;
    }
    let e = policy_for(&Egress::Unrestricted, &settings.server_guard()).err()?;
    Some(DoctorLine::about(
        DoctorLevel::Refused,
        "OPEN_SANDBOX_SERVER_UNREACHABLE",
        format!(
            "every run is refused (LANGFLOW_SANDBOX_ALLOW_NETWORK=true with no \
             LANGFLOW_SANDBOX_ALLOWED_DOMAINS asks for unrestricted egress): {}",
            e.message()
        ),
    ))
}

/// The `OPEN_SANDBOX_*` settings (each bad value named on its own) and the server (one
/// listing, [`opensandbox::SERVER_CHECK`]), for either OpenSandbox surface: what read, the
/// findings, and the settings left out.
async fn opensandbox_server(
    env: &dyn Fn(&str) -> Option<String>,
) -> (
    Option<sandbox_opensandbox::OpenSandboxSettings>,
    Vec<DoctorLine>,
    Vec<String>,
) {
    use sandbox_opensandbox::OpenSandboxSettings;
    // The provider reads its settings through an owned lookup: hand it the values now.
    let read = |l: &dyn Fn(&str) -> Option<String>| {
        let values: Vec<(String, String)> = OPEN_SANDBOX_SETTINGS
            .iter()
            .filter_map(|n| l(n).map(|v| ((*n).to_owned(), v)))
            .collect();
        OpenSandboxSettings::from_lookup(move |k| {
            values.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
        })
    };
    let (settings, mut lines, left_out) = read_each(env, read);
    if let Some(settings) = &settings {
        lines.extend(opensandbox::settings_lines(settings));
        let asks = settings.api_key.is_some()
            && !left_out
                .iter()
                .any(|v| OPEN_SANDBOX_CONNECTION.contains(&v.as_str()));
        if asks {
            progress(&format!(
                "asking the OpenSandbox server (a listing; up to {} s)",
                opensandbox::SERVER_CHECK.as_secs()
            ));
            lines.extend(opensandbox::server_lines(settings).await);
        }
    }
    (settings, lines, left_out)
}

/// The executor on an OpenSandbox server (`LANGFLOW_EXECUTOR_KIND=opensandbox`): the
/// `OPEN_SANDBOX_*` settings and the server, as for the backend; then every refusal a flow run
/// meets before any sandbox exists, found by the executor's own plan over this environment
/// (isolation attested or container isolation accepted, the `CREATEOS_EXECUTOR_*` settings,
/// the egress asked for); and what only a sandbox can tell. Creates no sandbox.
async fn opensandbox_executor_lines(env: &dyn Fn(&str) -> Option<String>) -> Vec<DoctorLine> {
    use langflow_executor::{Executor, ExecutorOptions};
    use sandbox_core::provider::ProviderKind;
    let mut lines = vec![DoctorLine::about(
        DoctorLevel::Ok,
        ENV_EXECUTOR_KIND,
        format!(
            "lfx hands flow runs to the executor on an OpenSandbox server \
             ({ENV_EXECUTOR_KIND}={})",
            opensandbox::ENTRY_POINT
        ),
    )];
    let (settings, server, left_out) = opensandbox_server(env).await;
    lines.extend(server);
    lines.extend(settings.as_ref().and_then(opensandbox::host_kernel_line));
    // The plan reads through an owned lookup: the values of every name set in the process and
    // of every OpenSandbox setting, as `env` gives them.
    let mut names: Vec<String> = std::env::vars_os()
        .filter_map(|(k, _)| k.into_string().ok())
        .collect();
    names.extend(OPEN_SANDBOX_SETTINGS.iter().map(|n| (*n).to_owned()));
    let values: std::collections::BTreeMap<String, String> = names
        .into_iter()
        .filter(|n| !left_out.contains(n))
        .filter_map(|n| env(&n).map(|v| (n, v)))
        .collect();
    let executor = Executor::with_options(ExecutorOptions {
        surface: sandbox_core::surface::SurfaceOptions {
            env: std::sync::Arc::new(move |k: &str| values.get(k).cloned()),
            ..sandbox_core::surface::SurfaceOptions::default()
        },
        provider: ProviderKind::OpenSandbox,
        ..ExecutorOptions::default()
    });
    // Unrestricted egress (the executor's default) must keep guests from the server: a
    // server over loopback without the operator's word refuses every such run.
    let open_refused = match (executor.plan(), &settings) {
        (Ok(plan), Some(s))
            if plan.executor.egress == sandbox_core::egress::EgressPolicy::AllowAll =>
        {
            sandbox_opensandbox::gates::policy_of(&plan.executor.egress, &s.server_guard()).err()
        }
        _ => None,
    };
    match (executor.plan(), open_refused) {
        (Ok(_), Some(e)) => {
            lines.push(DoctorLine::about(
                DoctorLevel::Refused,
                "OPEN_SANDBOX_SERVER_UNREACHABLE",
                format!(
                    "every flow run is refused (CREATEOS_EXECUTOR_EGRESS is unrestricted): {}; or \
                     set CREATEOS_EXECUTOR_EGRESS=none or CREATEOS_EXECUTOR_ALLOWED_DOMAINS",
                    e.message()
                ),
            ));
        }
        (Ok(plan), None) => {
            let isolation = match &settings {
                Some(s) if s.declared_isolation() == "hardware-virtualized" => {
                    "hardware-virtualized, attested (the RuntimeClass and the in-guest probe are \
                     checked on every sandbox)"
                }
                _ => {
                    "container, accepted by OPEN_SANDBOX_ALLOW_CONTAINER_ISOLATION=true (a \
                      shared kernel: a weaker boundary than a virtual machine)"
                }
            };
            lines.push(DoctorLine::new(
                DoctorLevel::Ok,
                format!(
                    "a flow run would go ahead: isolation {isolation}; size {}; timeout {} s \
                     (CREATEOS_EXECUTOR_TIMEOUT_SECONDS)",
                    plan.executor.shape, plan.executor.timeout_seconds
                ),
            ));
        }
        (Err(e), _) => lines.push(DoctorLine::new(DoctorLevel::Refused, e.to_string())),
    }
    lines.push(DoctorLine::new(
        DoctorLevel::Info,
        "not known without creating a sandbox (doctor creates none): whether the image \
         (OPEN_SANDBOX_IMAGE) has lfx and the flow's packages, the server's runtime, its egress \
         sidecar's mode and its Docker network mode; every run checks the last three on its \
         own sandbox before the flow and refuses, naming the server setting",
    ));
    without_left_out(lines, &left_out)
}

/// Every `OPEN_SANDBOX_*` setting the provider reads.
const OPEN_SANDBOX_SETTINGS: &[&str] = &[
    "OPEN_SANDBOX_DOMAIN",
    "OPEN_SANDBOX_API_KEY",
    "OPEN_SANDBOX_CA_FILE",
    "OPEN_SANDBOX_ALLOW_PLAIN_HTTP",
    "OPEN_SANDBOX_SERVER_UNREACHABLE",
    "OPEN_SANDBOX_IMAGE",
    "OPEN_SANDBOX_ENTRYPOINT",
    "OPEN_SANDBOX_CPU",
    "OPEN_SANDBOX_ATTEST_ISOLATION",
    "OPEN_SANDBOX_RUNTIME_CLASS",
    "OPEN_SANDBOX_HOST_KERNEL",
    "OPEN_SANDBOX_ALLOW_CONTAINER_ISOLATION",
    "OPEN_SANDBOX_SANDBOX_TIMEOUT_SECONDS",
    "OPEN_SANDBOX_MAX_RENEW_SECONDS",
    "OPEN_SANDBOX_READY_SECONDS",
    "OPEN_SANDBOX_IDLE_SECONDS",
    "OPEN_SANDBOX_CREATED_BY",
    "OPEN_SANDBOX_USE_SERVER_PROXY",
    "OPEN_SANDBOX_REQUEST_TIMEOUT",
];

/// The settings the server check needs read as given (one left out: not asked).
const OPEN_SANDBOX_CONNECTION: &[&str] = &[
    "OPEN_SANDBOX_DOMAIN",
    "OPEN_SANDBOX_API_KEY",
    "OPEN_SANDBOX_CA_FILE",
    "OPEN_SANDBOX_ALLOW_PLAIN_HTTP",
    "OPEN_SANDBOX_CREATED_BY",
];

/// Reads settings with `read` through `env`, and when a value is refused, reads again without
/// it (as if unset), until the rest reads: every bad value is named once, each on its own, and
/// what the good ones decide is still shown. Returns what was read (`None` when a refusal
/// names no setting that is set), the refusals, and the settings left out.
fn read_each<T>(
    env: &dyn Fn(&str) -> Option<String>,
    read: impl Fn(&dyn Fn(&str) -> Option<String>) -> Result<T, SandboxError>,
) -> (Option<T>, Vec<DoctorLine>, Vec<String>) {
    let mut left_out: Vec<String> = Vec::new();
    let mut refusals = Vec::new();
    // Each pass leaves one more setting out; there are far fewer settings than this.
    for _ in 0..64 {
        let result = {
            let lookup = |k: &str| {
                if left_out.iter().any(|d| d == k) {
                    None
                } else {
                    env(k)
                }
            };
            read(&lookup)
        };
        match result {
            Ok(value) => return (Some(value), refusals, left_out),
            Err(e) => {
                let line = DoctorLine::new(DoctorLevel::Refused, e.message());
                let next = line
                    .setting
                    .clone()
                    .filter(|var| env(var).is_some() && !left_out.contains(var));
                refusals.push(line);
                match next {
                    Some(var) => left_out.push(var),
                    None => return (None, refusals, left_out),
                }
            }
        }
    }
    (None, refusals, left_out)
}

/// Drops the lines (other than problems) that describe a setting left out by [`read_each`]:
/// they would show its default, not the operator's value, which its refusal already names.
fn without_left_out(lines: Vec<DoctorLine>, left_out: &[String]) -> Vec<DoctorLine> {
    lines
        .into_iter()
        .filter(|l| l.is_problem() || !left_out.iter().any(|var| l.text.contains(var.as_str())))
        .collect()
}

/// A progress line on stderr, before a wait (stdout stays the report).
fn progress(what: &str) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "doctor: {what}");
}

/// What the Python side hands over: lfx's sandbox settings (or why they could not be read),
/// the surfaces asked for, and the findings only Python can make.
struct Inputs {
    /// lfx's policy, when lfx's settings loaded.
    policy: Option<Result<LfxPolicy, String>>,
    /// Why lfx's settings did not load: `(setting, message with lfx's reason)`.
    lfx_problems: Vec<(Option<String>, String)>,
    asked: Vec<Surface>,
    /// Which Langflow paths reach the executor (`reach.findings()`).
    paths: Vec<DoctorLine>,
    /// What is exported (`metrics.findings()`).
    exports: Vec<DoctorLine>,
    /// Where each secret comes from ([`secret_lines`]).
    secrets: Vec<DoctorLine>,
}

/// Everything the report needs, gathered with the process environment.
async fn gather(inputs: Inputs, env: &(dyn Fn(&str) -> Option<String> + Sync)) -> Report {
    let scopes = scopes(&inputs.asked, env);
    let checked = |s: Surface| scopes.iter().any(|x| x.surface == s && x.checked);
    let createos_checked = scopes.iter().any(|x| x.checked && x.surface.on_createos());
    let mut sections = Vec::new();

    // The caps, the wait and the retry (each setting on its own), and the admission store.
    let admission: Vec<DoctorLine> = sandbox_core::settings::shared_summary(env)
        .into_iter()
        .map(|line| match line {
            Ok(text) => DoctorLine::new(DoctorLevel::Info, text),
            Err(refusal) => DoctorLine::new(DoctorLevel::Refused, refusal),
        })
        .collect();
    if sandbox_core::settings::non_blank(env, sandbox_core::lease::ENV_ADMISSION_STORE).is_some() {
        progress(&format!(
            "asking the deployment's admission store (up to {} s)",
            sandbox_core::lease::STORE_CALL_TIMEOUT.as_secs()
        ));
    }
    let store: Vec<DoctorLine> = sandbox_core::lease::doctor_lines(env)
        .await
        .into_iter()
        .map(|line| match line {
            Ok(text) => DoctorLine::new(DoctorLevel::Info, text),
            Err(refusal) => DoctorLine::new(DoctorLevel::Refused, refusal),
        })
        .collect();

    // What every surface shares: lfx, the CREATEOS_* settings, the control plane.
    let mut shared = Vec::new();
    for (setting, reason) in &inputs.lfx_problems {
        let text = match setting {
            Some(var) => format!(
                "{reason} (lfx's own check): lfx cannot build its settings, so it runs no flow \
                 (`lfx run` says only \"Settings service not found\"); fix or unset {var}"
            ),
            None => format!(
                "lfx cannot build its settings ({reason}), so it runs no flow (`lfx run` says \
                 only \"Settings service not found\")"
            ),
        };
        shared.push(match setting {
            Some(var) => DoctorLine::about(DoctorLevel::Refused, var, text),
            None => DoctorLine::new(DoctorLevel::Refused, text),
        });
    }
    let (settings, refusals, left_out) = read_each(env, |l| Settings::from_lookup(l));
    // A bad cap, wait, retry or store is said in its own section below.
    shared.extend(
        refusals
            .into_iter()
            .filter(|r| !admission.iter().chain(&store).any(|l| l.text == r.text)),
    );
    let mut catalog: Option<Vec<Shape>> = None;
    // The CreateOS settings and control plane concern only the CreateOS surfaces: with none
    // checked, nothing is said of them and the control plane is not asked.
    if !createos_checked {
        shared.retain(|l| {
            inputs
                .lfx_problems
                .iter()
                .any(|(_, r)| l.text.contains(r.as_str()))
        });
    }
    if let Some(settings) = settings.as_ref().filter(|_| createos_checked) {
        shared.extend(langflow_backend::control_plane_lines(settings));
        let key_left_out = left_out
            .iter()
            .any(|v| v == ENV_API_KEY || v == ENV_API_KEY_FALLBACK);
        let url_left_out = left_out.iter().any(|v| v == ENV_BASE_URL);
        if !key_left_out {
            shared.push(langflow_backend::key_line(settings));
        }
        let usable = if settings.api_key.is_some() && !key_left_out && !url_left_out {
            // A URL the client refuses (plain http to another machine) is refused here, with
            // no wait to announce.
            session::session()
                .account(settings)
                .map_err(|e| shared.push(DoctorLine::new(DoctorLevel::Refused, e.message())))
                .is_ok()
        } else {
            false
        };
        if usable {
            progress(&format!(
                "asking the CreateOS control plane at {} (credential check and shape catalog; \
                 up to {} s)",
                sandbox_createos::shown_url(&settings.base_url),
                CONTROL_PLANE_CHECK.as_secs()
            ));
            let retry = settings
                .control_plane_retry
                .unwrap_or_else(|| sandbox_core::retry::Backoff::default().budget);
            let check =
                langflow_backend::check_control_plane(&session::session(), settings, retry).await;
            shared.extend(check.lines);
            catalog = check.catalog;
        } else if settings.api_key.is_some() && (key_left_out || url_left_out) {
            shared.push(DoctorLine::new(
                DoctorLevel::Info,
                "control plane: not asked until the setting above is fixed",
            ));
        }
        if let sandbox_core::gateway::GatewaySetting::Ready(g) = &settings.gateway {
            progress(&format!(
                "connecting to the egress gateway at {} (up to {} s)",
                g.addr(),
                langflow_backend::GATEWAY_PROBE_TIMEOUT.as_secs()
            ));
        }
        shared.extend(langflow_backend::gateway_lines(&settings.gateway).await);
    }
    sections.push(Section {
        area: Area::Shared,
        title: "Every surface: lfx, settings and the control plane",
        lines: without_left_out(shared, &left_out),
    });
    sections.push(Section {
        area: Area::Shared,
        title: "Every surface: admission and control-plane retry",
        lines: admission,
    });
    sections.push(Section {
        area: Area::Shared,
        title: "Every surface: the deployment's admission store",
        lines: store,
    });
    sections.push(Section {
        area: Area::Shared,
        title: "Every surface: where the secrets come from, and what a flow in this process can read",
        lines: inputs.secrets.clone(),
    });
    if checked(Surface::Backend) {
        let mut lines = langflow_backend::trust_gate(env);
        match (&settings, &inputs.policy) {
            (Some(settings), Some(Ok(policy))) => {
                let b = Backend::with_options(BackendOptions {
                    surface: session::surface_options(),
                });
                lines.extend(b.doctor_lines(settings, policy, catalog.as_deref()));
            }
            (_, Some(Err(why))) => lines.push(DoctorLine::new(DoctorLevel::Refused, why.clone())),
            (None, _) => lines.push(DoctorLine::new(
                DoctorLevel::Info,
                "the rest is not checked until the CREATEOS_ settings above read",
            )),
            (_, None) => lines.push(DoctorLine::new(
                DoctorLevel::Info,
                "lfx's sandbox settings (timeout, memory, network, domains) are not checked \
                 until lfx's settings load (above)",
            )),
        }
        sections.push(Section {
            area: Area::Only(Surface::Backend),
            title: "Sandbox backend (the Python Interpreter's code)",
            lines: without_left_out(lines, &left_out),
        });
    }
    if checked(Surface::Component) {
        let lines = match &settings {
            Some(settings) => component_lines(settings, catalog.as_deref(), env),
            None => vec![DoctorLine::new(
                DoctorLevel::Info,
                "not checked until the CREATEOS_ settings above read",
            )],
        };
        sections.push(Section {
            area: Area::Only(Surface::Component),
            title: "CreateOS Sandbox component",
            lines: without_left_out(lines, &left_out),
        });
    }
    if checked(Surface::Executor) {
        let lines = executor_lines(settings.as_ref(), catalog.as_deref(), env).await;
        sections.push(Section {
            area: Area::Only(Surface::Executor),
            title: "Whole-flow executor: settings",
            lines,
        });
        sections.push(Section {
            area: Area::Only(Surface::Executor),
            title: "Whole-flow executor: which Langflow paths reach it",
            lines: inputs.paths.clone(),
        });
    }
    if checked(Surface::OpenSandbox) {
        sections.push(Section {
            area: Area::Only(Surface::OpenSandbox),
            title: "Sandbox backend on an OpenSandbox server (LANGFLOW_SANDBOX_BACKEND=opensandbox)",
            lines: opensandbox_lines(env).await,
        });
    }
    if checked(Surface::OpenSandboxExecutor) {
        sections.push(Section {
            area: Area::Only(Surface::OpenSandboxExecutor),
            title: "Whole-flow executor on an OpenSandbox server \
                    (LANGFLOW_EXECUTOR_KIND=opensandbox)",
            lines: opensandbox_executor_lines(env).await,
        });
        if !checked(Surface::Executor) {
            sections.push(Section {
                area: Area::Only(Surface::OpenSandboxExecutor),
                title: "Whole-flow executor: which Langflow paths reach it",
                lines: inputs.paths,
            });
        }
    }
    sections.push(Section {
        area: Area::Shared,
        title: "Metrics and usage records",
        lines: inputs.exports,
    });
    let mut report = Report { scopes, sections };
    report.dedup();
    report
}

/// The component's findings: its settings, and what a node with the default inputs gets.
fn component_lines(
    settings: &Settings,
    catalog: Option<&[Shape]>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Vec<DoctorLine> {
    use langflow_component::{DOMAIN_SETTING_NAMES, ENV_ACCEPT_EGRESS_EXCEPTIONS, SETTING_NAMES};
    let mut out = vec![
        DoctorLine::about(
            DoctorLevel::Info,
            ENV_ROOTFS,
            format!(
                "every node's guest: image {} ({ENV_ROOTFS}), output cap {} bytes per stream \
                 ({ENV_MAX_OUTPUT_BYTES})",
                settings.rootfs, settings.max_output_bytes
            ),
        ),
        DoctorLine::about(
            DoctorLevel::Info,
            ENV_WARM_POOL,
            if settings.warm_pool == 0 {
                format!("warm pool for Guest Reuse = off runs: off ({ENV_WARM_POOL} unset or 0)")
            } else {
                format!(
                    "warm pool for Guest Reuse = off runs: {} guest(s) ({ENV_WARM_POOL})",
                    settings.warm_pool
                )
            },
        ),
    ];
    let network = read_flag(env, ENV_ACCEPT_EGRESS_EXCEPTIONS).and_then(|accept| {
        let none = sandbox_core::gateway::Domains::default();
        plan::network(
            &settings.gateway,
            &NetworkAsk {
                base: Base::Off,
                domains: &none,
                domains_setting: langflow_component::input::ALLOWED_DOMAINS,
                accept_exceptions: accept,
                names: &SETTING_NAMES,
                domain_names: &DOMAIN_SETTING_NAMES,
            },
        )
    });
    out.push(match network {
        Ok(net) => DoctorLine::about(
            DoctorLevel::Ok,
            ENV_ACCEPT_EGRESS_EXCEPTIONS,
            format!(
                "a node with the default inputs (Allow Network off, Guest Reuse off) runs with \
                 egress {} in a fresh guest per run (accepted by {ENV_ACCEPT_EGRESS_EXCEPTIONS})",
                net.egress
            ),
        ),
        Err(e) => DoctorLine::new(
            DoctorLevel::Refused,
            format!("a node with the default inputs is refused: {}", e.message()),
        ),
    });
    match catalog {
        Some(catalog) => out.push(
            match select_shape(
                catalog,
                0,
                sandbox_core::shapes::pin_of(settings),
                langflow_component::input::SHAPE,
            ) {
                Ok(c) => DoctorLine::new(
                    DoctorLevel::Ok,
                    format!(
                        "a node with Shape blank gets shape {} ({} vCPU, {} MiB{})",
                        c.shape.id,
                        c.shape.vcpu,
                        c.shape.mem_mib,
                        if c.pinned {
                            " pinned by CREATEOS_SANDBOX_SHAPE"
                        } else {
                            ", the smallest with at least 4096 MiB"
                        }
                    ),
                ),
                Err(e) => DoctorLine::new(DoctorLevel::Refused, e.message()),
            },
        ),
        None => out.push(DoctorLine::new(
            DoctorLevel::Info,
            "shape: not checked (the account's shape catalog could not be read; see the \
             control plane above)",
        )),
    }
    out.push(DoctorLine::new(
        DoctorLevel::Info,
        "per node: Shape, Timeout, Allow Network, Allowed Domains and Guest Reuse are the \
         node's inputs; a node that lists Allowed Domains needs the egress gateway above",
    ));
    out
}

/// The executor's findings: lfx's switch, each of its settings on its own (a bad one does not
/// hide the others), its shape against the catalog, and whether its image can run the runner
/// (what can be known without creating a guest).
async fn executor_lines(
    settings: Option<&Settings>,
    catalog: Option<&[Shape]>,
    env: &(dyn Fn(&str) -> Option<String> + Sync),
) -> Vec<DoctorLine> {
    let mut out = Vec::new();
    let kind = env(ENV_EXECUTOR_KIND).map(|v| v.trim().to_owned());
    out.push(if kind.as_deref() == Some(PLUGIN_NAME) {
        DoctorLine::about(
            DoctorLevel::Ok,
            ENV_EXECUTOR_KIND,
            format!("lfx hands flow runs to this executor ({ENV_EXECUTOR_KIND}={PLUGIN_NAME})"),
        )
    } else {
        DoctorLine::about(
            DoctorLevel::Refused,
            ENV_EXECUTOR_KIND,
            format!(
                "{ENV_EXECUTOR_KIND} is {:?}, so lfx does not hand flow runs to this executor; \
                 set {ENV_EXECUTOR_KIND}={PLUGIN_NAME}",
                kind.as_deref().filter(|k| !k.is_empty()).unwrap_or("unset")
            ),
        )
    });
    let (read, refusals, left_out) = read_each(env, |l| ExecutorSettings::from_lookup(l));
    out.extend(refusals);
    let Some(ex) = read else {
        return out;
    };
    let mut summary: Vec<DoctorLine> = ex
        .summary()
        .into_iter()
        .map(|text| DoctorLine::new(DoctorLevel::Info, text))
        .collect();
    // The shape, checked against the catalog the control plane gave (as a run checks it).
    if !left_out.iter().any(|v| v == ENV_EXECUTOR_SHAPE)
        && let Some(catalog) = catalog
    {
        let pin = Pin {
            id: &ex.shape,
            setting: ENV_EXECUTOR_SHAPE,
            otherwise: "",
        };
        let line = match in_catalog(catalog, &pin) {
            Ok(s) => DoctorLine::about(
                DoctorLevel::Ok,
                ENV_EXECUTOR_SHAPE,
                format!(
                    "shape: {} ({} vCPU, {} MiB; {ENV_EXECUTOR_SHAPE}), in the account's catalog",
                    s.id, s.vcpu, s.mem_mib
                ),
            ),
            Err(e) => DoctorLine::new(DoctorLevel::Refused, e.message()),
        };
        replace_line(&mut summary, "shape: ", line);
    }
    if !left_out
        .iter()
        .any(|v| v == ENV_EXECUTOR_ROOTFS || v == ENV_INSTALL_LFX)
    {
        let line = image_line(&ex, settings, catalog.is_some()).await;
        replace_line(&mut summary, "rootfs: ", line);
    }
    out.extend(without_left_out(summary, &left_out));
    out
}

/// Puts `line` where the summary line starting with `prefix` was (or at the end).
fn replace_line(lines: &mut Vec<DoctorLine>, prefix: &str, line: DoctorLine) {
    match lines.iter().position(|l| l.text.starts_with(prefix)) {
        Some(at) => lines[at] = line,
        None => lines.push(line),
    }
}

/// Whether the executor's image can run the runner, as far as can be known without creating a
/// guest: a catalog image known to have no lfx (the default `devbox:1`) is a problem unless
/// lfx is installed per run; a template is looked up (`reachable`: the control plane answered
/// above): missing, failed or still building is a problem, one built by `template build` (whose
/// build imports lfx) is fine, any other says plainly that doctor cannot know.
async fn image_line(
    ex: &ExecutorSettings,
    settings: Option<&Settings>,
    reachable: bool,
) -> DoctorLine {
    let rootfs = ex.rootfs.as_deref().unwrap_or(DEFAULT_ROOTFS);
    let named = if ex.rootfs.is_some() {
        format!("{ENV_EXECUTOR_ROOTFS}={rootfs}")
    } else {
        format!("{rootfs} ({ENV_EXECUTOR_ROOTFS} unset)")
    };
    let build = "`python -m langflow_sandbox_createos template build FLOW.json` bakes one and \
                 prints the value";
    if IMAGES_WITHOUT_LFX.contains(&rootfs) {
        return if ex.install_lfx {
            DoctorLine::about(
                DoctorLevel::Ok,
                ENV_INSTALL_LFX,
                format!(
                    "rootfs: {named} has no lfx; {ENV_INSTALL_LFX}=true pip-installs it in every \
                     guest (slow, and needs egress to PyPI: bake a template for production; \
                     {build})"
                ),
            )
        } else {
            DoctorLine::about(
                DoctorLevel::Refused,
                ENV_EXECUTOR_ROOTFS,
                format!(
                    "rootfs: {named} has no lfx, so every flow run would be refused in its \
                     guest; set {ENV_EXECUTOR_ROOTFS} to a template with lfx and the flow's \
                     components ({build}), or {ENV_INSTALL_LFX}=true to pip-install lfx per run \
                     (slow; for a first experiment)"
                ),
            )
        };
    }
    if rootfs.contains(':') {
        return DoctorLine::about(
            DoctorLevel::Info,
            ENV_EXECUTOR_ROOTFS,
            format!(
                "rootfs: {named} reads as a catalog image; doctor cannot tell without creating a \
                 guest whether it has lfx (a flow run says so if not; {build})"
            ),
        );
    }
    let (Some(settings), true) = (settings, reachable) else {
        return DoctorLine::about(
            DoctorLevel::Info,
            ENV_EXECUTOR_ROOTFS,
            format!(
                "rootfs: {named}: not looked up (the control plane was not asked, or did not \
                 answer; see above)"
            ),
        );
    };
    progress(&format!(
        "looking up the executor's template {rootfs} (up to {} s)",
        TEMPLATE_LOOKUP.as_secs()
    ));
    let looked_up = match session::session().account(settings) {
        Ok(account) => {
            let cp = account.control_plane().clone();
            let deadline = tokio::time::Instant::now() + TEMPLATE_LOOKUP;
            clipped(
                deadline,
                "the template lookup",
                cp.get_template(rootfs.to_owned()),
            )
            .await
        }
        Err(e) => return DoctorLine::new(DoctorLevel::Refused, e.message()),
    };
    let redactor = settings.redactor();
    match looked_up {
        Ok(t) => match &t.status {
            TemplateStatus::Ready if t.name.starts_with(TEMPLATE_PREFIX) || ex.install_lfx => {
                DoctorLine::about(
                    DoctorLevel::Ok,
                    ENV_EXECUTOR_ROOTFS,
                    format!(
                        "rootfs: {named}: template {} ({}) is ready{}",
                        t.name,
                        t.id,
                        if ex.install_lfx {
                            format!("; {ENV_INSTALL_LFX}=true installs lfx when it is missing")
                        } else {
                            ", built by `template build`, whose build checks that lfx imports"
                                .to_owned()
                        }
                    ),
                )
            }
            TemplateStatus::Ready => DoctorLine::about(
                DoctorLevel::Info,
                ENV_EXECUTOR_ROOTFS,
                format!(
                    "rootfs: {named}: template {} ({}) is ready; doctor cannot tell without \
                     creating a guest whether it has lfx (a flow run says so if not; {build})",
                    t.name, t.id
                ),
            ),
            status => DoctorLine::about(
                DoctorLevel::Refused,
                ENV_EXECUTOR_ROOTFS,
                format!(
                    "rootfs: {named}: template {} is {status}, so the control plane refuses \
                     guests from it; wait for its build, or build it again ({build})",
                    t.name
                ),
            ),
        },
        Err(e) if e.failure == CallFailure::Status(404) => DoctorLine::about(
            DoctorLevel::Refused,
            ENV_EXECUTOR_ROOTFS,
            format!(
                "rootfs: {named}: no template of that id or name on this account (and not a \
                 catalog image), so the control plane would refuse the guest; {build}"
            ),
        ),
        Err(e) => DoctorLine::about(
            DoctorLevel::Warn,
            ENV_EXECUTOR_ROOTFS,
            format!(
                "rootfs: {named}: the template could not be looked up ({}); not checked",
                redactor.cap(&e.message)
            ),
        ),
    }
}

/// The gathered report.
struct Report {
    scopes: Vec<Scope>,
    sections: Vec<Section>,
}

impl Report {
    /// Keeps the first of every line that appears more than once (the same finding reached
    /// from two checks), and drops sections left empty.
    fn dedup(&mut self) {
        let mut seen: HashSet<String> = HashSet::new();
        for section in &mut self.sections {
            section.lines.retain(|l| seen.insert(l.text.clone()));
        }
        self.sections.retain(|s| !s.lines.is_empty());
    }

    fn checked(&self) -> impl Iterator<Item = &Scope> {
        self.scopes.iter().filter(|s| s.checked)
    }

    fn problems(&self) -> impl Iterator<Item = (Area, &DoctorLine)> {
        self.sections
            .iter()
            .flat_map(|s| s.lines.iter().map(move |l| (s.area, l)))
            .filter(|(_, l)| l.is_problem())
    }

    /// Each checked surface: `ready`, or `refused` when a problem of its own or a shared one
    /// applies.
    fn states(&self) -> Vec<(Surface, &'static str)> {
        let shared = self.problems().any(|(a, _)| a == Area::Shared);
        self.checked()
            .map(|s| {
                let own = self.problems().any(|(a, _)| a == Area::Only(s.surface));
                (s.surface, if shared || own { "refused" } else { "ready" })
            })
            .collect()
    }

    fn exit_code(&self) -> i32 {
        i32::from(self.problems().next().is_some())
    }

    /// The one verdict line: every problem counted, grouped by area with the settings they
    /// name, then each checked surface's state.
    fn verdict(&self) -> String {
        let problems: Vec<(Area, &DoctorLine)> = self.problems().collect();
        let states: Vec<String> = self
            .states()
            .into_iter()
            .map(|(s, state)| format!("{}: {state}", s.name()))
            .collect();
        let head = match problems.len() {
            0 => "Result: no problems".to_owned(),
            n => {
                let mut groups: Vec<(Area, Vec<String>)> = Vec::new();
                for (area, line) in &problems {
                    let what = line.setting.clone().unwrap_or_else(|| short(&line.text));
                    match groups.iter_mut().find(|(a, _)| a == area) {
                        Some((_, items)) if items.contains(&what) => {}
                        Some((_, items)) => items.push(what),
                        None => groups.push((*area, vec![what])),
                    }
                }
                let groups: Vec<String> = groups
                    .into_iter()
                    .map(|(area, items)| format!("{}: {}", area.name(), items.join(", ")))
                    .collect();
                format!(
                    "Result: {n} problem{} ({})",
                    if n == 1 { "" } else { "s" },
                    groups.join("; ")
                )
            }
        };
        std::iter::once(head)
            .chain(states)
            .collect::<Vec<_>>()
            .join("; ")
    }

    fn text(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::from("langflow-sandbox-createos doctor\n");
        let list = |checked: bool| -> String {
            let items: Vec<String> = self
                .scopes
                .iter()
                .filter(|s| s.checked == checked)
                .map(|s| format!("{} ({})", s.surface.name(), s.reason))
                .collect();
            if items.is_empty() {
                "none".to_owned()
            } else {
                items.join("; ")
            }
        };
        let _ = writeln!(out, "Checked: {}", list(true));
        let _ = writeln!(out, "Skipped: {}", list(false));
        for section in &self.sections {
            out.push_str(section.title);
            out.push('\n');
            for l in &section.lines {
                let _ = writeln!(out, "  [{:<7}] {}", l.level.as_str(), l.text);
            }
        }
        out.push_str(&self.verdict());
        out
    }

    fn json(&self) -> String {
        let scopes = |checked: bool| -> Vec<serde_json::Value> {
            self.scopes
                .iter()
                .filter(|s| s.checked == checked)
                .map(|s| json!({"surface": s.surface.name(), "reason": s.reason}))
                .collect()
        };
        let findings: Vec<serde_json::Value> = self
            .sections
            .iter()
            .flat_map(|s| {
                s.lines.iter().map(move |l| {
                    json!({
                        "area": s.area.name(),
                        "section": s.title,
                        "level": l.level.as_str(),
                        "setting": l.setting,
                        "message": l.text,
                    })
                })
            })
            .collect();
        let states: serde_json::Map<String, serde_json::Value> = self
            .states()
            .into_iter()
            .map(|(s, state)| (s.name().to_owned(), json!(state)))
            .collect();
        json!({
            "doctor": 1,
            "version": env!("CARGO_PKG_VERSION"),
            "checked": scopes(true),
            "skipped": scopes(false),
            "findings": findings,
            "problems": self.problems().count(),
            "surfaces": states,
            "verdict": self.verdict(),
            "exit_code": self.exit_code(),
            "report": self.text(),
        })
        .to_string()
    }
}

/// A problem's short label for the verdict when it names no setting: its text up to the first
/// `:` or 48 characters.
fn short(text: &str) -> String {
    let head = text.split(':').next().unwrap_or(text);
    let mut cut: String = head.chars().take(48).collect();
    if cut.len() < head.len() {
        cut.push('…');
    }
    cut
}

/// `LANGFLOW_FALLBACK_TO_ENV_VAR`: whether Langflow resolves a field's unknown global variable
/// from the process environment (lfx's default: true).
const ENV_FALLBACK_TO_ENV_VAR: &str = "LANGFLOW_FALLBACK_TO_ENV_VAR";
/// `LANGFLOW_VARIABLES_TO_GET_FROM_ENVIRONMENT`: names Langflow copies from its environment into
/// every user's global variables (added to lfx's own list), while
/// `LANGFLOW_STORE_ENVIRONMENT_VARIABLES` is true (its default).
const ENV_VARIABLES_FROM_ENVIRONMENT: &str = "LANGFLOW_VARIABLES_TO_GET_FROM_ENVIRONMENT";
const ENV_STORE_ENVIRONMENT_VARIABLES: &str = "LANGFLOW_STORE_ENVIRONMENT_VARIABLES";

/// The names `LANGFLOW_VARIABLES_TO_GET_FROM_ENVIRONMENT` lists, as lfx's settings read it (a JSON
/// list, else comma-separated).
fn variables_from_environment(raw: &str) -> Vec<String> {
    let raw = raw.trim();
    let names: Vec<String> = if raw.starts_with('[') {
        serde_json::from_str(raw).unwrap_or_default()
    } else {
        raw.split(',').map(str::to_owned).collect()
    };
    names
        .into_iter()
        .map(|n| n.trim().to_owned())
        .filter(|n| !n.is_empty())
        .collect()
}

/// Where each secret setting comes from, through `raw` (the process environment without the
/// file convention): its variable, its file, or a refusal (both set, a bad file). `guard` is
/// what the Python side found of lfx's env-var deny-list in this process: whether it covers
/// this package's names, and how. A secret in the environment of a process whose env-var
/// fallback is on is a warning unless the deny-list covers it.
fn secret_lines(
    raw: &dyn Fn(&str) -> Option<String>,
    guard: Option<&(bool, String)>,
) -> Vec<DoctorLine> {
    use sandbox_core::vars::{FILE_SETTINGS, SecretSource, file_var, secret_source};

    let covered = guard.is_some_and(|(covered, _)| *covered);
    let fallback_raw = sandbox_core::settings::non_blank(raw, ENV_FALLBACK_TO_ENV_VAR);
    let fallback = fallback_raw.as_deref().is_none_or(|v| {
        sandbox_core::settings::parse_bool(ENV_FALLBACK_TO_ENV_VAR, v).unwrap_or(true)
    });
    let fallback_said = match &fallback_raw {
        None => format!("{ENV_FALLBACK_TO_ENV_VAR} unset: on"),
        Some(v) => format!("{ENV_FALLBACK_TO_ENV_VAR}={v}"),
    };
    let mut lines = Vec::new();
    match guard {
        Some((true, what)) => lines.push(DoctorLine::new(
            DoctorLevel::Ok,
            format!(
                "lfx's env-var fallback: this package's names (CREATEOS_*, OPEN_SANDBOX_*) are on \
                 lfx's deny-list in every process that imports the package ({what}), so no flow \
                 field resolves them from the environment; code a flow runs in the Langflow \
                 process itself (a custom component) can still read the environment, and any \
                 file this process can read"
            ),
        )),
        Some((false, what)) => lines.push(DoctorLine::new(
            DoctorLevel::Warn,
            format!(
                "lfx's env-var fallback: this package's names could not be put on lfx's \
                 deny-list ({what}); a flow field naming CREATEOS_* or OPEN_SANDBOX_* reads \
                 that variable from the Langflow process's environment"
            ),
        )),
        None => {}
    }
    for &name in FILE_SETTINGS {
        let var = file_var(name);
        match secret_source(raw, name) {
            Ok((_, SecretSource::Unset)) => {}
            Ok((_, SecretSource::File(path))) => lines.push(DoctorLine::about(
                DoctorLevel::Ok,
                name,
                format!(
                    "{name}: read from the file {var} names ({}); not in the environment",
                    outside_text::snippet(&path, 200)
                ),
            )),
            Ok((_, SecretSource::Env)) if covered => lines.push(DoctorLine::about(
                DoctorLevel::Info,
                name,
                format!(
                    "{name}: from the environment; no flow field can name it (the deny-list \
                     above), but in-process code can read the environment: set {var} (a file \
                     holding the value) and unset {name} to keep it out"
                ),
            )),
            Ok((_, SecretSource::Env)) if fallback => lines.push(DoctorLine::about(
                DoctorLevel::Warn,
                name,
                format!(
                    "{name} sits in the environment and lfx's env-var fallback is on \
                     ({fallback_said}): a flow field that loads a global variable named {name} \
                     gets its value in the Langflow process; set {var} (a file holding the \
                     value) and unset {name}"
                ),
            )),
            Ok((_, SecretSource::Env)) => lines.push(DoctorLine::about(
                DoctorLevel::Info,
                name,
                format!(
                    "{name}: from the environment ({fallback_said}; bare lfx, `lfx run` and \
                     `lfx serve`, still resolves a field's variable from the environment): set \
                     {var} (a file holding the value) and unset {name} to keep it out"
                ),
            )),
            Err(refusal) => lines.push(DoctorLine::about(
                DoctorLevel::Refused,
                name,
                refusal.message(),
            )),
        }
    }
    // Langflow's own copy of environment variables into every user's global variables: a
    // withheld name there is a variable any flow of those users names, in-process.
    let store =
        sandbox_core::settings::non_blank(raw, ENV_STORE_ENVIRONMENT_VARIABLES).is_none_or(|v| {
            sandbox_core::settings::parse_bool(ENV_STORE_ENVIRONMENT_VARIABLES, &v).unwrap_or(true)
        });
    if let Some(listed) = sandbox_core::settings::non_blank(raw, ENV_VARIABLES_FROM_ENVIRONMENT)
        && store
    {
        for name in variables_from_environment(&listed) {
            if sandbox_core::withheld::is_withheld_name(&name) && raw(&name).is_some() {
                lines.push(DoctorLine::about(
                    DoctorLevel::Refused,
                    ENV_VARIABLES_FROM_ENVIRONMENT,
                    format!(
                        "{ENV_VARIABLES_FROM_ENVIRONMENT} lists {name}: Langflow copies its value \
                         into every user's global variables at login, where any of their flows \
                         reads it by name in the Langflow process; remove it from the list (and \
                         delete the variable Langflow already stored)"
                    ),
                ));
            }
        }
    }
    lines
}

/// `(level, text)` pairs from Python as findings.
fn lines_of(pairs: Vec<(String, String)>) -> Vec<DoctorLine> {
    pairs
        .into_iter()
        .map(|(level, text)| {
            let level = match level.as_str() {
                "ok" => DoctorLevel::Ok,
                "warn" => DoctorLevel::Warn,
                "refused" => DoctorLevel::Refused,
                _ => DoctorLevel::Info,
            };
            DoctorLine::new(level, text)
        })
        .collect()
}

/// Checks the deployment and returns `(exit_code, report, report_as_json)`. Creates no guest.
///
/// `lfx` is lfx's `_SandboxSettings`, or `None` when lfx could not build its settings
/// service; then `lfx_problems` says why, as `(setting, message)` (the message names the
/// setting and gives lfx's reason; the setting is `None` when lfx's error names none). `surfaces` are the
/// names `--surface` asked for (none: the enabled surfaces). `paths` (which Langflow paths
/// reach the executor) and `exports` (metrics and usage records) are `(level, text)` findings
/// only Python can make. `env_guard` is `(covered, how)`: whether lfx's env-var deny-list
/// covers this package's names in the calling process (`env_fallback.status()`); with it, a
/// secret in the environment is a warning only where nothing keeps a flow field from it.
/// Progress goes to stderr; the waits are bounded. Only an internal failure raises
/// (`SandboxFailedError`).
#[pyfunction]
#[pyo3(signature = (lfx, lfx_problems, surfaces, paths, exports, env_guard=None))]
#[allow(clippy::needless_pass_by_value)] // a Python list arrives as an owned Vec
pub fn doctor(
    py: Python<'_>,
    lfx: Option<&Bound<'_, PyAny>>,
    lfx_problems: Vec<(Option<String>, String)>,
    surfaces: Vec<String>,
    paths: Vec<(String, String)>,
    exports: Vec<(String, String)>,
    env_guard: Option<(bool, String)>,
) -> PyResult<(i32, String, String)> {
    logbridge::install();
    logbridge::sync_level(py);
    let mut asked = Vec::new();
    for name in &surfaces {
        match Surface::parse(name) {
            Some(s) if !asked.contains(&s) => asked.push(s),
            Some(_) => {}
            None => {
                return Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "unknown surface {name:?}: backend, component, executor, opensandbox or \
                     opensandbox-executor"
                )));
            }
        }
    }
    let inputs = Inputs {
        policy: lfx.map(backend::policy_from),
        lfx_problems,
        asked,
        paths: lines_of(paths),
        exports: lines_of(exports),
        secrets: secret_lines(&|k| std::env::var(k).ok(), env_guard.as_ref()),
    };
    let rt = runtime::get()
        .map_err(|e| errors::execution(py, format!("cannot start the async runtime: {e}")))?;
    let report = match wait::drive(py, rt, move || async move {
        gather(inputs, &sandbox_core::vars::process_env).await
    }) {
        wait::Waited::Finished(report) => report,
        wait::Waited::Panicked => {
            return Err(errors::execution(
                py,
                "doctor failed with an internal error",
            ));
        }
        wait::Waited::Interrupted(interrupt) => return Err(interrupt),
    };
    logbridge::drain(py);
    Ok((report.exit_code(), report.text(), report.json()))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + Sync + use<> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |k| m.get(k).cloned()
    }

    fn checked(scopes: &[Scope]) -> Vec<&'static str> {
        scopes
            .iter()
            .filter(|s| s.checked)
            .map(|s| s.surface.name())
            .collect()
    }

    #[test]
    fn the_enabled_surfaces_are_checked_and_the_component_when_nothing_else_is() {
        assert_eq!(checked(&scopes(&[], &env(&[]))), ["component"]);
        let executor = env(&[(ENV_EXECUTOR_KIND, " createos ")]);
        assert_eq!(checked(&scopes(&[], &executor)), ["executor"]);
        let backend = env(&[(ENV_LF_SELECTED, "createos")]);
        assert_eq!(checked(&scopes(&[], &backend)), ["backend"]);
        // Trusted but not selected: half configured, so checked (and refused there).
        let half = env(&[(ENV_LF_PLUGINS, "createos")]);
        assert_eq!(checked(&scopes(&[], &half)), ["backend"]);
        // Trusted, but another backend deliberately selected: not this one.
        let other = env(&[(ENV_LF_PLUGINS, "createos"), (ENV_LF_SELECTED, "none")]);
        let s = scopes(&[], &other);
        assert_eq!(checked(&s), ["component"]);
        assert!(
            s[0].reason.contains("selects another backend"),
            "{}",
            s[0].reason
        );
        // The OpenSandbox backend, selected or trusted alone: it, not the component.
        let os = env(&[(ENV_LF_SELECTED, "opensandbox")]);
        assert_eq!(checked(&scopes(&[], &os)), ["opensandbox"]);
        let os_half = env(&[(ENV_LF_PLUGINS, "opensandbox")]);
        assert_eq!(checked(&scopes(&[], &os_half)), ["opensandbox"]);
        let both = env(&[(ENV_LF_PLUGINS, "createos,opensandbox")]);
        assert_eq!(checked(&scopes(&[], &both)), ["backend", "opensandbox"]);
        assert_eq!(Surface::parse(" opensandbox "), Some(Surface::OpenSandbox));
        // The executor on OpenSandbox is its own surface: not CreateOS's executor, and not
        // the component either (something is enabled).
        let os_exec = env(&[(ENV_EXECUTOR_KIND, "opensandbox")]);
        assert_eq!(checked(&scopes(&[], &os_exec)), ["opensandbox-executor"]);
        assert_eq!(
            Surface::parse("opensandbox-executor"),
            Some(Surface::OpenSandboxExecutor)
        );
        assert!(!Surface::OpenSandboxExecutor.on_createos());
        // Asked for: exactly those, whatever is enabled.
        let s = scopes(&[Surface::Component], &executor);
        assert_eq!(checked(&s), ["component"]);
        assert!(
            s[2].reason.contains("--surface component"),
            "{}",
            s[2].reason
        );
    }

    #[test]
    fn each_bad_setting_is_named_once_and_the_rest_still_reads() {
        let e = env(&[
            ("CREATEOS_EXECUTOR_TIMEOUT_SECONDS", "0"),
            ("CREATEOS_EXECUTOR_SHAPE", "s bad"),
            ("CREATEOS_EXECUTOR_WARM_POOL", "3"),
        ]);
        let (read, refusals, left_out) = read_each(&e, |l| ExecutorSettings::from_lookup(l));
        let read = read.expect("the good settings read");
        assert_eq!(read.warm_pool, 3);
        assert_eq!(
            left_out,
            [
                "CREATEOS_EXECUTOR_SHAPE",
                "CREATEOS_EXECUTOR_TIMEOUT_SECONDS"
            ]
        );
        assert_eq!(refusals.len(), 2);
        assert!(refusals.iter().all(DoctorLine::is_problem));
        // A line that would show the default in place of a refused value is dropped.
        let summary: Vec<DoctorLine> = read
            .summary()
            .into_iter()
            .map(|t| DoctorLine::new(DoctorLevel::Info, t))
            .collect();
        let kept = without_left_out(summary, &left_out);
        assert!(
            kept.iter().all(|l| !l.text.contains("TIMEOUT_SECONDS")),
            "{kept:?}"
        );
        assert!(
            kept.iter().any(|l| l.text.starts_with("warm pool: 3")),
            "{kept:?}"
        );
    }

    #[test]
    fn a_bad_ca_file_is_a_problem_and_plain_http_a_warning() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let find = |lines: &[DoctorLine], setting: &str| {
            lines
                .iter()
                .find(|l| l.setting.as_deref() == Some(setting))
                .cloned()
                .unwrap_or_else(|| panic!("no line about {setting}: {lines:?}"))
        };
        // A CA file that does not exist: a problem naming it; the rest still reads and the
        // server is not asked with it left out.
        let e = env(&[
            ("OPEN_SANDBOX_CA_FILE", "/nonexistent/ca.pem"),
            ("OPEN_SANDBOX_DOMAIN", "https://sandbox.example.internal"),
        ]);
        let (settings, lines, left_out) = rt.block_on(opensandbox_server(&e));
        assert!(settings.is_some());
        assert_eq!(left_out, ["OPEN_SANDBOX_CA_FILE"]);
        let ca = find(&lines, "OPEN_SANDBOX_CA_FILE");
        assert!(ca.is_problem(), "{ca:?}");
        assert!(ca.text.contains("/nonexistent/ca.pem"), "{}", ca.text);
        // Plain http to another host with the opt-in: a warning that says what travels in
        // clear; without it, a refusal of the run (the server check names both routes).
        let e = env(&[
            ("OPEN_SANDBOX_DOMAIN", "sandbox-server.internal:8080"),
            ("OPEN_SANDBOX_ALLOW_PLAIN_HTTP", "true"),
        ]);
        let (_, lines, _) = rt.block_on(opensandbox_server(&e));
        let warn = find(&lines, "OPEN_SANDBOX_ALLOW_PLAIN_HTTP");
        assert_eq!(warn.level, DoctorLevel::Warn, "{warn:?}");
        assert!(warn.text.contains("in clear"), "{}", warn.text);
    }

    fn line(level: DoctorLevel, text: &str) -> DoctorLine {
        DoctorLine::new(level, text)
    }

    fn report(sections: Vec<Section>, asked: &[Surface]) -> Report {
        let mut r = Report {
            scopes: scopes(asked, &env(&[])),
            sections,
        };
        r.dedup();
        r
    }

    #[test]
    fn the_verdict_counts_every_problem_by_area_and_each_surface_state() {
        let r = report(
            vec![
                Section {
                    area: Area::Shared,
                    title: "shared",
                    lines: vec![
                        line(
                            DoctorLevel::Refused,
                            "CREATEOS_MAX_LIVE_GUESTS=\"-1\" is bad",
                        ),
                        line(DoctorLevel::Ok, "fine"),
                    ],
                },
                Section {
                    area: Area::Only(Surface::Executor),
                    title: "executor",
                    lines: vec![
                        line(
                            DoctorLevel::Refused,
                            "CREATEOS_EXECUTOR_SHAPE=s-nope is not there",
                        ),
                        // The same finding twice: shown and counted once.
                        line(
                            DoctorLevel::Refused,
                            "CREATEOS_MAX_LIVE_GUESTS=\"-1\" is bad",
                        ),
                    ],
                },
            ],
            &[Surface::Backend, Surface::Executor],
        );
        assert_eq!(r.exit_code(), 1);
        assert_eq!(
            r.verdict(),
            "Result: 2 problems (shared: CREATEOS_MAX_LIVE_GUESTS; executor: \
             CREATEOS_EXECUTOR_SHAPE); backend: refused; executor: refused"
        );
        let text = r.text();
        assert!(text.ends_with(&r.verdict()), "{text}");
        let lines: Vec<&str> = text.lines().collect();
        let unique: HashSet<&str> = lines.iter().copied().collect();
        assert_eq!(lines.len(), unique.len(), "{text}");
        let json: serde_json::Value = serde_json::from_str(&r.json()).unwrap();
        assert_eq!(json["exit_code"], 1);
        assert_eq!(json["problems"], 2);
        assert_eq!(json["surfaces"]["executor"], "refused");
        assert_eq!(json["skipped"][0]["surface"], "component");
        assert_eq!(json["findings"][2]["setting"], "CREATEOS_EXECUTOR_SHAPE");
    }

    #[test]
    fn no_problem_is_ready_and_exit_zero() {
        let r = report(
            vec![Section {
                area: Area::Only(Surface::Component),
                title: "component",
                lines: vec![line(DoctorLevel::Warn, "egress: unrestricted")],
            }],
            &[Surface::Component],
        );
        assert_eq!(r.exit_code(), 0);
        assert_eq!(r.verdict(), "Result: no problems; component: ready");
    }

    #[test]
    fn each_secret_says_where_it_comes_from_and_warns_where_a_flow_field_could_read_it() {
        // No temporary-file crate here: a file of this test's own, removed at the end.
        let file = std::env::temp_dir().join(format!("lfsc-doctor-secret-{}", std::process::id()));
        std::fs::write(&file, b"sk-from-a-file-0123\n").unwrap();
        let path = file.to_str().unwrap().to_owned();
        let raw = env(&[
            ("CREATEOS_SANDBOX_API_KEY_FILE", path.as_str()),
            ("OPEN_SANDBOX_API_KEY", "osb-in-the-env"),
        ]);
        let text = |lines: &[DoctorLine]| {
            lines
                .iter()
                .map(|l| format!("{:?} {}", l.level, l.text))
                .collect::<Vec<_>>()
                .join("\n")
        };

        // Nothing covers the names, and the fallback is on by default: the env one warns.
        let lines = secret_lines(&raw, Some(&(false, "unknown shape".to_owned())));
        let shown = text(&lines);
        assert!(
            shown.contains("Warn lfx's env-var fallback") && shown.contains("unknown shape"),
            "{shown}"
        );
        let key = lines
            .iter()
            .find(|l| l.setting.as_deref() == Some("CREATEOS_SANDBOX_API_KEY"))
            .unwrap();
        assert_eq!(key.level, DoctorLevel::Ok);
        assert!(
            key.text.contains("CREATEOS_SANDBOX_API_KEY_FILE") && key.text.contains(&path),
            "{}",
            key.text
        );
        let osb = lines
            .iter()
            .find(|l| l.setting.as_deref() == Some("OPEN_SANDBOX_API_KEY"))
            .unwrap();
        assert_eq!(osb.level, DoctorLevel::Warn);
        assert!(
            osb.text.contains("LANGFLOW_FALLBACK_TO_ENV_VAR unset: on")
                && osb.text.contains("OPEN_SANDBOX_API_KEY_FILE"),
            "{}",
            osb.text
        );
        assert!(
            !shown.contains("sk-from-a-file") && !shown.contains("osb-in-the-env"),
            "{shown}"
        );
        // Unset secrets say nothing.
        assert!(!shown.contains("CREATEOS_GATEWAY_SECRET"), "{shown}");

        // Covered by the deny-list: said, not warned.
        let lines = secret_lines(&raw, Some(&(true, "extended".to_owned())));
        assert!(
            lines.iter().all(|l| l.level != DoctorLevel::Warn),
            "{}",
            text(&lines)
        );
        assert!(lines[0].level == DoctorLevel::Ok && lines[0].text.contains("custom component"));

        // The fallback off: said, not warned (bare lfx's own reading is named).
        let off = env(&[
            ("OPEN_SANDBOX_API_KEY", "osb-in-the-env"),
            ("LANGFLOW_FALLBACK_TO_ENV_VAR", "false"),
        ]);
        let lines = secret_lines(&off, None);
        assert_eq!(lines.len(), 1);
        assert_eq!(lines[0].level, DoctorLevel::Info);
        assert!(
            lines[0].text.contains("LANGFLOW_FALLBACK_TO_ENV_VAR=false")
                && lines[0].text.contains("lfx serve")
        );

        // Both ways is a problem naming both.
        let both = env(&[
            ("CREATEOS_GATEWAY_SECRET", "gw-secret-in-env"),
            ("CREATEOS_GATEWAY_SECRET_FILE", path.as_str()),
        ]);
        let lines = secret_lines(&both, None);
        assert_eq!(lines.len(), 1);
        assert!(lines[0].is_problem());
        assert!(
            lines[0]
                .text
                .contains("CREATEOS_GATEWAY_SECRET and CREATEOS_GATEWAY_SECRET_FILE are both set")
        );
        std::fs::remove_file(&file).unwrap();

        // Langflow told to copy a withheld variable into its users' global variables.
        for listed in [
            "OPENAI_API_KEY,CREATEOS_SANDBOX_API_KEY",
            r#"["OPENAI_API_KEY", "CREATEOS_SANDBOX_API_KEY"]"#,
        ] {
            let copied = env(&[
                ("CREATEOS_SANDBOX_API_KEY", "sk-in-the-env"),
                ("LANGFLOW_VARIABLES_TO_GET_FROM_ENVIRONMENT", listed),
            ]);
            let lines = secret_lines(&copied, Some(&(true, "extended".to_owned())));
            let refused: Vec<&DoctorLine> = lines.iter().filter(|l| l.is_problem()).collect();
            assert_eq!(refused.len(), 1, "{}", text(&lines));
            assert!(
                refused[0].text.contains("lists CREATEOS_SANDBOX_API_KEY"),
                "{}",
                refused[0].text
            );
            let off = env(&[
                ("CREATEOS_SANDBOX_API_KEY", "sk-in-the-env"),
                ("LANGFLOW_VARIABLES_TO_GET_FROM_ENVIRONMENT", listed),
                ("LANGFLOW_STORE_ENVIRONMENT_VARIABLES", "false"),
            ]);
            assert!(secret_lines(&off, None).iter().all(|l| !l.is_problem()));
        }
    }
}
