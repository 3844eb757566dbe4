//! What every surface decides before any I/O, decided once for all of them: the network a run
//! gets ([`network`]: its egress rules, and with a domain allowlist the egress gateway and the
//! run's grant) and how a core error is raised ([`SurfaceError`]). The shape choice and the
//! catalog check are [`crate::shapes::select_shape`] and [`crate::shapes::in_catalog`]. Each
//! surface translates its own settings or inputs into a [`NetworkAsk`] and composes these.

use std::fmt;
use std::time::Duration;

use crate::egress::{EgressException, EgressPolicy};
use crate::error::SandboxError;
use crate::gateway::{Domains, Gateway, GatewaySetting, Grant};
use crate::vars::SettingNames;

/// What a surface's own settings ask of the network, before any domain allowlist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Base {
    /// Unrestricted egress (the network on).
    Open,
    /// Deny-all (the network off).
    Off,
    /// These address rules only (validated strictly: no host names).
    Rules(Vec<String>),
}

/// A run's question about its network, in its surface's words.
#[derive(Debug, Clone)]
pub struct NetworkAsk<'a> {
    /// The egress without domains.
    pub base: Base,
    /// The domain allowlist (empty: none). A surface whose network is off passes none: its
    /// list is not used then.
    pub domains: &'a Domains,
    /// The setting (or input) that names the domains, for refusals.
    pub domains_setting: &'a str,
    /// The link-local opt-in: every restricted policy leaves 169.254.0.0/16 reachable on
    /// CreateOS, and runs only when the operator accepted that.
    pub accept_exceptions: bool,
    /// How refusals name the surface's settings without domains, and with them.
    pub names: &'a SettingNames,
    /// How refusals name them with domains.
    pub domain_names: &'a SettingNames,
}

/// The network a run gets: its egress, and with domains the gateway that enforces them.
#[derive(Clone)]
pub struct Network {
    /// The guest's egress rules.
    pub egress: EgressPolicy,
    /// The gateway and the domains it admits, for a domains run.
    via: Option<(Gateway, Domains)>,
}

impl fmt::Debug for Network {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Network")
            .field("egress", &self.egress)
            .field("domains", &self.via.as_ref().map(|(_, d)| d))
            .finish()
    }
}

impl Network {
    /// The grant of one run through the gateway (its proxy variables and token lifetime, for a
    /// run of `budget`), or `None` when the run asks for no domains.
    pub fn grant(&self, budget: Duration) -> Option<Grant> {
        self.via
            .as_ref()
            .map(|(gateway, domains)| gateway.grant(domains, budget))
    }

    /// The domains the run reaches through the gateway (empty without an allowlist).
    pub fn domains(&self) -> Option<&Domains> {
        self.via.as_ref().map(|(_, d)| d)
    }
}

/// Decides the network of a run on CreateOS: [`network_on`] with CreateOS's egress exceptions
/// (its link-local hole, [`crate::provider::createos::egress::EXCEPTIONS`]).
pub fn network(gateway: &GatewaySetting, ask: &NetworkAsk<'_>) -> Result<Network, SandboxError> {
    network_on(gateway, ask, crate::provider::createos::egress::EXCEPTIONS)
}

/// Decides the network of a run on a provider whose guests can always reach `exceptions`
/// ([`crate::provider::Provider::egress_exceptions`]): without domains, `ask.base` as it is
/// (restricted policies only under the operator's opt-in to those exceptions, when there are
/// any); with domains, exactly the gateway's `IP:port` (plus any address rules of `ask.base`),
/// refused when no usable gateway is configured (naming `ask.domains_setting`) or when the base
/// is deny-all.
pub fn network_on(
    gateway: &GatewaySetting,
    ask: &NetworkAsk<'_>,
    exceptions: &[EgressException],
) -> Result<Network, SandboxError> {
    let accept = ask.accept_exceptions;
    if ask.domains.is_empty() {
        let egress = match &ask.base {
            Base::Open => EgressPolicy::AllowAll,
            Base::Off => EgressPolicy::restricted_with(&[], exceptions, accept, ask.names)?,
            Base::Rules(rules) => {
                EgressPolicy::restricted_with(rules, exceptions, accept, ask.names)?
            }
        };
        return Ok(Network { egress, via: None });
    }
    let extra: &[String] = match &ask.base {
        Base::Open => &[],
        Base::Rules(rules) => rules,
        Base::Off => {
            return Err(SandboxError::refused(format!(
                "{} asks for a domain allowlist, but the network is off ({}); turn it on ({}) \
                 for the listed domains, or clear {}",
                ask.domains_setting,
                ask.names.restrict_egress,
                ask.names.allow_egress,
                ask.domains_setting
            )));
        }
    };
    let gateway = gateway.require(ask.domains_setting)?;
    let egress = gateway.egress_with(extra, exceptions, accept, ask.domain_names)?;
    Ok(Network {
        egress,
        via: Some((gateway.clone(), ask.domains.clone())),
    })
}

/// Decides the network of a run on a provider that enforces a domain allowlist itself
/// (OpenSandbox's egress sidecar) and has no egress exception: no gateway and no opt-in are
/// involved. Without domains, `ask.base` as it is (`Open` unrestricted, `Off` deny-all);
/// address rules are refused (the provider's allowlist holds domain names only, so they would
/// be refused at create anyway). With domains, deny-all but exactly those names
/// ([`EgressPolicy::only_domains`], validated entry by entry with refusals naming
/// `ask.domains_setting`), refused when the base is deny-all or address rules.
pub fn network_named(ask: &NetworkAsk<'_>) -> Result<Network, SandboxError> {
    if let Base::Rules(rules) = &ask.base {
        return Err(SandboxError::refused(format!(
            "{} lists {} address rule(s), but this provider's egress allowlist holds domain \
             names only; list domains in {} instead, or deny all ({})",
            ask.names.restrict_egress,
            rules.len(),
            ask.domains_setting,
            ask.names.restrict_egress
        )));
    }
    if ask.domains.is_empty() {
        let egress = match ask.base {
            Base::Off => EgressPolicy::DenyAll,
            _ => EgressPolicy::AllowAll,
        };
        return Ok(Network { egress, via: None });
    }
    if ask.base == Base::Off {
        return Err(SandboxError::refused(format!(
            "{} asks for a domain allowlist, but the network is off ({}); turn it on ({}) for \
             the listed domains, or clear {}",
            ask.domains_setting,
            ask.names.restrict_egress,
            ask.names.allow_egress,
            ask.domains_setting
        )));
    }
    let egress = EgressPolicy::only_domains(ask.domains_setting, ask.domains.entries())?;
    Ok(Network { egress, via: None })
}

/// A core error as a surface raises it: lfx's two sandbox error classes. `Display` is the
/// message, which never contains the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SurfaceError {
    /// Configured but unusable; nothing ran (lfx: `SandboxUnavailableError`).
    #[error("{0}")]
    Unavailable(String),
    /// An infrastructure failure, a timeout, or an unknown outcome (lfx:
    /// `SandboxExecutionError`). The message says whether the program may have run.
    #[error("{0}")]
    Execution(String),
}

impl SurfaceError {
    /// Whether nothing ran (lfx's `SandboxUnavailableError`).
    pub fn is_unavailable(&self) -> bool {
        matches!(self, SurfaceError::Unavailable(_))
    }

    /// The message.
    pub fn message(&self) -> &str {
        match self {
            SurfaceError::Unavailable(m) | SurfaceError::Execution(m) => m,
        }
    }
}

impl From<SandboxError> for SurfaceError {
    fn from(e: SandboxError) -> Self {
        if e.kind().is_unavailable() {
            SurfaceError::Unavailable(e.message().to_owned())
        } else {
            SurfaceError::Execution(e.message().to_owned())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    const NAMES: SettingNames = SettingNames {
        restrict_egress: "NET=off",
        allow_egress: "NET=on",
        accept_egress_exceptions: "ACCEPT",
        memory: "MEM",
    };
    const SECRET: &str = "0123456789abcdef0123456789abcdef";

    fn ask(base: Base, domains: &Domains, accept: bool) -> NetworkAsk<'_> {
        NetworkAsk {
            base,
            domains,
            domains_setting: "DOMAINS",
            accept_exceptions: accept,
            names: &NAMES,
            domain_names: &NAMES,
        }
    }

    fn gateway() -> GatewaySetting {
        GatewaySetting::from_lookup(&|k| match k {
            crate::gateway::ENV_GATEWAY_URL => Some("http://10.0.0.5:3128".to_owned()),
            crate::gateway::ENV_GATEWAY_SECRET => Some(SECRET.to_owned()),
            _ => None,
        })
    }

    #[test]
    fn without_domains_the_base_is_the_egress() {
        let none = Domains::default();
        let off = GatewaySetting::Off;
        let n = network(&off, &ask(Base::Open, &none, false)).unwrap();
        assert_eq!(n.egress, EgressPolicy::AllowAll);
        assert!(n.grant(Duration::from_secs(1)).is_none() && n.domains().is_none());
        let e = network(&off, &ask(Base::Off, &none, false)).unwrap_err();
        assert!(
            e.kind().is_unavailable() && e.to_string().contains("ACCEPT"),
            "{e}"
        );
        let n = network(&off, &ask(Base::Off, &none, true)).unwrap();
        assert_eq!(n.egress, EgressPolicy::DenyAll);
        let rules = Base::Rules(vec!["1.2.3.4:443".to_owned()]);
        let n = network(&off, &ask(rules, &none, true)).unwrap();
        assert!(matches!(n.egress, EgressPolicy::Rules(_)), "{:?}", n.egress);
        let e = network(
            &off,
            &ask(Base::Rules(vec!["pypi.org".into()]), &none, true),
        );
        assert_eq!(e.unwrap_err().kind(), ErrorKind::Refused);
    }

    #[test]
    fn domains_go_through_the_gateway_or_are_refused() {
        let domains = Domains::parse_list("DOMAINS", "pypi.org").unwrap();
        let e = network(&GatewaySetting::Off, &ask(Base::Open, &domains, true)).unwrap_err();
        assert!(e.to_string().contains("DOMAINS"), "{e}");
        let e = network(&gateway(), &ask(Base::Off, &domains, true)).unwrap_err();
        assert!(
            e.to_string().contains("NET=on") && e.to_string().contains("DOMAINS"),
            "{e}"
        );
        let n = network(&gateway(), &ask(Base::Open, &domains, true)).unwrap();
        assert_eq!(n.egress.rules(), ["10.0.0.5:3128".to_owned()]);
        let grant = n.grant(Duration::from_secs(60)).unwrap();
        assert!(!format!("{n:?} {grant:?}").contains(SECRET));
        let rules = Base::Rules(vec!["1.2.3.4:443".to_owned()]);
        let n = network(&gateway(), &ask(rules, &domains, true)).unwrap();
        assert_eq!(n.egress.rules().len(), 2);
        // The link-local opt-in still applies to a domains run.
        let e = network(&gateway(), &ask(Base::Open, &domains, false)).unwrap_err();
        assert!(e.to_string().contains("ACCEPT"), "{e}");
    }

    #[test]
    fn a_provider_without_exceptions_needs_no_opt_in_and_one_with_them_does() {
        let none = Domains::default();
        let domains = Domains::parse_list("DOMAINS", "pypi.org").unwrap();
        let off = GatewaySetting::Off;
        // No hole to accept: restricted policies run without the opt-in.
        let n = network_on(&off, &ask(Base::Off, &none, false), &[]).unwrap();
        assert_eq!(n.egress, EgressPolicy::DenyAll);
        let n = network_on(&gateway(), &ask(Base::Open, &domains, false), &[]).unwrap();
        assert!(matches!(n.egress, EgressPolicy::Rules(_)), "{:?}", n.egress);
        // A provider's own hole is named in its refusal.
        let hole = [EgressException {
            provider: "Elsewhere",
            range: "192.0.2.0/24",
            what: "its agent",
        }];
        let e = network_on(&off, &ask(Base::Off, &none, false), &hole).unwrap_err();
        let m = e.to_string();
        assert!(m.contains("Elsewhere") && m.contains("192.0.2.0/24"), "{m}");
        assert!(!m.contains("169.254"), "{m}");
    }

    #[test]
    fn a_provider_enforcing_names_gets_the_domains_as_its_own_policy_and_no_gateway() {
        let none = Domains::default();
        let domains = Domains::parse_list("DOMAINS", "pypi.org, *.pythonhosted.org").unwrap();
        let n = network_named(&ask(Base::Open, &domains, false)).unwrap();
        assert_eq!(
            n.egress,
            EgressPolicy::Domains(vec!["*.pythonhosted.org".into(), "pypi.org".into()])
        );
        assert!(n.grant(Duration::from_secs(60)).is_none() && n.domains().is_none());
        // Without domains the base as it is, no opt-in needed.
        let n = network_named(&ask(Base::Off, &none, false)).unwrap();
        assert_eq!(n.egress, EgressPolicy::DenyAll);
        let n = network_named(&ask(Base::Open, &none, false)).unwrap();
        assert_eq!(n.egress, EgressPolicy::AllowAll);
        // Domains with the network off, and address rules, are refused naming the settings.
        let e = network_named(&ask(Base::Off, &domains, true)).unwrap_err();
        assert!(
            e.to_string()
                .contains("DOMAINS asks for a domain allowlist"),
            "{e}"
        );
        let rules = Base::Rules(vec!["10.0.0.0/8".to_owned()]);
        let e = network_named(&ask(rules, &none, true)).unwrap_err();
        let m = e.to_string();
        assert!(
            m.contains("NET=off") && m.contains("DOMAINS") && m.contains("domain names only"),
            "{m}"
        );
    }

    #[test]
    fn errors_are_raised_as_lfx_classes() {
        let refused: SurfaceError = SandboxError::refused("no key").into();
        assert!(refused.is_unavailable() && refused.message() == "no key");
        let lost: SurfaceError = SandboxError::new(ErrorKind::OutcomeUnknown, "lost").into();
        assert_eq!(lost, SurfaceError::Execution("lost".into()));
    }
}
