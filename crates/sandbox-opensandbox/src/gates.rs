//! The OpenSandbox provider's checks, without I/O: the egress policy sent and its read-back,
//! the RuntimeClass cross-check, the in-guest probe and the host-network-mode signs. Each
//! refusal names the server or plugin setting to change.

use opensandbox_api::{EnforcementMode, NetworkPolicy, PolicyAction, PolicyStatus, RuntimeClass};

use sandbox_core::egress::{EgressPolicy, domain_entry};
use sandbox_core::error::SandboxError;

/// `OPEN_SANDBOX_RUNTIME_CLASS`: the Kubernetes RuntimeClass the server's sandboxes must
/// report in their inspect diagnostics (e.g. `kata-fc`).
pub const ENV_RUNTIME_CLASS: &str = "OPEN_SANDBOX_RUNTIME_CLASS";
/// `OPEN_SANDBOX_HOST_KERNEL`: the kernel release(s) of the server's hosts or nodes,
/// comma-separated: a guest reporting one of them shares the host kernel and is refused.
pub const ENV_HOST_KERNEL: &str = "OPEN_SANDBOX_HOST_KERNEL";
/// `OPEN_SANDBOX_SERVER_UNREACHABLE`: the operator's word that no sandbox can route to the
/// server's API or its execd proxy (it listens on loopback only, or a firewall keeps the
/// sandbox network from it). Without it, unrestricted egress sends a rule denying the server
/// and needs the egress sidecar to enforce it.
pub const ENV_SERVER_UNREACHABLE: &str = "OPEN_SANDBOX_SERVER_UNREACHABLE";

/// The egress a run asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Egress {
    /// Deny everything (the default).
    DenyAll,
    /// Deny everything but these domains (FQDN or `*.wildcard`).
    Domains {
        /// The setting the domains came from, as a refusal names it (the surface's: the
        /// backend hands lfx's allowlist setting); this crate spells no surface's setting.
        setting: &'static str,
        /// The domains, as the setting listed them.
        domains: Vec<String>,
    },
    /// No restriction: no policy is sent and no sidecar runs.
    Unrestricted,
}

/// What every egress policy must keep a guest from: the OpenSandbox server itself, whose API
/// and execd proxy (which 1.1.1 does not authenticate) would let a guest drive any other
/// sandbox whose id it learns (issue 45).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerGuard {
    /// The server's URL as the client reaches it (`OPEN_SANDBOX_DOMAIN`, read).
    url: Option<url::Url>,
    /// `OPEN_SANDBOX_SERVER_UNREACHABLE`: the operator's word that no sandbox can route to the
    /// server (it listens on loopback only, or a firewall drops the sandbox network's traffic
    /// to it).
    unreachable: bool,
}

impl ServerGuard {
    /// The guard for a client whose base URL is `server_url`.
    pub fn new(server_url: &str, unreachable: bool) -> Self {
        ServerGuard {
            url: url::Url::parse(server_url).ok(),
            unreachable,
        }
    }

    /// The server's host as a rule names it: lowercased, without a trailing dot or an IPv6
    /// literal's brackets.
    pub fn host(&self) -> Option<String> {
        let host = self.url.as_ref()?.host_str()?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        Some(host.trim_end_matches('.').to_ascii_lowercase())
    }

    /// The policy for unrestricted egress: none when the operator says the server is out of
    /// every sandbox's reach; otherwise allow by default with a deny rule for the server's
    /// host, which the sidecar must read back. A server reached over loopback is refused: no
    /// rule can name the address a guest would use for it (the sandbox bridge's gateway).
    fn open_policy(&self) -> Result<Option<NetworkPolicy>, SandboxError> {
        if self.unreachable {
            return Ok(None);
        }
        let (Some(url), Some(host)) = (self.url.as_ref(), self.host()) else {
            return Err(SandboxError::refused(format!(
                "unrestricted egress needs a rule that keeps guests from the OpenSandbox server,                  and the server's host cannot be read from OPEN_SANDBOX_DOMAIN; fix the domain,                  or, if no sandbox can route to the server, set {ENV_SERVER_UNREACHABLE}=true"
            )));
        };
        if opensandbox_api::is_loopback(url) {
            return Err(SandboxError::refused(format!(
                "unrestricted egress would let a guest reach the OpenSandbox server, which this                  process reaches over loopback ({}): no egress rule can name the address a                  guest would use (the sandbox bridge's gateway). If the server listens on                  loopback only, or a firewall keeps the sandbox network from it, set                  {ENV_SERVER_UNREACHABLE}=true; otherwise deny egress or allow a list of                  domains",
                outside_text::snippet(&host, 80)
            )));
        }
        Ok(Some(
            NetworkPolicy {
                default_action: PolicyAction::Allow,
                egress: Vec::new(),
            }
            .deny(host),
        ))
    }
}

/// The `networkPolicy` to send for `egress` ([`ServerGuard::open_policy`] for
/// [`Egress::Unrestricted`]). An address or CIDR rule is refused: the lifecycle API does not
/// support them and `dns` mode could not enforce them; a rule that is not a domain is refused
/// (by [`domain_entry`], naming the setting the surface handed in with the domains).
pub fn policy_for(
    egress: &Egress,
    guard: &ServerGuard,
) -> Result<Option<NetworkPolicy>, SandboxError> {
    match egress {
        Egress::Unrestricted => guard.open_policy(),
        Egress::DenyAll => Ok(Some(NetworkPolicy::deny_all())),
        Egress::Domains { setting, domains } => {
            let names = domains
                .iter()
                .map(|raw| {
                    // A blank entry is refused here: lfx hands a list, not a comma-joined text.
                    domain_entry(setting, raw)?.ok_or_else(|| {
                        SandboxError::refused(format!("{setting} holds a blank entry; remove it"))
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Some(deny_all_but(names)))
        }
    }
}

/// The `networkPolicy` for sandbox-core's neutral decision (what the component and the
/// executor ask for through the provider seam): [`ServerGuard::open_policy`] for allow-all,
/// deny-all as itself, a domain allowlist ([`EgressPolicy::Domains`]) as deny plus one allow
/// rule per domain, each checked again by [`domain_entry`]. Address rules are refused:
/// OpenSandbox allowlists hold domain names only.
pub fn policy_of(
    policy: &EgressPolicy,
    guard: &ServerGuard,
) -> Result<Option<NetworkPolicy>, SandboxError> {
    match policy {
        EgressPolicy::AllowAll => guard.open_policy(),
        EgressPolicy::DenyAll => Ok(Some(NetworkPolicy::deny_all())),
        EgressPolicy::Domains(domains) => {
            let mut names = Vec::with_capacity(domains.len());
            for raw in domains {
                names.extend(domain_entry("the domain allowlist", raw)?);
            }
            Ok(Some(deny_all_but(names)))
        }
        EgressPolicy::Rules(rules) => Err(SandboxError::refused(format!(
            "the OpenSandbox provider refuses address rules ({} given): its egress sidecar \
             allowlists domain names; use a domain allowlist, or deny all egress",
            rules.len()
        ))),
    }
}

/// Refuses a policy that allows the OpenSandbox server itself: an allow rule naming the host of
/// `server_url` (the client's base URL), or a `*.` wildcard it falls under. Such a guest could
/// drive the server's API, and through its execd proxy (which 1.1.1 does not authenticate)
/// any other sandbox whose id it learns (issue 45).
pub fn refuse_server_in_allowlist(
    policy: Option<&NetworkPolicy>,
    guard: &ServerGuard,
) -> Result<(), SandboxError> {
    let (Some(policy), Some(host)) = (policy, guard.host()) else {
        return Ok(());
    };
    for rule in &policy.egress {
        if rule.action != PolicyAction::Allow {
            continue;
        }
        let target = rule.target.trim_end_matches('.').to_ascii_lowercase();
        let covers = match target.strip_prefix("*.") {
            Some(suffix) => host.ends_with(&format!(".{suffix}")),
            None => target == host,
        };
        if covers {
            return Err(SandboxError::refused(format!(
                "the egress allowlist entry {} covers the OpenSandbox server itself ({}): a \
                 guest could drive the server's API and, through its execd proxy, other \
                 sandboxes; remove the entry from the allowlist, or reach the server under a \
                 name the allowlist does not cover (OPEN_SANDBOX_DOMAIN)",
                outside_text::snippet(&rule.target, 80),
                outside_text::snippet(&host, 80)
            )));
        }
    }
    Ok(())
}

/// Deny-all with one allow rule per name, each once, in the order first given.
fn deny_all_but(names: Vec<String>) -> NetworkPolicy {
    let mut policy = NetworkPolicy::deny_all();
    for d in names {
        if !policy.egress.iter().any(|r| r.target == d) {
            policy = policy.allow(d);
        }
    }
    policy
}

/// Checks the sidecar's read-back against what was sent: `dns+nft`, the default action sent
/// (`deny`, or `allow` with the rule that denies the server) and exactly the rules sent, in
/// any order.
pub fn check_policy_readback(sent: &NetworkPolicy, got: &PolicyStatus) -> Result<(), SandboxError> {
    if got.enforcement_mode != EnforcementMode::DnsNft {
        return Err(SandboxError::refused(format!(
            "the OpenSandbox egress sidecar enforces in mode {:?}, which filters only name \
             lookups (connections to addresses pass); set [egress] mode = \"dns+nft\" in the \
             server's configuration",
            outside_text::snippet(got.enforcement_mode.as_str(), 40)
        )));
    }
    let Some(policy) = &got.policy else {
        return Err(SandboxError::refused(
            "the OpenSandbox egress sidecar read back no policy; check the server's [egress] \
             image and that the sidecar runs",
        ));
    };
    if policy.default_action != sent.default_action {
        return Err(SandboxError::refused(format!(
            "the OpenSandbox egress sidecar reads back defaultAction {:?}, not {}; the \
             sandbox was destroyed: check the server's [egress] configuration",
            outside_text::snippet(policy.default_action.as_str(), 40),
            sent.default_action.as_str()
        )));
    }
    let mut want: Vec<(&str, &str)> = sent
        .egress
        .iter()
        .map(|r| (r.action.as_str(), r.target.as_str()))
        .collect();
    let mut have: Vec<(&str, &str)> = policy
        .egress
        .iter()
        .map(|r| (r.action.as_str(), r.target.as_str()))
        .collect();
    want.sort_unstable();
    have.sort_unstable();
    if want != have {
        let shown: Vec<String> = have
            .iter()
            .take(8)
            .map(|(a, t)| format!("{a} {}", outside_text::snippet(t, 80)))
            .collect();
        return Err(SandboxError::refused(format!(
            "the OpenSandbox egress sidecar reads back rules [{}] ({} rules), not the {} \
             sent; the sandbox was destroyed: check the server's [egress] configuration",
            shown.join(", "),
            have.len(),
            want.len()
        )));
    }
    Ok(())
}

/// The refusal for a `networkpolicy` read-back that answered 502 or 404: no sidecar. `sent`
/// is the policy that needed one: for unrestricted egress (allow by default, the server
/// denied) the way out is [`ENV_SERVER_UNREACHABLE`], for the others unrestricted egress.
pub fn no_sidecar(sent: &NetworkPolicy, detail: &str) -> SandboxError {
    let otherwise = if sent.default_action == PolicyAction::Allow {
        format!(
            "; unrestricted egress needs the sidecar to keep guests from the server itself, \
             unless no sandbox can route to the server: then set {ENV_SERVER_UNREACHABLE}=true"
        )
    } else {
        ", or allow unrestricted egress".to_owned()
    };
    SandboxError::refused(format!(
        "the OpenSandbox server runs no egress sidecar for this sandbox ({}); configure an \
         [egress] image with mode = \"dns+nft\" on the server (and Docker bridge networking or \
         Kubernetes){otherwise}",
        outside_text::snippet(detail, 200)
    ))
}

/// Cross-checks the inspect diagnostics' RuntimeClass against the expected one.
pub fn check_runtime_class(expected: &str, got: &RuntimeClass) -> Result<(), SandboxError> {
    match got {
        RuntimeClass::Named(n) if n == expected => Ok(()),
        RuntimeClass::Named(n) => Err(SandboxError::refused(format!(
            "the OpenSandbox sandbox runs with RuntimeClass {}, not {expected} as \
             {ENV_RUNTIME_CLASS} says; set [secure_runtime] k8s_runtime_class = \
             \"{expected}\" on the server, or correct {ENV_RUNTIME_CLASS}",
            outside_text::snippet(n, 70)
        ))),
        RuntimeClass::NotReported => Err(SandboxError::refused(format!(
            "the OpenSandbox server reports no RuntimeClass for the sandbox, but \
             {ENV_RUNTIME_CLASS}={expected}; a Docker server has none (unset \
             {ENV_RUNTIME_CLASS}), a Kubernetes one needs [secure_runtime] configured"
        ))),
        RuntimeClass::Conflicting(names) => Err(SandboxError::refused(format!(
            "the OpenSandbox inspect diagnostics name several RuntimeClasses ({}); cannot \
             check {ENV_RUNTIME_CLASS}",
            outside_text::snippet(&names.join(", "), 200)
        ))),
    }
}

/// The shell line of the first exec: the identity canary and the isolation probe, one
/// `key=value` per line.
pub const PROBE_COMMAND: &str = "printf 'lf-id=%s\\n' \"$OPENSANDBOX_ID\"; \
    printf 'lf-release=%s\\n' \"$(uname -r 2>/dev/null)\"; \
    printf 'lf-version=%s\\n' \"$(head -c 300 /proc/version 2>/dev/null | tr '\\n' ' ')\"; \
    printf 'lf-dmesg=%s\\n' \"$(dmesg 2>/dev/null | head -n 3 | tr '\\n' ' ' | head -c 300)\"";

/// What the probe found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Probe {
    /// `$OPENSANDBOX_ID` as the guest sees it.
    pub id: String,
    /// `uname -r`.
    pub release: String,
    /// The start of `/proc/version`.
    pub version: String,
    /// The start of `dmesg` (empty where it is not readable).
    pub dmesg: String,
}

impl Probe {
    /// Parses the probe's output.
    pub fn parse(stdout: &str) -> Probe {
        let mut p = Probe::default();
        for line in stdout.lines() {
            let Some((k, v)) = line.split_once('=') else {
                continue;
            };
            let v = v.trim().to_owned();
            match k {
                "lf-id" => p.id = v,
                "lf-release" => p.release = v,
                "lf-version" => p.version = v,
                "lf-dmesg" => p.dmesg = v,
                _ => {}
            }
        }
        p
    }

    /// Whether the guest shows gVisor's signature.
    pub fn is_gvisor(&self) -> bool {
        let has = |s: &str| s.to_ascii_lowercase().contains("gvisor");
        has(&self.dmesg) || has(&self.version) || self.release == "4.4.0"
    }
}

/// The identity canary: the guest's `$OPENSANDBOX_ID` must be the sandbox's own id.
pub fn check_identity(sandbox_id: &str, probe: &Probe) -> Result<(), SandboxError> {
    if probe.id == sandbox_id {
        return Ok(());
    }
    Err(SandboxError::refused(format!(
        "a command sent to OpenSandbox sandbox {sandbox_id} ran in {} : the server routes \
         commands between sandboxes, as a Docker server in host network mode does; set \
         [docker] network_mode = \"bridge\" (with publish_host = \"127.0.0.1\") or use \
         Kubernetes",
        if probe.id.is_empty() {
            "a guest without $OPENSANDBOX_ID".to_owned()
        } else {
            format!("sandbox {}", outside_text::snippet(&probe.id, 64))
        }
    )))
}

/// A host-network-mode endpoint: execd's port published as `host:44772` with no per-sandbox
/// path or port, shared by every sandbox.
pub fn check_endpoint(endpoint: &str) -> Result<(), SandboxError> {
    let bare = endpoint
        .trim()
        .trim_start_matches("http://")
        .trim_start_matches("https://")
        .trim_end_matches('/');
    if !bare.contains('/') && bare.ends_with(":44772") {
        return Err(SandboxError::refused(format!(
            "the OpenSandbox server publishes every sandbox's execd at {} (host network \
             mode: commands reach the wrong sandbox and guests share the host's network); \
             set [docker] network_mode = \"bridge\" with publish_host = \"127.0.0.1\", or use \
             Kubernetes",
            outside_text::snippet(bare, 80)
        )));
    }
    Ok(())
}

/// Judges the probe when isolation is attested: no gVisor, no host kernel.
pub fn check_attested_probe(probe: &Probe, host_kernels: &[String]) -> Result<(), SandboxError> {
    if probe.is_gvisor() {
        return Err(SandboxError::refused(
            "the OpenSandbox guest runs under gVisor (a user-space kernel, not a VM), though \
             OPEN_SANDBOX_ATTEST_ISOLATION=hardware-virtualized; set the server's \
             [secure_runtime] type to kata or firecracker, or unset the attestation",
        ));
    }
    if host_kernels.contains(&probe.release) {
        return Err(SandboxError::refused(format!(
            "the OpenSandbox guest reports kernel {}, which {ENV_HOST_KERNEL} names as the \
             host's: it shares the host kernel (runc), not a VM; set the server's \
             [secure_runtime] type to kata or firecracker, or unset \
             OPEN_SANDBOX_ATTEST_ISOLATION",
            outside_text::snippet(&probe.release, 80)
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server on another host, reachable by guests as far as the plugin knows.
    fn remote() -> ServerGuard {
        ServerGuard::new("https://sandboxes.corp.internal:8443/v1", false)
    }

    /// Issue 45: an allowlist cannot let a guest reach the server's own API or proxy.
    #[test]
    fn an_allowlist_covering_the_server_is_refused() {
        let policy = |names: &[&str]| {
            policy_of(
                &EgressPolicy::Domains(names.iter().map(|n| (*n).to_owned()).collect()),
                &remote(),
            )
            .unwrap()
        };
        let server = &remote();
        for covering in [
            &["sandboxes.corp.internal"][..],
            &["pypi.org", "*.corp.internal"],
        ] {
            let e = refuse_server_in_allowlist(policy(covering).as_ref(), server).unwrap_err();
            assert!(
                e.to_string()
                    .contains("covers the OpenSandbox server itself"),
                "{e}"
            );
        }
        for fine in [&["pypi.org"][..], &["*.pythonhosted.org", "internal"]] {
            refuse_server_in_allowlist(policy(fine).as_ref(), server).unwrap();
        }
        refuse_server_in_allowlist(None, server).unwrap();
        let local = ServerGuard::new("http://127.0.0.1:8080/v1", false);
        refuse_server_in_allowlist(Some(&NetworkPolicy::deny_all()), &local).unwrap();
    }

    /// Issue 45: unrestricted egress keeps guests from the server: a deny rule for its host
    /// (read back like any policy), nothing only where the operator says no sandbox can route
    /// to it, and a refusal naming that setting for a server reached over loopback, which no
    /// rule can name for a guest.
    #[test]
    fn unrestricted_egress_denies_the_server_or_is_refused() {
        let open = NetworkPolicy {
            default_action: PolicyAction::Allow,
            egress: Vec::new(),
        };
        for url in [
            "https://sandboxes.corp.internal:8443/v1",
            "https://SandBoxes.Corp.Internal.:8443",
        ] {
            let guard = ServerGuard::new(url, false);
            let want = Some(open.clone().deny("sandboxes.corp.internal"));
            assert_eq!(policy_for(&Egress::Unrestricted, &guard).unwrap(), want);
            assert_eq!(policy_of(&EgressPolicy::AllowAll, &guard).unwrap(), want);
        }
        let v6 = ServerGuard::new("https://[fd00::5]:8443", false);
        assert_eq!(
            policy_of(&EgressPolicy::AllowAll, &v6).unwrap(),
            Some(open.clone().deny("fd00::5"))
        );
        for url in [
            "http://127.0.0.1:8080",
            "http://localhost:8080/v1",
            "http://[::1]:8080",
        ] {
            let e = policy_of(&EgressPolicy::AllowAll, &ServerGuard::new(url, false)).unwrap_err();
            assert!(
                e.message().contains("OPEN_SANDBOX_SERVER_UNREACHABLE=true"),
                "{e}"
            );
            assert!(e.message().contains("loopback"), "{e}");
            let e = policy_for(&Egress::Unrestricted, &ServerGuard::new(url, false)).unwrap_err();
            assert!(
                e.message().contains("OPEN_SANDBOX_SERVER_UNREACHABLE"),
                "{e}"
            );
            // The operator's word: no policy, no sidecar needed.
            let fenced = ServerGuard::new(url, true);
            assert_eq!(policy_of(&EgressPolicy::AllowAll, &fenced).unwrap(), None);
            assert_eq!(policy_for(&Egress::Unrestricted, &fenced).unwrap(), None);
        }
        // The other policies do not change with the word.
        let fenced = ServerGuard::new("http://127.0.0.1:8080", true);
        assert_eq!(
            policy_of(&EgressPolicy::DenyAll, &fenced).unwrap(),
            Some(NetworkPolicy::deny_all())
        );
        // The open policy reads back as allow plus the deny rule, and nothing else.
        let sent = open.clone().deny("sandboxes.corp.internal");
        let back = |default: &str, rules: &[(&str, &str)]| -> PolicyStatus {
            serde_json::from_value(serde_json::json!({
                "status": "ok", "mode": "enforcing", "enforcementMode": "dns+nft",
                "policy": {"defaultAction": default, "egress": rules.iter()
                    .map(|(a, t)| serde_json::json!({"action": a, "target": t}))
                    .collect::<Vec<_>>()},
            }))
            .unwrap()
        };
        check_policy_readback(
            &sent,
            &back("allow", &[("deny", "sandboxes.corp.internal")]),
        )
        .unwrap();
        for (default, rules) in [
            ("allow", &[][..]),
            ("allow", &[("allow", "sandboxes.corp.internal")][..]),
            ("deny", &[("deny", "sandboxes.corp.internal")][..]),
        ] {
            assert!(check_policy_readback(&sent, &back(default, rules)).is_err());
        }
        // No sidecar: the refusal names the way out that fits the policy.
        let e = no_sidecar(&sent, "502");
        assert!(
            e.message().contains("OPEN_SANDBOX_SERVER_UNREACHABLE=true"),
            "{e}"
        );
        let e = no_sidecar(&NetworkPolicy::deny_all(), "502");
        assert!(e.message().contains("allow unrestricted egress"), "{e}");
    }

    fn status(mode: &str, default: &str, rules: &[&str]) -> PolicyStatus {
        serde_json::from_value(serde_json::json!({
            "status": "ok",
            "mode": "enforcing",
            "enforcementMode": mode,
            "policy": {
                "defaultAction": default,
                "egress": rules.iter().map(|t| serde_json::json!({"action": "allow", "target": t})).collect::<Vec<_>>(),
            }
        }))
        .unwrap()
    }

    #[test]
    fn policies_are_deny_all_with_domains_and_refuse_addresses() {
        assert_eq!(
            policy_for(&Egress::DenyAll, &remote()).unwrap(),
            Some(NetworkPolicy::deny_all())
        );
        let p = policy_for(
            &Egress::Domains {
                setting: "LANGFLOW_SANDBOX_ALLOWED_DOMAINS",
                domains: vec![
                    "PyPI.org.".into(),
                    "*.example.com".into(),
                    "pypi.org".into(),
                ],
            },
            &remote(),
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            p,
            NetworkPolicy::deny_all()
                .allow("pypi.org")
                .allow("*.example.com")
        );
        for bad in ["10.0.0.0/8", "1.2.3.4", "::1", "a b", "", "1.2.3"] {
            let e = policy_for(
                &Egress::Domains {
                    setting: "LANGFLOW_SANDBOX_ALLOWED_DOMAINS",
                    domains: vec![bad.into()],
                },
                &remote(),
            )
            .unwrap_err();
            assert!(
                e.message().contains("LANGFLOW_SANDBOX_ALLOWED_DOMAINS"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn the_neutral_domain_policy_is_deny_plus_one_rule_per_domain() {
        let p = policy_of(
            &EgressPolicy::Domains(vec!["*.example.com".into(), "pypi.org".into()]),
            &remote(),
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            p,
            NetworkPolicy::deny_all()
                .allow("*.example.com")
                .allow("pypi.org")
        );
        assert_eq!(
            policy_of(&EgressPolicy::DenyAll, &remote()).unwrap(),
            Some(NetworkPolicy::deny_all())
        );
        // A hand-built variant is checked again.
        let e = policy_of(&EgressPolicy::Domains(vec!["10.0.0.1".into()]), &remote()).unwrap_err();
        assert!(e.message().contains("address rule"), "{e}");
        let rules = EgressPolicy::Rules(vec![
            sandbox_core::egress::validate_address_rule("10.0.0.0/8").unwrap(),
        ]);
        assert!(policy_of(&rules, &remote()).is_err());
    }

    #[test]
    fn readback_needs_dns_nft_deny_and_the_exact_rules() {
        let sent = NetworkPolicy::deny_all().allow("a.com").allow("b.com");
        check_policy_readback(&sent, &status("dns+nft", "deny", &["b.com", "a.com"])).unwrap();
        let e =
            check_policy_readback(&sent, &status("dns", "deny", &["a.com", "b.com"])).unwrap_err();
        assert!(e.message().contains("dns+nft"), "{e}");
        let e = check_policy_readback(&sent, &status("dns+nft", "allow", &["a.com", "b.com"]))
            .unwrap_err();
        assert!(e.message().contains("defaultAction"), "{e}");
        for rules in [&["a.com"][..], &["a.com", "b.com", "c.com"], &[]] {
            assert!(check_policy_readback(&sent, &status("dns+nft", "deny", rules)).is_err());
        }
    }

    #[test]
    fn runtime_class_cross_check() {
        check_runtime_class("kata-fc", &RuntimeClass::Named("kata-fc".into())).unwrap();
        for got in [
            RuntimeClass::Named("kata-qemu".into()),
            RuntimeClass::NotReported,
            RuntimeClass::Conflicting(vec!["a".into(), "b".into()]),
        ] {
            let e = check_runtime_class("kata-fc", &got).unwrap_err();
            assert!(e.message().contains(ENV_RUNTIME_CLASS), "{e}");
        }
    }

    #[test]
    fn probe_identity_gvisor_and_host_kernel() {
        let p = Probe::parse(
            "lf-id=abc\nlf-release=6.1.62-kata\nlf-version=Linux version 6.1.62\nlf-dmesg=\n",
        );
        assert_eq!(p.release, "6.1.62-kata");
        check_identity("abc", &p).unwrap();
        assert!(
            check_identity("xyz", &p)
                .unwrap_err()
                .message()
                .contains("network_mode")
        );
        check_attested_probe(&p, &["6.18.44".into()]).unwrap();
        let e = check_attested_probe(&p, &["6.1.62-kata".into()]).unwrap_err();
        assert!(e.message().contains(ENV_HOST_KERNEL));
        let g = Probe::parse("lf-id=abc\nlf-release=4.4.0\nlf-dmesg=Starting gVisor...\n");
        assert!(g.is_gvisor());
        assert!(
            check_attested_probe(&g, &[])
                .unwrap_err()
                .message()
                .contains("gVisor")
        );
    }

    #[test]
    fn host_mode_endpoints() {
        assert!(check_endpoint("127.0.0.1:44772").is_err());
        check_endpoint("127.0.0.1:8080/sandboxes/x/proxy/44772").unwrap();
        check_endpoint("10.0.0.5:32811").unwrap();
    }
}
