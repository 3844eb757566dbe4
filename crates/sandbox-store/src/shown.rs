//! How a store setting's value is shown: the one description of it every message, log line,
//! `Debug` and `doctor` line uses, and the secrets it may hold.
//!
//! A store URL usually carries a password, and the places it can sit are many: the userinfo
//! (`redis://:pw@host`), a `password=` query parameter (`postgres://host/db?password=pw`), a
//! libpq keyword string (`host=db password=pw`), or text that only looks like a URL (a password
//! holding a raw `#` or `?` ends the authority early, so whatever cuts at those characters shows
//! the rest of the password). So the value is never echoed: a clean URL is rebuilt from its
//! parsed parts (userinfo as `***@`, query values outside a short list of known harmless
//! parameters as `***`), and anything else is named, never shown.

use std::fmt::Write as _;

use secrecy::SecretString;

use sandbox_core::error::Redactor;

/// Query parameters whose values are shown (TLS, timeouts, names): nothing secret. Any other
/// parameter's value is shown as `***`.
const SHOWN_PARAMS: &[&str] = &[
    "sslmode",
    "sslrootcert",
    "sslnegotiation",
    "sslcertmode",
    "ssl_cert_reqs",
    "ssl_ca_certs",
    "ssl_check_hostname",
    "application_name",
    "connect_timeout",
    "target_session_attrs",
    "load_balance_hosts",
    "channel_binding",
    "hostaddr",
    "port",
    "dbname",
    "protocol",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_retries",
    "tcp_user_timeout",
];

/// What a store value is, as far as showing it goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Shape {
    /// A URL rebuilt from its parts, without its secrets.
    Clean(String),
    /// libpq's `key=value ...` form.
    Keywords,
    /// A `scheme://` text in which an `@` comes after a `?` or `#`: a password holding a raw
    /// `#` or `?` (cut there, what follows would be shown as a host, a port or a query).
    AtAfterQuery {
        /// The scheme, lower case.
        scheme: String,
    },
    /// A `scheme://` text that does not parse as a URL (nor, for PostgreSQL, as
    /// tokio-postgres's URL with a host list).
    BadUrl {
        /// The scheme, lower case.
        scheme: String,
    },
    /// No scheme, or not a URL at all.
    Unparseable,
}

impl Shape {
    /// How it reads in a message: the rebuilt URL, or a name between `<` and `>`.
    pub(crate) fn text(&self) -> String {
        match self {
            Shape::Clean(shown) => shown.clone(),
            Shape::Keywords => {
                "<a libpq keyword string, not shown: it may hold a password>".to_owned()
            }
            Shape::AtAfterQuery { scheme } => {
                format!("<a {scheme}:// URL that cannot be shown safely>")
            }
            Shape::BadUrl { scheme } => format!("<a {scheme}:// URL that does not parse>"),
            Shape::Unparseable => "<an unparseable value>".to_owned(),
        }
    }

    /// Why a value of this shape is refused (`None`: a clean URL, refused or not on other
    /// grounds), with the fix.
    pub(crate) fn refusal(&self) -> Option<String> {
        match self {
            Shape::Clean(_) => None,
            Shape::Keywords => Some(
                "a libpq keyword string (host=... user=...) is not accepted here; write it as \
                 one postgres://user:password@host:5432/dbname URL, percent-encoding what the \
                 password holds"
                    .to_owned(),
            ),
            Shape::AtAfterQuery { .. } => Some(
                "an '@' comes after its '?' or '#', so a password holds a raw '#' or '?' and \
                 the URL would name the wrong host; percent-encode them in the password (%23 \
                 for '#', %3F for '?', %2F for '/', %40 for '@')"
                    .to_owned(),
            ),
            Shape::BadUrl { .. } => Some(
                "it does not parse as a URL; write it as scheme://user:password@host:port/name, \
                 percent-encoding what the password holds (%23 for '#', %3F for '?', %2F for \
                 '/', %40 for '@')"
                    .to_owned(),
            ),
            Shape::Unparseable => Some(
                "it is not a URL (no scheme://); write it as a redis://host:6379/0, rediss:// or \
                 postgres://user@host/db URL"
                    .to_owned(),
            ),
        }
    }
}

/// How a store setting's value is shown in every message, log line, `Debug` and `doctor`
/// line (the one function that describes it):
///
/// - a clean URL is rebuilt from its parsed parts: `scheme://`, `***@` for any user or password,
///   the host(s), port(s) and path, and its query with the values of parameters other than
///   known harmless ones (`sslmode`, `sslrootcert`, `ssl_ca_certs`, timeouts, ...) as `***`
///   (so `password=` never shows); a fragment other than `#insecure` is left out;
/// - anything else is named, never echoed: `<a libpq keyword string, not shown: ...>`,
///   `<a postgres:// URL that cannot be shown safely>` (an `@` after a `?` or `#`: a password
///   holding a raw `#` or `?`), `<a redis:// URL that does not parse>`, `<an unparseable
///   value>`.
///
/// ```
/// use sandbox_store::describe_store_value;
/// assert_eq!(
///     describe_store_value("postgres://lf:pw@db:5432/lf?sslmode=require&password=pw2"),
///     "postgres://***@db:5432/lf?sslmode=require&password=***"
/// );
/// assert_eq!(
///     describe_store_value("host=db user=lf password=pw dbname=lf"),
///     "<a libpq keyword string, not shown: it may hold a password>"
/// );
/// assert_eq!(
///     describe_store_value("redis://:p#w@cache:6379/0"),
///     "<a redis:// URL that cannot be shown safely>"
/// );
/// ```
pub fn describe_store_value(raw: &str) -> String {
    shape(raw).text()
}

/// The [`Shape`] of a store value.
pub(crate) fn shape(raw: &str) -> Shape {
    let raw = raw.trim();
    let Some(at) = raw.find("://") else {
        return if looks_like_keywords(raw) {
            Shape::Keywords
        } else {
            Shape::Unparseable
        };
    };
    let scheme = &raw[..at];
    if scheme.is_empty()
        || !scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        || !scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
    {
        return Shape::Unparseable;
    }
    let scheme = scheme.to_ascii_lowercase();
    let rest = &raw[at + 3..];
    if let Some(cut) = rest.find(['?', '#'])
        && rest[cut..].contains('@')
    {
        return Shape::AtAfterQuery { scheme };
    }
    if let Ok(url) = url::Url::parse(raw) {
        return Shape::Clean(rebuild(&url));
    }
    // tokio-postgres also reads a host list (`postgres://u@h1:5432,h2:5432/db`), which `url`
    // does not: rebuilt from what it parsed.
    if matches!(scheme.split('+').next(), Some("postgres" | "postgresql"))
        && let Ok(config) = plain_postgres(raw, &scheme).parse::<tokio_postgres::Config>()
    {
        return Shape::Clean(rebuild_postgres(&scheme, &config, rest));
    }
    Shape::BadUrl { scheme }
}

/// The secrets a store value may hold, for the [`Redactor`] of every store error: the URL's
/// password (as written and percent-decoded), and the value of every query parameter not
/// known to be harmless (`password=` among them).
pub(crate) fn secrets(raw: &str) -> Redactor {
    let raw = raw.trim();
    let mut r = Redactor::default();
    let mut add = |s: &str| r = r.with(&SecretString::from(s.to_owned()));
    if let Ok(url) = url::Url::parse(raw) {
        if let Some(pw) = url.password() {
            add(pw);
            if let Ok(decoded) = percent_decode(pw) {
                add(&decoded);
            }
        }
        for (k, v) in url.query_pairs() {
            if !SHOWN_PARAMS.contains(&k.as_ref()) {
                add(&v);
            }
        }
    } else if let Some(at) = raw.find("://") {
        let scheme = raw[..at].to_ascii_lowercase();
        if let Ok(config) = plain_postgres(raw, &scheme).parse::<tokio_postgres::Config>()
            && let Some(pw) = config.get_password()
        {
            add(&String::from_utf8_lossy(pw));
        }
    }
    r
}

/// `raw` with `SQLAlchemy`'s driver suffix (`postgresql+psycopg://`) taken off the scheme.
fn plain_postgres(raw: &str, scheme: &str) -> String {
    match scheme.split_once('+') {
        Some((base, _)) => format!("{base}{}", &raw[scheme.len()..]),
        None => raw.to_owned(),
    }
}

fn percent_decode(s: &str) -> Result<String, ()> {
    url::form_urlencoded::parse(format!("p={}", s.replace('+', "%2B")).as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .ok_or(())
}

/// libpq's keyword form: `key=value` words (`host=db dbname=lf`).
fn looks_like_keywords(raw: &str) -> bool {
    raw.split_whitespace().next().is_some_and(|w| {
        w.split_once('=').is_some_and(|(k, _)| {
            !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
    })
}

/// A parsed URL rebuilt without its secrets.
fn rebuild(url: &url::Url) -> String {
    let mut out = format!("{}://", url.scheme());
    if !url.username().is_empty() || url.password().is_some() {
        out.push_str("***@");
    }
    out.push_str(url.host_str().unwrap_or(""));
    if let Some(port) = url.port() {
        let _ = write!(out, ":{port}");
    }
    out.push_str(url.path());
    push_query(&mut out, url.query().unwrap_or(""));
    if url.fragment() == Some("insecure") {
        out.push_str("#insecure");
    }
    out
}

/// A PostgreSQL URL with a host list, rebuilt from what tokio-postgres parsed (`rest`: the raw
/// text after `://`, for its query).
fn rebuild_postgres(scheme: &str, config: &tokio_postgres::Config, rest: &str) -> String {
    let mut out = format!("{scheme}://");
    if config.get_user().is_some() || config.get_password().is_some() {
        out.push_str("***@");
    }
    let ports = config.get_ports();
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let name = match h {
                tokio_postgres::config::Host::Tcp(name) => name.clone(),
                #[cfg(unix)]
                tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
            };
            match ports.get(i).or_else(|| ports.first()) {
                Some(p) => format!("{name}:{p}"),
                None => name,
            }
        })
        .collect();
    out.push_str(&hosts.join(","));
    if let Some(db) = config.get_dbname() {
        let _ = write!(out, "/{db}");
    }
    let query = rest.split_once('?').map_or("", |(_, q)| q);
    push_query(&mut out, query.split('#').next().unwrap_or(""));
    out
}

/// Appends `?query` with the values of parameters not in [`SHOWN_PARAMS`] as `***`.
fn push_query(out: &mut String, query: &str) {
    if query.is_empty() {
        return;
    }
    let pairs: Vec<String> = url::form_urlencoded::parse(query.as_bytes())
        .map(|(k, v)| {
            if SHOWN_PARAMS.contains(&k.as_ref()) {
                format!("{k}={}", outside_text::line(&v))
            } else if !k.is_empty()
                && k.len() <= 40
                && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            {
                format!("{k}=***")
            } else {
                "***".to_owned()
            }
        })
        .collect();
    let _ = write!(out, "?{}", pairs.join("&"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_urls_are_rebuilt_without_any_secret() {
        for (raw, want) in [
            ("redis://cache:6379/0", "redis://cache:6379/0"),
            (
                "redis://:pw-secret@cache:6379/0",
                "redis://***@cache:6379/0",
            ),
            (
                "rediss://u:pw-secret@cache/0#insecure",
                "rediss://***@cache/0#insecure",
            ),
            (
                "postgres://lf:pw-secret@db:5432/lf?sslmode=verify-full&sslrootcert=/ca.pem",
                "postgres://***@db:5432/lf?sslmode=verify-full&sslrootcert=/ca.pem",
            ),
            (
                "postgresql://db/lf?password=pw-secret&user=lf",
                "postgresql://db/lf?password=***&user=***",
            ),
            (
                "postgresql+psycopg://lf:pw-secret@db:5432/langflow",
                "postgresql+psycopg://***@db:5432/langflow",
            ),
            // A percent-encoded '#', '?' and '@' in the password are a clean URL.
            (
                "redis://:p%23w%3Fsecret%40x@cache:6379/0",
                "redis://***@cache:6379/0",
            ),
            (
                "postgres://lf:pw-secret@h1:5432,h2:5433/lf?sslmode=require",
                "postgres://***@h1:5432,h2:5433/lf?sslmode=require",
            ),
        ] {
            assert_eq!(describe_store_value(raw), want, "{raw}");
        }
    }

    #[test]
    fn anything_else_is_named_never_echoed() {
        for (raw, want) in [
            (
                "host=db user=lf password=pw-secret dbname=lf",
                "libpq keyword",
            ),
            ("password=pw-secret", "libpq keyword"),
            ("pw-secret", "an unparseable value"),
            ("db:5432 pw-secret", "an unparseable value"),
            (
                "redis://:pw#secret@cache:6379/0",
                "redis:// URL that cannot be shown",
            ),
            (
                "redis://:pw?secret@cache:6379/0",
                "redis:// URL that cannot be shown",
            ),
            (
                "redis://user:123#secret@cache/0",
                "redis:// URL that cannot be shown",
            ),
            (
                "postgres://lf:pw?secret@db/lf",
                "postgres:// URL that cannot be shown",
            ),
            (
                "postgres://lf:p#w-secret@db:5432/lf",
                "postgres:// URL that cannot be shown",
            ),
            (
                "redis://:pw-secret@ca che/0",
                "redis:// URL that does not parse",
            ),
            ("1x://pw-secret", "an unparseable value"),
        ] {
            let shown = describe_store_value(raw);
            assert!(shown.contains(want), "{raw}: {shown}");
            assert!(!shown.contains("secret"), "{raw}: {shown}");
            assert!(!shown.contains("pw"), "{raw}: {shown}");
        }
    }

    #[test]
    fn the_secrets_are_the_password_and_unknown_parameter_values() {
        let r = secrets("postgres://lf:p%40ss-secret-1@db/lf?password=qsecret-2&sslmode=require");
        let text = r.apply("p%40ss-secret-1 p@ss-secret-1 qsecret-2 require");
        assert_eq!(text, "[REDACTED] [REDACTED] [REDACTED] require");
        let r = secrets("postgres://lf:hostlist-secret@h1,h2/lf");
        assert_eq!(r.apply("x hostlist-secret"), "x [REDACTED]");
    }
}
