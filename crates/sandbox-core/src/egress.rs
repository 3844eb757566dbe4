//! Egress policy: the only two outcomes CreateOS can enforce for a backend run, the refusals in
//! front of them, the read-back comparison, and strict validation of address rules for surfaces
//! that accept them.
//!
//! CreateOS egress is an allowlist with no deny-all token: `null`, `[]` and `["*"]` all mean
//! allow-all. Deny-all is spelled as one unroutable reserved range, [`DENY_ALL_RULE`]. Hostname
//! rules are accepted and echoed but never enforced, and `169.254.0.0/16` (the metadata
//! service) stays reachable under any policy.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::error::SandboxError;
use crate::settings::{ENV_ACCEPT_EGRESS_EXCEPTIONS, ENV_LF_ALLOW_NETWORK, ENV_LF_ALLOWED_DOMAINS};

/// The rule that spells deny-all: IANA-reserved and unroutable, so only the final DROP applies.
pub const DENY_ALL_RULE: &str = "240.0.0.0/4";
/// The rule that spells allow-all.
pub const ALLOW_ALL_RULE: &str = "*";
/// The range every guest can reach whatever the policy says.
pub const LINK_LOCAL_HOLE: &str = "169.254.0.0/16";

/// The egress a backend run gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EgressPolicy {
    /// Unrestricted (`["*"]`).
    AllowAll,
    /// Nothing but the permanent holes (`["240.0.0.0/4"]`).
    DenyAll,
}

impl EgressPolicy {
    /// The rules sent at create.
    pub fn rules(self) -> Vec<String> {
        match self {
            EgressPolicy::AllowAll => vec![ALLOW_ALL_RULE.to_owned()],
            EgressPolicy::DenyAll => vec![DENY_ALL_RULE.to_owned()],
        }
    }

    /// Decides the policy from lfx's settings and the operator's opt-in, refusing what cannot
    /// be honoured.
    pub fn decide(
        allow_network: bool,
        allowed_domains: &[String],
        accept_exceptions: bool,
    ) -> Result<Self, SandboxError> {
        if !allowed_domains.is_empty() {
            return Err(SandboxError::refused(format!(
                "{ENV_LF_ALLOWED_DOMAINS} is set ({}), but CreateOS does not enforce hostname \
                 egress rules: it accepts and echoes them while restricting nothing. Unset \
                 {ENV_LF_ALLOWED_DOMAINS}; use {ENV_LF_ALLOW_NETWORK}=false for an enforced \
                 restriction, or the exec-sandbox backend for a real domain allowlist",
                allowed_domains.join(",")
            )));
        }
        if allow_network {
            return Ok(EgressPolicy::AllowAll);
        }
        if !accept_exceptions {
            return Err(SandboxError::refused(format!(
                "{ENV_LF_ALLOW_NETWORK}=false asks for no network, but a CreateOS guest can \
                 always reach {LINK_LOCAL_HOLE} (the VM metadata service). Set \
                 {ENV_ACCEPT_EGRESS_EXCEPTIONS}=true to run with everything else blocked, or \
                 {ENV_LF_ALLOW_NETWORK}=true for unrestricted egress"
            )));
        }
        Ok(EgressPolicy::DenyAll)
    }

    /// Whether the egress a created guest reports is the one this policy asked for. Order is
    /// ignored; an absent or empty list, or `*`, means allow-all.
    pub fn matches(self, reported: Option<&[String]>) -> bool {
        let mut got: Vec<&str> = reported
            .unwrap_or_default()
            .iter()
            .map(|s| s.trim())
            .collect();
        got.sort_unstable();
        got.dedup();
        match self {
            EgressPolicy::AllowAll => got.is_empty() || got == [ALLOW_ALL_RULE],
            EgressPolicy::DenyAll => got == [DENY_ALL_RULE],
        }
    }
}

impl fmt::Display for EgressPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EgressPolicy::AllowAll => write!(f, "unrestricted ([\"{ALLOW_ALL_RULE}\"])"),
            EgressPolicy::DenyAll => write!(
                f,
                "deny-all ([\"{DENY_ALL_RULE}\"]; {LINK_LOCAL_HOLE} stays reachable)"
            ),
        }
    }
}

/// A validated, canonical address rule: a network or a single address, optionally with a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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
        let full = match self.addr {
            IpAddr::V4(_) => 32,
            IpAddr::V6(_) => 128,
        };
        match (self.addr, self.port) {
            (IpAddr::V4(a), Some(p)) => write!(f, "{a}:{p}"),
            (IpAddr::V6(a), Some(p)) => write!(f, "[{a}]:{p}"),
            (a, None) if self.prefix == full => write!(f, "{a}"),
            (a, None) => write!(f, "{a}/{}", self.prefix),
        }
    }
}

fn rule_error(rule: &str, why: &str) -> SandboxError {
    SandboxError::refused(format!(
        "egress rule {rule:?} is not accepted: {why}. Use an IPv4/IPv6 address, IP:port, or a \
         canonical CIDR such as 203.0.113.0/24"
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

/// Validates one address rule strictly: canonical IPv4/IPv6 addresses, `IP:port`
/// (`[v6]:port`), or CIDR with no host bits set; no `/0`; no hostnames or wildcards.
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

    #[test]
    fn spelling() {
        assert_eq!(EgressPolicy::DenyAll.rules(), vec!["240.0.0.0/4"]);
        assert_eq!(EgressPolicy::AllowAll.rules(), vec!["*"]);
    }

    #[test]
    fn domains_are_refused_even_with_network_on() {
        for allow in [true, false] {
            let e = EgressPolicy::decide(allow, &s(&["pypi.org"]), true).unwrap_err();
            assert!(e.kind().is_unavailable());
            assert!(e.to_string().contains(ENV_LF_ALLOWED_DOMAINS));
        }
    }

    #[test]
    fn deny_all_needs_the_link_local_opt_in() {
        let e = EgressPolicy::decide(false, &[], false).unwrap_err();
        assert!(e.to_string().contains("169.254.0.0/16"));
        assert!(e.to_string().contains(ENV_ACCEPT_EGRESS_EXCEPTIONS));
        assert_eq!(
            EgressPolicy::decide(false, &[], true).unwrap(),
            EgressPolicy::DenyAll
        );
        assert_eq!(
            EgressPolicy::decide(true, &[], false).unwrap(),
            EgressPolicy::AllowAll
        );
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
            ("1.1.1.1", "1.1.1.1"),
            ("151.101.192.223:443", "151.101.192.223:443"),
            ("2001:db8::/32", "2001:db8::/32"),
            ("2001:db8::1", "2001:db8::1"),
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
}
