//! The egress sidecar double (port 18080): `/policy` and `/healthz`, reached through the server
//! proxy or the server's `/networkpolicy` route.

use serde_json::{Value, json};

use crate::config::Config;
use crate::http::{json_response, text};
use crate::state::Sidecar;
use axum::response::Response;

/// Validates a policy as the sidecar does; `Err` is its plain-text 400 message.
fn parse_policy(v: &Value) -> Result<Value, String> {
    let Value::Object(m) = v else {
        return Err("invalid policy: expected a JSON object".into());
    };
    let default = match m.get("defaultAction") {
        None | Some(Value::Null) => "deny",
        Some(Value::String(s)) if s == "allow" || s == "deny" => s.as_str(),
        Some(other) => return Err(format!("invalid policy: unknown defaultAction {other}")),
    };
    let rules = match m.get("egress") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => {
            let mut out = Vec::new();
            for r in a {
                out.push(parse_rule(r)?);
            }
            out
        }
        Some(_) => return Err("invalid policy: egress must be a list".into()),
    };
    Ok(json!({"defaultAction": default, "egress": rules}))
}

fn parse_rule(r: &Value) -> Result<Value, String> {
    let action = r.get("action").and_then(Value::as_str).unwrap_or_default();
    let target = r.get("target").and_then(Value::as_str).unwrap_or_default();
    if action != "allow" && action != "deny" {
        return Err(format!(
            "invalid policy: rule action must be allow or deny, got {action:?}"
        ));
    }
    if target.trim().is_empty() {
        return Err("invalid policy: rule target must not be empty".into());
    }
    Ok(json!({"action": action, "target": target}))
}

fn status(sidecar: &Sidecar, cfg: &Config) -> Value {
    let policy = sidecar.reported(cfg.policy_drift);
    json!({
        "status": "ok",
        "mode": Sidecar::mode_of(&policy),
        "enforcementMode": cfg.egress_mode.as_str(),
        "policy": policy,
    })
}

/// Serves one request to the sidecar (path relative to its root).
pub(crate) fn handle(
    sidecar: &mut Sidecar,
    cfg: &Config,
    method: &str,
    path: &str,
    body: &[u8],
) -> Response {
    let path = path.trim_end_matches('/');
    if path == "/healthz" {
        return text(200, "ok");
    }
    if path != "/policy" {
        return text(404, "404 page not found\n");
    }
    let parsed: Option<Value> = if body.iter().all(u8::is_ascii_whitespace) {
        None
    } else {
        match serde_json::from_slice(body) {
            Ok(v) => Some(v),
            Err(e) => return text(400, format!("invalid policy: {e}\n")),
        }
    };
    match method {
        "GET" => json_response(200, &status(sidecar, cfg)),
        "POST" | "PUT" => {
            match parsed {
                None => {
                    sidecar.policy = json!({"defaultAction": "deny", "egress": []});
                    return json_response(
                        200,
                        &json!({"status": "ok", "mode": "deny_all", "reason": "policy reset to default deny-all"}),
                    );
                }
                Some(v) => match parse_policy(&v) {
                    Ok(p) => sidecar.policy = p,
                    Err(e) => return text(400, format!("{e}\n")),
                },
            }
            json_response(200, &status(sidecar, cfg))
        }
        "PATCH" => {
            let Some(Value::Array(rules)) = parsed else {
                return text(400, "invalid policy: expected a list of rules\n");
            };
            let mut incoming: Vec<Value> = Vec::new();
            for r in &rules {
                match parse_rule(r) {
                    Ok(rule) => {
                        // The first rule for a target in one payload wins.
                        if !incoming.iter().any(|x| x["target"] == rule["target"]) {
                            incoming.push(rule);
                        }
                    }
                    Err(e) => return text(400, format!("{e}\n")),
                }
            }
            let current = sidecar.policy["egress"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let mut merged: Vec<Value> = Vec::new();
            for old in current {
                match incoming.iter().position(|n| n["target"] == old["target"]) {
                    Some(i) => merged.push(incoming.remove(i)),
                    None => merged.push(old),
                }
            }
            merged.extend(incoming);
            sidecar.policy["egress"] = Value::Array(merged);
            json_response(200, &status(sidecar, cfg))
        }
        "DELETE" => {
            let Some(Value::Array(targets)) = parsed else {
                return text(400, "invalid request: expected a list of targets\n");
            };
            let targets: Vec<&str> = targets.iter().filter_map(Value::as_str).collect();
            if let Some(rules) = sidecar.policy["egress"].as_array_mut() {
                rules.retain(|r| !targets.contains(&r["target"].as_str().unwrap_or_default()));
            }
            json_response(200, &status(sidecar, cfg))
        }
        _ => text(405, "method not allowed\n"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PolicyDrift;

    fn body_of(resp: Response) -> Value {
        let bytes =
            futures::executor::block_on(axum::body::to_bytes(resp.into_body(), 1 << 20)).unwrap();
        serde_json::from_slice(&bytes).unwrap()
    }

    #[test]
    fn patch_merges_by_target_and_keeps_the_default() {
        let mut sc = Sidecar {
            token: "t".into(),
            policy: json!({"defaultAction": "deny", "egress": [
                {"action": "allow", "target": "a.example"},
                {"action": "allow", "target": "b.example"}
            ]}),
        };
        let cfg = Config::default();
        let body = br#"[{"action":"deny","target":"a.example"},{"action":"allow","target":"a.example"},{"action":"allow","target":"c.example"}]"#;
        let v = body_of(handle(&mut sc, &cfg, "PATCH", "/policy", body));
        assert_eq!(v["policy"]["defaultAction"], "deny");
        assert_eq!(
            v["policy"]["egress"],
            json!([
                {"action": "deny", "target": "a.example"},
                {"action": "allow", "target": "b.example"},
                {"action": "allow", "target": "c.example"}
            ])
        );
        assert_eq!(v["mode"], "enforcing");
        assert_eq!(v["enforcementMode"], "dns+nft");
        let v = body_of(handle(
            &mut sc,
            &cfg,
            "DELETE",
            "/policy",
            br#"["a.example","zzz"]"#,
        ));
        assert_eq!(v["policy"]["egress"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn drift_changes_only_the_read_back() {
        let mut sc = Sidecar {
            token: "t".into(),
            policy: json!({"defaultAction": "deny", "egress": []}),
        };
        let cfg = Config {
            policy_drift: PolicyDrift::DefaultAllow,
            ..Config::default()
        };
        let v = body_of(handle(&mut sc, &cfg, "GET", "/policy", b""));
        assert_eq!(v["policy"]["defaultAction"], "allow");
        assert_eq!(v["mode"], "allow_all");
        assert_eq!(sc.policy["defaultAction"], "deny");
    }

    #[test]
    fn empty_post_resets_to_deny_all() {
        let mut sc = Sidecar {
            token: "t".into(),
            policy: json!({"defaultAction": "allow", "egress": []}),
        };
        let v = body_of(handle(&mut sc, &Config::default(), "POST", "/policy", b" "));
        assert_eq!(v["mode"], "deny_all");
        assert_eq!(sc.policy["defaultAction"], "deny");
    }
}
