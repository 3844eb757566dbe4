//! Fault injection, the control routes, the request log and the stand-alone execd binary.

mod common;

use std::time::Duration;

use common::{Bin, FrameReader, KEY};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

#[tokio::test]
async fn delete_can_fail_once_with_500_and_then_succeed() {
    let bin = Bin::spawn(&["--faults", "delete=500#1"]);
    let id = bin.create_id().await;
    let (st, v) = bin
        .call(Method::DELETE, &format!("/v1/sandboxes/{id}"), None)
        .await;
    assert_eq!(
        (st, v["code"].as_str()),
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            Some("DOCKER::SANDBOX_DELETE_FAILED")
        )
    );
    let (st, _) = bin
        .call(Method::GET, &format!("/v1/sandboxes/{id}"), None)
        .await;
    assert_eq!(st, StatusCode::OK, "the failed delete removed nothing");
    let (st, _) = bin
        .call(Method::DELETE, &format!("/v1/sandboxes/{id}"), None)
        .await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    assert_eq!(bin.stats().await["live"], 0);
}

#[tokio::test]
async fn a_lost_create_response_still_creates_the_sandbox() {
    let bin = Bin::spawn(&[]);
    bin.faults("create=reset-after#1").await;
    let r = bin
        .req(Method::POST, "/v1/sandboxes")
        .json(&json!({"image": {"uri": "python:3.12-slim"}, "entrypoint": ["x"], "resourceLimits": {}, "timeout": 600, "metadata": {"lf-create-id": "nonce-1"}}))
        .send()
        .await;
    assert!(r.is_err(), "the connection is closed unanswered: {r:?}");
    let (_, v) = bin
        .call(
            Method::GET,
            "/v1/sandboxes?metadata=lf-create-id%3Dnonce-1",
            None,
        )
        .await;
    let items = v["items"].as_array().unwrap();
    assert_eq!(
        items.len(),
        1,
        "the sandbox exists and is found by its nonce"
    );
    assert_eq!(bin.stats().await["created"], 1);
}

#[tokio::test]
async fn a_stalled_stream_sends_init_then_nothing_at_all() {
    let bin = Bin::spawn(&[]);
    let id = bin.create_id().await;
    bin.faults("command=stall-mid#1").await;
    let resp = bin
        .http
        .post(format!("{}/v1/sandboxes/{id}/proxy/44772/command", bin.url))
        .json(&json!({"command": "echo hi"}))
        .send()
        .await
        .unwrap();
    let mut frames = FrameReader::new(resp);
    assert_eq!(
        frames.next(Duration::from_secs(5)).await.unwrap().unwrap()["type"],
        "init"
    );
    assert!(
        frames.next(Duration::from_millis(1200)).await.is_err(),
        "no ping (every 300 ms), no output, no end"
    );
    drop(frames);
    // Only once: the next command behaves.
    assert_eq!(bin.sh(&id, "echo hi").await.stdout(), vec!["hi"]);
}

#[tokio::test]
async fn status_faults_on_proxied_execd_routes_and_bad_specs() {
    let bin = Bin::spawn(&[]);
    let id = bin.create_id().await;
    bin.faults("execd_ping=502#2").await;
    let ping = format!("{}/v1/sandboxes/{id}/proxy/44772/ping", bin.url);
    for _ in 0..2 {
        let r = bin.http.get(&ping).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::BAD_GATEWAY);
    }
    assert_eq!(
        bin.http.get(&ping).send().await.unwrap().status(),
        StatusCode::OK
    );
    let r = bin
        .http
        .put(format!("{}/_fake/faults", bin.url))
        .body("nope=500")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let r = bin
        .http
        .post(format!("{}/_fake/config", bin.url))
        .json(&json!({"network_mode": "overlay"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let r = bin
        .http
        .post(format!("{}/_fake/config", bin.url))
        .json(&json!({"secure_runtime": "firecracker"}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        StatusCode::BAD_REQUEST,
        "firecracker needs kubernetes"
    );
    let cfg: Value = bin
        .http
        .get(format!("{}/_fake/config", bin.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        cfg["network_mode"], "bridge",
        "a refused change changes nothing"
    );
}

#[tokio::test]
async fn reset_drops_everything_and_restores_the_start_up_configuration() {
    let bin = Bin::spawn(&["--egress-mode", "dns"]);
    let id = bin.create_id().await;
    // A child left running by a finished command belongs to the guest until it is dropped.
    let x = bin.sh(&id, "sleep 60 >/dev/null 2>&1 & echo $!").await;
    let pid: i32 = x.stdout()[0].parse().unwrap();
    assert!(common::alive(pid));
    bin.config(json!({"egress_mode": "dns+nft"})).await;
    let r = bin
        .http
        .post(format!("{}/_fake/reset", bin.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let s = bin.stats().await;
    assert_eq!(
        (s["live"].as_u64(), s["created"].as_u64()),
        (Some(0), Some(0))
    );
    let cfg: Value = bin
        .http
        .get(format!("{}/_fake/config", bin.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(cfg["egress_mode"], "dns");
    assert!(
        common::eventually(Duration::from_secs(5), || !common::alive(pid)).await,
        "reset killed the guest's leftover process"
    );
}

#[tokio::test]
async fn the_request_log_records_requests_without_headers() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("req.jsonl");
    let bin = Bin::spawn(&["--request-log", log.to_str().unwrap()]);
    let id = bin
        .create(json!({"metadata": {"created-by": "langflow"}}))
        .await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    bin.sh(&id, "true").await;
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains(KEY), "the key never reaches the log");
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["route"], "create");
    assert_eq!(lines[0]["method"], "POST");
    assert!(lines[0]["body"].as_str().unwrap().contains("created-by"));
    assert_eq!(lines[1]["route"], "proxy:command");
    assert_eq!(
        lines[1]["path"],
        format!("/v1/sandboxes/{id}/proxy/44772/command")
    );
}

#[tokio::test]
async fn sigterm_kills_the_guests_and_exits_cleanly() {
    let mut bin = Bin::spawn(&[]);
    let id = bin.create_id().await;
    let resp = bin
        .http
        .post(format!("{}/v1/sandboxes/{id}/proxy/44772/command", bin.url))
        .json(&json!({"command": "echo $$; sleep 60"}))
        .send()
        .await
        .unwrap();
    let mut frames = FrameReader::new(resp);
    let mut pid = None;
    while pid.is_none() {
        let f = frames.next(Duration::from_secs(5)).await.unwrap().unwrap();
        if f["type"] == "stdout" {
            pid = f["text"].as_str().unwrap().parse::<i32>().ok();
        }
    }
    let pid = pid.unwrap();
    let st = bin.terminate().unwrap();
    assert!(st.success(), "{st:?}");
    assert!(common::eventually(Duration::from_secs(5), || !common::alive(pid)).await);
}

#[tokio::test]
async fn the_standalone_execd_serves_the_machines_own_file_system() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap().to_owned();
    let bin = Bin::spawn_raw(&[
        "execd",
        "--listen",
        "127.0.0.1:0",
        "--root",
        &root,
        "--ping-ms",
        "200",
    ]);
    let r = bin
        .http
        .get(format!("{}/ping", bin.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let file = dir.path().join("up.txt");
    let boundary = "b0undary";
    let meta = json!({"path": file.to_str().unwrap(), "mode": 644});
    let body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"metadata\"; filename=\"metadata\"\r\n\r\n{meta}\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"up.txt\"\r\n\r\nreal file\r\n--{boundary}--\r\n"
    );
    let r = bin
        .http
        .post(format!("{}/files/upload", bin.url))
        .header(
            "content-type",
            format!("multipart/form-data; boundary={boundary}"),
        )
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "real file",
        "no path rewriting"
    );
    // No cwd: the --root directory; the daemon's environment is inherited.
    let resp = bin
        .http
        .post(format!("{}/command", bin.url))
        .json(&json!({"command": "pwd; cat up.txt"}))
        .send()
        .await
        .unwrap();
    let x = common::Exec::parse(&resp.text().await.unwrap());
    assert_eq!(
        x.stdout(),
        vec![
            std::fs::canonicalize(dir.path())
                .unwrap()
                .to_str()
                .unwrap()
                .to_owned(),
            "real file".to_owned()
        ]
    );
    // Also behind a bridge-mode server's /proxy/44772 prefix.
    let resp = bin
        .http
        .post(format!("{}/proxy/44772/command", bin.url))
        .json(&json!({"command": "exit 5"}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        common::Exec::parse(&resp.text().await.unwrap()).exit_code(),
        Some(5)
    );
    let r = bin
        .http
        .get(format!("{}/proxy/8080/", bin.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_GATEWAY);
}
