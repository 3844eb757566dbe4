//! Host names and the allowlist patterns a credential carries.
//!
//! Every name, whether it comes from a pattern, a `CONNECT` line, a request URI or a TLS
//! `server_name`, goes through [`normalize_host`] first: Unicode names become their ASCII
//! (Punycode) form, letters are lowercased, one trailing dot is dropped, and anything that is
//! not a plain DNS name of letters, digits and hyphens is refused. Matching then compares those
//! normal forms exactly, so `PyPI.org.`, `pypi.org` and `ＰｙＰＩ．ｏｒｇ` are one name.
//!
//! A pattern is `name` (that name only) or `*.name` (any name ending in `.name`, at any depth,
//! but not `name` itself), optionally followed by `:port`. Without a port a pattern admits the
//! web ports [`DEFAULT_PORTS`] (443 and 80); with one, that port only. `*.name` needs at least two
//! labels after the `*.` (`*.com` is refused as too broad to be meant).

use std::fmt;
use std::net::IpAddr;

/// The ports a pattern without `:port` admits: HTTPS and HTTP.
pub const DEFAULT_PORTS: [u16; 2] = [443, 80];

/// The longest DNS name, in ASCII form without the trailing dot.
const MAX_NAME: usize = 253;
/// The longest DNS label.
const MAX_LABEL: usize = 63;

/// Why a host name or pattern was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    /// Nothing to match.
    #[error("empty host name")]
    Empty,
    /// An IP address where a name was expected.
    #[error("an IP address is not a host name (the allowlist holds names only)")]
    IpLiteral,
    /// Not a DNS name once normalised (a character outside letters, digits and `-`, an empty or
    /// over-long label, a name ending in a number, ...).
    #[error("not a valid DNS host name")]
    Invalid,
    /// A wildcard other than a leading `*.` followed by at least two labels.
    #[error("a wildcard must be a leading `*.` followed by at least two labels (`*.example.com`)")]
    BadWildcard,
    /// A `:port` that is not a number from 1 to 65535.
    #[error("the port must be a number from 1 to 65535")]
    BadPort,
}

/// Whether `name` (lowercase ASCII, no trailing dot) is an IPv4 address in one of the
/// spellings `inet_aton` and URL parsers accept besides the dotted quad: one to four parts, each
/// decimal, octal (a leading `0`) or hex (`0x`), such as `2130706433`, `0177.0.0.1`,
/// `0x7f.1` or `127.1`. Whatever the value, such a name is an address, never a host name.
fn is_legacy_ipv4(name: &str) -> bool {
    let parts: Vec<&str> = name.split('.').collect();
    parts.len() <= 4
        && parts.iter().all(|part| match part.strip_prefix("0x") {
            Some(hex) => hex.bytes().all(|b| b.is_ascii_hexdigit()),
            None => !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()),
        })
}

/// Normalises a host name to the form every comparison uses: ASCII (Punycode) labels,
/// lowercase, no trailing dot. Refuses IP literals (in every spelling a resolver reads as an
/// address) and anything that is not a DNS name; at most one trailing dot is dropped.
pub fn normalize_host(input: &str) -> Result<String, HostError> {
    let had_dot = input.ends_with('.');
    let trimmed = input.strip_suffix('.').unwrap_or(input);
    if trimmed.is_empty() {
        return Err(HostError::Empty);
    }
    if trimmed.starts_with('[') || trimmed.parse::<IpAddr>().is_ok() {
        return Err(HostError::IpLiteral);
    }
    // `pkg.test..` is not `pkg.test`: one trailing dot only.
    if trimmed.ends_with('.') {
        return Err(HostError::Invalid);
    }
    let ascii = idna::domain_to_ascii_cow(trimmed.as_bytes(), idna::AsciiDenyList::STD3)
        .map_err(|_| HostError::Invalid)?;
    // UTS 46 may map a character to a dot (an ideographic full stop): that is the one trailing
    // dot when the input had no ASCII one.
    let ascii = if had_dot {
        &ascii
    } else {
        ascii.strip_suffix('.').unwrap_or(&ascii)
    };
    if ascii.parse::<IpAddr>().is_ok() || is_legacy_ipv4(ascii) {
        return Err(HostError::IpLiteral);
    }
    if ascii.len() > MAX_NAME {
        return Err(HostError::Invalid);
    }
    let mut last = "";
    for label in ascii.split('.') {
        let ldh = label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if label.is_empty()
            || label.len() > MAX_LABEL
            || !ldh
            || label.starts_with('-')
            || label.ends_with('-')
        {
            return Err(HostError::Invalid);
        }
        last = label;
    }
    // A name whose last label is a number is read as an IPv4 address by some resolvers
    // (`0x7f.1`, `2130706433`): never a name here.
    let hex = last
        .strip_prefix("0x")
        .is_some_and(|h| h.bytes().all(|b| b.is_ascii_hexdigit()));
    if last.bytes().all(|b| b.is_ascii_digit()) || hex {
        return Err(HostError::Invalid);
    }
    Ok(ascii.to_owned())
}

/// What a [`Pattern`] matches.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Names {
    /// Exactly this name.
    Exact(String),
    /// Any name ending in `.` + this suffix.
    Below(String),
}

/// One allowlist entry: `name`, `*.name`, either with an optional `:port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    names: Names,
    port: Option<u16>,
}

impl Pattern {
    /// Parses and normalises one entry.
    pub fn parse(entry: &str) -> Result<Self, HostError> {
        let (host, port) = match entry.rsplit_once(':') {
            Some((host, port)) => {
                let port = port
                    .parse::<u16>()
                    .ok()
                    .filter(|p| *p != 0 && port.bytes().all(|b| b.is_ascii_digit()))
                    .ok_or(HostError::BadPort)?;
                (host, Some(port))
            }
            None => (entry, None),
        };
        let names = if let Some(suffix) = host.strip_prefix("*.") {
            let suffix = normalize_host(suffix).map_err(|e| match e {
                HostError::Empty => HostError::BadWildcard,
                other => other,
            })?;
            if !suffix.contains('.') {
                return Err(HostError::BadWildcard);
            }
            Names::Below(suffix)
        } else if host.contains('*') {
            return Err(HostError::BadWildcard);
        } else {
            Names::Exact(normalize_host(host)?)
        };
        Ok(Self { names, port })
    }

    /// Whether this pattern's names include `host` (already normalised), whatever the port.
    fn names_match(&self, host: &str) -> bool {
        match &self.names {
            Names::Exact(name) => host == name,
            Names::Below(suffix) => host
                .strip_suffix(suffix.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
        }
    }

    /// Whether this pattern admits `port`.
    fn port_matches(&self, port: u16) -> bool {
        self.port
            .map_or(DEFAULT_PORTS.contains(&port), |own| own == port)
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.names {
            Names::Exact(name) => f.write_str(name)?,
            Names::Below(suffix) => write!(f, "*.{suffix}")?,
        }
        if let Some(port) = self.port {
            write!(f, ":{port}")?;
        }
        Ok(())
    }
}

/// What an [`Allowlist`] says about a destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// A pattern admits this name and port.
    Allowed,
    /// Some pattern names this host, but none admits the port.
    PortNotAllowed,
    /// No pattern names this host.
    HostNotAllowed,
}

/// The patterns of one credential: a destination is allowed when any pattern admits it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Allowlist {
    patterns: Vec<Pattern>,
}

impl Allowlist {
    /// Parses every entry; the first invalid one fails the whole list (with its position).
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<Self, (usize, HostError)> {
        let patterns = entries
            .iter()
            .enumerate()
            .map(|(i, e)| Pattern::parse(e.as_ref()).map_err(|err| (i, err)))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { patterns })
    }

    /// The patterns, in their normal form.
    pub fn patterns(&self) -> &[Pattern] {
        &self.patterns
    }

    /// Whether nothing is allowed.
    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// Whether `host` (already normalised by [`normalize_host`]) on `port` is allowed.
    pub fn decide(&self, host: &str, port: u16) -> Decision {
        let mut named = false;
        for pattern in &self.patterns {
            if pattern.names_match(host) {
                if pattern.port_matches(port) {
                    return Decision::Allowed;
                }
                named = true;
            }
        }
        if named {
            Decision::PortNotAllowed
        } else {
            Decision::HostNotAllowed
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(entries: &[&str]) -> Allowlist {
        Allowlist::parse(entries).unwrap()
    }

    #[test]
    fn names_are_normalised_to_one_form() {
        assert_eq!(normalize_host("PyPI.org.").unwrap(), "pypi.org");
        assert_eq!(
            normalize_host("files.PythonHosted.ORG").unwrap(),
            "files.pythonhosted.org"
        );
        // Fullwidth letters and an ideographic full stop map to the plain name (UTS 46).
        assert_eq!(normalize_host("ＰｙＰＩ．ｏｒｇ").unwrap(), "pypi.org");
        // Unicode labels become Punycode, as in DNS and in a TLS server_name.
        assert_eq!(
            normalize_host("bücher.example").unwrap(),
            "xn--bcher-kva.example"
        );
        assert_eq!(
            normalize_host("XN--BCHER-KVA.example").unwrap(),
            "xn--bcher-kva.example"
        );
    }

    #[test]
    fn hostile_or_odd_names_are_refused() {
        for bad in [
            "",
            ".",
            "a..b",
            ".example.com",
            "exa mple.com",
            "example.com/",
            "user@example.com",
            "example.com:443",
            "-lead.example",
            "trail-.example",
            "under_score.example",
            "a\u{0}b.example",
            "pypi.org\r\nX-Injected: 1",
            "0x7f.1",
            "2130706433",
            "example.123",
            &"a".repeat(64),
            &format!("{}.com", ["abcdefghij"; 25].join(".")),
        ] {
            assert!(normalize_host(bad).is_err(), "{bad:?} was accepted");
        }
        for ip in ["127.0.0.1", "::1", "[::1]", "10.0.0.1.", "::ffff:127.0.0.1"] {
            assert_eq!(normalize_host(ip), Err(HostError::IpLiteral), "{ip}");
        }
    }

    #[test]
    fn every_spelling_of_an_ipv4_address_is_an_ip_literal() {
        for ip in [
            "2130706433",
            "017700000001",
            "0177.0.0.1",
            "0x7f.0.0.1",
            "0X7F.0.0.1",
            "0x7f000001",
            "0x7f.1",
            "127.1",
            "127.0.1",
            "0",
            "0x",
            "0xa9.0xfe.0xa9.0xfe",
            "2852039166.",
            // Fullwidth digits map to ASCII ones (UTS 46): still an address.
            "１２７.０.０.１",
        ] {
            assert_eq!(normalize_host(ip), Err(HostError::IpLiteral), "{ip}");
        }
        // Numbers that are not an address are not names either.
        for bad in ["1.2.3.4.5", "example.123", "0x7g.1", "08.1.1.1.1"] {
            assert_eq!(normalize_host(bad), Err(HostError::Invalid), "{bad}");
        }
    }

    #[test]
    fn one_trailing_dot_in_any_form_is_dropped_and_no_more() {
        assert_eq!(normalize_host("pkg.test.").unwrap(), "pkg.test");
        assert_eq!(normalize_host("pkg.test\u{3002}").unwrap(), "pkg.test");
        for bad in [
            "pkg.test..",
            "pkg.test.\u{3002}",
            "pkg.test\u{3002}.",
            "pkg.test\u{3002}\u{3002}",
            "..",
        ] {
            assert!(normalize_host(bad).is_err(), "{bad:?} was accepted");
        }
    }

    /// Asserts `list`'s decision for each `(host, port, expected)`.
    fn decides(list: &Allowlist, cases: &[(&str, u16, Decision)]) {
        for (host, port, want) in cases {
            assert_eq!(list.decide(host, *port), *want, "{host}:{port}");
        }
    }

    #[test]
    fn exact_names_match_only_themselves_on_the_web_ports() {
        use Decision::{Allowed, HostNotAllowed, PortNotAllowed};
        decides(
            &list(&["pypi.org"]),
            &[
                ("pypi.org", 443, Allowed),
                ("pypi.org", 80, Allowed),
                ("pypi.org", 22, PortNotAllowed),
                ("evil.pypi.org", 443, HostNotAllowed),
                ("pypi.org.evil.example", 443, HostNotAllowed),
                ("xpypi.org", 443, HostNotAllowed),
            ],
        );
    }

    #[test]
    fn wildcards_match_names_below_the_suffix_only() {
        use Decision::{Allowed, HostNotAllowed};
        decides(
            &list(&["*.PythonHosted.org."]),
            &[
                ("files.pythonhosted.org", 443, Allowed),
                ("a.b.pythonhosted.org", 443, Allowed),
                ("pythonhosted.org", 443, HostNotAllowed),
                ("evilpythonhosted.org", 443, HostNotAllowed),
                ("pythonhosted.org.evil.example", 443, HostNotAllowed),
            ],
        );
        for bad in [
            "*",
            "*.",
            "*.com",
            "a.*.example.com",
            "*example.com",
            "**.example.com",
        ] {
            assert!(Pattern::parse(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn an_explicit_port_replaces_the_web_ports() {
        use Decision::{Allowed, PortNotAllowed};
        decides(
            &list(&["api.example.com:8443", "*.svc.example.com:9000"]),
            &[
                ("api.example.com", 8443, Allowed),
                ("api.example.com", 443, PortNotAllowed),
                ("x.svc.example.com", 9000, Allowed),
                ("x.svc.example.com", 80, PortNotAllowed),
            ],
        );
        for bad in [
            "a.example:0",
            "a.example:65536",
            "a.example:",
            "a.example:+1",
            "a.example:4x",
        ] {
            assert_eq!(Pattern::parse(bad), Err(HostError::BadPort), "{bad:?}");
        }
    }

    #[test]
    fn patterns_print_in_normal_form() {
        let l = list(&["PyPI.org.", "*.Example.COM:8443"]);
        let shown: Vec<String> = l.patterns().iter().map(ToString::to_string).collect();
        assert_eq!(shown, ["pypi.org", "*.example.com:8443"]);
        assert_eq!(
            Allowlist::parse(&["ok.example", "bad host"]).unwrap_err().0,
            1
        );
    }
}
