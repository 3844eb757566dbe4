//! Fault injection: `ROUTE=ACTION[@PROB][#COUNT][>SKIP]` rules separated by `;`. A rule with
//! `>SKIP` lets the first `SKIP` requests to its route through before it fires (the run's exec
//! after an OpenSandbox sandbox's probe command, say).

use rand::Rng;

/// Every route name requests are classified into (the keys of `Stats::requests` and the
/// `ROUTE` of a fault rule). Requests through the server proxy are counted under `proxy` and,
/// when they reach execd or the sidecar, under the execd/sidecar route too.
pub const ROUTE_NAMES: &[&str] = &[
    "health",
    "version",
    "create",
    "list",
    "get",
    "delete",
    "patch_metadata",
    "renew",
    "pause",
    "resume",
    "endpoint",
    "snapshot_create",
    "snapshot_list",
    "snapshot_get",
    "snapshot_delete",
    "networkpolicy_get",
    "networkpolicy_put",
    "networkpolicy_patch",
    "networkpolicy_delete",
    "diagnostics",
    "metrics_event",
    "proxy",
    "execd_ping",
    "command",
    "command_interrupt",
    "command_status",
    "command_logs",
    "files_upload",
    "files_download",
    "files_info",
    "files_delete",
    "directories_create",
    "directories_list",
    "directories_delete",
    "execd_other",
    "sidecar_policy",
];

/// What an injected fault does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    /// Answer `{code, message}` with this status; the request is not processed.
    Status(u16),
    /// Close the connection without answering; not processed.
    Reset,
    /// Process the request fully, then close the connection without answering (a create whose
    /// answer is lost: the sandbox exists).
    ResetAfter,
    /// Never answer (until the client gives up or the server stops).
    Stall,
    /// `command`: send `init`, then no frame at all (no output, no ping, no end) while the
    /// connection stays open, as a frozen sandbox does.
    StallMid,
}

#[derive(Debug, Clone)]
struct Rule {
    route: String,
    action: Action,
    prob: f64,
    remaining: Option<u64>,
    /// Requests to the route still let through before the rule fires.
    skip: u64,
}

/// The active rules.
#[derive(Debug, Clone, Default)]
pub(crate) struct Faults {
    rules: Vec<Rule>,
}

impl Faults {
    /// Parses a spec; a blank spec is no faults.
    pub(crate) fn parse(spec: &str) -> Result<Self, String> {
        let mut rules = Vec::new();
        for raw in spec.split(';').map(str::trim).filter(|r| !r.is_empty()) {
            rules.push(parse_rule(raw)?);
        }
        Ok(Self { rules })
    }

    /// The action for a request to `route`, using up one firing of the rule.
    pub(crate) fn pick(&mut self, route: &str) -> Option<Action> {
        let mut rng = rand::rng();
        for rule in &mut self.rules {
            if (rule.route != "*" && rule.route != route) || rule.remaining == Some(0) {
                continue;
            }
            if rule.skip > 0 {
                rule.skip -= 1;
                continue;
            }
            if rule.prob < 1.0 && rng.random::<f64>() >= rule.prob {
                continue;
            }
            if let Some(n) = rule.remaining.as_mut() {
                *n -= 1;
            }
            return Some(rule.action.clone());
        }
        None
    }
}

fn parse_rule(raw: &str) -> Result<Rule, String> {
    let (route, rest) = raw
        .split_once('=')
        .ok_or_else(|| format!("fault rule {raw:?}: expected ROUTE=ACTION"))?;
    let route = route.trim();
    if route != "*" && !ROUTE_NAMES.contains(&route) {
        return Err(format!(
            "fault rule {raw:?}: unknown route {route:?} (known: {})",
            ROUTE_NAMES.join(", ")
        ));
    }
    let end = rest.find(['@', '#', '>']).unwrap_or(rest.len());
    let action_text = rest[..end].trim();
    let mut suffix = &rest[end..];
    let mut prob = 1.0_f64;
    let mut remaining = None;
    let mut skip = 0;
    while let Some(marker) = suffix.chars().next() {
        let body = &suffix[1..];
        let stop = body.find(['@', '#', '>']).unwrap_or(body.len());
        let value = body[..stop].trim();
        if marker == '@' {
            prob = value
                .parse::<f64>()
                .ok()
                .filter(|p| (0.0..=1.0).contains(p))
                .ok_or_else(|| format!("fault rule {raw:?}: probability must be in [0, 1]"))?;
        } else if marker == '>' {
            skip = value
                .parse::<u64>()
                .map_err(|_| format!("fault rule {raw:?}: bad skip {value:?}"))?;
        } else {
            remaining = Some(
                value
                    .parse::<u64>()
                    .map_err(|_| format!("fault rule {raw:?}: bad count {value:?}"))?,
            );
        }
        suffix = &body[stop..];
    }
    let action = match action_text {
        "reset" => Action::Reset,
        "reset-after" => Action::ResetAfter,
        "stall" => Action::Stall,
        "stall-mid" => Action::StallMid,
        other => match other.parse::<u16>() {
            Ok(code) if (300..=599).contains(&code) => Action::Status(code),
            _ => {
                return Err(format!(
                    "fault rule {raw:?}: unknown action {other:?} (a status 300-599, reset, \
                     reset-after, stall or stall-mid)"
                ));
            }
        },
    };
    Ok(Rule {
        route: route.to_owned(),
        action,
        prob,
        remaining,
        skip,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_fire_in_order_with_counts() {
        let mut f = Faults::parse("delete=500#1; create=reset-after; *=stall@0").unwrap();
        assert_eq!(f.pick("delete"), Some(Action::Status(500)));
        assert_eq!(f.pick("delete"), None);
        assert_eq!(f.pick("create"), Some(Action::ResetAfter));
        assert_eq!(f.pick("get"), None);
    }

    #[test]
    fn a_skip_lets_the_first_requests_of_its_route_through() {
        let mut f = Faults::parse("command=400#1>2").unwrap();
        assert_eq!(f.pick("get"), None, "other routes do not use up the skip");
        assert_eq!(f.pick("command"), None);
        assert_eq!(f.pick("command"), None);
        assert_eq!(f.pick("command"), Some(Action::Status(400)));
        assert_eq!(f.pick("command"), None, "fired its one time");
    }

    #[test]
    fn bad_specs_are_refused() {
        assert!(Faults::parse("nope=500").is_err());
        assert!(Faults::parse("create=teapot").is_err());
        assert!(Faults::parse("create=200").is_err());
        assert!(Faults::parse("create=500@2").is_err());
        assert!(Faults::parse("create=500#x").is_err());
        assert!(Faults::parse("create=500>x").is_err());
        assert!(Faults::parse("create").is_err());
        assert!(Faults::parse(" ; ").unwrap().pick("create").is_none());
    }
}
