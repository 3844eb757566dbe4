//! Which destination addresses the gateway never connects to, whatever DNS says.
//!
//! A name on the allowlist is only as good as its DNS answer: a record pointing at
//! `127.0.0.1`, `10.0.0.5` or the cloud metadata service `169.254.169.254` would turn the
//! gateway into a way into its own network. So every resolved address is classified here and
//! only public unicast addresses are ever connected to. IPv4 is checked against the special-use
//! ranges of the IANA registry; IPv6 must be global unicast (`2000::/3`) outside its special-use
//! blocks, and an IPv4 address carried inside IPv6 (`::ffff:a.b.c.d`, the NAT64 prefix
//! `64:ff9b::/96`) is judged as that IPv4 address.
//!
//! A public address can still be the gateway's own (the public IP of the host it runs on):
//! connecting to it would reach the host's own services, the gateway included.
//! [`is_own_address`] tells, by asking the kernel which source address it would use to reach
//! it: for an address of this host, the address itself.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};

/// IPv4 ranges never connected to: (network, prefix length, why).
const V4_FORBIDDEN: &[(Ipv4Addr, u8, &str)] = &[
    (Ipv4Addr::BROADCAST, 32, "broadcast"),
    (Ipv4Addr::UNSPECIFIED, 8, "this-network (0.0.0.0/8)"),
    (Ipv4Addr::new(10, 0, 0, 0), 8, "private (10.0.0.0/8)"),
    (
        Ipv4Addr::new(100, 64, 0, 0),
        10,
        "shared address space (CGNAT, 100.64.0.0/10)",
    ),
    (Ipv4Addr::new(127, 0, 0, 0), 8, "loopback"),
    (
        Ipv4Addr::new(169, 254, 0, 0),
        16,
        "link-local (169.254.0.0/16, cloud metadata)",
    ),
    (Ipv4Addr::new(172, 16, 0, 0), 12, "private (172.16.0.0/12)"),
    (
        Ipv4Addr::new(192, 0, 0, 0),
        24,
        "IETF protocol assignments (192.0.0.0/24)",
    ),
    (
        Ipv4Addr::new(192, 0, 2, 0),
        24,
        "documentation (192.0.2.0/24)",
    ),
    (
        Ipv4Addr::new(192, 88, 99, 0),
        24,
        "reserved (6to4 relay, 192.88.99.0/24)",
    ),
    (
        Ipv4Addr::new(192, 168, 0, 0),
        16,
        "private (192.168.0.0/16)",
    ),
    (
        Ipv4Addr::new(198, 18, 0, 0),
        15,
        "benchmarking (198.18.0.0/15)",
    ),
    (
        Ipv4Addr::new(198, 51, 100, 0),
        24,
        "documentation (198.51.100.0/24)",
    ),
    (
        Ipv4Addr::new(203, 0, 113, 0),
        24,
        "documentation (203.0.113.0/24)",
    ),
    (Ipv4Addr::new(224, 0, 0, 0), 4, "multicast"),
    (Ipv4Addr::new(240, 0, 0, 0), 4, "reserved (240.0.0.0/4)"),
];

/// IPv6 blocks never connected to, checked before the "global unicast only" rule so the
/// reason is specific: (network, prefix length, why).
const V6_FORBIDDEN: &[(Ipv6Addr, u8, &str)] = &[
    (Ipv6Addr::UNSPECIFIED, 128, "unspecified (::)"),
    (Ipv6Addr::LOCALHOST, 128, "loopback (::1)"),
    (
        Ipv6Addr::UNSPECIFIED,
        96,
        "IPv4-compatible (deprecated, ::/96)",
    ),
    (
        Ipv6Addr::new(0x64, 0xff9b, 1, 0, 0, 0, 0, 0),
        48,
        "local-use NAT64 (64:ff9b:1::/48)",
    ),
    (
        Ipv6Addr::new(0x100, 0, 0, 0, 0, 0, 0, 0),
        64,
        "discard-only (100::/64)",
    ),
    (
        Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0),
        32,
        "documentation (2001:db8::/32)",
    ),
    (
        Ipv6Addr::new(0x2001, 0, 0, 0, 0, 0, 0, 0),
        23,
        "IETF protocol assignments (2001::/23)",
    ),
    (
        Ipv6Addr::new(0x2002, 0, 0, 0, 0, 0, 0, 0),
        16,
        "6to4 (2002::/16)",
    ),
    (
        Ipv6Addr::new(0x3fff, 0, 0, 0, 0, 0, 0, 0),
        20,
        "documentation (3fff::/20)",
    ),
    (
        Ipv6Addr::new(0xfc00, 0, 0, 0, 0, 0, 0, 0),
        7,
        "unique local (fc00::/7)",
    ),
    (
        Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0),
        10,
        "link-local (fe80::/10)",
    ),
    (
        Ipv6Addr::new(0xfec0, 0, 0, 0, 0, 0, 0, 0),
        10,
        "site-local (deprecated, fec0::/10)",
    ),
    (Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0), 8, "multicast"),
];

/// The well-known NAT64 prefix: the low 32 bits are an IPv4 address.
const NAT64: (Ipv6Addr, u8) = (Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0, 0), 96);

fn in_v4(ip: Ipv4Addr, net: Ipv4Addr, len: u8) -> bool {
    let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
    u32::from(ip) & mask == u32::from(net) & mask
}

fn in_v6(ip: Ipv6Addr, net: Ipv6Addr, len: u8) -> bool {
    let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
    u128::from(ip) & mask == u128::from(net) & mask
}

fn forbidden_v4(ip: Ipv4Addr) -> Option<&'static str> {
    V4_FORBIDDEN
        .iter()
        .find(|(net, len, _)| in_v4(ip, *net, *len))
        .map(|(_, _, why)| *why)
}

/// Why the gateway must not connect to `ip`, or `None` for a public unicast address.
pub fn forbidden_reason(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => forbidden_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return forbidden_v4(v4);
            }
            if in_v6(v6, NAT64.0, NAT64.1) {
                let low = u32::try_from(u128::from(v6) & u128::from(u32::MAX)).unwrap_or(0);
                return forbidden_v4(Ipv4Addr::from(low));
            }
            if let Some((_, _, why)) = V6_FORBIDDEN.iter().find(|(n, l, _)| in_v6(v6, *n, *l)) {
                return Some(why);
            }
            let global_unicast = Ipv6Addr::new(0x2000, 0, 0, 0, 0, 0, 0, 0);
            if in_v6(v6, global_unicast, 3) {
                None
            } else {
                Some("reserved (outside IPv6 global unicast 2000::/3)")
            }
        }
    }
}

/// Whether `ip` is an address of the host the gateway runs on (any interface of its network
/// namespace), asked of the kernel without sending anything: a UDP socket "connected" to `ip`
/// gets the source address its route would use, which for a local address is that address.
/// When the question cannot be asked (no socket), the answer is yes: the address is not used.
pub fn is_own_address(ip: IpAddr) -> bool {
    let ip = ip.to_canonical();
    let any: SocketAddr = match ip {
        IpAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        IpAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let Ok(socket) = UdpSocket::bind(any) else {
        return true;
    };
    // No route: nothing can be connected to there, by this check or by the gateway.
    if socket.connect((ip, 9)).is_err() {
        return false;
    }
    socket
        .local_addr()
        .map_or(true, |local| local.ip().to_canonical() == ip)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hosts_own_addresses_are_recognised() {
        // Loopback is this host's in every namespace; a documentation address is not.
        assert!(is_own_address("127.0.0.1".parse().unwrap()));
        assert!(is_own_address("::ffff:127.0.0.1".parse().unwrap()));
        assert!(!is_own_address("192.0.2.1".parse().unwrap()));
    }

    fn reason(s: &str) -> Option<&'static str> {
        forbidden_reason(s.parse().unwrap())
    }

    #[test]
    fn public_unicast_is_allowed() {
        for ok in [
            "151.101.0.223",
            "8.8.8.8",
            "1.1.1.1",
            "11.0.0.1",
            "100.63.255.255",
            "100.128.0.0",
            "172.32.0.1",
            "192.0.1.1",
            "198.20.0.1",
            "223.255.255.255",
            "2a04:4e42::223",
            "2001:4860:4860::8888",
            "::ffff:151.101.0.223",
            "64:ff9b::808:808",
        ] {
            assert_eq!(reason(ok), None, "{ok} refused");
        }
    }

    #[test]
    fn special_use_ipv4_is_refused() {
        for (bad, why) in [
            ("127.0.0.1", "loopback"),
            ("127.255.255.254", "loopback"),
            ("10.1.2.3", "private"),
            ("172.16.0.1", "private"),
            ("172.31.255.255", "private"),
            ("192.168.1.1", "private"),
            ("169.254.169.254", "link-local"),
            ("100.64.0.1", "CGNAT"),
            ("100.127.255.255", "CGNAT"),
            ("0.0.0.0", "this-network"),
            ("0.1.2.3", "this-network"),
            ("255.255.255.255", "broadcast"),
            ("224.0.0.1", "multicast"),
            ("239.255.255.250", "multicast"),
            ("240.0.0.1", "reserved"),
            ("192.0.2.10", "documentation"),
            ("198.51.100.10", "documentation"),
            ("203.0.113.10", "documentation"),
            ("198.18.0.1", "benchmarking"),
            ("198.19.255.255", "benchmarking"),
            ("192.0.0.8", "IETF"),
            ("192.88.99.1", "6to4"),
        ] {
            let got = reason(bad).unwrap_or_else(|| panic!("{bad} allowed"));
            assert!(got.contains(why), "{bad}: {got}");
        }
    }

    #[test]
    fn special_use_ipv6_and_embedded_ipv4_are_refused() {
        for (bad, why) in [
            ("::", "unspecified"),
            ("::1", "loopback"),
            ("fe80::1", "link-local"),
            ("febf::1", "link-local"),
            ("fd00::1", "unique local"),
            ("fc00::1", "unique local"),
            ("ff02::1", "multicast"),
            ("2001:db8::1", "documentation"),
            ("3fff::1", "documentation"),
            ("2001::1", "IETF"),
            ("2002:7f00:1::1", "6to4"),
            ("100::1", "discard"),
            ("fec0::1", "site-local"),
            ("::7f00:1", "IPv4-compatible"),
            ("64:ff9b:1::1", "NAT64"),
            ("5f00::1", "outside"),
            ("4000::1", "outside"),
            // IPv4 inside IPv6 is judged as the IPv4 address it carries.
            ("::ffff:127.0.0.1", "loopback"),
            ("::ffff:169.254.169.254", "link-local"),
            ("::ffff:10.0.0.1", "private"),
            ("64:ff9b::a9fe:a9fe", "link-local"),
            ("64:ff9b::7f00:1", "loopback"),
        ] {
            let got = reason(bad).unwrap_or_else(|| panic!("{bad} allowed"));
            assert!(got.contains(why), "{bad}: {got}");
        }
    }
}
