//! The enforcing mode's reading of CreateOS egress rules (contract §4.1), and the guest
//! networks that enforce them.
//!
//! What CreateOS does, as measured live, and so what this does:
//!
//! - `null`, `[]` and `["*"]` allow everything (there is no deny-all token);
//! - address rules are enforced: CIDR (`240.0.0.0/4`, `2001:db8::/32`) and `IP:port`
//!   (`151.101.0.223:443`, `[2001:db8::1]:443`), the port for TCP and UDP;
//! - host-name rules (`pypi.org`, `pypi.org:443`, `*.pypi.org`) are accepted and echoed but not
//!   enforced, and a rule set that does not parse falls back to allowing everything; one host
//!   name in a set was seen to disable the whole set, so any rule that is not an address rule
//!   makes the whole set allow-all here. That includes bare addresses (`1.2.3.4`), a form never
//!   verified live: a fake that enforced it would hide a possible fail-open;
//! - the permanent holes stay open whatever the rules say: the guest's own /31 and all of
//!   `169.254.0.0/16` (the metadata service). The agent's time servers are not modelled.
//!
//! Each guest gets a network namespace `createos-fake-<pid>-<n>` with one veth link to the
//! uplink namespace (the fake's own unless `--egress-uplink-netns` names another), a /31 from
//! `10.213.0.0/16` (the uplink end even, the guest odd, which is also the guest's `ip`), a default
//! route through the uplink end, and an nftables `output` chain holding the rules. Nothing is
//! routed or translated beyond the uplink namespace.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::netns::{self, Netns};

/// Namespaces of guests are named `{PREFIX}-<pid>-<n>`.
pub(crate) const PREFIX: &str = "createos-fake";

/// The nftables table that holds a guest's chain.
const TABLE: &str = "createos_fake";

/// A parsed rule set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Policy {
    /// Everything allowed, and why (`"*"`, empty, or the rule that did not parse).
    AllowAll(String),
    /// Only these destinations (plus the permanent holes).
    Only(Vec<Rule>),
}

/// One enforced rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Rule {
    /// A network, host bits cleared.
    Cidr(IpAddr, u8),
    /// One address and port (TCP and UDP).
    AddrPort(IpAddr, u16),
}

fn mask(ip: IpAddr, len: u8) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => {
            let m = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from(u32::from(v4) & m))
        }
        IpAddr::V6(v6) => {
            let m = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
            IpAddr::V6((u128::from(v6) & m).into())
        }
    }
}

/// A decimal number of digits only (Rust's `parse` would also take a leading `+`).
fn number<T: std::str::FromStr>(text: &str) -> Option<T> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

fn parse_rule(rule: &str) -> Option<Rule> {
    if let Some((net, len)) = rule.split_once('/') {
        let ip: IpAddr = net.parse().ok()?;
        let max = if ip.is_ipv4() { 32 } else { 128 };
        let len: u8 = number(len).filter(|l| *l <= max)?;
        return Some(Rule::Cidr(mask(ip, len), len));
    }
    let (addr, port) = if let Some(rest) = rule.strip_prefix('[') {
        let (v6, port) = rest.split_once("]:")?;
        (IpAddr::V6(v6.parse().ok()?), port)
    } else {
        let (v4, port) = rule.rsplit_once(':')?;
        (IpAddr::V4(v4.parse().ok()?), port)
    };
    let port: u16 = number(port).filter(|p| *p != 0)?;
    Some(Rule::AddrPort(addr, port))
}

/// Reads a rule set as CreateOS does.
pub(crate) fn policy(rules: &[String]) -> Policy {
    if rules.is_empty() {
        return Policy::AllowAll("no rules".to_owned());
    }
    let mut out = Vec::new();
    for rule in rules {
        if rule == "*" {
            return Policy::AllowAll("`*`".to_owned());
        }
        match parse_rule(rule) {
            Some(r) => out.push(r),
            None => return Policy::AllowAll(format!("{rule:?} is not an address rule")),
        }
    }
    Policy::Only(out)
}

/// The nftables ruleset (replacing any earlier one atomically) for a guest whose own /31 is
/// `own`.
pub(crate) fn ruleset(policy: &Policy, own: Ipv4Addr) -> String {
    let mut chain = String::new();
    match policy {
        Policy::AllowAll(_) => {
            chain.push_str("    type filter hook output priority 0; policy accept;\n");
        }
        Policy::Only(rules) => {
            chain.push_str("    type filter hook output priority 0; policy drop;\n");
            chain.push_str("    oifname \"lo\" accept\n");
            chain.push_str("    ip daddr ");
            chain.push_str(&own.to_string());
            chain.push_str("/31 accept\n    ip daddr 169.254.0.0/16 accept\n");
            for rule in rules {
                let line = match rule {
                    Rule::Cidr(IpAddr::V4(ip), len) => format!("ip daddr {ip}/{len} accept"),
                    Rule::Cidr(IpAddr::V6(ip), len) => format!("ip6 daddr {ip}/{len} accept"),
                    Rule::AddrPort(IpAddr::V4(ip), port) => {
                        format!("ip daddr {ip} meta l4proto {{ tcp, udp }} th dport {port} accept")
                    }
                    Rule::AddrPort(IpAddr::V6(ip), port) => {
                        format!("ip6 daddr {ip} meta l4proto {{ tcp, udp }} th dport {port} accept")
                    }
                };
                chain.push_str("    ");
                chain.push_str(&line);
                chain.push('\n');
            }
        }
    }
    format!(
        "table inet {TABLE}\ndelete table inet {TABLE}\ntable inet {TABLE} {{\n  chain egress {{\n{chain}  }}\n}}\n"
    )
}

/// The enforcing mode's settings and address allocator.
#[derive(Debug)]
pub(crate) struct Enforcer {
    ip: std::path::PathBuf,
    uplink: Option<String>,
    next: AtomicU32,
}

/// /31 networks in `10.213.0.0/16`.
const SLOTS: u32 = 1 << 15;

impl Enforcer {
    /// Checks that this machine can enforce (root, `ip`, `nft`, the uplink namespace exists)
    /// and clears namespaces left by fakes that died.
    pub(crate) fn new(uplink: Option<String>) -> Result<Enforcer, String> {
        let tools = netns::support().map_err(|why| {
            format!("--enforce-egress cannot run here: {why}. Run without --enforce-egress, or as root with iproute2 and nftables installed")
        })?;
        if let Some(ns) = &uplink
            && !std::path::Path::new("/run/netns").join(ns).exists()
        {
            return Err(format!(
                "--egress-uplink-netns {ns:?}: no such network namespace (create it with `ip netns add {ns}`)"
            ));
        }
        netns::remove_stale(PREFIX);
        // A random start keeps two fakes sharing an uplink out of each other's addresses.
        let start = rand::random::<u32>() % SLOTS;
        Ok(Enforcer {
            ip: tools.ip,
            uplink,
            next: AtomicU32::new(start),
        })
    }

    /// iproute2's `ip`, which runs guest commands inside their namespace.
    pub(crate) fn ip_program(&self) -> &std::path::Path {
        &self.ip
    }

    /// Creates a guest's namespace, link, addresses, route and firewall for `rules`.
    pub(crate) fn attach(&self, rules: &[String]) -> std::io::Result<GuestNet> {
        let slot = self.next.fetch_add(1, Ordering::Relaxed) % SLOTS;
        let base = u32::from(Ipv4Addr::new(10, 213, 0, 0)) + slot * 2;
        let (up, own) = (Ipv4Addr::from(base), Ipv4Addr::from(base + 1));
        let ns = Netns::create(PREFIX)?;
        let up_if = format!("cf{:08x}", rand::random::<u32>());
        netns::veth(
            self.uplink.as_deref(),
            &up_if,
            &format!("{up}/31"),
            &ns,
            "eth0",
            &format!("{own}/31"),
        )?;
        ns.ip(&["route", "add", "default", "via", &up.to_string()])?;
        let net = GuestNet { ns, own };
        net.apply(rules)?;
        Ok(net)
    }
}

/// A guest's network: its namespace (deleted with it) and its address.
#[derive(Debug)]
pub(crate) struct GuestNet {
    ns: Netns,
    own: Ipv4Addr,
}

impl GuestNet {
    /// The namespace guest commands run in.
    pub(crate) fn name(&self) -> &str {
        self.ns.name()
    }

    /// The guest's address (its `ip`).
    pub(crate) fn addr(&self) -> Ipv4Addr {
        self.own
    }

    /// Replaces the guest's firewall with `rules`.
    pub(crate) fn apply(&self, rules: &[String]) -> std::io::Result<()> {
        self.ns.nft(&ruleset(&policy(rules), self.own))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(r: &[&str]) -> Vec<String> {
        r.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn the_contract_forms_parse_and_everything_else_allows_all() {
        assert!(matches!(policy(&[]), Policy::AllowAll(_)));
        assert!(matches!(policy(&rules(&["*"])), Policy::AllowAll(_)));
        assert!(matches!(
            policy(&rules(&["1.2.3.4:443", "*"])),
            Policy::AllowAll(_)
        ));
        assert_eq!(
            policy(&rules(&[
                "240.0.0.0/4",
                "151.101.0.223:443",
                "[2001:db8::1]:8443",
                "10.1.2.3/8"
            ])),
            Policy::Only(vec![
                Rule::Cidr("240.0.0.0".parse().unwrap(), 4),
                Rule::AddrPort("151.101.0.223".parse().unwrap(), 443),
                Rule::AddrPort("2001:db8::1".parse().unwrap(), 8443),
                Rule::Cidr("10.0.0.0".parse().unwrap(), 8),
            ])
        );
        // Host names (with or without a port or wildcard), bare addresses and garbage: the
        // whole set is allow-all, as CreateOS falls back.
        for odd in [
            "pypi.org",
            "pypi.org:443",
            "*.pypi.org",
            "1.2.3.4",
            "::1",
            "1.2.3.4/33",
            "1.2.3.4:0",
            "1.2.3.4:65536",
            "1.2.3.4:+1",
            "1.2.3.4/+8",
            "[::1]",
            "",
            " 1.2.3.4:443",
        ] {
            assert!(
                matches!(
                    policy(&rules(&["151.101.0.223:443", odd])),
                    Policy::AllowAll(_)
                ),
                "{odd:?} was enforced"
            );
        }
    }

    #[test]
    fn the_ruleset_keeps_the_holes_and_lists_each_rule() {
        let own = Ipv4Addr::new(10, 213, 0, 1);
        let text = ruleset(&policy(&rules(&["11.0.0.1:443", "2001:db8::/32"])), own);
        assert!(text.contains("policy drop;"));
        assert!(text.contains("ip daddr 10.213.0.1/31 accept"));
        assert!(text.contains("ip daddr 169.254.0.0/16 accept"));
        assert!(text.contains("ip daddr 11.0.0.1 meta l4proto { tcp, udp } th dport 443 accept"));
        assert!(text.contains("ip6 daddr 2001:db8::/32 accept"));
        let open = ruleset(&policy(&rules(&["pypi.org"])), own);
        assert!(open.contains("policy accept;") && !open.contains("dport"));
    }
}
