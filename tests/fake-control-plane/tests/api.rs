//! Envelopes, auth, base path, catalog and the sandbox lifecycle, over HTTP.

mod common;

use common::{Fx, fast};
use createos_fake::FakeOptions;
use reqwest::Method;
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread")]
async fn health_and_catalog_need_no_key_but_accept_one() {
    let fx = Fx::new().await;
    for path in ["/healthz", "/readyz", "/v1/shapes", "/v1/rootfs"] {
        let anon = fx.send(Method::GET, path, None, None).await;
        assert_eq!(anon.status, 200, "{path}: {anon:?}");
        assert_eq!(anon.body["status"], "success");
        assert!(
            anon.headers.contains_key("x-request-id"),
            "{path} lacks X-Request-ID"
        );
        let keyed = fx.get(path).await;
        assert_eq!(keyed.status, 200);
    }
    assert_eq!(fx.get("/healthz").await.data()["up"], true);
    let ready = fx.get("/readyz").await;
    assert_eq!(ready.data()["ready"], true);
    let shapes = fx.get("/v1/shapes").await;
    let rows = shapes.data()["data"].as_array().unwrap().clone();
    let ids: Vec<&str> = rows.iter().map(|r| r["id"].as_str().unwrap()).collect();
    for want in [
        "s-1vcpu-256mb",
        "s-2vcpu-2gb",
        "s-2vcpu-4gb",
        "s-4vcpu-8gb",
        "s-4vcpu-16gb",
    ] {
        assert!(ids.contains(&want), "missing shape {want}");
    }
    let four = rows.iter().find(|r| r["id"] == "s-2vcpu-4gb").unwrap();
    assert_eq!(four["vcpu"], 2);
    assert_eq!(four["mem_mib"], 4096);
    assert!(four["default_disk_mib"].as_u64().unwrap() > 0);
    assert_eq!(shapes.data()["pagination"]["total"], rows.len());
    let rootfs = fx.get("/v1/rootfs").await;
    assert_eq!(rootfs.data()["default"], "devbox:1");
    assert!(
        rootfs.data()["rootfs"]
            .as_array()
            .unwrap()
            .contains(&json!("devbox:1"))
    );
    assert_eq!(rootfs.data()["entries"][0]["deprecated"], false);
}

#[tokio::test(flavor = "multi_thread")]
async fn auth_is_required_and_errors_are_jsend_with_request_ids() {
    let fx = Fx::new().await;
    let missing = fx.send(Method::GET, "/v1/whoami", None, None).await;
    assert_eq!(missing.status, 401);
    assert_eq!(missing.body["status"], "error");
    assert_eq!(missing.body["code"], 401);
    assert!(missing.headers.contains_key("x-request-id"));
    let wrong = fx
        .send(Method::GET, "/v1/sandboxes", Some("wrong-key-123"), None)
        .await;
    assert_eq!(wrong.status, 401);
    assert!(
        !wrong.text.contains("wrong-key-123"),
        "the key must not be echoed"
    );
    let who = fx.get("/v1/whoami").await;
    assert!(who.data()["user_id"].is_string());
    assert_eq!(who.data()["stats"]["total"], 0);
    // Request ids are distinct.
    let a = fx.get("/healthz").await.headers["x-request-id"].clone();
    let b = fx.get("/healthz").await.headers["x-request-id"].clone();
    assert_ne!(a, b);
    // 404 for an unknown sandbox and an unknown route, 405 for a wrong method.
    let nf = fx.get("/v1/sandboxes/sbx-nope").await;
    assert_eq!(nf.status, 404);
    assert_eq!(nf.body["status"], "fail");
    assert_eq!(fx.get("/v1/nothing-here").await.status, 404);
    let wrong_method = fx
        .send(Method::PUT, "/v1/whoami", Some(&fx.key), None)
        .await;
    assert_eq!(wrong_method.status, 405);
    assert_eq!(wrong_method.body["status"], "error");
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_requests_get_a_jsend_400() {
    let fx = Fx::new().await;
    let resp = fx
        .http
        .post(format!("{}/v1/sandboxes", fx.url))
        .header("X-Api-Key", &fx.key)
        .header("Content-Type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["status"], "fail");
    for bad in [
        json!([1, 2]),
        json!({"shape": 5}),
        json!({}),
        json!({"shape": "s-9vcpu-1tb"}),
        json!({"shape": "s-1vcpu-256mb", "envs": {"A": 1}}),
        json!({"shape": "s-1vcpu-256mb", "egress": "x"}),
        json!({"shape": "s-1vcpu-256mb", "rootfs": "nope:9"}),
    ] {
        let r = fx.post("/v1/sandboxes", bad.clone()).await;
        assert_eq!(r.status, 400, "{bad} -> {r:?}");
        assert_eq!(r.body["status"], "fail");
    }
    let r = fx.get("/v1/sandboxes?limit=abc").await;
    assert_eq!(r.status, 400);
    let r = fx.get("/v1/sandboxes?status=sleeping").await;
    assert_eq!(r.status, 400);
    assert_eq!(
        fx.stats().await.created,
        0,
        "no invalid body creates a sandbox"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn base_path_prefixes_every_api_route() {
    let fx = Fx::with(FakeOptions {
        base_path: "/api".into(),
        ..fast()
    })
    .await;
    assert!(fx.url.ends_with("/api"));
    let id = fx.create(json!({})).await;
    assert_eq!(
        fx.get(&format!("/v1/sandboxes/{id}")).await.data()["id"],
        id
    );
    let root = fx.url.trim_end_matches("/api").to_owned();
    let outside = fx
        .http
        .get(format!("{root}/v1/whoami"))
        .header("X-Api-Key", &fx.key)
        .send()
        .await
        .unwrap();
    assert_eq!(outside.status().as_u16(), 404);
    // Control routes answer both inside and outside the base path.
    let stats = fx
        .http
        .get(format!("{root}/_fake/stats"))
        .send()
        .await
        .unwrap();
    assert_eq!(stats.status().as_u16(), 200);
    assert_eq!(fx.get("/_fake/stats").await.data()["created"], 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn create_get_list_delete_walks_the_state_machine() {
    let fx = Fx::new().await;
    let r = fx
        .post(
            "/v1/sandboxes",
            json!({"shape": "s-2vcpu-4gb", "name": "lf-demo-1", "rootfs": "devbox:1",
                   "egress": ["240.0.0.0/4"], "envs": {"SECRET_X": "v1"}, "auto_pause_after_seconds": 600}),
        )
        .await;
    let sb = r.data().clone();
    let id = sb["id"].as_str().unwrap().to_owned();
    assert_eq!(sb["status"], "running");
    assert_eq!(sb["name"], "lf-demo-1");
    assert_eq!(sb["mem_mib"], 4096);
    assert_eq!(sb["egress"], json!(["240.0.0.0/4"]));
    assert_eq!(sb["envs"], json!(["SECRET_X"]), "env names only");
    assert!(!r.text.contains("v1\""), "env values are never returned");
    assert_eq!(sb["auto_pause_after_seconds"], 600);
    assert!(sb["ip"].is_string());
    let got = fx.get(&format!("/v1/sandboxes/{id}")).await;
    assert_eq!(got.data()["id"], id);
    let by_ip = fx
        .get(&format!(
            "/v1/sandboxes/by-ip/{}",
            sb["ip"].as_str().unwrap()
        ))
        .await;
    assert_eq!(by_ip.data()["id"], id);
    let who = fx.get("/v1/whoami").await;
    assert_eq!(who.data()["stats"]["running"], 1);

    let del = fx.delete(&format!("/v1/sandboxes/{id}")).await;
    assert_eq!(del.data()["id"], id);
    assert_eq!(del.data()["status"], "destroying");
    assert_eq!(fx.stats().await.live, 0, "a DELETE was accepted");
    fx.wait_status(&id, "destroyed").await;
    let again = fx.delete(&format!("/v1/sandboxes/{id}")).await;
    assert_eq!(again.data()["status"], "destroyed");
    let st = fx.stats().await;
    assert_eq!((st.created, st.destroyed, st.live), (1, 1, 0));
    assert_eq!(st.requests.get("create"), Some(&1));
    assert_eq!(st.requests.get("delete"), Some(&2));
}

#[tokio::test(flavor = "multi_thread")]
async fn list_pages_and_filters_by_status() {
    let fx = Fx::new().await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(fx.create(json!({})).await);
    }
    let p1 = fx.get("/v1/sandboxes?limit=2&offset=0").await;
    assert_eq!(p1.data()["data"].as_array().unwrap().len(), 2);
    assert_eq!(p1.data()["pagination"]["total"], 3);
    assert_eq!(p1.data()["pagination"]["count"], 2);
    let p2 = fx.get("/v1/sandboxes?limit=2&offset=2").await;
    assert_eq!(p2.data()["data"].as_array().unwrap().len(), 1);
    assert_eq!(p2.data()["pagination"]["offset"], 2);
    assert_eq!(p2.data()["data"][0]["id"], ids[2].as_str());
    fx.post(&format!("/v1/sandboxes/{}/pause", ids[0]), json!({}))
        .await
        .data();
    let paused = fx.get("/v1/sandboxes?status=paused").await;
    let rows = paused.data()["data"].as_array().unwrap().clone();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["id"], ids[0].as_str());
    let running = fx.get("/v1/sandboxes?status=running&limit=500").await;
    assert_eq!(running.data()["pagination"]["total"], 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn names_are_short_and_unique_until_destroyed() {
    let fx = Fx::new().await;
    let long = fx
        .post(
            "/v1/sandboxes",
            json!({"shape": "s-1vcpu-256mb", "name": "a23456789012345678901bc"}),
        )
        .await;
    assert_eq!(long.status, 400, "23 characters is too long");
    let id = fx.create(json!({"name": "a2345678901234567890bc"})).await; // exactly 22
    let dup = fx
        .post(
            "/v1/sandboxes",
            json!({"shape": "s-1vcpu-256mb", "name": "a2345678901234567890bc"}),
        )
        .await;
    assert_eq!(dup.status, 409);
    assert_eq!(dup.body["status"], "fail");
    // Still taken while destroying.
    let fx2 = Fx::with(createos_fake::FakeOptions {
        destroy_delay: std::time::Duration::from_millis(600),
        ..fast()
    })
    .await;
    let id2 = fx2.create(json!({"name": "held"})).await;
    assert_eq!(
        fx2.delete(&format!("/v1/sandboxes/{id2}")).await.data()["status"],
        "destroying"
    );
    let during = fx2
        .post(
            "/v1/sandboxes",
            json!({"shape": "s-1vcpu-256mb", "name": "held"}),
        )
        .await;
    assert_eq!(
        during.status, 409,
        "a destroying sandbox still holds its name"
    );
    fx2.wait_status(&id2, "destroyed").await;
    let after = fx2
        .post(
            "/v1/sandboxes",
            json!({"shape": "s-1vcpu-256mb", "name": "held"}),
        )
        .await;
    assert_eq!(after.status, 200, "free again once destroyed: {after:?}");
    // A paused sandbox holds its name too.
    fx.post(&format!("/v1/sandboxes/{id}/pause"), json!({}))
        .await
        .data();
    let dup_paused = fx
        .post(
            "/v1/sandboxes",
            json!({"shape": "s-1vcpu-256mb", "name": "a2345678901234567890bc"}),
        )
        .await;
    assert_eq!(dup_paused.status, 409);
}

#[tokio::test(flavor = "multi_thread")]
async fn egress_is_stored_and_echoed() {
    let fx = Fx::new().await;
    let id = fx
        .create(json!({"egress": ["pypi.org", "1.1.1.1:53"]}))
        .await;
    let g = fx.get(&format!("/v1/sandboxes/{id}/egress")).await;
    assert_eq!(g.data()["egress"], json!(["pypi.org", "1.1.1.1:53"]));
    let p = fx
        .put(
            &format!("/v1/sandboxes/{id}/egress"),
            json!({"egress": ["*"]}),
        )
        .await;
    assert_eq!(p.data()["egress"], json!(["*"]));
    assert_eq!(p.data()["id"], id);
    let p = fx
        .put(
            &format!("/v1/sandboxes/{id}/egress"),
            json!({"egress": null}),
        )
        .await;
    assert_eq!(p.data()["egress"], json!([]));
    assert_eq!(
        fx.get(&format!("/v1/sandboxes/{id}")).await.data()["egress"],
        json!([])
    );
    let bad = fx
        .put(
            &format!("/v1/sandboxes/{id}/egress"),
            json!({"egress": [1]}),
        )
        .await;
    assert_eq!(bad.status, 400);
}

#[tokio::test(flavor = "multi_thread")]
async fn auto_pause_is_validated() {
    let fx = Fx::new().await;
    for bad in [59, 86_401] {
        let r = fx
            .post(
                "/v1/sandboxes",
                json!({"shape": "s-1vcpu-256mb", "auto_pause_after_seconds": bad}),
            )
            .await;
        assert_eq!(r.status, 400, "{bad}");
    }
    let id = fx.create(json!({"auto_pause_after_seconds": 60})).await;
    let r = fx
        .patch(
            &format!("/v1/sandboxes/{id}"),
            json!({"auto_pause_after_seconds": 30}),
        )
        .await;
    assert_eq!(r.status, 400);
    let r = fx
        .patch(
            &format!("/v1/sandboxes/{id}"),
            json!({"auto_pause_after_seconds": 86_400}),
        )
        .await;
    assert_eq!(r.data()["auto_pause_after_seconds"], 86_400);
    let r = fx
        .patch(
            &format!("/v1/sandboxes/{id}"),
            json!({"disable_auto_pause": true}),
        )
        .await;
    assert!(r.data().get("auto_pause_after_seconds").is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn odd_requests_never_break_the_server() {
    let fx = Fx::new().await;
    let id = fx.create(json!({})).await;
    let odd: Vec<(reqwest::Method, String, Vec<u8>)> = vec![
        (
            Method::POST,
            format!("/v1/sandboxes/{id}/exec"),
            b"\xff\xfe\x00".to_vec(),
        ),
        (
            Method::POST,
            format!("/v1/sandboxes/{id}/exec"),
            b"null".to_vec(),
        ),
        (
            Method::POST,
            format!("/v1/sandboxes/{id}/exec"),
            br#"{"cmd": ["x"]}"#.to_vec(),
        ),
        (
            Method::POST,
            format!("/v1/sandboxes/{id}/exec"),
            br#"{"cmd": "true", "env": [1]}"#.to_vec(),
        ),
        (
            Method::PATCH,
            format!("/v1/sandboxes/{id}"),
            br#"{"auto_pause_after_seconds": -5}"#.to_vec(),
        ),
        (
            Method::PUT,
            format!("/v1/sandboxes/{id}/files?path=%ZZ"),
            b"x".to_vec(),
        ),
        (
            Method::GET,
            format!("/v1/sandboxes/{id}/files?path=relative/path"),
            Vec::new(),
        ),
        (
            Method::POST,
            format!("/v1/sandboxes/{id}/processes"),
            br#"{"pty": 5}"#.to_vec(),
        ),
        (
            Method::POST,
            format!("/v1/sandboxes/{id}/processes"),
            br#"{"cmd": "true", "cwd": "../x"}"#.to_vec(),
        ),
        (
            Method::POST,
            format!("/v1/sandboxes/{id}/resize"),
            br#"{"disk_mib": "big"}"#.to_vec(),
        ),
        (
            Method::GET,
            "/v1/sandboxes?offset=-1".to_owned(),
            Vec::new(),
        ),
        (Method::POST, "/v1/templates".to_owned(), b"[]".to_vec()),
        (
            Method::POST,
            "/v1/disks".to_owned(),
            br#"{"name": "ok-name", "config": 3}"#.to_vec(),
        ),
    ];
    for (m, p, body) in odd {
        let r = fx
            .http
            .request(m.clone(), format!("{}{p}", fx.url))
            .header("X-Api-Key", &fx.key)
            .body(body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let v: Value = r.json().await.unwrap_or(Value::Null);
        assert_eq!(status, 400, "{m} {p}: {v}");
        assert_eq!(v["status"], "fail", "{m} {p}: {v}");
    }
    // Still serving.
    assert_eq!(fx.exec(&id, "echo", &["alive"]).await["stdout"], "alive\n");
}
