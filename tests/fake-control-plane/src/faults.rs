//! Fault injection rules: `ROUTE=ACTION[+ra=VALUE][@PROB][#COUNT]` separated by `;`.

use rand::Rng;

/// Every route name the fake classifies requests into (also the keys of `Stats::requests`).
pub const ROUTE_NAMES: &[&str] = &[
    "healthz",
    "readyz",
    "whoami",
    "shapes",
    "rootfs",
    "hosts",
    "list",
    "create",
    "get",
    "get_by_ip",
    "patch",
    "delete",
    "pause",
    "resume",
    "fork",
    "resize",
    "ssh_keys",
    "egress_get",
    "egress_put",
    "bandwidth",
    "recharge",
    "exec",
    "exec_stream",
    "upload",
    "download",
    "process_create",
    "process_list",
    "process_get",
    "process_connect",
    "process_input",
    "process_stdin_close",
    "process_resize",
    "process_signal",
    "process_wait",
    "process_delete",
    "token_create",
    "token_get",
    "token_rotate",
    "token_delete",
    "template_list",
    "template_create",
    "template_get",
    "template_delete",
    "template_logs",
    "template_follow",
    "network_list",
    "network_create",
    "network_get",
    "network_delete",
    "network_attach",
    "network_detach",
    "disk_list",
    "disk_create",
    "disk_get",
    "disk_delete",
    "disk_patch",
    "sandbox_disks",
    "disk_attach",
    "disk_detach",
    "computer",
];

/// What an injected fault does to a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    /// Answer a JSend `error` with this status; the request is not processed.
    Status(u16),
    /// Close the connection without answering; not processed.
    Reset,
    /// Process the request, then close the connection without answering.
    ResetAfter,
    /// Never answer.
    Stall,
    /// Streaming routes: stream what exists, then go silent with the connection open.
    StallMid,
    /// 500 whose message reflects every request header.
    EchoHeaders,
    /// 307 to another origin.
    Redirect,
    /// 500 with a plain-text body.
    Text,
    /// 404 with an 8 MiB body.
    Huge,
    /// 200 whose body is not JSON.
    Malformed,
    /// Process the request, then leave this key out of the JSend `data` of its answer
    /// (`drop-egress`: a create response without `egress`).
    Drop(String),
}

/// The `Retry-After` header of a status fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RetryAfter {
    /// The usual: `0` on 429 and 503, nothing on other statuses.
    Default,
    /// No `Retry-After` at all (`+ra=none`).
    Omit,
    /// This value, verbatim, valid or not (`+ra=2`, `+ra=garbage`, `+ra=-1`, an HTTP date).
    Value(String),
}

/// What to do to one request: the action and, for a status, its `Retry-After`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fault {
    pub action: Action,
    pub retry_after: RetryAfter,
}

#[derive(Debug, Clone)]
struct Rule {
    route: String,
    fault: Fault,
    prob: f64,
    remaining: Option<u64>,
}

/// The active fault rules.
#[derive(Debug, Clone, Default)]
pub(crate) struct Faults {
    rules: Vec<Rule>,
}

impl Faults {
    /// Parses a SPEC; an empty or blank spec means no faults.
    pub(crate) fn parse(spec: &str) -> Result<Self, String> {
        let mut rules = Vec::new();
        for raw in spec.split(';') {
            let raw = raw.trim();
            if raw.is_empty() {
                continue;
            }
            rules.push(parse_rule(raw)?);
        }
        Ok(Self { rules })
    }

    /// Picks the action to apply to a request for `route`, consuming one use of the rule.
    pub(crate) fn pick(&mut self, route: &str) -> Option<Fault> {
        let mut rng = rand::rng();
        for rule in &mut self.rules {
            if rule.route != "*" && rule.route != route {
                continue;
            }
            if rule.remaining == Some(0) {
                continue;
            }
            if rule.prob < 1.0 && rng.random::<f64>() >= rule.prob {
                continue;
            }
            if let Some(n) = rule.remaining.as_mut() {
                *n -= 1;
            }
            return Some(rule.fault.clone());
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
        return Err(format!("fault rule {raw:?}: unknown route {route:?}"));
    }
    // Split ACTION from the optional @PROB and #COUNT suffixes (either order).
    let end = rest.find(['@', '#']).unwrap_or(rest.len());
    let action_text = rest[..end].trim();
    let mut suffix = &rest[end..];
    let mut prob = 1.0_f64;
    let mut remaining = None;
    while !suffix.is_empty() {
        let marker = suffix.as_bytes()[0];
        let body = &suffix[1..];
        let stop = body.find(['@', '#']).unwrap_or(body.len());
        let value = body[..stop].trim();
        match marker {
            b'@' => {
                prob = value
                    .parse::<f64>()
                    .map_err(|_| format!("fault rule {raw:?}: bad probability {value:?}"))?;
                // 0 is allowed: a rule that never fires (handy to switch one off).
                if !(0.0..=1.0).contains(&prob) {
                    return Err(format!("fault rule {raw:?}: probability must be in [0, 1]"));
                }
            }
            _ => {
                remaining = Some(
                    value
                        .parse::<u64>()
                        .map_err(|_| format!("fault rule {raw:?}: bad count {value:?}"))?,
                );
            }
        }
        suffix = &body[stop..];
    }
    let mut parts = action_text.split('+');
    let action_name = parts.next().unwrap_or_default().trim();
    let action = parse_action(action_name)
        .ok_or_else(|| format!("fault rule {raw:?}: unknown action {action_name:?}"))?;
    let mut retry_after = RetryAfter::Default;
    for option in parts {
        let Some(value) = option.trim().strip_prefix("ra=") else {
            return Err(format!(
                "fault rule {raw:?}: unknown option {option:?} (expected +ra=VALUE)"
            ));
        };
        if !matches!(action, Action::Status(_)) {
            return Err(format!(
                "fault rule {raw:?}: +ra= applies to a status action only"
            ));
        }
        let value = value.trim();
        if value.is_empty() || !value.bytes().all(|b| (0x20..0x7f).contains(&b)) {
            return Err(format!(
                "fault rule {raw:?}: a Retry-After value must be printable ASCII (or none)"
            ));
        }
        retry_after = if value == "none" {
            RetryAfter::Omit
        } else {
            RetryAfter::Value(value.to_owned())
        };
    }
    Ok(Rule {
        route: route.to_owned(),
        fault: Fault {
            action,
            retry_after,
        },
        prob,
        remaining,
    })
}

fn parse_action(text: &str) -> Option<Action> {
    Some(match text {
        "reset" => Action::Reset,
        "reset-after" => Action::ResetAfter,
        "stall" => Action::Stall,
        "stall-mid" => Action::StallMid,
        "echo-headers" => Action::EchoHeaders,
        "redirect" => Action::Redirect,
        "text" => Action::Text,
        "huge" => Action::Huge,
        "malformed" => Action::Malformed,
        other if other.starts_with("drop-") && other.len() > 5 => {
            Action::Drop(other[5..].to_owned())
        }
        other => {
            let code: u16 = other.parse().ok()?;
            if !(300..=599).contains(&code) {
                return None;
            }
            Action::Status(code)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_rules_with_probability_and_count() {
        let mut f = Faults::parse("create=503#2; exec=reset@1.0;*=stall@0.5#1").unwrap();
        let act = |f: Option<Fault>| f.map(|f| f.action);
        assert_eq!(act(f.pick("create")), Some(Action::Status(503)));
        assert_eq!(act(f.pick("create")), Some(Action::Status(503)));
        assert_eq!(act(f.pick("exec")), Some(Action::Reset));
        // The wildcard rule fires at most once, with probability 0.5.
        let mut fired = 0;
        for _ in 0..200 {
            if f.pick("create").is_some() {
                fired += 1;
            }
        }
        assert!(fired <= 1);
    }

    #[test]
    fn status_faults_carry_a_retry_after() {
        let mut f = Faults::parse(
            "create=429+ra=0;exec_stream=503+ra=2@1#1;whoami=429+ra=none;\
             get=503+ra=Wed, 21 Oct 2015 07:28:00 GMT;*=429+ra=garbage",
        )
        .unwrap();
        let ra = |f: Option<Fault>| f.map(|f| f.retry_after);
        assert_eq!(ra(f.pick("create")), Some(RetryAfter::Value("0".into())));
        assert_eq!(
            ra(f.pick("exec_stream")),
            Some(RetryAfter::Value("2".into()))
        );
        assert_eq!(ra(f.pick("whoami")), Some(RetryAfter::Omit));
        assert_eq!(
            ra(f.pick("get")),
            Some(RetryAfter::Value("Wed, 21 Oct 2015 07:28:00 GMT".into()))
        );
        // #1 used up: exec_stream falls through to the wildcard.
        assert_eq!(
            ra(f.pick("exec_stream")),
            Some(RetryAfter::Value("garbage".into()))
        );
        let plain = Faults::parse("create=503").unwrap().pick("create");
        assert_eq!(ra(plain), Some(RetryAfter::Default));
        assert!(Faults::parse("create=reset+ra=1").is_err());
        assert!(Faults::parse("create=503+ra=").is_err());
        assert!(Faults::parse("create=503+rb=1").is_err());
        assert!(Faults::parse("create=503+ra=\u{e9}").is_err());
    }

    #[test]
    fn rejects_bad_specs() {
        assert!(Faults::parse("nope=500").is_err());
        assert!(Faults::parse("create=teapot").is_err());
        assert!(Faults::parse("create=500@-0.1").is_err());
        assert!(Faults::parse("create=500@nan").is_err());
        let mut never = Faults::parse("create=500@0").unwrap();
        assert!((0..100).all(|_| never.pick("create").is_none()));
        assert!(Faults::parse("create=500@1.5").is_err());
        assert!(Faults::parse("create=500#x").is_err());
        assert!(Faults::parse("create").is_err());
        assert!(Faults::parse("create=200").is_err());
        assert!(Faults::parse("  ").unwrap().pick("create").is_none());
    }
}
