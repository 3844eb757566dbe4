//! Typed settings read from an environment lookup.
//!
//! Everything is read through a lookup function (`Fn(&str) -> Option<String>`) rather than the
//! process environment directly, so tests never mutate global state. A bad value fails closed
//! with an error that names the variable and says what would be accepted.
//!
//! Only `CREATEOS_*` settings, shared by every surface, are read here; a surface reads its own
//! (lfx's sandbox settings, the executor's `CREATEOS_EXECUTOR_*`, the egress opt-in) and
//! hands this crate the names its refusals quote ([`SettingNames`]).

use std::fmt;
use std::time::Duration;

use secrecy::SecretString;

use crate::error::SandboxError;
pub use crate::provider::createos::{DEFAULT_BASE_URL, ENV_BASE_URL, ENV_SHAPE};
pub use crate::vars::{
    ENV_MAX_LIVE_GUESTS, SettingNames, non_blank, parse_bool, parse_cap, read_flag,
};

/// `CREATEOS_SANDBOX_API_KEY`: the credential (preferred spelling; the order is
/// [`api_key_from`]'s, the same as `createos_api::api_key_from`, which sandbox-createos checks).
pub const ENV_API_KEY: &str = "CREATEOS_SANDBOX_API_KEY";
/// `CREATEOS_API_KEY`: the credential's fallback spelling (the SDK's).
pub const ENV_API_KEY_FALLBACK: &str = "CREATEOS_API_KEY";

/// The API key an environment holds and the variable it came from: [`ENV_API_KEY`] first,
/// then [`ENV_API_KEY_FALLBACK`]; a blank value counts as unset (the order of
/// `createos_api::api_key_from`, so every surface and the SDK send the same key).
pub fn api_key_from(lookup: &dyn Fn(&str) -> Option<String>) -> Option<(String, &'static str)> {
    [ENV_API_KEY, ENV_API_KEY_FALLBACK]
        .into_iter()
        .find_map(|name| {
            lookup(name)
                .filter(|v| !v.trim().is_empty())
                .map(|v| (v, name))
        })
}
/// `CREATEOS_SANDBOX_ROOTFS`: guest image.
pub const ENV_ROOTFS: &str = "CREATEOS_SANDBOX_ROOTFS";
/// `CREATEOS_SANDBOX_MAX_OUTPUT_BYTES`: per-stream output cap.
pub const ENV_MAX_OUTPUT_BYTES: &str = "CREATEOS_SANDBOX_MAX_OUTPUT_BYTES";

/// `CREATEOS_SANDBOX_WARM_POOL`: guests kept created, verified and idle for the next run.
pub const ENV_WARM_POOL: &str = "CREATEOS_SANDBOX_WARM_POOL";
/// The largest warm pool [`ENV_WARM_POOL`] may ask for.
pub const MAX_WARM_POOL: usize = 64;

/// `CREATEOS_MAX_LIVE_GUESTS_PER_FLOW`: the most runs of one flow (by flow id) holding a guest
/// at once, for the component and the executor (unset: unlimited).
pub const ENV_MAX_LIVE_GUESTS_PER_FLOW: &str = "CREATEOS_MAX_LIVE_GUESTS_PER_FLOW";
/// `CREATEOS_ADMISSION_WAIT_SECONDS`: how long a run over a cap waits for a slot before it is
/// refused (default 30; never beyond the run's own budget).
pub const ENV_ADMISSION_WAIT: &str = "CREATEOS_ADMISSION_WAIT_SECONDS";
/// The default of [`ENV_ADMISSION_WAIT`].
pub const DEFAULT_ADMISSION_WAIT: Duration = Duration::from_secs(30);
/// `CREATEOS_CONTROL_PLANE_RETRY_SECONDS`: how long a run keeps retrying a control plane that
/// fails transiently (5xx, resets, no answer, 429 without quota semantics) before it gives up
/// (default 30: [`crate::retry::Backoff::default`]'s budget).
pub const ENV_CONTROL_PLANE_RETRY: &str = "CREATEOS_CONTROL_PLANE_RETRY_SECONDS";
/// `CREATEOS_METRICS`: whether the Python package exports its metrics and spans (see
/// [`metrics_enabled`]). Usage records are written either way.
pub const ENV_METRICS: &str = "CREATEOS_METRICS";
/// The shortest and longest control-plane retry budget accepted, in seconds.
const MIN_CONTROL_PLANE_RETRY_SECONDS: f64 = 1.0;
const MAX_CONTROL_PLANE_RETRY_SECONDS: f64 = 3600.0;
/// The longest wait accepted.
const MAX_ADMISSION_WAIT_SECONDS: f64 = 3600.0;

/// The default guest image (has `python3`, `bash` and GNU `timeout`).
pub const DEFAULT_ROOTFS: &str = "devbox:1";
/// Default per-stream output cap: 1 MiB of stdout and 1 MiB of stderr.
pub const DEFAULT_MAX_OUTPUT_BYTES: usize = 1024 * 1024;
/// Smallest accepted per-stream cap.
pub const MIN_MAX_OUTPUT_BYTES: usize = 1024;
/// Largest accepted per-stream cap.
pub const MAX_MAX_OUTPUT_BYTES: usize = 256 * 1024 * 1024;

/// The CreateOS settings this package reads (a surface reads its own on top).
#[derive(Clone)]
pub struct Settings {
    /// The API key, trimmed; `None` when neither variable is set (a refusal at run time, so
    /// `doctor` can still report everything else).
    pub api_key: Option<SecretString>,
    /// Which variable the key came from.
    pub api_key_source: Option<&'static str>,
    /// Control-plane base URL, without a trailing `/`.
    pub base_url: String,
    /// Guest image.
    pub rootfs: String,
    /// A pinned shape id, or `None` for automatic choice.
    pub pinned_shape: Option<String>,
    /// Per-stream output cap in bytes.
    pub max_output_bytes: usize,
    /// Warm pool size (0 = off, at most [`MAX_WARM_POOL`]).
    pub warm_pool: usize,
    /// [`ENV_MAX_LIVE_GUESTS`] (`None`: unlimited).
    pub max_live_guests: Option<usize>,
    /// [`ENV_MAX_LIVE_GUESTS_PER_FLOW`] (`None`: unlimited).
    pub max_live_guests_per_flow: Option<usize>,
    /// [`ENV_ADMISSION_WAIT`].
    pub admission_wait: Duration,
    /// [`ENV_CONTROL_PLANE_RETRY`], when set (`None`: the surface's own backoff budget).
    pub control_plane_retry: Option<Duration>,
    /// The egress gateway (`CREATEOS_GATEWAY_*`): a bad value refuses only the runs that ask
    /// for domains.
    pub gateway: crate::gateway::GatewaySetting,
    /// The deployment's admission store ([`crate::lease::ENV_ADMISSION_STORE`]; `None`: the
    /// caps are per process).
    pub admission_store: Option<&'static crate::lease::StoreConfig>,
}

impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settings")
            .field(
                "api_key",
                &self.api_key.as_ref().map(|_| crate::error::REDACTED),
            )
            .field("api_key_source", &self.api_key_source)
            .field("base_url", &crate::error::redact_url(&self.base_url))
            .field("rootfs", &self.rootfs)
            .field("pinned_shape", &self.pinned_shape)
            .field("max_output_bytes", &self.max_output_bytes)
            .field("warm_pool", &self.warm_pool)
            .field("max_live_guests", &self.max_live_guests)
            .field("max_live_guests_per_flow", &self.max_live_guests_per_flow)
            .field("admission_wait", &self.admission_wait)
            .field("control_plane_retry", &self.control_plane_retry)
            .field("gateway", &self.gateway)
            .field("admission_store", &self.admission_store)
            .finish()
    }
}

/// Whether [`ENV_METRICS`] leaves metrics on: `off`, `0`, `false`, `no` or `disabled` (any
/// case, trimmed) turn them off; anything else, unset included, leaves them on. Never a
/// refusal: a misspelt value keeps the figures an operator relies on, and a run never fails
/// over how it is counted.
pub fn metrics_enabled(lookup: &dyn Fn(&str) -> Option<String>) -> bool {
    !non_blank(lookup, ENV_METRICS).is_some_and(|v| {
        matches!(
            v.to_ascii_lowercase().as_str(),
            "off" | "0" | "false" | "no" | "disabled"
        )
    })
}

/// What every surface of a process shares, read through `lookup`, for `doctor`: the live-guest
/// caps, the admission wait and the control-plane retry budget, one line each. `Ok` says what
/// the setting does; `Err` is the refusal its bad value gets (every run of every surface is
/// refused then), so each line stands on its own whatever the other settings hold.
pub fn shared_summary(lookup: &dyn Fn(&str) -> Option<String>) -> Vec<Result<String, String>> {
    let line = |r: Result<String, SandboxError>| r.map_err(|e| e.message().to_owned());
    let cap = |var: &'static str, what: &str, unset: &str| {
        line(match non_blank(lookup, var) {
            None => Ok(format!("{what}: no cap ({var} unset){unset}")),
            Some(raw) => parse_cap(var, &raw).map(|n| format!("{what}: at most {n} ({var}={n})")),
        })
    };
    let wait = match non_blank(lookup, ENV_ADMISSION_WAIT) {
        None => Ok((DEFAULT_ADMISSION_WAIT, " unset")),
        Some(raw) => parse_admission_wait(&raw).map(|d| (d, "")),
    };
    let default_retry = crate::retry::Backoff::default().budget;
    let retry = match non_blank(lookup, ENV_CONTROL_PLANE_RETRY) {
        None => Ok((default_retry, " unset")),
        Some(raw) => parse_control_plane_retry(&raw).map(|d| (d, "")),
    };
    vec![
        cap(
            ENV_MAX_LIVE_GUESTS,
            "live guests in this process, every surface and warm pool included",
            ": every concurrent run creates its guest at once",
        ),
        cap(
            ENV_MAX_LIVE_GUESTS_PER_FLOW,
            "runs of one flow (by flow id) holding a guest at once, component and executor",
            "",
        ),
        line(wait.map(|(d, unset)| {
            format!(
                "admission wait: a run over a cap, or declined by the account's quota, waits \
                 in line up to {} s (never beyond its own budget), then is refused and nothing \
                 runs ({ENV_ADMISSION_WAIT}{unset})",
                d.as_secs_f64()
            )
        })),
        line(retry.map(|(d, unset)| {
            format!(
                "control-plane retry: a failing control plane is retried for {} s per call \
                 before the run gives up ({ENV_CONTROL_PLANE_RETRY}{unset})",
                d.as_secs_f64()
            )
        })),
    ]
}

/// Checks a base URL: http(s), a host, no credentials, query or fragment. Returns it without a
/// trailing `/`. A refusal shows the value through [`crate::error::redact_url`]: never its
/// userinfo, query or fragment, even when it does not parse.
pub fn parse_base_url(name: &str, raw: &str) -> Result<String, SandboxError> {
    let shown = crate::error::redact_url(raw);
    let bad = |why: &str| {
        SandboxError::refused(format!(
            "{name}={shown:?} is not a usable control-plane URL ({why}); set it to e.g. {DEFAULT_BASE_URL}"
        ))
    };
    let u = url::Url::parse(raw.trim()).map_err(|e| bad(&e.to_string()))?;
    if !matches!(u.scheme(), "http" | "https") {
        return Err(bad("the scheme must be http or https"));
    }
    if u.host_str().is_none_or(str::is_empty) {
        return Err(bad("it has no host"));
    }
    if !u.username().is_empty() || u.password().is_some() {
        // Do not echo the raw value: it holds a credential.
        return Err(SandboxError::refused(format!(
            "{name} must not carry credentials (user:password@); put the key in {ENV_API_KEY}"
        )));
    }
    if u.query().is_some() || u.fragment().is_some() {
        return Err(bad("it must not have a query string or fragment"));
    }
    Ok(u.as_str().trim_end_matches('/').to_owned())
}

/// Parses [`ENV_WARM_POOL`]: a whole number from 0 to [`MAX_WARM_POOL`].
pub fn parse_warm_pool(raw: &str) -> Result<usize, SandboxError> {
    parse_pool_size(ENV_WARM_POOL, raw, MAX_WARM_POOL)
}

/// Parses the pool size `raw` of the setting `var`: a whole number from 0 to `max`; the
/// refusal names `var`.
pub fn parse_pool_size(var: &str, raw: &str, max: usize) -> Result<usize, SandboxError> {
    match raw.trim().parse::<usize>() {
        Ok(n) if n <= max => Ok(n),
        _ => Err(SandboxError::refused(format!(
            "{var}={raw:?} is not a pool size from 0 to {max}; set it to the number of guests \
             to keep ready (e.g. 4), or to 0 or unset it to turn the warm pool off"
        ))),
    }
}

/// Parses [`ENV_ADMISSION_WAIT`]: seconds from 0 to 3600, fractions allowed.
pub fn parse_admission_wait(raw: &str) -> Result<Duration, SandboxError> {
    match raw.trim().parse::<f64>() {
        Ok(s) if (0.0..=MAX_ADMISSION_WAIT_SECONDS).contains(&s) => Ok(Duration::from_secs_f64(s)),
        _ => Err(SandboxError::refused(format!(
            "{ENV_ADMISSION_WAIT}={raw:?} is not a number of seconds from 0 to 3600; set how \
             long a run over a cap waits for a slot (default 30), or 0 to refuse at once"
        ))),
    }
}

/// Parses [`ENV_CONTROL_PLANE_RETRY`]: seconds from 1 to 3600, fractions allowed.
pub fn parse_control_plane_retry(raw: &str) -> Result<Duration, SandboxError> {
    match raw.trim().parse::<f64>() {
        Ok(s)
            if (MIN_CONTROL_PLANE_RETRY_SECONDS..=MAX_CONTROL_PLANE_RETRY_SECONDS).contains(&s) =>
        {
            Ok(Duration::from_secs_f64(s))
        }
        _ => Err(SandboxError::refused(format!(
            "{ENV_CONTROL_PLANE_RETRY}={raw:?} is not a number of seconds from 1 to 3600; set \
             how long a run keeps retrying a failing control plane before it gives up \
             (default 30), or unset it"
        ))),
    }
}

fn valid_token(s: &str, extra: &[char]) -> bool {
    !s.is_empty()
        && s.len() <= 200
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || extra.contains(&c))
}

impl Settings {
    /// Reads and validates every CreateOS setting through `lookup`.
    pub fn from_lookup(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Self, SandboxError> {
        crate::vars::check_secret_files(lookup)?;
        let (api_key, api_key_source) = match api_key_from(lookup) {
            Some((k, from)) => (Some(k.trim().to_owned()), Some(from)),
            None => (None, None),
        };
        if let (Some(k), Some(src)) = (&api_key, api_key_source)
            && (k.len() < 8 || k.chars().any(|c| c.is_control() || c.is_whitespace()))
        {
            return Err(SandboxError::refused(format!(
                "{src} does not look like a CreateOS API key (too short, or it contains \
                 whitespace or control characters); copy it again from \
                 https://createos.nodeops.network/profile"
            )));
        }
        let base_url = match non_blank(lookup, ENV_BASE_URL) {
            Some(raw) => parse_base_url(ENV_BASE_URL, &raw)?,
            None => DEFAULT_BASE_URL.to_owned(),
        };
        let rootfs = match non_blank(lookup, ENV_ROOTFS) {
            Some(r) if valid_token(&r, &['-', '_', '.', ':', '/']) => r,
            Some(r) => {
                return Err(SandboxError::refused(format!(
                    "{ENV_ROOTFS}={r:?} is not a rootfs name; set it to a catalog name such as \
                     {DEFAULT_ROOTFS} or a template id, or unset it"
                )));
            }
            None => DEFAULT_ROOTFS.to_owned(),
        };
        let pinned_shape = match non_blank(lookup, ENV_SHAPE) {
            None => None,
            Some(s) if s.eq_ignore_ascii_case("auto") => None,
            Some(s) if valid_token(&s, &['-', '_', '.']) => Some(s),
            Some(s) => {
                return Err(SandboxError::refused(format!(
                    "{ENV_SHAPE}={s:?} is not a shape id; set it to an id from GET /v1/shapes \
                     (e.g. s-2vcpu-4gb) or to auto"
                )));
            }
        };
        let max_output_bytes = match non_blank(lookup, ENV_MAX_OUTPUT_BYTES) {
            None => DEFAULT_MAX_OUTPUT_BYTES,
            Some(raw) => match raw.replace('_', "").parse::<usize>() {
                Ok(n) if (MIN_MAX_OUTPUT_BYTES..=MAX_MAX_OUTPUT_BYTES).contains(&n) => n,
                _ => {
                    return Err(SandboxError::refused(format!(
                        "{ENV_MAX_OUTPUT_BYTES}={raw:?} is not a byte count between \
                         {MIN_MAX_OUTPUT_BYTES} and {MAX_MAX_OUTPUT_BYTES}; set it to e.g. \
                         {DEFAULT_MAX_OUTPUT_BYTES} or unset it"
                    )));
                }
            },
        };
        let warm_pool = match non_blank(lookup, ENV_WARM_POOL) {
            None => 0,
            Some(raw) => parse_warm_pool(&raw)?,
        };
        let cap = |var: &str| {
            non_blank(lookup, var)
                .map(|raw| parse_cap(var, &raw))
                .transpose()
        };
        let max_live_guests = cap(ENV_MAX_LIVE_GUESTS)?;
        let max_live_guests_per_flow = cap(ENV_MAX_LIVE_GUESTS_PER_FLOW)?;
        let admission_wait = non_blank(lookup, ENV_ADMISSION_WAIT)
            .map(|raw| parse_admission_wait(&raw))
            .transpose()?
            .unwrap_or(DEFAULT_ADMISSION_WAIT);
        let control_plane_retry = non_blank(lookup, ENV_CONTROL_PLANE_RETRY)
            .map(|raw| parse_control_plane_retry(&raw))
            .transpose()?;
        Ok(Self {
            api_key: api_key.map(SecretString::from),
            api_key_source,
            base_url,
            rootfs,
            pinned_shape,
            max_output_bytes,
            warm_pool,
            max_live_guests,
            max_live_guests_per_flow,
            admission_wait,
            control_plane_retry,
            gateway: crate::gateway::GatewaySetting::from_lookup(lookup),
            admission_store: crate::lease::StoreConfig::from_lookup(lookup)?,
        })
    }

    /// Reads the settings from the process environment.
    pub fn from_env() -> Result<Self, SandboxError> {
        Self::from_lookup(&crate::vars::process_env)
    }

    /// The key, or the refusal that applies when there is none.
    pub fn require_key(&self) -> Result<&SecretString, SandboxError> {
        self.api_key.as_ref().ok_or_else(|| {
            SandboxError::refused(format!(
                "no CreateOS API key: set {ENV_API_KEY} (or {ENV_API_KEY_FALLBACK}); get one at \
                 https://createos.nodeops.network/profile"
            ))
        })
    }

    /// A redactor for this key (empty when there is none).
    pub fn redactor(&self) -> crate::error::Redactor {
        self.api_key
            .as_ref()
            .map_or_else(crate::error::Redactor::default, |k| {
                crate::error::Redactor::default().with(k)
            })
    }
}

#[cfg(test)]
mod tests {
    use secrecy::ExposeSecret;
    use std::collections::HashMap;

    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn the_shared_summary_says_each_setting_and_refuses_each_bad_one_on_its_own_line() {
        let unset = shared_summary(&env(&[]));
        assert_eq!(unset.len(), 4);
        let text: Vec<String> = unset.into_iter().map(Result::unwrap).collect();
        assert!(
            text[0].contains("no cap (CREATEOS_MAX_LIVE_GUESTS unset)"),
            "{text:?}"
        );
        assert!(text[1].contains("no cap (CREATEOS_MAX_LIVE_GUESTS_PER_FLOW unset)"));
        assert!(
            text[2].contains("up to 30 s")
                && text[2].contains("CREATEOS_ADMISSION_WAIT_SECONDS unset")
        );
        assert!(text[3].contains("retried for 30 s") && text[3].contains("SECONDS unset)"));
        let set = shared_summary(&env(&[
            (ENV_MAX_LIVE_GUESTS, "16"),
            (ENV_MAX_LIVE_GUESTS_PER_FLOW, "0"),
            (ENV_ADMISSION_WAIT, "2.5"),
            (ENV_CONTROL_PLANE_RETRY, "90"),
        ]));
        assert_eq!(
            set[0].as_deref(),
            Ok(
                "live guests in this process, every surface and warm pool included: at most 16 (CREATEOS_MAX_LIVE_GUESTS=16)"
            )
        );
        assert!(
            set[1]
                .as_ref()
                .unwrap_err()
                .contains("CREATEOS_MAX_LIVE_GUESTS_PER_FLOW=\"0\"")
        );
        assert!(set[2].as_ref().unwrap().contains("up to 2.5 s (never"));
        assert!(set[3].as_ref().unwrap().contains("retried for 90 s per call before the run gives up (CREATEOS_CONTROL_PLANE_RETRY_SECONDS)"), "{:?}", set[3]);
    }

    #[test]
    fn metrics_are_on_unless_turned_off_by_a_known_word() {
        assert!(metrics_enabled(&env(&[])));
        for on in ["on", "1", "true", "", "  ", "offf", "yes please"] {
            assert!(metrics_enabled(&env(&[(ENV_METRICS, on)])), "{on:?}");
        }
        for off in ["off", "OFF", " 0 ", "false", "No", "disabled"] {
            assert!(!metrics_enabled(&env(&[(ENV_METRICS, off)])), "{off:?}");
        }
    }

    #[test]
    fn defaults() {
        let s = Settings::from_lookup(&env(&[])).unwrap();
        assert!(s.api_key.is_none());
        assert_eq!(s.base_url, DEFAULT_BASE_URL);
        assert_eq!(s.rootfs, "devbox:1");
        assert_eq!(s.pinned_shape, None);
        assert_eq!(s.max_output_bytes, DEFAULT_MAX_OUTPUT_BYTES);
        assert_eq!(s.warm_pool, 0);
        assert_eq!(s.max_live_guests, None);
        assert_eq!(s.max_live_guests_per_flow, None);
        assert_eq!(s.admission_wait, Duration::from_secs(30));
        assert_eq!(s.control_plane_retry, None);
        let e = s.require_key().unwrap_err();
        assert!(e.kind().is_unavailable());
        assert!(e.to_string().contains(ENV_API_KEY));
    }

    #[test]
    fn key_prefers_sandbox_variable_and_falls_back() {
        let s = Settings::from_lookup(&env(&[
            (ENV_API_KEY, " key-primary-1 "),
            (ENV_API_KEY_FALLBACK, "key-fallback-1"),
        ]))
        .unwrap();
        assert_eq!(s.api_key.unwrap().expose_secret(), "key-primary-1");
        let s = Settings::from_lookup(&env(&[(ENV_API_KEY_FALLBACK, "key-fallback-1")])).unwrap();
        assert_eq!(s.api_key.unwrap().expose_secret(), "key-fallback-1");
        assert_eq!(s.api_key_source, Some(ENV_API_KEY_FALLBACK));
        // Blank primary falls through to the fallback.
        let s = Settings::from_lookup(&env(&[
            (ENV_API_KEY, "  "),
            (ENV_API_KEY_FALLBACK, "key-fallback-1"),
        ]))
        .unwrap();
        assert_eq!(s.api_key_source, Some(ENV_API_KEY_FALLBACK));
    }

    #[test]
    fn flags_read_unset_as_false_and_name_a_bad_value() {
        let lookup = env(&[("SURFACE_FLAG", "TRUE"), ("BAD_FLAG", "maybe")]);
        assert!(read_flag(&lookup, "SURFACE_FLAG").unwrap());
        assert!(!read_flag(&lookup, "UNSET_FLAG").unwrap());
        let e = read_flag(&lookup, "BAD_FLAG").unwrap_err();
        assert!(
            e.kind().is_unavailable() && e.to_string().contains("BAD_FLAG"),
            "{e}"
        );
    }

    #[test]
    fn debug_never_shows_the_key() {
        let s = Settings::from_lookup(&env(&[(ENV_API_KEY, "super-secret-key")])).unwrap();
        let d = format!("{s:?}");
        assert!(!d.contains("super-secret-key"), "{d}");
    }

    #[test]
    fn bad_values_name_the_variable() {
        let cases: &[(&str, &str)] = &[
            (ENV_BASE_URL, "ftp://x"),
            (ENV_BASE_URL, "https://example.test/?a=1"),
            (ENV_BASE_URL, "not a url"),
            (ENV_ROOTFS, "dev box"),
            (ENV_SHAPE, "s 2"),
            (ENV_MAX_OUTPUT_BYTES, "lots"),
            (ENV_MAX_OUTPUT_BYTES, "10"),
            (ENV_MAX_OUTPUT_BYTES, "-5"),
            (ENV_API_KEY, "short"),
            (ENV_WARM_POOL, "-1"),
            (ENV_WARM_POOL, "four"),
            (ENV_WARM_POOL, "65"),
            (ENV_WARM_POOL, "1e3"),
            (ENV_WARM_POOL, "18446744073709551616"),
            (ENV_MAX_LIVE_GUESTS, "0"),
            (ENV_MAX_LIVE_GUESTS, "-1"),
            (ENV_MAX_LIVE_GUESTS, "lots"),
            (ENV_MAX_LIVE_GUESTS_PER_FLOW, "100001"),
            (ENV_ADMISSION_WAIT, "-1"),
            (ENV_ADMISSION_WAIT, "soon"),
            (ENV_ADMISSION_WAIT, "3601"),
            (ENV_CONTROL_PLANE_RETRY, "0"),
            (ENV_CONTROL_PLANE_RETRY, "0.5"),
            (ENV_CONTROL_PLANE_RETRY, "3601"),
            (ENV_CONTROL_PLANE_RETRY, "-3"),
            (ENV_CONTROL_PLANE_RETRY, "NaN"),
            (ENV_CONTROL_PLANE_RETRY, "inf"),
            (ENV_CONTROL_PLANE_RETRY, "soon"),
        ];
        for (k, v) in cases {
            let e = Settings::from_lookup(&env(&[(k, v)])).unwrap_err();
            assert!(e.kind().is_unavailable());
            assert!(e.to_string().contains(k), "{k}={v}: {e}");
        }
    }

    #[test]
    fn base_url_with_credentials_is_not_echoed() {
        let e = Settings::from_lookup(&env(&[(ENV_BASE_URL, "https://u:pw-secret@h.test")]))
            .unwrap_err();
        assert!(!e.to_string().contains("pw-secret"));
        assert!(e.to_string().contains(ENV_BASE_URL));
    }

    #[test]
    fn hostile_base_urls_never_show_their_secrets() {
        for raw in [
            "https://user:pw-secret@/x",
            "https://user:pw-secret@host.test:99999",
            "https://host.test/api?token=tok-secret",
            "https://host.test/#frag-secret",
            "https://u:p/w-secret@host.test",
            "not a url?token=tok-secret",
            "ftp://u:pw-secret@host.test",
        ] {
            let e = Settings::from_lookup(&env(&[(ENV_BASE_URL, raw)])).unwrap_err();
            let text = format!("{e} {e:?}");
            assert!(!text.contains("secret"), "{raw}: {text}");
            assert!(text.contains(ENV_BASE_URL), "{raw}: {text}");
        }
    }

    #[test]
    fn parses_valid_values() {
        let s = Settings::from_lookup(&env(&[
            (ENV_BASE_URL, "http://127.0.0.1:8080/api/"),
            (ENV_ROOTFS, "python:3.12"),
            (ENV_SHAPE, "s-2vcpu-4gb"),
            (ENV_MAX_OUTPUT_BYTES, "65536"),
        ]))
        .unwrap();
        assert_eq!(s.base_url, "http://127.0.0.1:8080/api");
        assert_eq!(s.rootfs, "python:3.12");
        assert_eq!(s.pinned_shape.as_deref(), Some("s-2vcpu-4gb"));
        assert_eq!(s.max_output_bytes, 65536);
        let s = Settings::from_lookup(&env(&[(ENV_SHAPE, "AUTO")])).unwrap();
        assert_eq!(s.pinned_shape, None);
    }

    #[test]
    fn control_plane_retry_accepts_fractions_within_its_range() {
        for (raw, want) in [
            ("1", Duration::from_secs(1)),
            (" 2.5 ", Duration::from_millis(2500)),
            ("3600", Duration::from_secs(3600)),
        ] {
            let s = Settings::from_lookup(&env(&[(ENV_CONTROL_PLANE_RETRY, raw)])).unwrap();
            assert_eq!(s.control_plane_retry, Some(want), "{raw}");
        }
        let e = Settings::from_lookup(&env(&[(ENV_CONTROL_PLANE_RETRY, "0.5")])).unwrap_err();
        assert!(e.to_string().contains("from 1 to 3600"), "{e}");
    }

    #[test]
    fn admission_caps_and_wait() {
        let s = Settings::from_lookup(&env(&[
            (ENV_MAX_LIVE_GUESTS, " 16 "),
            (ENV_MAX_LIVE_GUESTS_PER_FLOW, "2"),
            (ENV_ADMISSION_WAIT, "0.5"),
        ]))
        .unwrap();
        assert_eq!(s.max_live_guests, Some(16));
        assert_eq!(s.max_live_guests_per_flow, Some(2));
        assert_eq!(s.admission_wait, Duration::from_millis(500));
        let s = Settings::from_lookup(&env(&[(ENV_ADMISSION_WAIT, "0")])).unwrap();
        assert_eq!(s.admission_wait, Duration::ZERO);
    }

    #[test]
    fn warm_pool_sizes() {
        for (raw, n) in [("0", 0), (" 4 ", 4), ("64", 64), ("", 0)] {
            let s = Settings::from_lookup(&env(&[(ENV_WARM_POOL, raw)])).unwrap();
            assert_eq!(s.warm_pool, n, "{raw:?}");
        }
        let e = Settings::from_lookup(&env(&[(ENV_WARM_POOL, "-3")])).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains(ENV_WARM_POOL) && text.contains("64"),
            "{text}"
        );
        assert!(text.contains("unset it"), "{text}");
    }
}
