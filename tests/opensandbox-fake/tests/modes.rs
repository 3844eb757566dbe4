//! The server modes a provider must detect or survive: host networking, egress modes and
//! sidecars, secure runtimes, Kubernetes, paused sandboxes, execd start-up.

mod common;

use std::time::{Duration, Instant};

use common::{Bin, FrameReader};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

const DENY_ALL: &str =
    r#"{"defaultAction": "deny", "egress": [{"action": "allow", "target": "pypi.org"}]}"#;

fn deny_all() -> Value {
    serde_json::from_str(DENY_ALL).unwrap()
}

#[tokio::test]
async fn host_network_mode_shares_one_endpoint_and_misroutes_commands() {
    let bin = Bin::spawn(&["--network-mode", "host"]);
    let first = bin.create_id().await;
    let second = bin.create_id().await;
    for id in [&first, &second] {
        let (_, v) = bin
            .call(
                Method::GET,
                &format!("/v1/sandboxes/{id}/endpoints/44772"),
                None,
            )
            .await;
        assert_eq!(
            v["endpoint"], "127.0.0.1:44772",
            "every sandbox reports the same endpoint"
        );
    }
    // The oldest sandbox's execd holds port 44772: the second sandbox's commands run there.
    let x = bin.sh(&second, "echo $OPENSANDBOX_ID").await;
    assert_eq!(
        x.stdout(),
        vec![first.clone()],
        "the canary shows another sandbox's id"
    );
    let x = bin.sh(&first, "echo $OPENSANDBOX_ID").await;
    assert_eq!(x.stdout(), vec![first.clone()]);
    // Files go astray the same way.
    bin.sh(&second, "echo from-second > /workspace/w").await;
    let (st, _) = bin
        .call(Method::DELETE, &format!("/v1/sandboxes/{first}"), None)
        .await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    let x = bin
        .sh(&second, "echo $OPENSANDBOX_ID; cat /workspace/w")
        .await;
    assert_eq!(
        x.stdout()[0],
        second,
        "with the holder gone, the next oldest answers"
    );
    assert_eq!(
        x.exit_code(),
        Some(1),
        "the file was written into the other sandbox"
    );
    // networkPolicy is refused on a host-mode server.
    let (st, v) = bin
        .call(Method::POST, "/v1/sandboxes", Some(json!({"image": {"uri": "python:3.12-slim"}, "entrypoint": ["x"], "resourceLimits": {}, "timeout": 60, "networkPolicy": deny_all()})))
        .await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    assert_eq!(
        v["message"],
        "networkPolicy is not supported when docker network_mode=host."
    );
}

#[tokio::test]
async fn networkpolicy_reads_back_the_sidecar_status() {
    let bin = Bin::spawn(&[]);
    let id = bin.create(json!({"networkPolicy": deny_all()})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let path = format!("/v1/sandboxes/{id}/networkpolicy");
    let (st, v) = bin.call(Method::GET, &path, None).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(
        v,
        json!({"status": "ok", "mode": "enforcing", "enforcementMode": "dns+nft",
               "policy": {"defaultAction": "deny", "egress": [{"action": "allow", "target": "pypi.org"}]}})
    );
    // Without /v1, and through the proxy to port 18080, it is the same sidecar.
    let (_, v2) = bin
        .call(Method::GET, &format!("/sandboxes/{id}/networkpolicy"), None)
        .await;
    assert_eq!(v2, v);
    let r = bin
        .http
        .get(format!("{}/v1/sandboxes/{id}/proxy/18080/policy", bin.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.json::<Value>().await.unwrap(), v);
    // PUT replaces, PATCH merges by target, DELETE removes targets.
    let (st, v) = bin
        .call(
            Method::PUT,
            &path,
            Some(json!({"defaultAction": "deny", "egress": []})),
        )
        .await;
    assert_eq!((st, v["mode"].as_str()), (StatusCode::OK, Some("deny_all")));
    let (_, v) = bin
        .call(
            Method::PATCH,
            &path,
            Some(json!([{"action": "allow", "target": "*.example.com"}])),
        )
        .await;
    assert_eq!(
        v["policy"]["egress"],
        json!([{"action": "allow", "target": "*.example.com"}])
    );
    let (_, v) = bin
        .call(Method::DELETE, &path, Some(json!(["*.example.com"])))
        .await;
    assert_eq!(v["policy"]["egress"], json!([]));
    assert_eq!(v["policy"]["defaultAction"], "deny");
    // The sidecar is paused with its sandbox.
    let (st, _) = bin
        .call(Method::POST, &format!("/v1/sandboxes/{id}/pause"), None)
        .await;
    assert_eq!(st, StatusCode::ACCEPTED);
    let slow = bin
        .req(Method::GET, &path)
        .timeout(Duration::from_millis(700))
        .send()
        .await;
    assert!(
        slow.is_err_and(|e| e.is_timeout()),
        "a paused sandbox's policy does not answer"
    );
}

#[tokio::test]
async fn no_sidecar_answers_502_backend_connection_failed() {
    let bin = Bin::spawn(&[]);
    // A sandbox created without a networkPolicy has no sidecar.
    let plain = bin.create_id().await;
    let (st, v) = bin
        .call(
            Method::GET,
            &format!("/v1/sandboxes/{plain}/networkpolicy"),
            None,
        )
        .await;
    assert_eq!(
        (st, v["code"].as_str()),
        (StatusCode::BAD_GATEWAY, Some("BACKEND_CONNECTION_FAILED"))
    );
    // A server whose sidecars are absent: the policy was accepted but nothing enforces it.
    bin.config(json!({"sidecar_absent": true})).await;
    let id = bin.create(json!({"networkPolicy": deny_all()})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (st, v) = bin
        .call(
            Method::GET,
            &format!("/v1/sandboxes/{id}/networkpolicy"),
            None,
        )
        .await;
    assert_eq!(
        (st, v["code"].as_str()),
        (StatusCode::BAD_GATEWAY, Some("BACKEND_CONNECTION_FAILED"))
    );
    let (_, v) = bin
        .call(
            Method::GET,
            &format!("/v1/sandboxes/{id}/endpoints/18080"),
            None,
        )
        .await;
    assert!(v.get("headers").is_none(), "no sidecar, no token");
    // A server without an egress image refuses the policy outright.
    bin.config(json!({"egress_mode": "none", "sidecar_absent": false}))
        .await;
    let (st, v) = bin
        .call(Method::POST, "/v1/sandboxes", Some(json!({"image": {"uri": "python:3.12-slim"}, "entrypoint": ["x"], "resourceLimits": {}, "networkPolicy": deny_all()})))
        .await;
    assert_eq!(
        (st, v["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("SANDBOX::INVALID_PARAMETER"))
    );
}

#[tokio::test]
async fn dns_mode_and_a_drifting_policy_read_back_as_they_are() {
    let bin = Bin::spawn(&["--egress-mode", "dns"]);
    let id = bin.create(json!({"networkPolicy": deny_all()})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let path = format!("/v1/sandboxes/{id}/networkpolicy");
    let (_, v) = bin.call(Method::GET, &path, None).await;
    assert_eq!(v["enforcementMode"], "dns");
    bin.config(json!({"egress_mode": "dns+nft", "policy_drift": "default-allow"}))
        .await;
    let (_, v) = bin.call(Method::GET, &path, None).await;
    assert_eq!(
        (
            v["enforcementMode"].as_str(),
            v["policy"]["defaultAction"].as_str()
        ),
        (Some("dns+nft"), Some("allow"))
    );
    bin.config(json!({"policy_drift": "extra-rule"})).await;
    let (_, v) = bin.call(Method::GET, &path, None).await;
    assert_eq!(v["policy"]["egress"].as_array().unwrap().len(), 2);
    assert_eq!(v["policy"]["egress"][1]["target"], "*");
    bin.config(json!({"policy_drift": "drop-rules"})).await;
    let (_, v) = bin.call(Method::GET, &path, None).await;
    assert_eq!(
        (v["policy"]["egress"].clone(), v["mode"].as_str()),
        (json!([]), Some("deny_all"))
    );
}

#[tokio::test]
async fn gvisor_refuses_policies_and_reports_its_kernel_in_guests() {
    let bin = Bin::spawn(&["--secure-runtime", "gvisor"]);
    let (st, v) = bin
        .call(Method::POST, "/v1/sandboxes", Some(json!({"image": {"uri": "python:3.12-slim"}, "entrypoint": ["x"], "resourceLimits": {}, "networkPolicy": deny_all()})))
        .await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    assert!(v["message"].as_str().unwrap().contains("gvisor"), "{v}");
    let id = bin.create_id().await;
    let x = bin.sh(&id, "uname -r; dmesg | head -1; uname -s").await;
    assert_eq!(
        x.stdout(),
        vec!["4.4.0", "[    0.000000] Starting gVisor...", "Linux"]
    );
    let x = bin.exec(&id, json!({"argv": ["uname", "-r"]})).await;
    assert_eq!(x.stdout(), vec!["4.4.0"]);
    // Kata: a guest kernel of its own; runc: the host's.
    bin.config(json!({"secure_runtime": "kata", "guest_kernel": "6.1.99-kata-guest"}))
        .await;
    assert_eq!(
        bin.sh(&id, "uname -r").await.stdout(),
        vec!["6.1.99-kata-guest"]
    );
    bin.config(json!({"secure_runtime": "none"})).await;
    let host = String::from_utf8(
        std::process::Command::new("uname")
            .arg("-r")
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert_eq!(
        bin.sh(&id, "uname -r").await.stdout(),
        vec![host.trim().to_owned()]
    );
}

#[tokio::test]
async fn kubernetes_answers_pending_then_running_and_prints_the_runtime_class() {
    let bin = Bin::spawn(&[
        "--runtime",
        "kubernetes",
        "--pending-ms",
        "600",
        "--secure-runtime",
        "firecracker",
    ]);
    let v = bin.create(json!({})).await;
    assert_eq!(v["status"]["state"], "Pending");
    let id = v["id"].as_str().unwrap().to_owned();
    // execd is not reachable while the pod is pending.
    let r = bin
        .http
        .get(format!("{}/v1/sandboxes/{id}/proxy/44772/ping", bin.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_GATEWAY);
    let started = Instant::now();
    loop {
        let (_, v) = bin
            .call(Method::GET, &format!("/v1/sandboxes/{id}"), None)
            .await;
        if v["status"]["state"] == "Running" {
            break;
        }
        assert_eq!(v["status"]["state"], "Pending");
        assert!(started.elapsed() < Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(started.elapsed() >= Duration::from_millis(400));
    assert_eq!(bin.sh(&id, "echo ok").await.stdout(), vec!["ok"]);
    let text = bin
        .req(
            Method::GET,
            &format!("/v1/sandboxes/{id}/diagnostics/inspect"),
        )
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.lines().any(|l| l == "Runtime Class:  kata-fc"),
        "{text}"
    );
    bin.config(json!({"runtime_class": "custom-rc"})).await;
    let text = bin
        .req(
            Method::GET,
            &format!("/v1/sandboxes/{id}/diagnostics/inspect"),
        )
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.contains("Runtime Class:  custom-rc"));
    let (st, v) = bin.call(Method::GET, "/v1/sandboxes/nope", None).await;
    assert_eq!(
        (st, v["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("KUBERNETES::SANDBOX_NOT_FOUND"))
    );
    // Pause goes through Pausing; processes do not survive it (the pod is released).
    let bg = bin
        .exec(&id, json!({"command": "sleep 30", "background": true}))
        .await
        .id();
    let (st, _) = bin
        .call(Method::POST, &format!("/v1/sandboxes/{id}/pause"), None)
        .await;
    assert_eq!(st, StatusCode::ACCEPTED);
    let (_, v) = bin
        .call(Method::GET, &format!("/v1/sandboxes/{id}"), None)
        .await;
    assert_eq!(v["status"]["state"], "Pausing");
    let (st, v) = bin
        .call(Method::POST, &format!("/v1/sandboxes/{id}/pause"), None)
        .await;
    assert_eq!(
        (st, v["code"].as_str()),
        (StatusCode::CONFLICT, Some("KUBERNETES::INVALID_STATE"))
    );
    wait_state(&bin, &id, "Paused").await;
    let (st, _) = bin
        .call(Method::POST, &format!("/v1/sandboxes/{id}/resume"), None)
        .await;
    assert_eq!(st, StatusCode::ACCEPTED);
    wait_state(&bin, &id, "Running").await;
    let (_, v) = bin
        .call(
            Method::GET,
            &format!("/v1/sandboxes/{id}/proxy/44772/command/status/{bg}"),
            None,
        )
        .await;
    assert_eq!(
        (v["running"].as_bool(), v["exit_code"].as_i64()),
        (Some(false), Some(-1))
    );
}

async fn wait_state(bin: &Bin, id: &str, state: &str) {
    let started = Instant::now();
    loop {
        let (_, v) = bin
            .call(Method::GET, &format!("/v1/sandboxes/{id}"), None)
            .await;
        if v["status"]["state"] == state {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "never {state}: {v}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn exec_on_a_paused_sandbox_hangs_and_a_frozen_stream_sends_nothing() {
    let bin = Bin::spawn(&["--proxy-timeout-ms", "1500"]);
    let id = bin.create_id().await;
    // A running command: frames and pings flow, then stop entirely while paused.
    let resp = bin
        .http
        .post(format!("{}/v1/sandboxes/{id}/proxy/44772/command", bin.url))
        .json(&json!({"command": "for i in 1 2 3 4 5 6 7 8; do echo $i; sleep 0.2; done"}))
        .send()
        .await
        .unwrap();
    let mut frames = FrameReader::new(resp);
    assert_eq!(
        frames.next(Duration::from_secs(5)).await.unwrap().unwrap()["type"],
        "init"
    );
    let (st, _) = bin
        .call(Method::POST, &format!("/v1/sandboxes/{id}/pause"), None)
        .await;
    assert_eq!(st, StatusCode::ACCEPTED);
    // Drain what was in flight, then expect silence: no output, no ping, no end (pings come
    // every 300 ms on a live stream).
    let mut silent = false;
    for _ in 0..40 {
        if frames.next(Duration::from_millis(900)).await.is_err() {
            silent = true;
            break;
        }
    }
    assert!(silent, "a paused sandbox's stream kept sending frames");
    // A new command on the paused sandbox gets no answer; the proxy gives up with 504.
    let started = Instant::now();
    let r = bin
        .http
        .post(format!("{}/v1/sandboxes/{id}/proxy/44772/command", bin.url))
        .json(&json!({"command": "echo hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::GATEWAY_TIMEOUT);
    assert!(started.elapsed() >= Duration::from_millis(1400));
    assert_eq!(r.json::<Value>().await.unwrap()["code"], "BACKEND_TIMEOUT");
    // Resume: the first stream carries on to its end.
    let (st, _) = bin
        .call(Method::POST, &format!("/v1/sandboxes/{id}/resume"), None)
        .await;
    assert_eq!(st, StatusCode::ACCEPTED);
    let mut last = Value::Null;
    while let Ok(Some(f)) = frames.next(Duration::from_secs(10)).await {
        last = f;
    }
    assert_eq!(last["type"], "execution_complete");
}

#[tokio::test]
async fn execd_is_not_ready_right_after_running() {
    let bin = Bin::spawn(&["--execd-ready-ms", "800"]);
    let v = bin.create(json!({})).await;
    assert_eq!(
        v["status"]["state"], "Running",
        "Running before execd answers"
    );
    let id = v["id"].as_str().unwrap();
    let ping = format!("{}/v1/sandboxes/{id}/proxy/44772/ping", bin.url);
    let r = bin.http.get(&ping).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::BAD_GATEWAY);
    assert_eq!(
        r.json::<Value>().await.unwrap()["code"],
        "BACKEND_CONNECTION_FAILED"
    );
    let started = Instant::now();
    while bin.http.get(&ping).send().await.unwrap().status() != StatusCode::OK {
        assert!(started.elapsed() < Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(bin.sh(id, "echo up").await.stdout(), vec!["up"]);
}

#[tokio::test]
async fn other_ports_and_unknown_execd_paths() {
    let bin = Bin::spawn(&[]);
    let id = bin.create_id().await;
    let r = bin
        .http
        .get(format!("{}/v1/sandboxes/{id}/proxy/8080/", bin.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_GATEWAY);
    let r = bin
        .http
        .get(format!("{}/v1/sandboxes/{id}/proxy/44772/nothing", bin.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn an_image_the_server_does_not_hold_fails_its_pull() {
    // Docker pulls inside the create: 500 DOCKER::SANDBOX_IMAGE_PULL_FAILED, nothing made.
    let bin = Bin::spawn(&[]);
    let body = json!({"image": {"uri": "devbox:1"}, "entrypoint": ["x"], "resourceLimits": {}});
    let (st, v) = bin
        .call(Method::POST, "/v1/sandboxes", Some(body.clone()))
        .await;
    assert_eq!(st, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(v["code"], "DOCKER::SANDBOX_IMAGE_PULL_FAILED");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .starts_with("Failed to pull image devbox:1: "),
        "{v}"
    );
    let (_, stats) = bin.call(Method::GET, "/_fake/stats", None).await;
    assert_eq!(stats["live"], 0, "{stats}");
    // The default image is held; more can be listed, or all accepted, at start or later.
    bin.create(json!({})).await;
    let (st, _) = bin
        .call(
            Method::POST,
            "/_fake/config",
            Some(json!({"images": ["devbox:1"]})),
        )
        .await;
    assert_eq!(st, StatusCode::OK);
    let (st, _) = bin
        .call(Method::POST, "/v1/sandboxes", Some(body.clone()))
        .await;
    assert_eq!(st, StatusCode::ACCEPTED);
    let any = Bin::spawn(&["--images", "*"]);
    let (st, _) = any.call(Method::POST, "/v1/sandboxes", Some(body)).await;
    assert_eq!(st, StatusCode::ACCEPTED);
    // Kubernetes: the create waits for the pod, which fails in ErrImagePull; the server
    // answers 500 with the controller's summary and keeps nothing.
    let k8s = Bin::spawn(&["--runtime", "kubernetes", "--pending-ms", "100"]);
    let (st, v) = k8s
        .call(
            Method::POST,
            "/v1/sandboxes",
            Some(json!({
                "image": {"uri": "registry.invalid/nope:1"},
                "entrypoint": ["sh"],
                "resourceLimits": {"cpu": "1", "memory": "256Mi"},
            })),
        )
        .await;
    assert_eq!(st, StatusCode::INTERNAL_SERVER_ERROR, "{v}");
    assert_eq!(v["code"], "KUBERNETES::POD_FAILED", "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("primary reason=ErrImagePull"),
        "{v}"
    );
    let (_, v) = k8s.call(Method::GET, "/v1/sandboxes", None).await;
    assert_eq!(v["items"], json!([]), "{v}");
}
