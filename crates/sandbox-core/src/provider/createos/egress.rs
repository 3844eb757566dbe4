//! CreateOS's spelling of an egress policy, and what it reads back.
//!
//! CreateOS egress is an allowlist with no deny-all token: `null`, `[]` and `["*"]` all mean
//! allow-all. Deny-all is spelled as one unroutable reserved range, [`DENY_ALL_RULE`]. Hostname
//! rules are accepted and echoed but never enforced, and [`LINK_LOCAL_HOLE`] (the metadata
//! service) stays reachable under any policy, so every restricted policy needs the operator's
//! opt-in ([`EgressPolicy::restricted`]). Rules are sent only in forms with live evidence of
//! enforcement, `IP:port` and CIDR: a single address goes out as `/32` (`/128`), never bare
//! (see [`crate::egress::AddressRule`]).
//!
//! These are methods of the provider-neutral [`EgressPolicy`], defined here so that everything
//! CreateOS-specific about egress sits in CreateOS's module.

use std::collections::BTreeSet;
use std::fmt;

use crate::egress::{
    ALLOW_ALL_RULE, AddressRule, EgressException, EgressPolicy, validate_address_rule,
};
use crate::error::SandboxError;
use crate::vars::SettingNames;

/// The rule that spells deny-all: IANA-reserved and unroutable, so only the final DROP applies.
pub const DENY_ALL_RULE: &str = "240.0.0.0/4";
/// The range every CreateOS guest can reach whatever the policy says.
pub const LINK_LOCAL_HOLE: &str = "169.254.0.0/16";

/// The hole every CreateOS guest has whatever its egress: the VM metadata service.
pub const LINK_LOCAL: EgressException = EgressException {
    provider: "CreateOS",
    range: LINK_LOCAL_HOLE,
    what: "the VM metadata service",
};

/// Every hole of a CreateOS guest (the opt-in covers them all).
pub const EXCEPTIONS: &[EgressException] = &[LINK_LOCAL];

impl EgressPolicy {
    /// A restricted policy on CreateOS: deny-all when `rules` is empty, else exactly those
    /// address rules (each validated by [`validate_address_rule`]). Refused unless the operator
    /// accepted that a CreateOS guest always reaches [`LINK_LOCAL_HOLE`]; the refusal names the
    /// surface's settings. See [`EgressPolicy::restricted_with`] for any provider.
    pub fn restricted(
        rules: &[String],
        accept_exceptions: bool,
        names: &SettingNames,
    ) -> Result<Self, SandboxError> {
        Self::restricted_with(rules, EXCEPTIONS, accept_exceptions, names)
    }

    /// The rules CreateOS gets at create: `["*"]`, `["240.0.0.0/4"]`, or the address rules. A
    /// domain allowlist ([`EgressPolicy::Domains`]) is spelled as deny-all: CreateOS stores
    /// host-name rules but does not enforce them, so the names are never sent (and the
    /// provider refuses such a policy before any create, [`refuse_domains`]).
    pub fn rules(&self) -> Vec<String> {
        match self {
            EgressPolicy::AllowAll => vec![ALLOW_ALL_RULE.to_owned()],
            EgressPolicy::DenyAll | EgressPolicy::Domains(_) => vec![DENY_ALL_RULE.to_owned()],
            EgressPolicy::Rules(rules) => rules.iter().map(ToString::to_string).collect(),
        }
    }

    /// Whether the egress a CreateOS guest reports is the one this policy asked for. Order and
    /// duplicates are ignored; an absent or empty list, or `*`, means allow-all; address rules
    /// compare in canonical form.
    pub fn matches(&self, reported: Option<&[String]>) -> bool {
        let got: BTreeSet<&str> = reported
            .unwrap_or_default()
            .iter()
            .map(|s| s.trim())
            .collect();
        match self {
            EgressPolicy::AllowAll => got.is_empty() || got == BTreeSet::from([ALLOW_ALL_RULE]),
            EgressPolicy::DenyAll => got == BTreeSet::from([DENY_ALL_RULE]),
            EgressPolicy::Rules(want) => {
                let parsed: Result<BTreeSet<AddressRule>, _> =
                    got.iter().map(|r| validate_address_rule(r)).collect();
                parsed.is_ok_and(|p| p.into_iter().eq(want.iter().copied()))
            }
            // Never sent to CreateOS, so nothing it reports is this policy.
            EgressPolicy::Domains(_) => false,
        }
    }
}

/// The policy as a CreateOS user reads it: the rules sent and the hole that stays open.
impl fmt::Display for EgressPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EgressPolicy::AllowAll => write!(f, "unrestricted ([\"{ALLOW_ALL_RULE}\"])"),
            EgressPolicy::DenyAll => write!(
                f,
                "deny-all ([\"{DENY_ALL_RULE}\"]; {LINK_LOCAL_HOLE} stays reachable)"
            ),
            EgressPolicy::Rules(_) => write!(
                f,
                "only {:?} ({LINK_LOCAL_HOLE} stays reachable)",
                self.rules()
            ),
            EgressPolicy::Domains(domains) => write!(
                f,
                "deny-all but the domains {domains:?} (enforced by the provider's own egress \
                 control, not CreateOS's)"
            ),
        }
    }
}

/// The refusal of a domain allowlist ([`EgressPolicy::Domains`]) on CreateOS, before any
/// create: CreateOS stores host-name rules without enforcing them, so a domain allowlist runs
/// there only through the egress gateway (which the surfaces' plans set up as address rules).
pub fn refuse_domains(policy: &EgressPolicy) -> Result<(), SandboxError> {
    match policy {
        EgressPolicy::Domains(_) => Err(SandboxError::refused(
            "CreateOS does not enforce host-name egress rules: a domain allowlist runs on \
             CreateOS only through the egress gateway (CREATEOS_GATEWAY_URL); this policy was \
             decided for another provider",
        )),
        _ => Ok(()),
    }
}
