//! What an execution decides before any I/O: the `Plan` (settings, egress, the domain grant,
//! the clocks, the `Program` and the pinned shape), and the refusals that need no guest, in the
//! order a user would fix them (`SandboxComponent::plan`, `check_command`; `choose_shape` once
//! the catalog is read). Also the two pure helpers the Python component calls: [`strip_fence`]
//! and [`describe`].

use std::sync::Arc;
use std::time::Duration;

use sandbox_core::SandboxError;
use sandbox_core::egress::EgressPolicy;
use sandbox_core::exec::ExecLimits;
use sandbox_core::gateway::{Domains, GatewaySetting, Grant};
use sandbox_core::plan::{self, Base, NetworkAsk};
use sandbox_core::provider::ProviderKind;
use sandbox_core::provider::createos::LINK_LOCAL_HOLE;
use sandbox_core::settings::{Settings, parse_bool, read_flag};
use sandbox_core::shapes::{Pin, Shape, select_shape};
use sandbox_core::withheld::{Source, Withheld};
use sandbox_opensandbox::OpenSandboxSettings;
use sandbox_opensandbox::settings::{
    ENV_ALLOW_CONTAINER_ISOLATION as OS_ALLOW_CONTAINER_ISOLATION,
    ENV_ATTEST_ISOLATION as OS_ATTEST_ISOLATION,
};

use crate::{
    ARTIFACTS_DIR, ARTIFACTS_ENV, ComponentInputs, DOMAIN_SETTING_NAMES,
    ENV_ACCEPT_EGRESS_EXCEPTIONS, MAX_COMMAND_BYTES, MAX_TIMEOUT_SECONDS, Reuse, SETTING_NAMES,
    SandboxComponent, input,
};

/// What a run executes.
pub(crate) enum Program {
    /// Python source, uploaded and run with `python3 -u`.
    Python(String),
    /// A shell script run with `sh -c`.
    Shell(String),
}

/// Everything an execution decides before any I/O.
pub(crate) struct Plan {
    pub(crate) settings: Settings,
    pub(crate) egress: EgressPolicy,
    pub(crate) grant: Option<Grant>,
    pub(crate) limits: ExecLimits,
    pub(crate) program: Program,
    pub(crate) pinned_shape: Option<(String, &'static str)>,
}

/// Removes one markdown fence around the whole text (```` ```python … ``` ````), as agents
/// write code; anything else is left as it is.
pub fn strip_fence(code: &str) -> &str {
    let t = code.trim();
    let Some(rest) = t.strip_prefix("```") else {
        return code;
    };
    let Some(body) = rest.strip_suffix("```") else {
        return code;
    };
    match body.split_once('\n') {
        Some((lang, inner)) if lang.trim().chars().all(|c| c.is_ascii_alphanumeric()) => inner,
        _ => code,
    }
}

/// The node's static description on the canvas: what it does, never a policy (Langflow 1.13
/// does not refresh a node's description when its inputs change). The policy a run got is
/// [`describe`]'s text, which the node shows as its status after the run.
pub const DESCRIPTION: &str = "Runs Python code (or a shell command) in a disposable CreateOS \
     Firecracker microVM, optionally kept between runs (Guest Reuse), and hands back the files \
     it wrote. With Allow Network off the guest gets deny-all egress except 169.254.0.0/16, which \
     Accept Link-Local Egress (or the operator) must accept. After a run, the node's status \
     shows the policy that run got.";

/// The node's description for a user or an agent: where a run on `provider` goes, the
/// effective network policy and the reuse mode, as a run with these inputs would get them
/// under `env`'s settings (the node's Accept Link-Local Egress counts as the operator's
/// setting). On OpenSandbox it names the server's sandbox and the isolation the operator
/// attested (or a container), never a microVM.
pub fn describe(
    provider: ProviderKind,
    allow_network: bool,
    reuse: Reuse,
    env: &dyn Fn(&str) -> Option<String>,
) -> String {
    if provider == ProviderKind::OpenSandbox {
        return describe_opensandbox(allow_network, reuse, env);
    }
    let network = if allow_network {
        if GatewaySetting::from_lookup(env).is_ready() {
            "Network: on, unrestricted egress; with Allowed Domains, only those names, through \
             the operator's egress gateway (a program that ignores the proxy settings reaches \
             nothing)."
                .to_owned()
        } else {
            "Network: on, unrestricted egress (CreateOS cannot restrict by domain, and no \
             egress gateway is configured, so Allowed Domains is refused)."
                .to_owned()
        }
    } else {
        let accepted = env(ENV_ACCEPT_EGRESS_EXCEPTIONS)
            .and_then(|raw| parse_bool(ENV_ACCEPT_EGRESS_EXCEPTIONS, &raw).ok())
            .unwrap_or(false);
        if accepted {
            format!(
                "Network: off, deny-all egress; only {LINK_LOCAL_HOLE} (the VM metadata \
                 service) stays reachable."
            )
        } else {
            format!(
                "Network: off, deny-all egress, which CreateOS cannot make complete \
                 ({LINK_LOCAL_HOLE} stays reachable), so runs are refused until {}=true.",
                SETTING_NAMES.accept_egress_exceptions
            )
        }
    };
    let reuse = reuse_sentence(reuse, "microVM", "destroyed");
    format!(
        "Runs Python code (or a shell command) in a CreateOS Firecracker microVM. {network} \
         {reuse} Files a run writes to {ARTIFACTS_DIR} (${ARTIFACTS_ENV}) can be returned, only \
         that run's."
    )
}

/// The description's sentence on Guest Reuse, naming the provider's guest (`microVM`,
/// `sandbox`) and how it ends (`destroyed`, `deleted`).
fn reuse_sentence(reuse: Reuse, guest: &str, ended: &str) -> String {
    match reuse {
        Reuse::Off => format!("Guest reuse: off, a fresh {guest} per run, {ended} afterwards."),
        Reuse::Flow => format!(
            "Guest reuse: flow, one {guest} per flow and node kept between runs (installed \
             packages and files carry over; every user and concurrent run of the flow shares \
             it)."
        ),
        Reuse::Session => format!(
            "Guest reuse: session, one {guest} per flow, node and Langflow session kept \
             between that session's runs (installed packages and files carry over; other \
             sessions get their own)."
        ),
    }
}

/// [`describe`] on OpenSandbox: a sandbox on the operator's server, isolated as the operator
/// attested (`OPEN_SANDBOX_ATTEST_ISOLATION`) or as a container; egress enforced and read back
/// by the server, with no link-local exception and no gateway.
fn describe_opensandbox(
    allow_network: bool,
    reuse: Reuse,
    env: &dyn Fn(&str) -> Option<String>,
) -> String {
    let attested = env(OS_ATTEST_ISOLATION)
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("hardware-virtualized"));
    let isolation = if attested {
        format!("hardware-virtualized isolation, as the operator attests ({OS_ATTEST_ISOLATION})")
    } else {
        let accepted = env(OS_ALLOW_CONTAINER_ISOLATION)
            .and_then(|raw| parse_bool(OS_ALLOW_CONTAINER_ISOLATION, &raw).ok())
            .unwrap_or(false);
        if accepted {
            format!(
                "container isolation (a kernel shared with other sandboxes, accepted by \
                 {OS_ALLOW_CONTAINER_ISOLATION})"
            )
        } else {
            format!(
                "container isolation (a kernel shared with other sandboxes), so runs are \
                 refused until {OS_ATTEST_ISOLATION} or {OS_ALLOW_CONTAINER_ISOLATION}=true"
            )
        }
    };
    let network = if allow_network {
        "Network: on, unrestricted egress; with Allowed Domains, only those names, enforced by \
         the OpenSandbox server and read back before the program runs."
    } else {
        "Network: off, deny-all egress, enforced by the OpenSandbox server and read back before \
         the program runs."
    };
    let reuse = reuse_sentence(reuse, "sandbox", "deleted");
    format!(
        "Runs Python code (or a shell command) in a sandbox on the OpenSandbox server, with \
         {isolation}. {network} {reuse} Files a run writes to {ARTIFACTS_DIR} \
         (${ARTIFACTS_ENV}) can be returned, only that run's."
    )
}

impl SandboxComponent {
    /// The refusals that need no I/O, in the order a user would fix them.
    pub(crate) fn plan(&self, inputs: &ComponentInputs) -> Result<Plan, SandboxError> {
        let settings = self.surface.settings()?;
        // The operator's setting is read (and a bad value refused) whatever the node says.
        let accept_exceptions =
            read_flag(&|k| self.surface.lookup(k), ENV_ACCEPT_EGRESS_EXCEPTIONS)?
                || inputs.accept_egress_exceptions;
        if !(1..=MAX_TIMEOUT_SECONDS).contains(&inputs.timeout_seconds) {
            return Err(SandboxError::refused(format!(
                "{} is {}; set it between 1 and {MAX_TIMEOUT_SECONDS}",
                input::TIMEOUT,
                inputs.timeout_seconds
            )));
        }
        let program = if inputs.command.trim().is_empty() {
            let code = strip_fence(&inputs.python_code);
            if code.trim().is_empty() {
                return Err(SandboxError::refused(format!(
                    "nothing to run: {} and {} are both empty",
                    input::PYTHON_CODE,
                    input::COMMAND
                )));
            }
            Program::Python(code.to_owned())
        } else {
            check_command(&inputs.command)?;
            Program::Shell(inputs.command.clone())
        };
        let (place, text) = match &program {
            Program::Python(code) => (input::PYTHON_CODE, code),
            Program::Shell(command) => (input::COMMAND, command),
        };
        // The program is the author's text (or a value an upstream node resolved): looked at as
        // the author's, so that it answers no guess (issue 45).
        Withheld::from_lookup(&|k| self.surface.lookup(k)).check_from(
            Source::Author,
            place,
            text,
        )?;
        let shape = inputs.shape.trim();
        let pinned_shape = if shape.is_empty() || shape.eq_ignore_ascii_case("auto") {
            settings
                .pinned_shape
                .clone()
                .map(|s| (s, sandbox_core::settings::ENV_SHAPE))
        } else if shape
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            Some((shape.to_owned(), input::SHAPE))
        } else {
            return Err(SandboxError::refused(format!(
                "{} is {shape:?}, which is not a shape id (e.g. s-2vcpu-4gb)",
                input::SHAPE
            )));
        };
        let limits = self
            .surface
            .limits(Duration::from_secs(u64::from(inputs.timeout_seconds)));
        // A bad entry is refused even with Allow Network off, where the list is not used. On
        // OpenSandbox the backend's validation comes first (its refusal of an address or CIDR
        // entry), since the names become the sandbox's own egress rules.
        let on_opensandbox = self.opts.provider == ProviderKind::OpenSandbox;
        if on_opensandbox {
            let entries: Vec<&str> = inputs.allowed_domains.split(',').collect();
            EgressPolicy::only_domains(input::ALLOWED_DOMAINS, &entries)?;
        }
        let domains = Domains::parse_list(input::ALLOWED_DOMAINS, &inputs.allowed_domains)?;
        let unused = Domains::default();
        let on = inputs.allow_network;
        let ask = NetworkAsk {
            base: if on { Base::Open } else { Base::Off },
            domains: if on { &domains } else { &unused },
            domains_setting: input::ALLOWED_DOMAINS,
            accept_exceptions,
            names: &SETTING_NAMES,
            domain_names: &DOMAIN_SETTING_NAMES,
        };
        let net = if on_opensandbox {
            // The OpenSandbox provider has no egress exception, and enforces a domain
            // allowlist itself (deny plus one FQDN rule per domain, read back): no gateway.
            plan::network_named(&ask)?
        } else {
            plan::network(&settings.gateway, &ask)?
        };
        let (egress, grant) = (net.egress.clone(), net.grant(limits.host_deadline()));
        if self.opts.provider == ProviderKind::OpenSandbox {
            let env = Arc::clone(&self.opts.surface.env);
            OpenSandboxSettings::from_lookup(move |k: &str| env(k))?
                .require_isolation_for("sandbox component")?;
            // Guest Reuse works as on CreateOS through the provider seam: the kept sandbox is
            // found by its `lf-name` label, renewed on every adoption (it expires on its own
            // when idle) and replaced when it expired, was deleted or drifted.
        } else {
            settings.require_key()?;
        }
        Ok(Plan {
            settings,
            egress,
            grant,
            limits,
            program,
            pinned_shape,
        })
    }
}

/// Refuses a Command that cannot travel as one argument of the exec request: one with a NUL
/// byte (no argument can carry it) or longer than [`MAX_COMMAND_BYTES`]. Either would cost a
/// guest and then fail in it.
fn check_command(command: &str) -> Result<(), SandboxError> {
    let why = if let Some(at) = command.bytes().position(|b| b == 0) {
        format!("contains a NUL byte (at byte {at}), which no command argument can carry")
    } else if command.len() > MAX_COMMAND_BYTES {
        format!("is {} bytes long", command.len())
    } else {
        return Ok(());
    };
    Err(SandboxError::refused(format!(
        "{} {why}; a command is sent as one argument of the exec request, at most \
         {MAX_COMMAND_BYTES} bytes and with no NUL byte. Put a long script in {} instead: it \
         is uploaded as a file (a shell script can run from there with subprocess)",
        input::COMMAND,
        input::PYTHON_CODE
    )))
}

pub(crate) fn choose_shape(
    catalog: &[Shape],
    pinned: Option<&(String, &'static str)>,
) -> Result<Shape, SandboxError> {
    // A pinned shape is the user's choice, whatever its memory; otherwise at least 4 GiB.
    let pin = pinned.map(|(id, setting)| Pin {
        id,
        setting,
        otherwise: "leave it blank",
    });
    Ok(select_shape(catalog, 0, pin, input::SHAPE)?.shape)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fences_are_removed_only_around_the_whole_text() {
        assert_eq!(strip_fence("```python\nprint(1)\n```"), "print(1)\n");
        assert_eq!(strip_fence("```\nprint(1)\n```"), "print(1)\n");
        assert_eq!(strip_fence("print('```')"), "print('```')");
        assert_eq!(strip_fence("x = 1"), "x = 1");
    }

    #[test]
    fn descriptions_state_policy_and_reuse() {
        let none = |_: &str| None;
        let accepted = |k: &str| (k == ENV_ACCEPT_EGRESS_EXCEPTIONS).then(|| "true".to_owned());
        let d = describe(ProviderKind::CreateOs, false, Reuse::Off, &none);
        assert!(d.contains("deny-all") && d.contains("refused"), "{d}");
        assert!(d.contains("fresh microVM per run"), "{d}");
        let d = describe(ProviderKind::CreateOs, false, Reuse::Flow, &accepted);
        assert!(d.contains("deny-all") && !d.contains("refused"), "{d}");
        assert!(d.contains("kept between runs"), "{d}");
        let d = describe(ProviderKind::CreateOs, true, Reuse::Off, &none);
        assert!(d.contains("unrestricted"), "{d}");
        let d = describe(ProviderKind::CreateOs, true, Reuse::Session, &none);
        assert!(
            d.contains("Langflow session") && d.contains("only that run's"),
            "{d}"
        );
        assert!(d.contains("Allowed Domains is refused"), "{d}");
        let gateway = |k: &str| match k {
            "CREATEOS_GATEWAY_URL" => Some("http://10.0.0.5:3128".to_owned()),
            "CREATEOS_GATEWAY_SECRET" => Some("0123456789abcdef0123456789abcdef".to_owned()),
            _ => None,
        };
        let d = describe(ProviderKind::CreateOs, true, Reuse::Off, &gateway);
        assert!(d.contains("with Allowed Domains, only those names"), "{d}");
        assert!(!d.contains("0123456789abcdef"), "{d}");
    }

    #[test]
    fn on_opensandbox_the_description_names_the_server_and_its_isolation_not_a_microvm() {
        let none = |_: &str| None;
        let attested =
            |k: &str| (k == OS_ATTEST_ISOLATION).then(|| "hardware-virtualized".to_owned());
        let container = |k: &str| (k == OS_ALLOW_CONTAINER_ISOLATION).then(|| "true".to_owned());
        let os = ProviderKind::OpenSandbox;
        for (d, isolation) in [
            (describe(os, false, Reuse::Off, &none), "refused until"),
            (
                describe(os, true, Reuse::Flow, &attested),
                "hardware-virtualized isolation",
            ),
            (
                describe(os, false, Reuse::Session, &container),
                "container isolation",
            ),
        ] {
            assert!(d.contains("a sandbox on the OpenSandbox server"), "{d}");
            assert!(d.contains(isolation), "{d}");
            assert!(!d.contains("CreateOS") && !d.contains("microVM"), "{d}");
            assert!(!d.contains("Firecracker") && !d.contains("169.254"), "{d}");
        }
        let d = describe(os, false, Reuse::Off, &attested);
        assert!(d.contains("deny-all") && !d.contains("refused"), "{d}");
        assert!(d.contains("fresh sandbox per run"), "{d}");
        let d = describe(os, true, Reuse::Off, &container);
        assert!(
            d.contains("only those names, enforced by the OpenSandbox server"),
            "{d}"
        );
    }

    fn on_opensandbox() -> SandboxComponent {
        let env = |k: &str| match k {
            // Nothing listens here: the plan makes no call.
            "OPEN_SANDBOX_DOMAIN" => Some("http://127.0.0.1:9".to_owned()),
            "OPEN_SANDBOX_API_KEY" => Some("os-key-never-shown".to_owned()),
            "OPEN_SANDBOX_ATTEST_ISOLATION" => Some("hardware-virtualized".to_owned()),
            _ => None,
        };
        SandboxComponent::with_options(crate::ComponentOptions {
            surface: sandbox_core::surface::SurfaceOptions {
                env: Arc::new(env),
                orphan_sweep: false,
                ..sandbox_core::surface::SurfaceOptions::default()
            },
            provider: ProviderKind::OpenSandbox,
            ..crate::ComponentOptions::default()
        })
    }

    fn inputs(allow_network: bool, domains: &str) -> ComponentInputs {
        ComponentInputs {
            flow_id: "f".into(),
            component_id: "CreateOSSandbox-os01".into(),
            python_code: "print(1)".into(),
            allow_network,
            allowed_domains: domains.into(),
            timeout_seconds: 20,
            ..ComponentInputs::default()
        }
    }

    #[test]
    fn on_opensandbox_allowed_domains_are_the_guests_own_rules_with_no_gateway() {
        let c = on_opensandbox();
        let plan = c
            .plan(&inputs(true, "PyPI.org, *.pythonhosted.org"))
            .unwrap();
        assert_eq!(
            plan.egress,
            EgressPolicy::Domains(vec!["*.pythonhosted.org".into(), "pypi.org".into()])
        );
        assert!(plan.grant.is_none());
        // Without domains the network switch alone decides, with no opt-in.
        assert_eq!(
            c.plan(&inputs(true, "")).unwrap().egress,
            EgressPolicy::AllowAll
        );
        assert_eq!(
            c.plan(&inputs(false, "")).unwrap().egress,
            EgressPolicy::DenyAll
        );
        // An address or CIDR entry is refused naming the input, even with the network off.
        for (on, list) in [(true, "pypi.org, 10.0.0.0/8"), (false, "192.0.2.7")] {
            let Err(e) = c.plan(&inputs(on, list)) else {
                panic!("{list} accepted")
            };
            let m = e.message();
            assert!(
                m.contains(input::ALLOWED_DOMAINS) && m.contains("address rule"),
                "{m}"
            );
        }
        // With the network off the list is not used (as on CreateOS): deny-all.
        assert_eq!(
            c.plan(&inputs(false, "pypi.org")).unwrap().egress,
            EgressPolicy::DenyAll
        );
    }
}
