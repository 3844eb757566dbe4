//! The enforcing mode (`--enforce-egress`): guest commands run in a network namespace of their
//! own whose firewall holds the guest's address rules, as CreateOS enforces them.
//!
//! The guests are linked to a "hub" namespace made here, which plays the outside world: it
//! answers on 11.0.0.1, 12.0.0.1 and the metadata address 169.254.169.254, ports 80 and 443. A
//! guest probes them with Python sockets: `open` means connected, `dropped` means the connect
//! timed out (the firewall drops; nothing answers "refused").
//!
//! These tests need root, `ip` and `nft`; without them they pass after saying why they did not
//! run (the enforcing mode then refuses to start, which `refuses_to_start_without_root` checks
//! where it can).

mod common;

use std::collections::BTreeMap;

use common::{Fx, fast};
use createos_fake::FakeOptions;
use createos_fake::netns::{self, Netns};
use serde_json::json;

/// The guest-side prober: connects to every `host:port` argument at once and prints a JSON
/// object `{target: "open:<greeting>" | "dropped" | "refused" | "error:..."}`.
const PROBE: &str = r#"
import concurrent.futures as cf, json, socket, sys
def probe(t):
    host, port = t.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=1.0) as s:
            # Only the connect decides "dropped"; a slow greeting on a busy machine is not one.
            s.settimeout(30)
            return t, "open:" + s.recv(64).decode()
    except TimeoutError:
        return t, "dropped"
    except ConnectionRefusedError:
        return t, "refused"
    except OSError as e:
        return t, "error:" + str(e)
with cf.ThreadPoolExecutor(16) as ex:
    print(json.dumps(dict(ex.map(probe, sys.argv[1:]))))
"#;

/// `Some(reason)` when this machine cannot run the enforcing mode.
fn unsupported() -> Option<String> {
    netns::support().err()
}

/// The hub: the guests' uplink, with servers on its own addresses.
struct Hub {
    ns: Netns,
    _servers: Vec<tokio::task::JoinHandle<()>>,
}

fn hub() -> Hub {
    netns::remove_stale("cf-test-hub");
    let ns = Netns::create("cf-test-hub").expect("hub namespace");
    for addr in ["11.0.0.1/32", "12.0.0.1/32", "169.254.169.254/32"] {
        ns.ip(&["addr", "add", addr, "dev", "lo"])
            .expect("hub address");
    }
    let mut servers = Vec::new();
    for port in [80, 443] {
        let std = ns
            .bind_tcp(([0, 0, 0, 0], port).into())
            .expect("hub listener");
        let listener = tokio::net::TcpListener::from_std(std).expect("tokio listener");
        servers.push(tokio::spawn(async move {
            use tokio::io::AsyncWriteExt as _;
            while let Ok((mut s, _)) = listener.accept().await {
                let local = s
                    .local_addr()
                    .map(|a| a.ip().to_string())
                    .unwrap_or_default();
                let _ = s.write_all(format!("hi-{local}-{port}").as_bytes()).await;
            }
        }));
    }
    Hub {
        ns,
        _servers: servers,
    }
}

/// The hub and an enforcing fake linked to it; `None`, after saying why, when this machine
/// cannot run the enforcing mode.
async fn setup() -> Option<(Hub, Fx)> {
    if let Some(why) = unsupported() {
        eprintln!("skipped: the enforcing mode cannot run here: {why}");
        return None;
    }
    let hub = hub();
    let fx = Fx::with(FakeOptions {
        enforce_egress: true,
        egress_uplink_netns: Some(hub.ns.name().to_owned()),
        ..fast()
    })
    .await;
    Some((hub, fx))
}

/// Runs the prober in guest `id` and returns target → outcome.
async fn probe(fx: &Fx, id: &str, targets: &[&str]) -> BTreeMap<String, String> {
    let mut args = vec!["-c", PROBE];
    args.extend_from_slice(targets);
    let result = fx.exec(id, "python3", &args).await;
    assert_eq!(result["exit_code"], 0, "prober failed: {result}");
    serde_json::from_str(result["stdout"].as_str().unwrap_or_default())
        .unwrap_or_else(|e| panic!("prober output {result}: {e}"))
}

fn outcome<'a>(got: &'a BTreeMap<String, String>, target: &str) -> &'a str {
    got.get(target).map_or("missing", String::as_str)
}

/// Namespaces of the fake process `pid` that exist now.
fn guest_namespaces(pid: u32) -> usize {
    let prefix = format!("createos-fake-{pid}-");
    std::fs::read_dir("/run/netns").map_or(0, |d| {
        d.flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
            .count()
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn address_rules_are_enforced_and_the_holes_stay_open() {
    let Some((_hub, fx)) = setup().await else {
        return;
    };
    let targets = [
        "11.0.0.1:443",
        "11.0.0.1:80",
        "12.0.0.1:443",
        "169.254.169.254:80",
    ];

    // One guest per rule form, probed at once (a dropped connect waits for its timeout).
    let one = fx.create(json!({"egress": ["11.0.0.1:443"]})).await;
    let net = fx.create(json!({"egress": ["12.0.0.0/8"]})).await;
    let none = fx.create(json!({"egress": ["240.0.0.0/4"]})).await;
    let named = fx
        .create(json!({"egress": ["pypi.org", "11.0.0.1:443"]}))
        .await;
    let open = fx.create(json!({})).await;
    let (by_port, by_cidr, deny_all, with_name, no_rules) = tokio::join!(
        probe(&fx, &one, &targets),
        probe(&fx, &net, &targets),
        probe(&fx, &none, &targets),
        probe(&fx, &named, &targets),
        probe(&fx, &open, &targets),
    );

    // IP:port: that address and port only.
    let got = by_port;
    assert_eq!(
        outcome(&got, "11.0.0.1:443"),
        "open:hi-11.0.0.1-443",
        "{got:?}"
    );
    assert_eq!(outcome(&got, "11.0.0.1:80"), "dropped", "{got:?}");
    assert_eq!(outcome(&got, "12.0.0.1:443"), "dropped", "{got:?}");
    // The metadata hole is open whatever the rules say, as on CreateOS.
    assert_eq!(
        outcome(&got, "169.254.169.254:80"),
        "open:hi-169.254.169.254-80",
        "{got:?}"
    );

    // CIDR: every port of the network.
    let got = by_cidr;
    assert_eq!(
        outcome(&got, "12.0.0.1:443"),
        "open:hi-12.0.0.1-443",
        "{got:?}"
    );
    assert_eq!(outcome(&got, "11.0.0.1:443"), "dropped", "{got:?}");

    // Deny-all as the contract spells it.
    let got = deny_all;
    assert_eq!(outcome(&got, "11.0.0.1:443"), "dropped", "{got:?}");
    assert_eq!(outcome(&got, "12.0.0.1:443"), "dropped", "{got:?}");
    assert_eq!(
        outcome(&got, "169.254.169.254:80"),
        "open:hi-169.254.169.254-80",
        "{got:?}"
    );

    // Host-name rules are accepted, echoed and not enforced: one in a set opens everything.
    let view = fx.get(&format!("/v1/sandboxes/{named}")).await;
    assert_eq!(view.data()["egress"], json!(["pypi.org", "11.0.0.1:443"]));
    let got = with_name;
    assert_eq!(
        outcome(&got, "12.0.0.1:443"),
        "open:hi-12.0.0.1-443",
        "{got:?}"
    );
    // No rules at all: everything.
    assert!(
        no_rules.values().all(|v| v.starts_with("open:")),
        "{no_rules:?}"
    );

    // PUT /egress replaces the firewall of a running guest.
    let put = fx
        .put(
            &format!("/v1/sandboxes/{one}/egress"),
            json!({"egress": ["12.0.0.1:443"]}),
        )
        .await;
    assert_eq!(put.data()["egress"], json!(["12.0.0.1:443"]));
    let got = probe(&fx, &one, &["11.0.0.1:443", "12.0.0.1:443"]).await;
    assert_eq!(outcome(&got, "11.0.0.1:443"), "dropped", "{got:?}");
    assert_eq!(
        outcome(&got, "12.0.0.1:443"),
        "open:hi-12.0.0.1-443",
        "{got:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn each_guest_has_a_real_address_and_its_namespace_goes_with_it() {
    let Some((_hub, fx)) = setup().await else {
        return;
    };
    let pid = fx.bin.child.id();
    assert_eq!(guest_namespaces(pid), 0);
    let a = fx.create(json!({"egress": ["11.0.0.1:443"]})).await;
    let b = fx.create(json!({"egress": ["11.0.0.1:443"]})).await;
    assert_eq!(guest_namespaces(pid), 2);
    // The `ip` field is the guest's own address, as the servers see it.
    let ip = fx.get(&format!("/v1/sandboxes/{a}")).await.data()["ip"]
        .as_str()
        .expect("ip")
        .to_owned();
    assert!(ip.starts_with("10.213."), "{ip}");
    let seen = fx
        .exec(
            &a,
            "python3",
            &["-c", "import socket; s = socket.create_connection(('11.0.0.1', 443)); print(s.getsockname()[0])"],
        )
        .await;
    assert_eq!(
        seen["stdout"].as_str().map(str::trim),
        Some(ip.as_str()),
        "{seen}"
    );
    let by_ip = fx.get(&format!("/v1/sandboxes/by-ip/{ip}")).await;
    assert_eq!(by_ip.data()["id"], json!(a));
    // A fork gets a namespace of its own, with the source's rules unless it names others.
    let fork = fx
        .post(
            &format!("/v1/sandboxes/{b}/fork"),
            json!({"egress": ["12.0.0.1:443"]}),
        )
        .await;
    let fork_id = fork.data()["id"].as_str().expect("fork id").to_owned();
    assert_ne!(fork.data()["ip"], json!(ip));
    assert_eq!(guest_namespaces(pid), 3);
    let got = probe(&fx, &fork_id, &["11.0.0.1:443", "12.0.0.1:443"]).await;
    assert_eq!(outcome(&got, "11.0.0.1:443"), "dropped", "{got:?}");
    assert_eq!(
        outcome(&got, "12.0.0.1:443"),
        "open:hi-12.0.0.1-443",
        "{got:?}"
    );
    // Destroyed guests lose their namespaces.
    fx.delete(&format!("/v1/sandboxes/{a}")).await.data();
    fx.wait_status(&a, "destroyed").await;
    assert_eq!(guest_namespaces(pid), 2);
    // Exec, managed processes and PTYs all run inside the guest's namespace.
    let own_ns = fx.exec(&b, "readlink", &["/proc/self/ns/net"]).await;
    let own_ns = own_ns["stdout"].as_str().expect("stdout").trim().to_owned();
    let host_ns = std::fs::read_link("/proc/self/ns/net").expect("own netns");
    assert_ne!(
        own_ns,
        host_ns.to_string_lossy(),
        "exec ran in the host's namespace"
    );
    for (kind, extra) in [
        ("pipe", json!(null)),
        ("pty", json!({"rows": 24, "cols": 80})),
    ] {
        let mut body = json!({"cmd": "sh", "args": ["-c", format!("readlink /proc/self/ns/net > /workspace/ns-{kind}")]});
        if !extra.is_null() {
            body["pty"] = extra;
        }
        let started = fx.post(&format!("/v1/sandboxes/{b}/processes"), body).await;
        let pid = started.data()["process_id"]
            .as_str()
            .expect("process id")
            .to_owned();
        fx.get(&format!(
            "/v1/sandboxes/{b}/processes/{pid}/wait?scope=tree&timeout_ms=10000"
        ))
        .await
        .data();
        let seen = fx
            .exec(&b, "cat", &[&format!("/workspace/ns-{kind}")])
            .await;
        assert_eq!(
            seen["stdout"].as_str().map(str::trim),
            Some(own_ns.as_str()),
            "{kind}: {seen}"
        );
    }
    // A missing program still fails to start, as without the enforcing mode.
    let missing = fx.exec(&b, "no-such-program-here", &[]).await;
    assert_eq!(missing["exit_code"], 127, "{missing}");
    // Reset drops the rest; so would a stop.
    fx.reset().await;
    assert_eq!(guest_namespaces(pid), 0);
    let _again = fx.create(json!({})).await;
    assert_eq!(guest_namespaces(pid), 1);
    let mut fx = fx;
    assert!(fx.bin.terminate().is_some_and(|st| st.success()));
    assert_eq!(guest_namespaces(pid), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn refuses_to_start_without_what_it_needs() {
    // A missing uplink namespace is named in the message; checked wherever root is.
    if unsupported().is_none() {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_createos-fake"))
            .args([
                "--port",
                "0",
                "--enforce-egress",
                "--egress-uplink-netns",
                "no-such-netns-here",
            ])
            .output()
            .expect("run the fake");
        assert_eq!(out.status.code(), Some(2));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("no-such-netns-here") && err.contains("ip netns add"),
            "{err}"
        );
    }
    // Without root it refuses with the reason, instead of running guests unconfined. Run as
    // `nobody` when this test runs as root and `setpriv` exists; as a user, directly.
    let exe = env!("CARGO_BIN_EXE_createos-fake");
    let mut cmd = if nix::unistd::geteuid().is_root() {
        if !std::path::Path::new("/usr/bin/setpriv").exists() {
            eprintln!("skipped the non-root half: running as root and setpriv is missing");
            return;
        }
        let mut c = std::process::Command::new("/usr/bin/setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", exe]);
        c
    } else {
        std::process::Command::new(exe)
    };
    let out = cmd
        .args(["--port", "0", "--enforce-egress"])
        .output()
        .expect("run the fake");
    let err = String::from_utf8_lossy(&out.stderr);
    if err.contains("Permission denied") {
        eprintln!("skipped the non-root half: `nobody` cannot run the test binary here: {err}");
        return;
    }
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--enforce-egress cannot run here") && err.contains("root"),
        "{err}"
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).is_empty(),
        "it must not start listening"
    );
}
