//! Egress policy, independent of the surface and of the provider: deny-all, unrestricted, a
//! list of validated address rules, or a domain allowlist for a provider that enforces names
//! itself ([`EgressPolicy::Domains`], entries checked by [`domain_entry`]), each with a stable
//! fingerprint; the opt-in to a provider's permanent holes ([`EgressException`],
//! [`EgressPolicy::restricted_with`]) in front of every restricted policy; and strict validation
//! of address rules.
//!
//! How a provider *spells* a policy and compares what it reads back is that provider's own:
//! CreateOS's spelling ([`EgressPolicy::rules`], [`EgressPolicy::matches`], the `Display` of a
//! policy, its link-local hole and [`EgressPolicy::restricted`]) lives in
//! [`crate::provider::createos::egress`], as methods of this type.
//!
//! Refusals name the settings of the *calling surface* ([`SettingNames`]): the backend's user
//! reads lfx's allow-network setting, another surface's user reads its own.

use std::collections::BTreeSet;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::error::SandboxError;
use crate::vars::SettingNames;

/// The rule that spells allow-all, in settings and on CreateOS alike (never an address rule).
pub const ALLOW_ALL_RULE: &str = "*";

/// An address range a provider's guests can always reach whatever the policy says (CreateOS:
/// the link-local metadata service): sandbox-core refuses a restricted policy unless the
/// operator accepted every such exception of the provider in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EgressException {
    /// The provider whose guests have it, as a refusal names it (`CreateOS`).
    pub provider: &'static str,
    /// The range, e.g. `169.254.0.0/16`.
    pub range: &'static str,
    /// What is there, for the refusal (`the VM metadata service`).
    pub what: &'static str,
}

/// The egress a guest gets.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum EgressPolicy {
    /// Unrestricted (`["*"]`).
    AllowAll,
    /// Nothing but the permanent holes (`["240.0.0.0/4"]`).
    DenyAll,
    /// These address rules only (plus the permanent holes); never empty, kept sorted and
    /// without duplicates.
    Rules(Vec<AddressRule>),
    /// Deny everything but these domain names (an FQDN or a `*.` wildcard each, lower case,
    /// sorted, without duplicates; never empty): a domain allowlist enforced by the provider's
    /// own control plane (OpenSandbox's egress sidecar). Built by
    /// [`EgressPolicy::only_domains`]; a provider that cannot enforce names (CreateOS) refuses
    /// it before any create.
    Domains(Vec<String>),
}

impl EgressPolicy {
    /// A restricted policy: deny-all when `rules` is empty, else exactly those address rules
    /// (each validated by [`validate_address_rule`]). Refused unless the operator accepted
    /// (`accept_exceptions`) every one of `exceptions`, the holes of the provider in use; the
    /// refusal names the surface's settings.
    pub fn restricted_with(
        rules: &[String],
        exceptions: &[EgressException],
        accept_exceptions: bool,
        names: &SettingNames,
    ) -> Result<Self, SandboxError> {
        let mut parsed = BTreeSet::new();
        for r in rules {
            parsed.insert(validate_address_rule(r)?);
        }
        if !accept_exceptions && let Some(hole) = exceptions.first() {
            return Err(SandboxError::refused(format!(
                "{} asks for restricted egress, but a {} guest can always reach {} ({}). Set \
                 {}=true to run with everything else blocked, or {} for unrestricted egress",
                names.restrict_egress,
                hole.provider,
                hole.range,
                hole.what,
                names.accept_egress_exceptions,
                names.allow_egress
            )));
        }
        if parsed.is_empty() {
            Ok(EgressPolicy::DenyAll)
        } else {
            Ok(EgressPolicy::Rules(parsed.into_iter().collect()))
        }
    }

    /// A short, stable text that differs whenever the enforced policy differs (`allow-all`,
    /// `deny-all`, or `rules:` and the rules as sent, sorted). Used in derived guest names, so
    /// it changes only when what is sent changes: a single address reads `/32` (`/128`), the
    /// spelling sent since bare addresses were dropped, so a kept guest created with a bare
    /// rule is never adopted under the new name (auto-pause is its backstop).
    pub fn fingerprint(&self) -> String {
        match self {
            EgressPolicy::AllowAll => "allow-all".to_owned(),
            EgressPolicy::DenyAll => "deny-all".to_owned(),
            EgressPolicy::Rules(rules) => {
                let sent: Vec<String> = rules.iter().map(ToString::to_string).collect();
                format!("rules:{}", sent.join(","))
            }
            EgressPolicy::Domains(domains) => format!("domains:{}", domains.join(",")),
        }
    }

    /// Deny-all but `entries`, a domain allowlist for a provider that enforces names itself:
    /// [`EgressPolicy::Domains`], or deny-all when no entry is left (blank ones are skipped).
    /// Each entry is an FQDN or a `*.` wildcard (a trailing dot and case are dropped); an
    /// address or CIDR entry, a port, or anything else that is not a domain name is refused,
    /// and the refusal names `setting`, the setting or input the list came from.
    pub fn only_domains<S: AsRef<str>>(setting: &str, entries: &[S]) -> Result<Self, SandboxError> {
        let mut kept = BTreeSet::new();
        for raw in entries {
            if let Some(d) = domain_entry(setting, raw.as_ref())? {
                kept.insert(d);
            }
        }
        if kept.is_empty() {
            Ok(EgressPolicy::DenyAll)
        } else {
            Ok(EgressPolicy::Domains(kept.into_iter().collect()))
        }
    }
}

/// One entry of a domain allowlist in its normal form (trimmed, lower case, no trailing dot),
/// `None` when blank: an FQDN or a `*.` wildcard. An address or CIDR entry, a port, or anything
/// else that is not a domain name is refused, naming `setting` (the setting or input the entry
/// came from) and the entry, escaped and bounded.
pub fn domain_entry(setting: &str, raw: &str) -> Result<Option<String>, SandboxError> {
    let d = raw.trim().trim_end_matches('.').to_ascii_lowercase();
    if d.is_empty() {
        return Ok(None);
    }
    let bare = d.split('/').next().unwrap_or("");
    if bare.parse::<IpAddr>().is_ok() {
        return Err(SandboxError::refused(format!(
            "{setting} holds the address rule {}: a domain allowlist holds domain names only \
             (an FQDN or *.wildcard), no address or CIDR; list the domains the code needs in \
             {setting}",
            outside_text::snippet(raw.trim(), 80)
        )));
    }
    if !is_domain(&d) {
        return Err(SandboxError::refused(format!(
            "{setting} holds {}, which is not a domain name or *.wildcard (no port, no scheme); \
             fix {setting}",
            outside_text::snippet(raw.trim(), 80)
        )));
    }
    Ok(Some(d))
}

/// Whether `d` (lower case, no trailing dot) is a domain name or `*.` wildcard: labels of
/// letters, digits and inner hyphens, at most 63 bytes each and 253 in all, not all numeric.
fn is_domain(d: &str) -> bool {
    let host = d.strip_prefix("*.").unwrap_or(d);
    !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
        && !host
            .split('.')
            .all(|l| l.bytes().all(|b| b.is_ascii_digit()))
}

/// A validated, canonical address rule: a network or a single address, optionally with a port.
///
/// Its text (what is sent at create) is always a form the control plane has been seen to
/// enforce (`createos-api.md` §4.1): `IP:port` (`[v6]:port`) or CIDR. A single address without
/// a port is spelled `/32` (`/128`), never bare: a bare address is in neither verified form, and
/// a rule set the host fails to parse falls back to allow-all, which no read-back would show.
/// Either spelling reads back as the same rule ([`EgressPolicy::matches`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AddressRule {
    /// Network address (host bits zero).
    pub addr: IpAddr,
    /// Prefix length (32/128 for a single address).
    pub prefix: u8,
    /// Port, for an `IP:port` rule.
    pub port: Option<u16>,
}

impl fmt::Display for AddressRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.addr, self.port) {
            (IpAddr::V4(a), Some(p)) => write!(f, "{a}:{p}"),
            (IpAddr::V6(a), Some(p)) => write!(f, "[{a}]:{p}"),
            (a, None) => write!(f, "{a}/{}", self.prefix),
        }
    }
}

fn rule_error(rule: &str, why: &str) -> SandboxError {
    SandboxError::refused(format!(
        "egress rule {rule:?} is not accepted: {why}. Use IP:port, a canonical CIDR such as \
         203.0.113.0/24, or an IPv4/IPv6 address (sent as /32 or /128)"
    ))
}

fn host_bits_zero(addr: IpAddr, prefix: u8) -> bool {
    match addr {
        IpAddr::V4(a) => {
            let bits = u32::from(a);
            let mask = if prefix == 0 {
                0
            } else {
                u32::MAX << (32 - u32::from(prefix))
            };
            bits & !mask == 0
        }
        IpAddr::V6(a) => {
            let bits = u128::from(a);
            let mask = if prefix == 0 {
                0
            } else {
                u128::MAX << (128 - u32::from(prefix))
            };
            bits & !mask == 0
        }
    }
}

/// Validates one address rule strictly: canonical IPv4/IPv6 addresses (the same rule as their
/// `/32` or `/128`), `IP:port` (`[v6]:port`), or CIDR with no host bits set; no `/0`; no
/// hostnames or wildcards.
pub fn validate_address_rule(rule: &str) -> Result<AddressRule, SandboxError> {
    let r = rule.trim();
    if r.is_empty() {
        return Err(rule_error(rule, "it is empty"));
    }
    if r == ALLOW_ALL_RULE {
        return Err(rule_error(
            rule,
            "`*` is allow-all, not an address; leave the list empty to allow everything",
        ));
    }
    if let Some((net, len)) = r.split_once('/') {
        let addr: IpAddr = net
            .parse()
            .map_err(|_| rule_error(rule, "the network part is not an IP address"))?;
        if addr.to_string() != net {
            return Err(rule_error(rule, "the address is not in canonical form"));
        }
        if len.is_empty() || !len.chars().all(|c| c.is_ascii_digit()) || len.len() > 3 {
            return Err(rule_error(rule, "the prefix length is not a number"));
        }
        let prefix: u8 = len
            .parse()
            .map_err(|_| rule_error(rule, "the prefix length is not a number"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if prefix > max {
            return Err(rule_error(rule, "the prefix length is too long"));
        }
        if prefix == 0 {
            return Err(rule_error(
                rule,
                "a /0 rule is allow-all in disguise; leave the list empty instead",
            ));
        }
        if !host_bits_zero(addr, prefix) {
            return Err(rule_error(rule, "host bits are set below the prefix"));
        }
        return Ok(AddressRule {
            addr,
            prefix,
            port: None,
        });
    }
    if let Ok(addr) = r.parse::<IpAddr>() {
        if addr.to_string() != r {
            return Err(rule_error(rule, "the address is not in canonical form"));
        }
        let prefix = if addr.is_ipv4() { 32 } else { 128 };
        return Ok(AddressRule {
            addr,
            prefix,
            port: None,
        });
    }
    // IP:port or [v6]:port.
    let (host, port) = if let Some(rest) = r.strip_prefix('[') {
        let (h, p) = rest
            .split_once("]:")
            .ok_or_else(|| rule_error(rule, "expected [IPv6]:port"))?;
        let a: Ipv6Addr = h
            .parse()
            .map_err(|_| rule_error(rule, "not an IPv6 address"))?;
        if a.to_string() != h {
            return Err(rule_error(rule, "the address is not in canonical form"));
        }
        (IpAddr::V6(a), p)
    } else {
        let (h, p) = r.rsplit_once(':').ok_or_else(|| {
            rule_error(
                rule,
                "hostnames are not enforced by CreateOS; only address rules are",
            )
        })?;
        let a: Ipv4Addr = h.parse().map_err(|_| {
            rule_error(
                rule,
                "hostnames are not enforced by CreateOS; only address rules are",
            )
        })?;
        if a.to_string() != h {
            return Err(rule_error(rule, "the address is not in canonical form"));
        }
        (IpAddr::V4(a), p)
    };
    if port.is_empty() || !port.chars().all(|c| c.is_ascii_digit()) || port.len() > 5 {
        return Err(rule_error(rule, "the port is not a number"));
    }
    let port: u16 = port
        .parse()
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| rule_error(rule, "the port must be 1..=65535"))?;
    let prefix = if host.is_ipv4() { 32 } else { 128 };
    Ok(AddressRule {
        addr: host,
        prefix,
        port: Some(port),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| (*x).to_owned()).collect()
    }

    const NAMES: SettingNames = SettingNames {
        restrict_egress: "SURFACE_EGRESS=restricted",
        allow_egress: "SURFACE_EGRESS=open",
        accept_egress_exceptions: "SURFACE_ACCEPT",
        memory: "SURFACE_MEMORY",
    };

    #[test]
    fn spelling() {
        assert_eq!(EgressPolicy::DenyAll.rules(), vec!["240.0.0.0/4"]);
        assert_eq!(EgressPolicy::AllowAll.rules(), vec!["*"]);
        let p = EgressPolicy::restricted(
            &s(&["10.0.0.0/8", "1.1.1.1:53", "10.0.0.0/8"]),
            true,
            &NAMES,
        )
        .unwrap();
        assert_eq!(p.rules(), vec!["1.1.1.1:53", "10.0.0.0/8"]);
    }

    #[test]
    fn every_restricted_policy_needs_the_link_local_opt_in_named_by_the_surface() {
        for rules in [s(&[]), s(&["203.0.113.0/24"])] {
            let e = EgressPolicy::restricted(&rules, false, &NAMES).unwrap_err();
            let text = e.to_string();
            assert!(e.kind().is_unavailable());
            assert!(text.contains("169.254.0.0/16"), "{text}");
            assert!(text.contains("SURFACE_ACCEPT=true"), "{text}");
            assert!(text.contains("SURFACE_EGRESS=open"), "{text}");
            assert!(!text.contains("LANGFLOW"), "{text}");
        }
        assert_eq!(
            EgressPolicy::restricted(&[], true, &NAMES).unwrap(),
            EgressPolicy::DenyAll
        );
        // A bad rule is refused whatever the opt-in says.
        assert!(EgressPolicy::restricted(&s(&["pypi.org"]), true, &NAMES).is_err());
    }

    #[test]
    fn fingerprints_differ_by_policy_and_ignore_rule_order() {
        let a = EgressPolicy::restricted(&s(&["1.1.1.1", "10.0.0.0/8"]), true, &NAMES).unwrap();
        let b = EgressPolicy::restricted(&s(&["10.0.0.0/8", "1.1.1.1"]), true, &NAMES).unwrap();
        let c = EgressPolicy::restricted(&s(&["10.0.0.0/8"]), true, &NAMES).unwrap();
        assert_eq!(a.fingerprint(), b.fingerprint());
        assert_eq!(a.fingerprint(), "rules:1.1.1.1/32,10.0.0.0/8");
        let all = [
            EgressPolicy::AllowAll.fingerprint(),
            EgressPolicy::DenyAll.fingerprint(),
            a.fingerprint(),
            c.fingerprint(),
        ];
        let distinct: BTreeSet<_> = all.iter().collect();
        assert_eq!(distinct.len(), all.len());
    }

    #[test]
    fn single_addresses_are_sent_as_cidr_never_bare() {
        // Only IP:port and CIDR rules have live evidence of enforcement (`createos-api.md`
        // §4.1); a bare address is sent as the /32 or /128 that means the same thing.
        for (given, sent) in [
            ("1.2.3.4/32", "1.2.3.4/32"),
            ("1.2.3.4", "1.2.3.4/32"),
            ("::1/128", "::1/128"),
            ("::1", "::1/128"),
            ("2001:db8::1", "2001:db8::1/128"),
            ("1.2.3.4:443", "1.2.3.4:443"),
            ("10.0.0.0/8", "10.0.0.0/8"),
        ] {
            let p = EgressPolicy::restricted(&s(&[given]), true, &NAMES).unwrap();
            assert_eq!(p.rules(), vec![sent], "{given}");
            // The server may echo either spelling of a single address.
            let bare = sent.trim_end_matches("/32").trim_end_matches("/128");
            assert!(p.matches(Some(&s(&[sent]))), "{given}");
            assert!(p.matches(Some(&s(&[bare]))), "{given} echoed as {bare}");
        }
        for rule in EgressPolicy::restricted(
            &s(&["1.1.1.1", "::1", "9.9.9.9:53", "10.0.0.0/8"]),
            true,
            &NAMES,
        )
        .unwrap()
        .rules()
        {
            assert!(rule.parse::<IpAddr>().is_err(), "{rule} is sent bare");
        }
    }

    #[test]
    fn rules_read_back_compares_canonical_sets() {
        let p = EgressPolicy::restricted(&s(&["1.1.1.1", "10.0.0.0/8"]), true, &NAMES).unwrap();
        assert!(p.matches(Some(&s(&["10.0.0.0/8", "1.1.1.1"]))));
        assert!(p.matches(Some(&s(&["10.0.0.0/8", "1.1.1.1/32"]))));
        assert!(p.matches(Some(&s(&["10.0.0.0/8", " 1.1.1.1", "1.1.1.1"]))));
        assert!(!p.matches(Some(&s(&["10.0.0.0/8"]))));
        assert!(!p.matches(Some(&s(&["10.0.0.0/8", "1.1.1.1", "8.8.8.8"]))));
        assert!(!p.matches(Some(&s(&["*"]))));
        assert!(!p.matches(None));
        assert!(!p.matches(Some(&s(&["10.0.0.0/8", "pypi.org"]))));
    }

    #[test]
    fn read_back_comparison() {
        let deny = EgressPolicy::DenyAll;
        assert!(deny.matches(Some(&s(&["240.0.0.0/4"]))));
        assert!(!deny.matches(None));
        assert!(!deny.matches(Some(&[])));
        assert!(!deny.matches(Some(&s(&["*"]))));
        assert!(!deny.matches(Some(&s(&["240.0.0.0/4", "1.1.1.1"]))));
        let allow = EgressPolicy::AllowAll;
        assert!(allow.matches(None));
        assert!(allow.matches(Some(&[])));
        assert!(allow.matches(Some(&s(&["*"]))));
        assert!(!allow.matches(Some(&s(&["240.0.0.0/4"]))));
        assert!(!allow.matches(Some(&s(&["pypi.org"]))));
    }

    #[test]
    fn address_rules_accept_canonical_forms() {
        for (rule, canon) in [
            ("203.0.113.0/24", "203.0.113.0/24"),
            ("240.0.0.0/4", "240.0.0.0/4"),
            ("1.1.1.1", "1.1.1.1/32"),
            ("1.1.1.1/32", "1.1.1.1/32"),
            ("151.101.192.223:443", "151.101.192.223:443"),
            ("2001:db8::/32", "2001:db8::/32"),
            ("2001:db8::1", "2001:db8::1/128"),
            ("2001:db8::1/128", "2001:db8::1/128"),
            ("[2001:db8::1]:53", "[2001:db8::1]:53"),
        ] {
            let r = validate_address_rule(rule).unwrap_or_else(|e| panic!("{rule}: {e}"));
            assert_eq!(r.to_string(), canon);
        }
    }

    #[test]
    fn address_rules_reject_everything_else() {
        for rule in [
            "",
            "*",
            "pypi.org",
            "pypi.org:443",
            "*.pypi.org",
            "0.0.0.0/0",
            "::/0",
            "10.0.0.1/8",
            "2001:db8::1/32",
            "10.0.0.0/33",
            "010.0.0.1",
            "1.1.1.1:0",
            "1.1.1.1:99999",
            "1.1.1.1:http",
            "10.0.0.0/",
            "10.0.0.0/+8",
            "2001:DB8::1",
            "[2001:db8::1]",
            "1.1.1.1:53:53",
        ] {
            assert!(validate_address_rule(rule).is_err(), "{rule} was accepted");
        }
    }

    #[test]
    fn a_domain_allowlist_is_normalised_and_refuses_addresses_naming_the_setting() {
        let p =
            EgressPolicy::only_domains("LIST", &["PyPI.org.", " *.example.com", "", "pypi.org"])
                .unwrap();
        assert_eq!(p, EgressPolicy::Domains(s(&["*.example.com", "pypi.org"])));
        assert_eq!(p.fingerprint(), "domains:*.example.com,pypi.org");
        assert_eq!(
            EgressPolicy::only_domains::<&str>("LIST", &["", " "]).unwrap(),
            EgressPolicy::DenyAll
        );
        for bad in ["10.0.0.0/8", "1.2.3.4", "::1", "fe80::/10"] {
            let e =
                EgressPolicy::only_domains("LIST", &["pypi.org", &format!(" {bad}")]).unwrap_err();
            assert!(
                e.message()
                    .contains(&format!("LIST holds the address rule {bad}:")),
                "{bad}: {e}"
            );
        }
        for bad in [
            "pypi.org:443",
            "https://pypi.org",
            "a b",
            "1.2.3",
            "-x.org",
            "*.",
            "a..b",
        ] {
            let e = EgressPolicy::only_domains("LIST", &[bad]).unwrap_err();
            assert!(e.message().contains("fix LIST"), "{bad}: {e}");
        }
    }
}
