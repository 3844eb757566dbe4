//! The proxy rules of the clients this crate builds. (How a configured URL is shown safely,
//! [`redact_url`], lives with the other redaction helpers in `outside_text::secrets`.)

use std::net::IpAddr;

use url::Url;

use crate::transport::redact_url;

/// Variables naming the proxy for an `https` base URL, in the order they are consulted
/// (the first one set and not blank wins). Plain-`http` base URLs are never proxied.
pub const PROXY_ENV_VARS: [&str; 4] = ["HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"];

/// Variables listing hosts that bypass the proxy, in the order they are consulted.
pub const NO_PROXY_ENV_VARS: [&str; 2] = ["NO_PROXY", "no_proxy"];

/// The first of `names` that `env` has set to a non-blank value, trimmed.
fn first_set(env: &dyn Fn(&str) -> Option<String>, names: &[&str]) -> Option<String> {
    names
        .iter()
        .filter_map(|n| env(n))
        .map(|v| v.trim().to_owned())
        .find(|v| !v.is_empty())
}

/// Whether `host` is excluded by a `NO_PROXY` list: `*` excludes everything; an IP address
/// or a CIDR block (`10.0.0.0/8`) matches addresses; any other entry is a domain that
/// matches itself and its subdomains (a leading `.` or `*.` is ignored). Case-insensitive.
fn no_proxy_matches(list: &str, host: &url::Host<&str>) -> bool {
    let ip = match host {
        url::Host::Ipv4(a) => Some(IpAddr::V4(*a)),
        url::Host::Ipv6(a) => Some(IpAddr::V6(*a)),
        url::Host::Domain(_) => None,
    };
    for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        if entry == "*" {
            return true;
        }
        let bare = entry.trim_start_matches('[').trim_end_matches(']');
        if let Some(ip) = ip {
            if let Ok(e) = bare.parse::<IpAddr>()
                && e == ip
            {
                return true;
            }
            if let Some((net, bits)) = bare.split_once('/')
                && let (Ok(net), Ok(bits)) = (net.parse::<IpAddr>(), bits.parse::<u32>())
                && in_block(ip, net, bits)
            {
                return true;
            }
            continue;
        }
        if let url::Host::Domain(d) = host {
            let d = d.trim_end_matches('.').to_ascii_lowercase();
            let e = entry
                .trim_start_matches("*.")
                .trim_start_matches('.')
                .trim_end_matches('.')
                .to_ascii_lowercase();
            if !e.is_empty() && (d == e || d.ends_with(&format!(".{e}"))) {
                return true;
            }
        }
    }
    false
}

/// Whether `ip` lies in `net/bits`.
fn in_block(ip: IpAddr, net: IpAddr, bits: u32) -> bool {
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) if bits <= 32 => {
            let mask = u32::MAX.checked_shl(32 - bits).unwrap_or(0);
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) if bits <= 128 => {
            let mask = u128::MAX.checked_shl(128 - bits).unwrap_or(0);
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

/// The proxy URL (credentials included) a client for `base_url` must use, read through
/// `env`; `None` for no proxy. See [`proxy_for`] for the rules.
pub(crate) fn resolve_proxy(
    base_url: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Option<String> {
    let url = Url::parse(base_url.trim()).ok()?;
    if url.scheme() != "https" {
        return None;
    }
    // A CGI program gets request headers as variables: `Proxy:` becomes HTTP_PROXY
    // ("httpoxy"), and a request could pick our proxy. reqwest ignores proxy variables
    // under CGI for the same reason; so do we.
    if env("REQUEST_METHOD").is_some() {
        return None;
    }
    let host = url.host()?;
    if let Some(list) = first_set(env, &NO_PROXY_ENV_VARS)
        && no_proxy_matches(&list, &host)
    {
        return None;
    }
    let proxy = first_set(env, &PROXY_ENV_VARS)?;
    Some(if proxy.contains("://") {
        proxy
    } else {
        format!("http://{proxy}")
    })
}

/// The proxy a [`crate::Client`] built for `base_url` uses, read from the process
/// environment, for display: `None` means a direct connection. Userinfo, query and fragment
/// of the proxy URL are hidden (see [`redact_url`]).
///
/// The rules, made explicit rather than left to the HTTP library's defaults:
/// - a plain-`http` base URL is **never** proxied, whatever `HTTP_PROXY` or `ALL_PROXY`
///   say: the `X-Api-Key` header would reach the proxy unencrypted;
/// - an `https` base URL uses the first of [`PROXY_ENV_VARS`] that is set (`HTTPS_PROXY`,
///   `https_proxy`, `ALL_PROXY`, `all_proxy`), tunnelled with `CONNECT`, so the proxy never
///   sees the key, unless the host is excluded by [`NO_PROXY_ENV_VARS`] (`*`, IP addresses,
///   CIDR blocks, domains with their subdomains);
/// - a proxy URL without a scheme means `http://`; nothing applies when `REQUEST_METHOD` is
///   set (a CGI environment, where `HTTP_PROXY` can come from a request header).
pub fn proxy_for(base_url: &str) -> Option<String> {
    proxy_for_env(base_url, &|k| std::env::var(k).ok())
}

/// [`proxy_for`] reading the variables through `env` instead of the process environment.
pub fn proxy_for_env(base_url: &str, env: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    resolve_proxy(base_url, env).map(|p| redact_url(&p))
}

/// A variable lookup over fixed `(name, value)` pairs, for tests of code that takes one.
#[cfg(test)]
pub(crate) fn env_of(
    pairs: &'static [(&'static str, &'static str)],
) -> impl Fn(&str) -> Option<String> {
    move |k| {
        pairs
            .iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| (*v).to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_http_is_never_proxied() {
        let env = env_of(&[
            ("HTTP_PROXY", "http://p.test:3128"),
            ("http_proxy", "http://p.test:3128"),
            ("ALL_PROXY", "http://p.test:3128"),
            ("HTTPS_PROXY", "http://p.test:3128"),
        ]);
        assert_eq!(proxy_for_env("http://127.0.0.1:9", &env), None);
        assert_eq!(proxy_for_env("http://remote.test", &env), None);
    }

    #[test]
    fn https_uses_https_proxy_then_all_proxy_in_either_case() {
        let b = "https://api.test";
        let p = |pairs| proxy_for_env(b, &env_of(pairs));
        assert_eq!(
            p(&[("HTTPS_PROXY", "http://a.test:1")]).as_deref(),
            Some("http://a.test:1")
        );
        assert_eq!(
            p(&[("https_proxy", "b.test:2")]).as_deref(),
            Some("http://b.test:2")
        );
        assert_eq!(
            p(&[("ALL_PROXY", "http://c.test:3")]).as_deref(),
            Some("http://c.test:3")
        );
        assert_eq!(
            p(&[("all_proxy", "http://d.test:4")]).as_deref(),
            Some("http://d.test:4")
        );
        assert_eq!(
            p(&[("HTTPS_PROXY", " "), ("ALL_PROXY", "http://c.test:3")]).as_deref(),
            Some("http://c.test:3"),
            "a blank variable counts as unset"
        );
        assert_eq!(
            p(&[
                ("HTTPS_PROXY", "http://a.test:1"),
                ("ALL_PROXY", "http://c.test:3")
            ])
            .as_deref(),
            Some("http://a.test:1")
        );
        assert_eq!(
            p(&[("HTTP_PROXY", "http://a.test:1")]),
            None,
            "HTTP_PROXY is for http"
        );
        assert_eq!(
            p(&[("HTTPS_PROXY", "http://user:pw-secret@a.test:1/?k=v")]).as_deref(),
            Some("http://***@a.test:1/"),
            "credentials of the proxy are never shown"
        );
        assert_eq!(
            p(&[
                ("HTTPS_PROXY", "http://a.test:1"),
                ("REQUEST_METHOD", "GET")
            ]),
            None,
            "CGI environments ignore proxy variables"
        );
    }

    #[test]
    fn no_proxy_excludes_domains_addresses_and_blocks() {
        let with = |base: &str, no: &'static str| {
            let pairs: &'static [(&'static str, &'static str)] = Box::leak(Box::new([
                ("HTTPS_PROXY", "http://p.test:1"),
                ("NO_PROXY", no),
            ]));
            proxy_for_env(base, &env_of(pairs))
        };
        assert_eq!(with("https://api.test", "*"), None);
        assert_eq!(with("https://api.test", "other.test, api.test"), None);
        assert_eq!(with("https://x.api.test", ".api.test"), None);
        assert_eq!(with("https://x.api.test", "api.test"), None);
        assert!(with("https://notapi.test", "api.test").is_some());
        assert_eq!(with("https://10.1.2.3", "10.0.0.0/8"), None);
        assert!(with("https://11.1.2.3", "10.0.0.0/8").is_some());
        assert_eq!(with("https://[::1]:8443", "::1"), None);
        assert_eq!(with("https://API.TEST", "api.test"), None);
        let lower = proxy_for_env(
            "https://api.test",
            &env_of(&[("https_proxy", "http://p.test:1"), ("no_proxy", "api.test")]),
        );
        assert_eq!(lower, None);
    }
}
