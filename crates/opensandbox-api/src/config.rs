//! Settings as the SDK names and reads them: the environment variables, the defaults, and the
//! rule that turns `OPEN_SANDBOX_DOMAIN` into the API's base URL.

use std::net::IpAddr;
use std::time::Duration;

use url::Url;

use crate::error::{Error, Result};

/// The environment variable naming the server, as the official SDK reads it: a `host[:port]`
/// (plain `http`, as the SDK does) or a URL (`https://sandboxes.internal:8443`).
pub const ENV_DOMAIN: &str = "OPEN_SANDBOX_DOMAIN";
/// The environment variable holding the API key (sent as `OPEN-SANDBOX-API-KEY`).
pub const ENV_API_KEY: &str = "OPEN_SANDBOX_API_KEY";
/// The domain used when none is configured (the SDK's default).
pub const DEFAULT_DOMAIN: &str = "localhost:8080";
/// Default timeout of one buffered request, body included (30 s).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Default timeout to open a connection (10 s).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default `User-Agent`.
pub const DEFAULT_USER_AGENT: &str = concat!("opensandbox-rust/", env!("CARGO_PKG_VERSION"));

/// The API base (`…/v1`) for a domain as the SDK reads it (`host[:port]` is `http://`).
pub fn base_url(domain: &str) -> Result<Url> {
    let domain = domain.trim();
    if domain.is_empty() {
        return Err(Error::Config(format!("{ENV_DOMAIN} is blank")));
    }
    let lower = domain.to_ascii_lowercase();
    let with_scheme = if lower.starts_with("http://") || lower.starts_with("https://") {
        domain.to_owned()
    } else if lower.contains("://") {
        return Err(Error::Config(format!(
            "{ENV_DOMAIN} {}: only http:// and https:// are supported",
            shown_domain(domain)
        )));
    } else {
        format!("http://{domain}")
    };
    let mut url = Url::parse(&with_scheme).map_err(|e| {
        Error::Config(format!(
            "{ENV_DOMAIN} {} is not a host[:port] or URL: {e}",
            shown_domain(domain)
        ))
    })?;
    if url.host_str().is_none_or(str::is_empty) {
        return Err(Error::Config(format!("{ENV_DOMAIN} has no host")));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(Error::Config(format!(
            "{ENV_DOMAIN} must not carry credentials; pass the key as {ENV_API_KEY}"
        )));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(Error::Config(format!(
            "{ENV_DOMAIN} must not have a query or fragment"
        )));
    }
    let path = url.path().trim_end_matches('/').to_owned();
    if path.ends_with("/v1") {
        url.set_path(&path);
    } else {
        url.set_path(&format!("{path}/v1"));
    }
    Ok(url)
}

/// Whether a client for `domain` (as [`ENV_DOMAIN`] reads) would send the API key in clear to
/// another machine: a plain `http` URL, or a bare `host[:port]` (which the SDK reads as plain
/// `http`), whose host is not loopback. Such a domain is refused unless
/// [`crate::ClientBuilder::allow_insecure_http`] opts in. An unusable domain is an
/// [`Error::Config`].
pub fn is_plain_http_off_loopback(domain: &str) -> Result<bool> {
    let url = base_url(domain)?;
    Ok(url.scheme() == "http" && !is_loopback(&url))
}

/// A domain as it may be shown: anything after `?` or `#` dropped and a `user:pw@` hidden.
pub(crate) fn shown_domain(domain: &str) -> String {
    let kept = domain.split(['?', '#']).next().unwrap_or_default();
    let (scheme, rest) = kept.split_at(kept.find("://").map_or(0, |i| i + 3));
    match rest.rfind('@') {
        Some(at) => format!("{scheme}***@{}", &rest[at + 1..]),
        None => kept.to_owned(),
    }
}

/// Whether the URL's host is `localhost`, in `127.0.0.0/8` or `::1`.
pub fn is_loopback(url: &Url) -> bool {
    match url.host() {
        Some(url::Host::Ipv4(ip)) => IpAddr::V4(ip).is_loopback(),
        // `::ffff:127.0.0.1` is the IPv4 loopback too.
        Some(url::Host::Ipv6(ip)) => {
            IpAddr::V6(ip).is_loopback() || ip.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
        Some(url::Host::Domain(name)) => {
            name.trim_end_matches('.').eq_ignore_ascii_case("localhost")
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn domains_are_read_as_the_sdk_reads_them() {
        let cases = [
            ("localhost:8080", "http://localhost:8080/v1"),
            ("127.0.0.1:8080/", "http://127.0.0.1:8080/v1"),
            ("https://sb.example.com", "https://sb.example.com/v1"),
            (
                "HTTPS://sb.example.com:8443/api/",
                "https://sb.example.com:8443/api/v1",
            ),
            ("http://[::1]:8080/v1", "http://[::1]:8080/v1"),
        ];
        for (domain, want) in cases {
            assert_eq!(base_url(domain).unwrap().as_str(), want, "{domain}");
        }
        for bad in ["", "ftp://x", "https://u:pw@h", "https://h/?t=1", "http://"] {
            assert!(base_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn loopback_is_only_localhost_127_and_v6_one() {
        for (u, want) in [
            ("http://localhost/", true),
            ("http://127.8.0.1/", true),
            ("http://[::1]/", true),
            ("http://[::ffff:127.0.0.1]/", true),
            ("http://[::ffff:10.0.0.1]/", false),
            ("http://a.localhost/", false),
            ("http://10.0.0.1/", false),
        ] {
            assert_eq!(is_loopback(&Url::parse(u).unwrap()), want, "{u}");
        }
    }

    #[test]
    fn plain_http_off_loopback_is_told_apart() {
        for (domain, want) in [
            ("sandbox-server.internal:8080", true),
            ("http://10.0.0.5:8080", true),
            ("localhost:8080", false),
            ("http://127.0.0.1:8080", false),
            ("https://sandbox-server.internal", false),
        ] {
            assert_eq!(
                is_plain_http_off_loopback(domain).unwrap(),
                want,
                "{domain}"
            );
        }
        assert!(is_plain_http_off_loopback("ftp://x").is_err());
    }

    #[test]
    fn shown_domains_hide_credentials_and_queries() {
        assert_eq!(shown_domain("https://u:pw@h:1/x?k=v"), "https://***@h:1/x");
        assert_eq!(shown_domain("u:p@h"), "***@h");
    }
}
