//! The executor's own settings (`CREATEOS_EXECUTOR_*`), read through an environment lookup.
//!
//! The credential and endpoint are the package's shared `CREATEOS_SANDBOX_*` settings
//! ([`sandbox_core::settings::Settings`]); everything that shapes the guest is the executor's
//! own, so a refusal never points an executor user at a backend setting.

use sandbox_core::SandboxError;
use sandbox_core::egress::{ALLOW_ALL_RULE, EgressPolicy};
use sandbox_core::gateway::{Domains, ENV_GATEWAY_SECRET, ENV_GATEWAY_URL, GatewaySetting};
use sandbox_core::plan::{self, Base, NetworkAsk};
use sandbox_core::provider::ProviderKind;
use sandbox_core::settings::{SettingNames, non_blank, parse_bool, parse_pool_size};

/// `CREATEOS_EXECUTOR_ROOTFS`: the guest image (a template with lfx and the flow's components).
pub const ENV_ROOTFS: &str = "CREATEOS_EXECUTOR_ROOTFS";
/// `CREATEOS_EXECUTOR_SHAPE`: the guest's shape id.
pub const ENV_SHAPE: &str = "CREATEOS_EXECUTOR_SHAPE";
/// `CREATEOS_EXECUTOR_TIMEOUT_SECONDS`: the flow's wall clock, enforced in the guest.
pub const ENV_TIMEOUT: &str = "CREATEOS_EXECUTOR_TIMEOUT_SECONDS";
/// `CREATEOS_EXECUTOR_EGRESS`: comma-separated address rules, `*` (unrestricted) or `none`.
pub const ENV_EGRESS: &str = "CREATEOS_EXECUTOR_EGRESS";
/// `CREATEOS_EXECUTOR_ALLOWED_DOMAINS`: comma-separated host names (`pypi.org`,
/// `*.pythonhosted.org`) the flow reaches through the egress gateway, and nothing else beyond
/// the address rules of `CREATEOS_EXECUTOR_EGRESS`.
pub const ENV_ALLOWED_DOMAINS: &str = "CREATEOS_EXECUTOR_ALLOWED_DOMAINS";
/// `CREATEOS_EXECUTOR_ACCEPT_EGRESS_EXCEPTIONS`: accept that a restricted guest still reaches
/// `169.254.0.0/16`.
pub const ENV_ACCEPT_EGRESS_EXCEPTIONS: &str = "CREATEOS_EXECUTOR_ACCEPT_EGRESS_EXCEPTIONS";
/// `CREATEOS_EXECUTOR_INSTALL_LFX`: install lfx (the host's version) in the guest per run.
pub const ENV_INSTALL_LFX: &str = "CREATEOS_EXECUTOR_INSTALL_LFX";
/// `CREATEOS_EXECUTOR_PIP`: extra pip requirements for that per-run install.
pub const ENV_PIP: &str = "CREATEOS_EXECUTOR_PIP";

/// `CREATEOS_EXECUTOR_WARM_POOL`: guests kept created, verified and with lfx already imported
/// by a preloaded runner, for the next flow runs (0 = off).
pub const ENV_WARM_POOL: &str = "CREATEOS_EXECUTOR_WARM_POOL";
/// The largest executor pool accepted: its guests are large (the default shape has 8 GiB).
pub const MAX_WARM_POOL: usize = 16;

/// `CREATEOS_EXECUTOR_MAX_RESULT_BYTES`: the most bytes of results one flow run may send back
/// from its guest, all its frames together (every vertex's result, the chat messages it stores,
/// the run's outputs). A frame longer than one frame line comes in chunks, reassembled on the
/// host within this bound.
pub const ENV_MAX_RESULT_BYTES: &str = "CREATEOS_EXECUTOR_MAX_RESULT_BYTES";
/// Its default (64 MiB): a run's results are held whole by `lfx run` and `lfx serve` until the
/// run ends, so this is host memory per concurrent run. A 5 MB answer through Chat Input, one
/// component and Chat Output takes about 35 MB of it (a vertex's result carries its text up to
/// four times: results, outputs, artifacts, messages).
pub const DEFAULT_MAX_RESULT_BYTES: u64 = 64 * 1024 * 1024;
/// The least accepted (1 MiB): below it, ordinary flows' results would be refused.
pub const MIN_MAX_RESULT_BYTES: u64 = 1024 * 1024;
/// The most accepted (1 GiB).
pub const MAX_MAX_RESULT_BYTES: u64 = 1024 * 1024 * 1024;

/// The default shape: flows import heavy libraries.
pub const DEFAULT_SHAPE: &str = "s-4vcpu-8gb";
/// The default wall clock of one flow run, in seconds.
pub const DEFAULT_TIMEOUT_SECONDS: u32 = 600;
/// The longest accepted wall clock (the auto-pause backstop must stay above it).
pub const MAX_TIMEOUT_SECONDS: u32 = 86_400 - 120;

/// The settings the executor's egress refusals name.
pub const SETTING_NAMES: SettingNames = SettingNames {
    restrict_egress: "CREATEOS_EXECUTOR_EGRESS=<address rules>",
    allow_egress: "CREATEOS_EXECUTOR_EGRESS=*",
    accept_egress_exceptions: ENV_ACCEPT_EGRESS_EXCEPTIONS,
    memory: ENV_SHAPE,
};

/// The settings a domains run's egress refusals name.
pub const DOMAIN_SETTING_NAMES: SettingNames = SettingNames {
    restrict_egress: ENV_ALLOWED_DOMAINS,
    allow_egress: "unsetting CREATEOS_EXECUTOR_ALLOWED_DOMAINS (with CREATEOS_EXECUTOR_EGRESS=*)",
    accept_egress_exceptions: ENV_ACCEPT_EGRESS_EXCEPTIONS,
    memory: ENV_SHAPE,
};

/// What the executor's settings decide about the guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutorSettings {
    /// The rootfs, or `None` for the package default ([`sandbox_core::settings::DEFAULT_ROOTFS`],
    /// which has no lfx: the run then needs [`ExecutorSettings::install_lfx`]).
    pub rootfs: Option<String>,
    /// The shape id.
    pub shape: String,
    /// The flow's wall clock, in seconds.
    pub timeout_seconds: u32,
    /// The guest's egress.
    pub egress: EgressPolicy,
    /// The domains the flow reaches through the egress gateway (empty: no gateway involved).
    pub domains: Domains,
    /// Install lfx in the guest when it is missing.
    pub install_lfx: bool,
    /// Extra requirements for that install.
    pub pip_extras: Vec<String>,
    /// Warm pool size (0 = off, at most [`MAX_WARM_POOL`]).
    pub warm_pool: usize,
    /// The most bytes of results a run may send back ([`ENV_MAX_RESULT_BYTES`]).
    pub max_result_bytes: u64,
}

fn valid_token(s: &str, extra: &[char]) -> bool {
    !s.is_empty()
        && s.len() <= 200
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || extra.contains(&c))
}

/// A pip requirement we pass on: no options (`-`), no whitespace, no shell characters.
pub(crate) fn valid_requirement(s: &str) -> bool {
    valid_token(
        s,
        &[
            '-', '_', '.', '=', '<', '>', '!', '~', '[', ']', ',', '@', '+',
        ],
    ) && !s.starts_with('-')
}

impl ExecutorSettings {
    /// The effective settings, one line each, for `doctor`: rootfs, shape, timeout, egress and
    /// domains, the per-run install, the warm pool, and the bound on a run's results. Never a
    /// secret (none is read here).
    #[must_use]
    pub fn summary(&self) -> Vec<String> {
        let rootfs = match &self.rootfs {
            Some(r) => format!("rootfs: {r} ({ENV_ROOTFS})"),
            None => format!(
                "rootfs: {} ({ENV_ROOTFS} unset; this image has no lfx, so runs need {ENV_ROOTFS} \
                 set to a template with lfx, or {ENV_INSTALL_LFX}=true)",
                sandbox_core::settings::DEFAULT_ROOTFS
            ),
        };
        let domains = if self.domains.is_empty() {
            format!("domains: none ({ENV_ALLOWED_DOMAINS} unset)")
        } else if matches!(self.egress, EgressPolicy::Domains(_)) {
            format!(
                "domains: {}, enforced by the provider's own egress rules, no gateway \
                 ({ENV_ALLOWED_DOMAINS})",
                self.domains
            )
        } else {
            format!(
                "domains: {} through the egress gateway ({ENV_ALLOWED_DOMAINS})",
                self.domains
            )
        };
        let install = if self.install_lfx {
            format!(
                "per-run install: lfx when missing in the guest{} ({ENV_INSTALL_LFX}=true)",
                if self.pip_extras.is_empty() {
                    String::new()
                } else {
                    format!(", plus {}", self.pip_extras.join(" "))
                }
            )
        } else {
            format!("per-run install: off ({ENV_INSTALL_LFX})")
        };
        let pool = if self.warm_pool == 0 {
            format!("warm pool: off ({ENV_WARM_POOL} unset or 0)")
        } else {
            format!(
                "warm pool: {} guest(s) running a preloaded runner ({ENV_WARM_POOL})",
                self.warm_pool
            )
        };
        let results = format!(
            "results: at most {} bytes per flow run ({ENV_MAX_RESULT_BYTES})",
            self.max_result_bytes
        );
        vec![
            rootfs,
            format!("shape: {} ({ENV_SHAPE})", self.shape),
            format!(
                "timeout: {} s per flow run ({ENV_TIMEOUT})",
                self.timeout_seconds
            ),
            format!("egress: {} ({ENV_EGRESS})", self.egress),
            domains,
            install,
            pool,
            results,
        ]
    }

    /// Reads and validates the `CREATEOS_EXECUTOR_*` settings through `lookup`, for CreateOS. A
    /// bad value is a refusal that names its variable and what would be accepted.
    pub fn from_lookup(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Self, SandboxError> {
        Self::from_lookup_on(lookup, ProviderKind::CreateOs)
    }

    /// [`ExecutorSettings::from_lookup`] for a run on `provider`: on OpenSandbox the egress is
    /// decided by [`egress_named`] (a domain allowlist as the sandbox's own rules, no gateway,
    /// no link-local opt-in); on CreateOS by [`egress_of`].
    pub fn from_lookup_on(
        lookup: &dyn Fn(&str) -> Option<String>,
        provider: ProviderKind,
    ) -> Result<Self, SandboxError> {
        let rootfs = match non_blank(lookup, ENV_ROOTFS) {
            None => None,
            Some(r) if valid_token(&r, &['-', '_', '.', ':', '/']) => Some(r),
            Some(r) => {
                return Err(SandboxError::refused(format!(
                    "{ENV_ROOTFS}={r:?} is not a rootfs name; set it to a template id or name \
                     (see `python -m langflow_sandbox_createos template build`) or unset it"
                )));
            }
        };
        let shape = match non_blank(lookup, ENV_SHAPE) {
            None => DEFAULT_SHAPE.to_owned(),
            Some(s) if valid_token(&s, &['-', '_', '.']) => s,
            Some(s) => {
                return Err(SandboxError::refused(format!(
                    "{ENV_SHAPE}={s:?} is not a shape id; set it to an id from GET /v1/shapes \
                     (default {DEFAULT_SHAPE})"
                )));
            }
        };
        let timeout_seconds = match non_blank(lookup, ENV_TIMEOUT) {
            None => DEFAULT_TIMEOUT_SECONDS,
            Some(raw) => match raw.parse::<u32>() {
                Ok(n) if (1..=MAX_TIMEOUT_SECONDS).contains(&n) => n,
                _ => {
                    return Err(SandboxError::refused(format!(
                        "{ENV_TIMEOUT}={raw:?} is not a whole number of seconds between 1 and \
                         {MAX_TIMEOUT_SECONDS} (default {DEFAULT_TIMEOUT_SECONDS})"
                    )));
                }
            },
        };
        let accept = match lookup(ENV_ACCEPT_EGRESS_EXCEPTIONS) {
            Some(raw) => parse_bool(ENV_ACCEPT_EGRESS_EXCEPTIONS, &raw)?,
            None => false,
        };
        let named = provider == ProviderKind::OpenSandbox;
        let domains = match non_blank(lookup, ENV_ALLOWED_DOMAINS) {
            Some(raw) => {
                if named {
                    // The backend's validation first: its refusal of an address or CIDR entry.
                    EgressPolicy::only_domains(
                        ENV_ALLOWED_DOMAINS,
                        &raw.split(',').collect::<Vec<_>>(),
                    )?;
                }
                Domains::parse_list(ENV_ALLOWED_DOMAINS, &raw)?
            }
            None => Domains::default(),
        };
        let raw_egress = non_blank(lookup, ENV_EGRESS);
        let egress = if named {
            egress_named(raw_egress.as_deref(), &domains)?
        } else {
            egress_of(
                raw_egress.as_deref(),
                &domains,
                accept,
                &GatewaySetting::from_lookup(lookup),
            )?
        };
        let install_lfx = match lookup(ENV_INSTALL_LFX) {
            Some(raw) => parse_bool(ENV_INSTALL_LFX, &raw)?,
            None => false,
        };
        let pip_extras: Vec<String> = non_blank(lookup, ENV_PIP)
            .map(|raw| {
                raw.split([',', ' '])
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        if let Some(bad) = pip_extras.iter().find(|r| !valid_requirement(r)) {
            return Err(SandboxError::refused(format!(
                "{ENV_PIP} holds {bad:?}, which is not a plain requirement (name, extras and \
                 version specifiers only; no pip options); list requirements separated by commas"
            )));
        }
        if !pip_extras.is_empty() && !install_lfx {
            return Err(SandboxError::refused(format!(
                "{ENV_PIP} is set but {ENV_INSTALL_LFX} is not: the extras are installed only by \
                 the per-run install. Set {ENV_INSTALL_LFX}=true, or bake them into a template \
                 ({ENV_ROOTFS})"
            )));
        }
        let warm_pool = match non_blank(lookup, ENV_WARM_POOL) {
            None => 0,
            Some(raw) => parse_pool_size(ENV_WARM_POOL, &raw, MAX_WARM_POOL)?,
        };
        if warm_pool > 0 && install_lfx {
            return Err(SandboxError::refused(format!(
                "{ENV_WARM_POOL} needs lfx in the guest image, but {ENV_INSTALL_LFX}=true \
                 installs it per run, after the guest was handed out: bake a template \
                 (`python -m langflow_sandbox_createos template build FLOW.json`, then set \
                 {ENV_ROOTFS}) and unset {ENV_INSTALL_LFX}, or set {ENV_WARM_POOL}=0"
            )));
        }
        let max_result_bytes = match non_blank(lookup, ENV_MAX_RESULT_BYTES) {
            None => DEFAULT_MAX_RESULT_BYTES,
            Some(raw) => match raw.replace('_', "").parse::<u64>() {
                Ok(n) if (MIN_MAX_RESULT_BYTES..=MAX_MAX_RESULT_BYTES).contains(&n) => n,
                _ => {
                    return Err(SandboxError::refused(format!(
                        "{ENV_MAX_RESULT_BYTES}={raw:?} is not a byte count between \
                         {MIN_MAX_RESULT_BYTES} and {MAX_MAX_RESULT_BYTES}; set it to e.g. \
                         {DEFAULT_MAX_RESULT_BYTES} (the default) or unset it"
                    )));
                }
            },
        };
        Ok(Self {
            rootfs,
            shape,
            timeout_seconds,
            egress,
            domains,
            install_lfx,
            pip_extras,
            warm_pool,
            max_result_bytes,
        })
    }
}

/// What `CREATEOS_EXECUTOR_EGRESS` (`raw`) asks for before any domain: unset or `*` is
/// unrestricted, `none` deny-all, anything else address rules; with domains, `*` and `none`
/// contradict the list and are refused, and `*` mixed with rules is refused.
/// `named`: the provider enforces the domains itself (no gateway, no address rules).
fn base_of(raw: Option<&str>, domains: &Domains, named: bool) -> Result<Base, SandboxError> {
    Ok(match raw.map(str::trim) {
        None => Base::Open,
        Some(r)
            if !domains.is_empty() && (r == ALLOW_ALL_RULE || r.eq_ignore_ascii_case("none")) =>
        {
            return Err(SandboxError::refused(if named {
                format!(
                    "{ENV_EGRESS}={r:?} contradicts {ENV_ALLOWED_DOMAINS}: with domains, the \
                     guest's egress is deny-all but those names. Unset {ENV_EGRESS}, or unset \
                     {ENV_ALLOWED_DOMAINS}"
                )
            } else {
                format!(
                    "{ENV_EGRESS}={r:?} contradicts {ENV_ALLOWED_DOMAINS}: with domains, the \
                     guest's egress is the egress gateway plus any address rules listed in \
                     {ENV_EGRESS}. Unset {ENV_EGRESS} (or list address rules), or unset \
                     {ENV_ALLOWED_DOMAINS}"
                )
            }));
        }
        Some(r) if r == ALLOW_ALL_RULE => Base::Open,
        Some(r) if r.eq_ignore_ascii_case("none") => Base::Off,
        Some(r) => {
            let rules: Vec<String> = r
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect();
            if rules.iter().any(|rule| rule == ALLOW_ALL_RULE) {
                return Err(SandboxError::refused(format!(
                    "{ENV_EGRESS}={r:?} mixes `*` with address rules; set it to `*` alone for \
                     unrestricted egress, or list only address rules"
                )));
            }
            Base::Rules(rules)
        }
    })
}

/// The egress of a run on a provider that enforces domain names itself (OpenSandbox), through
/// sandbox-core's [`plan::network_named`]: unset or `*` is unrestricted, `none` deny-all (no
/// opt-in: the provider has no egress exception), address rules refused; with
/// `CREATEOS_EXECUTOR_ALLOWED_DOMAINS` (and `CREATEOS_EXECUTOR_EGRESS` unset), deny-all but
/// exactly those names, sent as the sandbox's own egress rules and read back. Refusals name
/// the variable.
pub fn egress_named(raw: Option<&str>, domains: &Domains) -> Result<EgressPolicy, SandboxError> {
    let ask = NetworkAsk {
        base: base_of(raw, domains, true)?,
        domains,
        domains_setting: ENV_ALLOWED_DOMAINS,
        accept_exceptions: false,
        names: &SETTING_NAMES,
        domain_names: &DOMAIN_SETTING_NAMES,
    };
    plan::network_named(&ask).map(|net| net.egress)
}

/// The egress of a run: what `CREATEOS_EXECUTOR_EGRESS` (`raw`) asks for, through
/// sandbox-core's one network decision ([`sandbox_core::plan::network`]). Without domains,
/// unset or `*` is unrestricted (flows call model providers), `none` is deny-all, anything else
/// a comma-separated list of address rules validated strictly (host names refused: CreateOS does
/// not enforce them; a single address is sent as `/32` or `/128`). With
/// `CREATEOS_EXECUTOR_ALLOWED_DOMAINS`, the gateway's `IP:port` plus those address rules; `*`
/// and `none` contradict a domain list and are refused, and so is a missing or unusable gateway.
/// Every restricted policy needs the link-local opt-in. Refusals name the variable.
pub fn egress_of(
    raw: Option<&str>,
    domains: &Domains,
    accept_exceptions: bool,
    gateway: &GatewaySetting,
) -> Result<EgressPolicy, SandboxError> {
    let base = base_of(raw, domains, false)?;
    let ask = NetworkAsk {
        base,
        domains,
        domains_setting: ENV_ALLOWED_DOMAINS,
        accept_exceptions,
        names: &SETTING_NAMES,
        domain_names: &DOMAIN_SETTING_NAMES,
    };
    plan::network(gateway, &ask)
        .map(|net| net.egress)
        .map_err(|e| {
            // Name the variable the bad rule came from.
            let named = [
                ENV_EGRESS,
                ENV_ACCEPT_EGRESS_EXCEPTIONS,
                ENV_ALLOWED_DOMAINS,
                ENV_GATEWAY_URL,
                ENV_GATEWAY_SECRET,
            ];
            if named.iter().any(|n| e.message().contains(n)) {
                e
            } else {
                SandboxError::refused(format!("{ENV_EGRESS}: {}", e.message()))
            }
        })
}

#[cfg(test)]
mod tests {
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
    fn defaults() {
        let s = ExecutorSettings::from_lookup(&env(&[])).unwrap();
        assert_eq!(s.rootfs, None);
        assert_eq!(s.shape, "s-4vcpu-8gb");
        assert_eq!(s.timeout_seconds, 600);
        assert_eq!(s.egress, EgressPolicy::AllowAll);
        assert!(!s.install_lfx);
        assert!(s.pip_extras.is_empty());
        assert_eq!(s.warm_pool, 0);
        assert_eq!(s.max_result_bytes, 67_108_864);
        let s = ExecutorSettings::from_lookup(&env(&[(ENV_WARM_POOL, " 3 ")])).unwrap();
        assert_eq!(s.warm_pool, 3);
        for (raw, bytes) in [
            ("1048576", 1_048_576),
            (" 268_435_456 ", 268_435_456),
            ("1073741824", 1_073_741_824),
        ] {
            let s = ExecutorSettings::from_lookup(&env(&[(ENV_MAX_RESULT_BYTES, raw)])).unwrap();
            assert_eq!(s.max_result_bytes, bytes, "{raw}");
        }
    }

    #[test]
    fn the_summary_names_each_effective_value_and_its_setting() {
        let s = ExecutorSettings::from_lookup(&env(&[
            (ENV_ROOTFS, "tpl_abc"),
            (ENV_TIMEOUT, "90"),
            (ENV_WARM_POOL, "2"),
        ]))
        .unwrap();
        let text = s.summary().join("\n");
        for part in [
            "rootfs: tpl_abc (CREATEOS_EXECUTOR_ROOTFS)",
            "shape: s-4vcpu-8gb",
            "timeout: 90 s",
            "warm pool: 2 guest(s)",
            "per-run install: off",
            "results: at most 67108864 bytes per flow run (CREATEOS_EXECUTOR_MAX_RESULT_BYTES)",
        ] {
            assert!(text.contains(part), "{part:?} not in {text}");
        }
        let default = ExecutorSettings::from_lookup(&env(&[])).unwrap().summary();
        assert!(default[0].contains("has no lfx"), "{}", default[0]);
        assert!(
            default
                .iter()
                .any(|l| l == "warm pool: off (CREATEOS_EXECUTOR_WARM_POOL unset or 0)")
        );
    }

    #[test]
    fn parses_values() {
        let s = ExecutorSettings::from_lookup(&env(&[
            (ENV_ROOTFS, "tpl_abc123"),
            (ENV_SHAPE, "s-2vcpu-4gb"),
            (ENV_TIMEOUT, "30"),
            (ENV_EGRESS, "203.0.113.0/24, 1.1.1.1:53"),
            (ENV_ACCEPT_EGRESS_EXCEPTIONS, "true"),
            (ENV_INSTALL_LFX, "yes"),
            (ENV_PIP, "langchain-experimental==0.4.2, pandas"),
        ]))
        .unwrap();
        assert_eq!(s.rootfs.as_deref(), Some("tpl_abc123"));
        assert_eq!(s.shape, "s-2vcpu-4gb");
        assert_eq!(s.timeout_seconds, 30);
        assert_eq!(s.egress.rules(), vec!["1.1.1.1:53", "203.0.113.0/24"]);
        // A single address is sent as CIDR, never bare (the verified forms, contract §4.1).
        for (given, sent) in [
            ("1.2.3.4/32", vec!["1.2.3.4/32"]),
            ("1.2.3.4", vec!["1.2.3.4/32"]),
            ("::1/128", vec!["::1/128"]),
            ("::1, 1.2.3.4:443", vec!["1.2.3.4:443", "::1/128"]),
        ] {
            let s = ExecutorSettings::from_lookup(&env(&[
                (ENV_EGRESS, given),
                (ENV_ACCEPT_EGRESS_EXCEPTIONS, "true"),
            ]))
            .unwrap();
            assert_eq!(s.egress.rules(), sent, "{given}");
        }
        assert!(s.install_lfx);
        assert_eq!(
            s.pip_extras,
            vec!["langchain-experimental==0.4.2", "pandas"]
        );
        let s = ExecutorSettings::from_lookup(&env(&[
            (ENV_EGRESS, "none"),
            (ENV_ACCEPT_EGRESS_EXCEPTIONS, "1"),
        ]))
        .unwrap();
        assert_eq!(s.egress, EgressPolicy::DenyAll);
    }

    #[test]
    fn bad_values_name_the_executor_variable() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[(ENV_ROOTFS, "a b")], ENV_ROOTFS),
            (&[(ENV_SHAPE, "s 4")], ENV_SHAPE),
            (&[(ENV_TIMEOUT, "0")], ENV_TIMEOUT),
            (&[(ENV_TIMEOUT, "ten")], ENV_TIMEOUT),
            (&[(ENV_INSTALL_LFX, "perhaps")], ENV_INSTALL_LFX),
            (
                &[(ENV_INSTALL_LFX, "true"), (ENV_PIP, "--index-url=http://x")],
                ENV_PIP,
            ),
            (&[(ENV_PIP, "pandas")], ENV_INSTALL_LFX),
            (
                &[
                    (ENV_EGRESS, "pypi.org"),
                    (ENV_ACCEPT_EGRESS_EXCEPTIONS, "true"),
                ],
                ENV_EGRESS,
            ),
            (
                &[
                    (ENV_EGRESS, "10.0.0.1/8"),
                    (ENV_ACCEPT_EGRESS_EXCEPTIONS, "true"),
                ],
                ENV_EGRESS,
            ),
            (&[(ENV_EGRESS, "*,1.1.1.1")], ENV_EGRESS),
            (&[(ENV_EGRESS, "1.1.1.1")], ENV_ACCEPT_EGRESS_EXCEPTIONS),
            (&[(ENV_EGRESS, "none")], ENV_ACCEPT_EGRESS_EXCEPTIONS),
            (&[(ENV_WARM_POOL, "17")], ENV_WARM_POOL),
            (&[(ENV_WARM_POOL, "-1")], ENV_WARM_POOL),
            (&[(ENV_WARM_POOL, "two")], ENV_WARM_POOL),
            (&[(ENV_MAX_RESULT_BYTES, "1048575")], ENV_MAX_RESULT_BYTES),
            (
                &[(ENV_MAX_RESULT_BYTES, "1073741825")],
                ENV_MAX_RESULT_BYTES,
            ),
            (&[(ENV_MAX_RESULT_BYTES, "64MiB")], ENV_MAX_RESULT_BYTES),
            (&[(ENV_MAX_RESULT_BYTES, "-1")], ENV_MAX_RESULT_BYTES),
            (
                &[(ENV_WARM_POOL, "2"), (ENV_INSTALL_LFX, "true")],
                ENV_INSTALL_LFX,
            ),
        ];
        for (pairs, var) in cases {
            let e = ExecutorSettings::from_lookup(&env(pairs)).unwrap_err();
            let text = e.to_string();
            assert!(e.kind().is_unavailable(), "{pairs:?}: {text}");
            assert!(text.contains(var), "{pairs:?}: {text}");
            assert!(!text.contains("LANGFLOW_SANDBOX"), "{pairs:?}: {text}");
        }
    }

    #[test]
    fn link_local_refusal_names_executor_settings() {
        let e = egress_of(
            Some("203.0.113.7"),
            &Domains::default(),
            false,
            &GatewaySetting::Off,
        )
        .unwrap_err();
        let text = e.to_string();
        assert!(text.contains("169.254.0.0/16"), "{text}");
        assert!(
            text.contains("CREATEOS_EXECUTOR_ACCEPT_EGRESS_EXCEPTIONS=true"),
            "{text}"
        );
        assert!(text.contains("CREATEOS_EXECUTOR_EGRESS=*"), "{text}");
        assert!(!text.contains("LANGFLOW_"), "{text}");
    }

    #[test]
    fn allowed_domains_make_the_gateway_the_egress_and_refuse_what_contradicts_them() {
        use sandbox_core::gateway::{ENV_GATEWAY_SECRET, ENV_GATEWAY_URL};
        let gw = [
            (ENV_ACCEPT_EGRESS_EXCEPTIONS, "true"),
            (ENV_GATEWAY_URL, "http://10.0.0.5:3128"),
            (ENV_GATEWAY_SECRET, "0123456789abcdef0123456789abcdef-exec"),
            (ENV_ALLOWED_DOMAINS, "pypi.org, *.pythonhosted.org"),
        ];
        let s = ExecutorSettings::from_lookup(&env(&gw)).unwrap();
        assert_eq!(s.egress.rules(), ["10.0.0.5:3128"]);
        assert_eq!(s.domains.entries(), ["*.pythonhosted.org", "pypi.org"]);
        let mut with_rules = gw.to_vec();
        with_rules.push((ENV_EGRESS, "203.0.113.0/24"));
        let s = ExecutorSettings::from_lookup(&env(&with_rules)).unwrap();
        assert_eq!(s.egress.rules(), ["10.0.0.5:3128", "203.0.113.0/24"]);
        for (extra, needles) in [
            (
                vec![(ENV_EGRESS, "*")],
                vec![ENV_EGRESS, ENV_ALLOWED_DOMAINS],
            ),
            (
                vec![(ENV_EGRESS, "none")],
                vec![ENV_EGRESS, ENV_ALLOWED_DOMAINS],
            ),
            (vec![(ENV_EGRESS, "pypi.org")], vec![ENV_EGRESS]),
            (
                vec![(ENV_ALLOWED_DOMAINS, "pypi.org,10.1.2.3")],
                vec![ENV_ALLOWED_DOMAINS, "10.1.2.3"],
            ),
            (
                vec![(ENV_GATEWAY_URL, "")],
                vec![ENV_ALLOWED_DOMAINS, ENV_GATEWAY_URL],
            ),
            (
                vec![(ENV_ACCEPT_EGRESS_EXCEPTIONS, "false")],
                vec![ENV_ACCEPT_EGRESS_EXCEPTIONS],
            ),
        ] {
            let mut pairs = gw.to_vec();
            pairs.retain(|(k, _)| !extra.iter().any(|(e, _)| e == k));
            pairs.extend(extra.iter().filter(|(_, v)| !v.is_empty()));
            let e = ExecutorSettings::from_lookup(&env(&pairs)).unwrap_err();
            for needle in needles {
                assert!(e.to_string().contains(needle), "{needle}: {e}");
            }
        }
    }

    #[test]
    fn on_opensandbox_domains_are_the_guests_own_rules_with_no_gateway() {
        let on = |pairs: &[(&str, &str)]| {
            ExecutorSettings::from_lookup_on(&env(pairs), ProviderKind::OpenSandbox)
        };
        // No gateway and no link-local opt-in: the names are the policy.
        let s = on(&[(ENV_ALLOWED_DOMAINS, "PyPI.org, *.pythonhosted.org")]).unwrap();
        assert_eq!(
            s.egress,
            EgressPolicy::Domains(vec!["*.pythonhosted.org".into(), "pypi.org".into()])
        );
        assert!(
            s.summary().iter().any(|l| l.contains("no gateway")),
            "{:?}",
            s.summary()
        );
        // Without domains: unrestricted by default, `none` deny-all without the opt-in.
        assert_eq!(on(&[]).unwrap().egress, EgressPolicy::AllowAll);
        assert_eq!(
            on(&[(ENV_EGRESS, "none")]).unwrap().egress,
            EgressPolicy::DenyAll
        );
        // Refusals name the variable: an address or CIDR entry, a port, address rules, and
        // `none` or `*` beside a list.
        for (pairs, needles) in [
            (
                vec![(ENV_ALLOWED_DOMAINS, "pypi.org, 10.0.0.0/8")],
                vec![ENV_ALLOWED_DOMAINS, "address rule", "10.0.0.0/8"],
            ),
            (
                vec![(ENV_ALLOWED_DOMAINS, "1.2.3.4")],
                vec![ENV_ALLOWED_DOMAINS, "address rule"],
            ),
            (
                vec![(ENV_ALLOWED_DOMAINS, "pypi.org:443")],
                vec![ENV_ALLOWED_DOMAINS, "not a domain name"],
            ),
            (
                vec![(ENV_EGRESS, "10.0.0.0/8")],
                vec![ENV_EGRESS, ENV_ALLOWED_DOMAINS, "domain names only"],
            ),
            (
                vec![(ENV_ALLOWED_DOMAINS, "pypi.org"), (ENV_EGRESS, "none")],
                vec![ENV_EGRESS, ENV_ALLOWED_DOMAINS, "deny-all but those names"],
            ),
        ] {
            let e = on(&pairs).unwrap_err();
            for needle in needles {
                assert!(e.to_string().contains(needle), "{needle}: {e}");
            }
        }
        // CreateOS is unchanged: domains still need the gateway.
        let e =
            ExecutorSettings::from_lookup(&env(&[(ENV_ALLOWED_DOMAINS, "pypi.org")])).unwrap_err();
        assert!(e.to_string().contains(ENV_GATEWAY_URL), "{e}");
    }
}
