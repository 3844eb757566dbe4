//! The real `createos-fake` binary: CLI, first line, exec through HTTP, SIGTERM cleanup.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{Bin, Fx, client, eventually, fast, pid_alive};
use createos_fake::FakeOptions;
use serde_json::{Value, json};

fn start(args: &[&str]) -> Bin {
    let mut all = vec!["--api-key".to_owned(), "bin-key".to_owned()];
    all.extend(args.iter().map(|a| (*a).to_owned()));
    Bin::spawn(&all)
}

/// Creates a guest with `body` and returns its id.
async fn create(http: &reqwest::Client, url: &str, body: &Value) -> String {
    let created: Value = http
        .post(format!("{url}/v1/sandboxes"))
        .header("X-Api-Key", "bin-key")
        .json(body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    created["data"]["id"].as_str().unwrap().to_owned()
}

/// Uploads `data` to `path` in the guest `id`; asserts it was accepted.
async fn upload(http: &reqwest::Client, url: &str, id: &str, path: &str, data: &'static str) {
    let up = http
        .put(format!("{url}/v1/sandboxes/{id}/files"))
        .query(&[("path", path)])
        .header("X-Api-Key", "bin-key")
        .body(data)
        .send()
        .await
        .unwrap();
    assert_eq!(up.status().as_u16(), 200);
}

/// Stops the binary with SIGTERM; asserts it exited cleanly.
async fn terminate(mut bin: Bin) {
    let status = tokio::task::spawn_blocking(move || {
        let st = bin.terminate();
        drop(bin);
        st
    })
    .await
    .unwrap();
    assert!(status.is_some_and(|s| s.success()));
}

#[tokio::test(flavor = "multi_thread")]
async fn binary_serves_python_exec_and_cleans_up_on_sigterm() {
    let mut bin = start(&["--faults", "whoami=503#1", "--latency-ms", "1"]);
    let http = client();
    let health: Value = http
        .get(format!("{}/healthz", bin.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health["data"]["up"], true);
    // The CLI fault spec is active.
    let w = http
        .get(format!("{}/v1/whoami", bin.url))
        .header("X-Api-Key", "bin-key")
        .send()
        .await
        .unwrap();
    assert_eq!(w.status().as_u16(), 503);
    let w = http
        .get(format!("{}/v1/whoami", bin.url))
        .header("X-Api-Key", "bin-key")
        .send()
        .await
        .unwrap();
    assert_eq!(w.status().as_u16(), 200);
    let created: Value = http
        .post(format!("{}/v1/sandboxes", bin.url))
        .header("X-Api-Key", "bin-key")
        .json(&json!({"shape": "s-2vcpu-4gb"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["data"]["id"].as_str().unwrap().to_owned();
    let exec: Value = http
        .post(format!("{}/v1/sandboxes/{id}/exec", bin.url))
        .header("X-Api-Key", "bin-key")
        .json(&json!({"cmd": "python3", "args": ["-c", "print(1)"]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(exec["data"]["result"]["stdout"], "1\n");
    assert_eq!(exec["data"]["result"]["exit_code"], 0);
    // A background guest process is killed when the server gets SIGTERM.
    let bg: Value = http
        .post(format!("{}/v1/sandboxes/{id}/exec", bin.url))
        .header("X-Api-Key", "bin-key")
        .json(&json!({"cmd": "sh", "args": ["-c", "sleep 60 >/dev/null 2>&1 & echo $!"]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let pid: i32 = bg["data"]["result"]["stdout"]
        .as_str()
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(pid_alive(pid));
    let status = tokio::task::spawn_blocking(move || {
        let status = bin.terminate();
        (status, bin)
    })
    .await
    .unwrap();
    let (status, mut bin) = status;
    let status = status.expect("server did not exit on SIGTERM");
    assert!(status.success(), "clean exit: {status:?}");
    eventually("guest processes to die with the server", || !pid_alive(pid)).await;
    let rest = bin.rest.take().unwrap().join().unwrap();
    assert!(
        rest.contains("NO isolation"),
        "start-up warning printed: {rest:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn binary_rejects_a_bad_fault_spec() {
    let out = Command::new(env!("CARGO_BIN_EXE_createos-fake"))
        .args(["--port", "0", "--faults", "nowhere=500"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown route"));
}

#[tokio::test(flavor = "multi_thread")]
async fn latency_ms_delays_api_responses_but_not_control_routes() {
    const LATENCY: Duration = Duration::from_millis(700);
    let fx = Fx::with(FakeOptions {
        latency: LATENCY,
        ..fast()
    })
    .await;
    // Warm the connection so only the server's delay is measured.
    let _ = fx.http.get(fx.control("stats")).send().await.unwrap();
    for path in ["/healthz", "/v1/whoami"] {
        let t = Instant::now();
        let r = fx.get(path).await;
        let took = t.elapsed();
        assert_eq!(r.status, 200);
        assert!(took >= LATENCY, "{path} took {took:?}, under {LATENCY:?}");
        assert!(took < LATENCY * 10, "{path} took {took:?}");
    }
    let t = Instant::now();
    let r = fx.http.get(fx.control("stats")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert!(
        t.elapsed() < LATENCY,
        "control route slowed down: {:?}",
        t.elapsed()
    );
    // Without the flag there is no added delay.
    let quick = Fx::new().await;
    let t = Instant::now();
    assert_eq!(quick.get("/healthz").await.status, 200);
    assert!(t.elapsed() < LATENCY, "{:?}", t.elapsed());
}

#[tokio::test(flavor = "multi_thread")]
async fn guest_path_flag_puts_its_directories_first() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    let write_exe = |dir: &std::path::Path, name: &str, body: &str| {
        let p = dir.join(name);
        std::fs::write(&p, body).unwrap();
        let mut perms = std::fs::metadata(&p).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
        std::fs::set_permissions(&p, perms).unwrap();
    };
    write_exe(a.path(), "python3", "#!/bin/sh\necho shim-a \"$@\"\n");
    write_exe(b.path(), "python3", "#!/bin/sh\necho shim-b\n");
    write_exe(b.path(), "only-in-b", "#!/bin/sh\necho found-in-b\n");
    let dirs = format!("{}:{}", a.path().display(), b.path().display());
    let bin = start(&["--guest-path", &dirs]);
    let http = client();
    let call = |path: String, body: Value| {
        let http = http.clone();
        let url = format!("{}{path}", bin.url);
        async move {
            http.post(url)
                .header("X-Api-Key", "bin-key")
                .json(&body)
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        }
    };
    let created = call("/v1/sandboxes".into(), json!({"shape": "s-1vcpu-256mb"})).await;
    let id = created["data"]["id"].as_str().unwrap().to_owned();
    let exec = |cmd: &str, args: Vec<&str>| {
        call(
            format!("/v1/sandboxes/{id}/exec"),
            json!({"cmd": cmd, "args": args}),
        )
    };
    // The first directory wins over the second and over the host's python3.
    let r = exec("python3", vec!["-c", "print(1)"]).await;
    assert_eq!(r["data"]["result"]["stdout"], "shim-a -c print(1)\n");
    // Later directories are searched too, and the host PATH still follows them.
    let r = exec("only-in-b", vec![]).await;
    assert_eq!(r["data"]["result"]["stdout"], "found-in-b\n");
    let r = exec("sh", vec!["-c", "echo \"$PATH\""]).await;
    let path = r["data"]["result"]["stdout"]
        .as_str()
        .unwrap()
        .trim()
        .to_owned();
    assert!(
        path.starts_with(&dirs),
        "guest PATH {path:?} starts with {dirs:?}"
    );
    assert!(path.len() > dirs.len(), "host PATH follows: {path:?}");
    // Without the flag the host's own python3 runs.
    let plain = start(&[]);
    let created: Value = http
        .post(format!("{}/v1/sandboxes", plain.url))
        .header("X-Api-Key", "bin-key")
        .json(&json!({"shape": "s-1vcpu-256mb"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let pid = created["data"]["id"].as_str().unwrap();
    let r: Value = http
        .post(format!("{}/v1/sandboxes/{pid}/exec", plain.url))
        .header("X-Api-Key", "bin-key")
        .json(&json!({"cmd": "python3", "args": ["-c", "print(1)"]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["data"]["result"]["stdout"], "1\n");
}

/// A non-loopback IPv4 address of this machine, found by asking the kernel which source
/// address it would use for an outside destination (a UDP `connect` sends nothing).
fn non_loopback_ipv4() -> Option<std::net::Ipv4Addr> {
    let sock = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    for probe in ["192.0.2.1:9", "10.255.255.254:9", "172.31.255.254:9"] {
        if sock.connect(probe).is_ok()
            && let Ok(std::net::SocketAddr::V4(a)) = sock.local_addr()
            && !a.ip().is_loopback()
            && !a.ip().is_unspecified()
        {
            return Some(*a.ip());
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread")]
async fn binds_loopback_only() {
    let bin = start(&[]);
    let port: u16 = bin.root().rsplit(':').next().unwrap().parse().unwrap();
    // Reachable on loopback.
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
    let Some(ip) = non_loopback_ipv4() else {
        eprintln!(
            "SKIPPED binds_loopback_only's outside check: this machine has no non-loopback IPv4 \
             address (no route to anything but 127.0.0.0/8), so there is nothing to connect to"
        );
        return;
    };
    // Control: a listener on every interface *is* reachable at that address, so a refusal
    // below means the fake is not listening there, not that the address is unusable.
    let any = std::net::TcpListener::bind(("0.0.0.0", 0)).unwrap();
    let any_port = any.local_addr().unwrap().port();
    assert!(
        std::net::TcpStream::connect_timeout(&(ip, any_port).into(), Duration::from_secs(2))
            .is_ok(),
        "control listener unreachable at {ip}"
    );
    let outside = std::net::TcpStream::connect_timeout(&(ip, port).into(), Duration::from_secs(2));
    assert!(
        outside.is_err(),
        "the fake answered on {ip}:{port}, a non-loopback address"
    );
    // Nor on the IPv6 wildcard's loopback.
    assert!(std::net::TcpStream::connect(("::1", port)).is_err());
}

#[tokio::test(flavor = "multi_thread")]
async fn state_dir_flag_keeps_guest_directories_there() {
    let state = tempfile::tempdir().unwrap();
    let dir = state.path().join("guests");
    let dir_s = dir.to_string_lossy().into_owned();
    let bin = start(&["--state-dir", &dir_s, "--destroy-delay-ms", "50"]);
    let http = client();
    let small = json!({"shape": "s-1vcpu-256mb"});
    let id = create(&http, &bin.url, &small).await;
    upload(&http, &bin.url, &id, "/workspace/kept.txt", "on disk").await;
    let host = dir.join(&id).join("workspace").join("kept.txt");
    assert_eq!(std::fs::read_to_string(&host).unwrap(), "on disk");
    // A second guest, destroyed: its directory goes, the state directory stays.
    let other = create(&http, &bin.url, &small).await;
    assert!(dir.join(&other).is_dir());
    http.delete(format!("{}/v1/sandboxes/{other}", bin.url))
        .header("X-Api-Key", "bin-key")
        .send()
        .await
        .unwrap();
    eventually("the destroyed guest's directory to go", || {
        !dir.join(&other).exists()
    })
    .await;
    terminate(bin).await;
    assert!(dir.is_dir(), "a --state-dir is not removed at exit");
}

#[tokio::test(flavor = "multi_thread")]
async fn request_log_flag_records_routes_and_bodies_but_no_header() {
    let state = tempfile::tempdir().unwrap();
    let log = state.path().join("requests.jsonl");
    let bin = start(&["--request-log", &log.to_string_lossy()]);
    let http = client();
    let body = json!({"shape": "s-1vcpu-256mb", "envs": {"A": "in-the-create-body"}});
    let id = create(&http, &bin.url, &body).await;
    upload(
        &http,
        &bin.url,
        &id,
        "/workspace/job.json",
        "uploaded bytes",
    )
    .await;
    terminate(bin).await;
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains("bin-key"), "{text}");
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let create = lines.iter().find(|l| l["route"] == "create").unwrap();
    assert_eq!(create["method"], "POST");
    assert!(
        create["body"]
            .as_str()
            .unwrap()
            .contains("in-the-create-body")
    );
    let upload = lines.iter().find(|l| l["route"] == "upload").unwrap();
    assert_eq!(upload["body"], "uploaded bytes");
    assert_eq!(upload["query"], json!([["path", "/workspace/job.json"]]));
}
