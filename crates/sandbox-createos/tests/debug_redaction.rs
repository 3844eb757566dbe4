//! `Debug` of everything that carries environment values, standard input or program text
//! shows names and sizes only, so a log line that formats one with `{:?}` cannot leak a secret.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use sandbox_core::control::{ControlPlane, CreateGuest, ExecRequest, ProcessSpec};
use sandbox_core::egress::EgressPolicy;
use sandbox_core::exec::{Command, ExecLimits};
use sandbox_core::gateway::{Domains, Gateway, Secret as GatewaySecret};
use sandbox_core::guest::{ExecInput, GuestSpec};
use sandbox_core::names::BACKEND_PREFIX;
use sandbox_core::pool::PoolKey;
use sandbox_createos::CreateOsControlPlane;
use secrecy::SecretString;

const SECRET: &str = "s3cr3t-value-do-not-log-7f1e";

fn envs() -> BTreeMap<String, String> {
    BTreeMap::from([("OPENAI_API_KEY".to_owned(), SECRET.to_owned())])
}

fn program() -> String {
    format!("token = {SECRET:?}\nprint(token)\n")
}

/// Every piece of secret-bearing text, formatted with `{:?}` and `{:#?}`.
fn formatted() -> Vec<(&'static str, String)> {
    let limits = ExecLimits::for_seconds(5);
    let spec = GuestSpec {
        shape: "s-2vcpu-4gb".into(),
        rootfs: "devbox:1".into(),
        envs: envs(),
        egress: EgressPolicy::AllowAll,
        auto_pause_after_seconds: 600,
    };
    // A gateway secret that contains the marker the leak check looks for.
    let gateway_secret = format!("{SECRET}-gateway-secret-0123456789abcdef");
    let gateway = Gateway::new(
        "10.0.0.5:3128".parse().unwrap(),
        GatewaySecret::new(gateway_secret.into_bytes()).unwrap(),
        None,
    );
    let grant = gateway.grant(
        &Domains::parse_list("X", "pypi.org").unwrap(),
        Duration::from_secs(5),
    );
    let inline = Command::python_inline("/workspace/main.py", program().as_bytes()).unwrap();
    let shell = Command::shell(format!("curl -H 'Authorization: {SECRET}' https://x"));
    let (cmd, args) = inline.under_timeout(&limits);
    let exec = ExecRequest {
        cmd,
        args,
        env: envs(),
        stdin: SECRET.to_owned(),
        timeout: Duration::from_secs(5),
    };
    let input = ExecInput {
        env: envs(),
        stdin: SECRET.to_owned(),
    };
    let create = CreateGuest {
        name: "lf-x".into(),
        shape: "s-2vcpu-4gb".into(),
        rootfs: "devbox:1".into(),
        envs: envs(),
        egress: vec!["*".into()],
        auto_pause_after_seconds: 600,
    };
    let process = ProcessSpec {
        cmd: "python3".into(),
        args: vec!["-c".into(), program()],
        cwd: "/workspace".into(),
    };
    let cp: Arc<dyn ControlPlane> = Arc::new(
        CreateOsControlPlane::new(
            &SecretString::from("sk-test"),
            "http://127.0.0.1:9",
            Duration::from_secs(1),
        )
        .unwrap(),
    );
    let key = PoolKey::new(&cp, &spec, BACKEND_PREFIX);
    let mut out = Vec::new();
    let mut both = |what: &'static str, d: &dyn std::fmt::Debug| {
        out.push((what, format!("{d:?}")));
        out.push((what, format!("{d:#?}")));
    };
    both("GuestSpec", &spec);
    both("Command::PythonInline", &inline);
    both("Command::Shell", &shell);
    both("ExecRequest", &exec);
    both("ExecInput", &input);
    both("CreateGuest", &create);
    both("ProcessSpec", &process);
    both("PoolKey", &key);
    both("Gateway", &gateway);
    both("Grant", &grant);
    out
}

#[test]
fn debug_never_shows_env_values_stdin_or_program_text() {
    let leaks: Vec<String> = formatted()
        .into_iter()
        .filter(|(_, text)| text.contains(SECRET) || text.contains("s3cr3t"))
        .map(|(what, text)| format!("{what}: {text}"))
        .collect();
    assert!(leaks.is_empty(), "secrets in Debug:\n{}", leaks.join("\n"));
}

#[test]
fn debug_still_names_what_it_hides() {
    // Names and sizes stay, so a log line is still useful.
    for (what, text) in formatted() {
        if [
            "GuestSpec",
            "RunSpec",
            "ExecRequest",
            "ExecInput",
            "CreateGuest",
        ]
        .contains(&what)
        {
            assert!(text.contains("OPENAI_API_KEY"), "{what}: {text}");
        }
    }
}
