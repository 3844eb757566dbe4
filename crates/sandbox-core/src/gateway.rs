//! Domain allowlists through the egress gateway: the settings, the egress a domains run gets,
//! and the proxy environment its program sees.
//!
//! CreateOS enforces address egress rules and not host names, so a run that asks for domains
//! gets exactly one egress rule, the gateway's `IP:port` (plus the permanent holes, stated
//! by [`EgressPolicy::restricted`]), and a short-lived token, signed with the secret the
//! plugin and the gateway share, that names the guest, the domains and an expiry. The token
//! travels as proxy credentials in the program's environment ([`Grant::env_for`]), passed with
//! each exec rather than baked into the guest: a kept guest gets a fresh token per run. A
//! program that ignores the proxy settings reaches nothing.
//!
//! Every surface composes the same pieces: [`Domains`] (the validated list, with a
//! fingerprint for reused guests' identities), [`GatewaySetting`] (read with the other
//! `CREATEOS_*` settings) and [`Grant`] (what one run receives).

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use egress_credential::allowlist::Pattern;
/// The shared secret (re-exported from the gateway crate; its `Debug` never shows it).
pub use egress_credential::token::Secret;
use egress_credential::token::{MAX_ENTRIES, MAX_TTL, MIN_SECRET_BYTES, TokenError};

use crate::egress::{EgressException, EgressPolicy, validate_address_rule};
use crate::error::SandboxError;
use crate::vars::{SettingNames, non_blank};

/// `CREATEOS_GATEWAY_URL`: the gateway as guests reach it, `http://IP:PORT`.
pub const ENV_GATEWAY_URL: &str = "CREATEOS_GATEWAY_URL";
/// `CREATEOS_GATEWAY_SECRET`: the secret shared with the gateway (at least 32 bytes).
pub const ENV_GATEWAY_SECRET: &str = egress_credential::token::SECRET_ENV;
/// `CREATEOS_GATEWAY_TOKEN_TTL_SECONDS`: the lifetime of a run's token (default: the run's
/// budget plus [`TOKEN_SLACK`]).
pub const ENV_GATEWAY_TOKEN_TTL: &str = "CREATEOS_GATEWAY_TOKEN_TTL_SECONDS";
/// How the operator starts the gateway (named in refusals).
pub const GATEWAY_COMMAND: &str = "python -m langflow_sandbox_createos gateway --listen ADDR:PORT";
/// What a token outlives its run's budget by, by default (the create, the upload and the
/// host's grace come before and after the program's own clock).
pub const TOKEN_SLACK: Duration = Duration::from_secs(120);
/// The user name of the proxy credentials (the gateway reads the token as the password).
pub const PROXY_USER: &str = "run";
/// The variables a domains run's program gets: the proxy in both spellings (curl reads only
/// the lowercase `http_proxy`), pip's own, and an empty no-proxy list so nothing bypasses it.
pub const PROXY_ENV_NAMES: [&str; 9] = [
    "HTTPS_PROXY",
    "HTTP_PROXY",
    "ALL_PROXY",
    "https_proxy",
    "http_proxy",
    "all_proxy",
    "PIP_PROXY",
    "NO_PROXY",
    "no_proxy",
];

/// The variable a domains guest is created with, holding its list (informational, and part
/// of what identifies the guest).
pub const ENV_DOMAINS_IN_GUEST: &str = "CREATEOS_ALLOWED_DOMAINS";

/// A validated domain list: each entry a name or `*.suffix` (optionally `:port`), checked
/// with the gateway's own parser and kept in its normal form, sorted, without duplicates.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Domains(Vec<String>);

impl Domains {
    /// Parses `entries` (blank ones are skipped); the refusal names `setting` and the entry.
    pub fn parse<S: AsRef<str>>(setting: &str, entries: &[S]) -> Result<Self, SandboxError> {
        let mut out = Vec::new();
        for raw in entries {
            let entry = raw.as_ref().trim();
            if entry.is_empty() {
                continue;
            }
            let pattern = Pattern::parse(entry).map_err(|e| {
                SandboxError::refused(format!(
                    "{setting} holds {entry:?}, which is not a domain ({e}); list host names \
                     such as pypi.org or *.pythonhosted.org, separated by commas"
                ))
            })?;
            out.push(pattern.to_string());
        }
        out.sort();
        out.dedup();
        if out.len() > MAX_ENTRIES {
            return Err(SandboxError::refused(format!(
                "{setting} lists {} domains; at most {MAX_ENTRIES} are accepted (use \
                 *.suffix entries to cover a family of names)",
                out.len()
            )));
        }
        Ok(Self(out))
    }

    /// Parses a comma-separated list (the form of every domains setting).
    pub fn parse_list(setting: &str, raw: &str) -> Result<Self, SandboxError> {
        Self::parse(setting, &raw.split(',').collect::<Vec<_>>())
    }

    /// No domain asked for.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The entries in normal form.
    pub fn entries(&self) -> &[String] {
        &self.0
    }

    /// A stable identity for reused guests and pool keys (`""` when empty, so a surface's
    /// existing identities stay as they were).
    pub fn fingerprint(&self) -> String {
        if self.0.is_empty() {
            String::new()
        } else {
            format!("domains:{}", self.0.join(","))
        }
    }
}

impl fmt::Display for Domains {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.join(","))
    }
}

/// A configured gateway: its address as guests reach it, the shared secret and the token
/// lifetime. `Debug` never shows the secret.
#[derive(Clone)]
pub struct Gateway {
    addr: SocketAddr,
    secret: Secret,
    ttl: Option<Duration>,
}

impl fmt::Debug for Gateway {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gateway")
            .field("addr", &self.addr)
            .field("secret", &crate::error::REDACTED)
            .field("ttl", &self.ttl)
            .finish()
    }
}

/// What the gateway settings say: not configured, usable, or configured wrongly (the refusal
/// a domains run gets; a run without domains is not affected).
#[derive(Debug, Clone)]
pub enum GatewaySetting {
    /// `CREATEOS_GATEWAY_URL` is not set.
    Off,
    /// URL, secret and lifetime are valid.
    Ready(Gateway),
    /// Something is set but unusable: the refusal, naming the setting and the fix.
    Invalid(SandboxError),
}

impl GatewaySetting {
    /// Reads the gateway settings through `lookup`.
    pub fn from_lookup(lookup: &dyn Fn(&str) -> Option<String>) -> Self {
        match Gateway::from_lookup(lookup) {
            Ok(None) => Self::Off,
            Ok(Some(g)) => Self::Ready(g),
            Err(e) => Self::Invalid(e),
        }
    }

    /// Whether a domain allowlist can be honoured (what `supports_domain_allowlist` says).
    pub fn is_ready(&self) -> bool {
        matches!(self, Self::Ready(_))
    }

    /// The gateway, or the refusal for a run whose `setting` asked for domains.
    pub fn require(&self, setting: &str) -> Result<&Gateway, SandboxError> {
        match self {
            Self::Ready(g) => Ok(g),
            Self::Invalid(e) => Err(e.clone()),
            Self::Off => Err(SandboxError::refused(format!(
                "{setting} asks for a domain allowlist, but no egress gateway is configured: \
                 CreateOS does not enforce host-name egress rules, so domains are enforced by \
                 the gateway. Start it ({GATEWAY_COMMAND}, with {ENV_GATEWAY_SECRET} set), \
                 then set {ENV_GATEWAY_URL}=http://IP:PORT (the address guests reach it on) \
                 and the same {ENV_GATEWAY_SECRET} here; or unset {setting}"
            ))),
        }
    }
}

fn bad_url(shown: &str, why: &str) -> SandboxError {
    SandboxError::refused(format!(
        "{ENV_GATEWAY_URL}={shown:?} is not usable ({why}); set it to http://IP:PORT, the IP \
         address and port guests reach the gateway on (e.g. http://10.0.0.5:3128): a guest's \
         egress rule must be an address, so a host name cannot be used"
    ))
}

/// Parses `CREATEOS_GATEWAY_URL`: `http://IP:PORT` with an IP literal that a guest can reach
/// (not unspecified, not loopback) and an explicit port; nothing else.
pub fn parse_gateway_url(raw: &str) -> Result<SocketAddr, SandboxError> {
    let shown = crate::error::redact_url(raw);
    let u = url::Url::parse(raw.trim()).map_err(|e| bad_url(&shown, &e.to_string()))?;
    if u.scheme() != "http" {
        return Err(bad_url(
            &shown,
            "the scheme must be http (the guest speaks plain HTTP to the proxy, and TLS \
             inside CONNECT)",
        ));
    }
    if !u.username().is_empty() || u.password().is_some() {
        return Err(SandboxError::refused(format!(
            "{ENV_GATEWAY_URL} must not carry credentials (user:password@); each run gets its \
             own token, signed with {ENV_GATEWAY_SECRET}"
        )));
    }
    if u.query().is_some() || u.fragment().is_some() || !matches!(u.path(), "" | "/") {
        return Err(bad_url(
            &shown,
            "it must not have a path, query or fragment",
        ));
    }
    let ip: IpAddr = match u.host() {
        Some(url::Host::Ipv4(a)) => a.into(),
        Some(url::Host::Ipv6(a)) => a.into(),
        _ => return Err(bad_url(&shown, "the host is not an IP address")),
    };
    if ip.is_unspecified() || ip.is_loopback() {
        return Err(bad_url(
            &shown,
            "an unspecified or loopback address is not where a guest reaches the gateway",
        ));
    }
    // `url` drops a scheme's default port, so an explicit `:80` reads back as none.
    let port = u.port().unwrap_or(80);
    if !raw
        .trim()
        .trim_end_matches('/')
        .rsplit_once(':')
        .is_some_and(|(_, p)| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(bad_url(&shown, "the port is missing"));
    }
    Ok(SocketAddr::new(ip, port))
}

impl Gateway {
    /// Reads `CREATEOS_GATEWAY_URL`, `CREATEOS_GATEWAY_SECRET` and
    /// `CREATEOS_GATEWAY_TOKEN_TTL_SECONDS`: `None` when the URL is unset.
    pub fn from_lookup(
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<Self>, SandboxError> {
        let Some(raw) = non_blank(lookup, ENV_GATEWAY_URL) else {
            return Ok(None);
        };
        let addr = parse_gateway_url(&raw)?;
        let secret = match lookup(ENV_GATEWAY_SECRET).filter(|s| !s.is_empty()) {
            None => Err(TokenError::SecretMissing),
            Some(s) => Secret::new(s.into_bytes()),
        }
        .map_err(|e| {
            SandboxError::refused(format!(
                "{ENV_GATEWAY_URL} is set, but {e}. Set {ENV_GATEWAY_SECRET} to the secret \
                 the gateway was started with"
            ))
        })?;
        let ttl = match non_blank(lookup, ENV_GATEWAY_TOKEN_TTL) {
            None => None,
            Some(raw) => match raw.parse::<u64>() {
                Ok(n) if (1..=MAX_TTL.as_secs()).contains(&n) => Some(Duration::from_secs(n)),
                _ => {
                    return Err(SandboxError::refused(format!(
                        "{ENV_GATEWAY_TOKEN_TTL}={raw:?} is not a whole number of seconds \
                         from 1 to {}; unset it to give each token its run's budget plus {} s",
                        MAX_TTL.as_secs(),
                        TOKEN_SLACK.as_secs()
                    )));
                }
            },
        };
        Ok(Some(Self { addr, secret, ttl }))
    }

    /// A gateway at `addr` with `secret` (tests and embedders).
    pub fn new(addr: SocketAddr, secret: Secret, ttl: Option<Duration>) -> Self {
        Self { addr, secret, ttl }
    }

    /// Its address as guests reach it.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://IP:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The one egress rule a domains run gets: the gateway's `IP:port`.
    pub fn egress_rule(&self) -> String {
        self.addr.to_string()
    }

    /// The egress of a domains run on CreateOS: [`Gateway::egress_with`] under CreateOS's
    /// link-local opt-in.
    pub fn egress(
        &self,
        extra: &[String],
        accept_exceptions: bool,
        names: &SettingNames,
    ) -> Result<EgressPolicy, SandboxError> {
        let exceptions = crate::provider::createos::egress::EXCEPTIONS;
        self.egress_with(extra, exceptions, accept_exceptions, names)
    }

    /// The egress of a domains run: the gateway's `IP:port` and the surface's `extra` address
    /// rules, under the opt-in to the provider's `exceptions` like every restricted policy.
    pub fn egress_with(
        &self,
        extra: &[String],
        exceptions: &[EgressException],
        accept_exceptions: bool,
        names: &SettingNames,
    ) -> Result<EgressPolicy, SandboxError> {
        let mut rules = vec![self.egress_rule()];
        rules.extend(extra.iter().cloned());
        // The address is an IP literal with a port, so this never refuses the rule itself.
        debug_assert!(validate_address_rule(&rules[0]).is_ok());
        EgressPolicy::restricted_with(&rules, exceptions, accept_exceptions, names)
    }

    /// How long a token for a run of `budget` lives.
    pub fn token_ttl(&self, budget: Duration) -> Duration {
        self.ttl
            .unwrap_or(budget + TOKEN_SLACK)
            .clamp(Duration::from_secs(1), MAX_TTL)
    }

    /// Reads back what a program was given ([`Grant::env_for`]'s variables, as `get` finds
    /// them): every proxy variable must hold the same `http://run:TOKEN@IP:PORT` of this
    /// gateway, the no-proxy ones must be empty, and the token must verify with this secret
    /// at `now`. For tests and for an operator checking a guest's environment; the error says
    /// what is wrong, never the token.
    pub fn check_proxy_env(
        &self,
        get: &dyn Fn(&str) -> Option<String>,
        now: std::time::SystemTime,
    ) -> Result<Granted, String> {
        let proxy = get("https_proxy").ok_or("https_proxy is not set")?;
        for k in PROXY_ENV_NAMES {
            let want = if k.eq_ignore_ascii_case("NO_PROXY") {
                ""
            } else {
                proxy.as_str()
            };
            if get(k).as_deref() != Some(want) {
                return Err(format!(
                    "{k} does not hold what https_proxy holds (or is not empty)"
                ));
            }
        }
        let token = proxy
            .strip_prefix(&format!("http://{PROXY_USER}:"))
            .and_then(|rest| rest.strip_suffix(&format!("@{}", self.addr)))
            .ok_or_else(|| format!("the proxy is not http://{PROXY_USER}:TOKEN@{}", self.addr))?;
        let cred =
            egress_credential::verify(&self.secret, token, now).map_err(|e| e.to_string())?;
        Ok(Granted {
            domains: cred
                .allowlist
                .patterns()
                .iter()
                .map(ToString::to_string)
                .collect(),
            guest: cred.guest,
            expires_at: cred.expires_at,
        })
    }

    /// The grant of a run: these domains, for a run of `budget`.
    pub fn grant(&self, domains: &Domains, budget: Duration) -> Grant {
        Grant {
            gateway: self.clone(),
            domains: domains.clone(),
            ttl: self.token_ttl(budget),
        }
    }
}

/// What a checked proxy token grants ([`Gateway::check_proxy_env`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Granted {
    /// The guest it was minted for.
    pub guest: String,
    /// Its domains, in normal form.
    pub domains: Vec<String>,
    /// When it stops being accepted.
    pub expires_at: std::time::SystemTime,
}

/// What one domains run receives: a token per guest, minted when the guest is known.
/// `Debug` shows the domains and the gateway's address, never the secret.
#[derive(Debug, Clone)]
pub struct Grant {
    gateway: Gateway,
    domains: Domains,
    ttl: Duration,
}

impl Grant {
    /// The domains granted.
    pub fn domains(&self) -> &Domains {
        &self.domains
    }

    /// The gateway.
    pub fn gateway(&self) -> &Gateway {
        &self.gateway
    }

    /// The environment a guest for this grant declares at create: [`declared_env`] (the
    /// proxy variables, empty) and [`ENV_DOMAINS_IN_GUEST`] with the list, so guests (and warm
    /// pool keys) of different lists differ. No secret: the token travels with each run.
    pub fn declared_env(&self) -> BTreeMap<String, String> {
        let mut env = declared_env();
        env.insert(ENV_DOMAINS_IN_GUEST.to_owned(), self.domains.to_string());
        env
    }

    /// The program's environment for a run in `guest`: every [`PROXY_ENV_NAMES`] variable,
    /// the proxy ones set to `http://run:TOKEN@IP:PORT` with a fresh token for `guest` and
    /// these domains, the no-proxy ones empty.
    pub fn env_for(&self, guest: &str) -> Result<BTreeMap<String, String>, SandboxError> {
        let token = egress_credential::mint(
            &self.gateway.secret,
            guest,
            self.domains.entries(),
            self.ttl,
        )
        .map_err(|e| {
            SandboxError::refused(format!(
                "could not mint the gateway token for guest {guest:?}: {e}"
            ))
        })?;
        let proxy = format!("http://{PROXY_USER}:{token}@{}", self.gateway.addr);
        Ok(PROXY_ENV_NAMES
            .iter()
            .map(|k| {
                let v = if k.eq_ignore_ascii_case("NO_PROXY") {
                    String::new()
                } else {
                    proxy.clone()
                };
                ((*k).to_owned(), v)
            })
            .collect())
    }
}

/// The environment a guest that may run domains programs declares at create: every
/// [`PROXY_ENV_NAMES`] key, empty (each exec sets the values, since an exec may only set
/// declared keys). Empty values leave a program without a proxy, so it reaches nothing.
pub fn declared_env() -> BTreeMap<String, String> {
    PROXY_ENV_NAMES
        .iter()
        .map(|k| ((*k).to_owned(), String::new()))
        .collect()
}

/// A line for `doctor`: is the gateway configured, and how.
pub fn describe(setting: &GatewaySetting) -> String {
    match setting {
        GatewaySetting::Off => format!(
            "egress gateway: not configured ({ENV_GATEWAY_URL} unset), so domain allowlists \
             are refused"
        ),
        GatewaySetting::Ready(g) => format!(
            "egress gateway: {} (a domains run's only egress rule is {}); {ENV_GATEWAY_SECRET} \
             is set (>= {MIN_SECRET_BYTES} bytes); tokens live {}",
            g.url(),
            g.egress_rule(),
            g.ttl.map_or_else(
                || format!("the run's budget + {} s", TOKEN_SLACK.as_secs()),
                |t| format!("{} s", t.as_secs())
            )
        ),
        GatewaySetting::Invalid(e) => format!("egress gateway: {}", e.message()),
    }
}

/// Opens (and closes) a TCP connection to the gateway from this host, within `timeout`: the
/// host's view, which says nothing about whether a guest's network reaches it.
pub async fn probe(addr: SocketAddr, timeout: Duration) -> Result<Duration, String> {
    let started = std::time::Instant::now();
    match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr)).await {
        Ok(Ok(_)) => Ok(started.elapsed()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {} s", timeout.as_secs())),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::time::SystemTime;

    use super::*;

    const SECRET: &str = "0123456789abcdef0123456789abcdef-test-secret";

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |k| m.get(k).cloned()
    }

    const NAMES: SettingNames = SettingNames {
        restrict_egress: "X_NET=false",
        allow_egress: "X_NET=true",
        accept_egress_exceptions: "X_ACCEPT",
        memory: "X_MEM",
    };

    #[test]
    fn domains_are_validated_normalised_and_fingerprinted() {
        let d =
            Domains::parse_list("X_DOMAINS", " PyPI.org, *.pythonhosted.org,,pypi.org. ").unwrap();
        assert_eq!(d.entries(), ["*.pythonhosted.org", "pypi.org"]);
        assert_eq!(d.fingerprint(), "domains:*.pythonhosted.org,pypi.org");
        let reordered = Domains::parse_list("X_DOMAINS", "pypi.org,*.pythonhosted.org").unwrap();
        assert_eq!(d.fingerprint(), reordered.fingerprint());
        assert_eq!(Domains::parse_list("X", " , ").unwrap().fingerprint(), "");
        for bad in [
            "*",
            "10.0.0.1",
            "*.com",
            "exa mple.com",
            "a.b:0",
            "http://pypi.org",
        ] {
            let e = Domains::parse_list("X_DOMAINS", &format!("pypi.org,{bad}")).unwrap_err();
            assert!(e.kind().is_unavailable());
            let text = e.to_string();
            assert!(text.contains("X_DOMAINS"), "{text}");
            assert!(text.contains(&format!("{bad:?}")), "{text}");
        }
    }

    #[test]
    fn gateway_url_must_be_an_ip_and_port_guests_reach() {
        let ok = |raw: &str| parse_gateway_url(raw).unwrap().to_string();
        assert_eq!(ok("http://10.0.0.5:3128"), "10.0.0.5:3128");
        assert_eq!(ok("http://10.0.0.5:3128/"), "10.0.0.5:3128");
        assert_eq!(ok("http://10.0.0.5:80"), "10.0.0.5:80");
        assert_eq!(ok("http://[2001:db8::5]:3128"), "[2001:db8::5]:3128");
        for bad in [
            "http://gateway.internal:3128",
            "https://10.0.0.5:3128",
            "http://10.0.0.5",
            "http://10.0.0.5:3128/path",
            "http://0.0.0.0:3128",
            "http://127.0.0.1:3128",
            "10.0.0.5:3128",
            "http://10.0.0.5:3128?x=1",
        ] {
            let e = parse_gateway_url(bad).unwrap_err();
            assert!(e.to_string().contains(ENV_GATEWAY_URL), "{bad}: {e}");
        }
        let e = parse_gateway_url("http://gateway.internal:3128").unwrap_err();
        assert!(e.to_string().contains("host name"), "{e}");
        let e = parse_gateway_url("http://u:pw-secret@10.0.0.5:3128").unwrap_err();
        assert!(!e.to_string().contains("pw-secret"), "{e}");
    }

    #[test]
    fn settings_read_off_ready_or_invalid_and_never_show_the_secret() {
        assert!(matches!(
            GatewaySetting::from_lookup(&env(&[(ENV_GATEWAY_SECRET, SECRET)])),
            GatewaySetting::Off
        ));
        let s = GatewaySetting::from_lookup(&env(&[
            (ENV_GATEWAY_URL, "http://10.0.0.5:3128"),
            (ENV_GATEWAY_SECRET, SECRET),
        ]));
        assert!(s.is_ready());
        let shown = format!("{s:?} {}", describe(&s));
        assert!(!shown.contains(SECRET), "{shown}");
        assert!(shown.contains("10.0.0.5:3128"), "{shown}");
        for (pairs, names) in [
            (
                vec![(ENV_GATEWAY_URL, "http://10.0.0.5:3128")],
                ENV_GATEWAY_SECRET,
            ),
            (
                vec![
                    (ENV_GATEWAY_URL, "http://10.0.0.5:3128"),
                    (ENV_GATEWAY_SECRET, "short-secret"),
                ],
                ENV_GATEWAY_SECRET,
            ),
            (
                vec![
                    (ENV_GATEWAY_URL, "http://gw.local:1"),
                    (ENV_GATEWAY_SECRET, SECRET),
                ],
                ENV_GATEWAY_URL,
            ),
            (
                vec![
                    (ENV_GATEWAY_URL, "http://10.0.0.5:3128"),
                    (ENV_GATEWAY_SECRET, SECRET),
                    (ENV_GATEWAY_TOKEN_TTL, "0"),
                ],
                ENV_GATEWAY_TOKEN_TTL,
            ),
        ] {
            let s = GatewaySetting::from_lookup(&env(&pairs));
            assert!(!s.is_ready());
            let e = s.require("X_DOMAINS").unwrap_err();
            assert!(e.to_string().contains(names), "{e}");
            assert!(!e.to_string().contains(SECRET), "{e}");
            assert!(!format!("{s:?}").contains(SECRET));
        }
        let e = GatewaySetting::Off.require("X_DOMAINS").unwrap_err();
        let text = e.to_string();
        assert!(e.kind().is_unavailable());
        for needle in [ENV_GATEWAY_URL, "X_DOMAINS", "gateway --listen"] {
            assert!(text.contains(needle), "{needle}: {text}");
        }
    }

    #[test]
    fn a_grant_gives_proxy_variables_with_a_token_for_the_guest_and_list() {
        let secret = Secret::new(SECRET.as_bytes().to_vec()).unwrap();
        let gw = Gateway::new("10.0.0.5:3128".parse().unwrap(), secret.clone(), None);
        let egress = gw.egress(&[], true, &NAMES).unwrap();
        assert_eq!(egress.rules(), ["10.0.0.5:3128"]);
        assert!(gw.egress(&[], false, &NAMES).is_err());
        let domains = Domains::parse_list("X", "pypi.org,*.pythonhosted.org").unwrap();
        let grant = gw.grant(&domains, Duration::from_secs(30));
        let env = grant.env_for("lf-abc").unwrap();
        assert_eq!(
            env.keys().map(String::as_str).collect::<Vec<_>>().len(),
            PROXY_ENV_NAMES.len()
        );
        let cred = gw
            .check_proxy_env(&|k| env.get(k).cloned(), SystemTime::now())
            .unwrap();
        assert_eq!(cred.guest, "lf-abc");
        assert_eq!(cred.domains, domains.entries());
        let left = cred.expires_at.duration_since(SystemTime::now()).unwrap();
        assert!(
            left <= Duration::from_secs(150) && left >= Duration::from_secs(100),
            "{left:?}"
        );
        // Another secret does not accept it, nor another gateway address, nor a changed
        // variable.
        let other = Gateway::new(gw.addr(), Secret::new(vec![7; 32]).unwrap(), None);
        let read = |m: &BTreeMap<String, String>, g: &Gateway| {
            g.check_proxy_env(&|k| m.get(k).cloned(), SystemTime::now())
        };
        assert!(read(&env, &other).is_err());
        let moved = Gateway::new("10.0.0.6:3128".parse().unwrap(), secret.clone(), None);
        assert!(read(&env, &moved).is_err());
        let mut bypass = env.clone();
        bypass.insert("NO_PROXY".into(), "*".into());
        assert!(read(&bypass, &gw).is_err());
        assert!(!format!("{grant:?}").contains(SECRET));
        assert_eq!(
            declared_env().keys().collect::<Vec<_>>(),
            env.keys().collect::<Vec<_>>()
        );
        let declared = grant.declared_env();
        assert_eq!(
            declared[ENV_DOMAINS_IN_GUEST],
            "*.pythonhosted.org,pypi.org"
        );
        assert!(env.keys().all(|k| declared[k].is_empty()));
    }

    #[test]
    fn the_token_lifetime_setting_wins_over_the_budget() {
        let secret = Secret::new(SECRET.as_bytes().to_vec()).unwrap();
        let gw = Gateway::new(
            "10.0.0.5:3128".parse().unwrap(),
            secret,
            Some(Duration::from_secs(5)),
        );
        assert_eq!(
            gw.token_ttl(Duration::from_secs(600)),
            Duration::from_secs(5)
        );
        let gw = Gateway::new(gw.addr(), gw.secret.clone(), None);
        assert_eq!(
            gw.token_ttl(Duration::from_secs(600)),
            Duration::from_secs(600) + TOKEN_SLACK
        );
        assert_eq!(gw.token_ttl(MAX_TTL * 2), MAX_TTL);
    }
}
