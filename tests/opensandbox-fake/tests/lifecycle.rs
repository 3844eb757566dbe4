//! The lifecycle API over HTTP: auth, errors, create validation, get/list/delete, metadata,
//! renew, pause/resume, endpoints, snapshots, diagnostics and the TTL.

mod common;

use std::time::Duration;

use common::{Bin, KEY};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

#[tokio::test]
async fn auth_is_required_except_health_and_the_proxy_and_every_answer_has_a_request_id() {
    let bin = Bin::spawn(&[]);
    let r = bin
        .http
        .get(format!("{}/v1/sandboxes", bin.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert!(r.headers().contains_key("x-request-id"));
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["code"], "MISSING_API_KEY");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("OPEN-SANDBOX-API-KEY")
    );
    let r = bin
        .http
        .get(format!("{}/sandboxes", bin.url))
        .header("OPEN-SANDBOX-API-KEY", "wrong")
        .header("X-Request-ID", "my-trace-1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        r.headers()["x-request-id"],
        "my-trace-1",
        "the caller's id is echoed"
    );
    assert_eq!(r.json::<Value>().await.unwrap()["code"], "INVALID_API_KEY");
    // An unknown path without a key is a 401 too (auth runs first), with a key a 404.
    let r = bin
        .http
        .get(format!("{}/v1/nothing", bin.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let (st, v) = bin.call(Method::GET, "/v1/nothing", None).await;
    assert_eq!(
        (st, v),
        (StatusCode::NOT_FOUND, json!({"detail": "Not Found"}))
    );
    let (st, _) = bin.call(Method::PUT, "/v1/sandboxes", None).await;
    assert_eq!(st, StatusCode::METHOD_NOT_ALLOWED);
    let r = bin
        .http
        .get(format!("{}/health", bin.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let id_a = r.headers()["x-request-id"].to_str().unwrap().to_owned();
    let r = bin
        .http
        .get(format!("{}/version", bin.url))
        .send()
        .await
        .unwrap();
    assert_ne!(
        r.headers()["x-request-id"].to_str().unwrap(),
        id_a,
        "ids are per request"
    );
    assert_eq!(r.json::<Value>().await.unwrap()["version"], "1.1.1");
    // The proxy is not checked (1.1.1 single-tenant): an unknown sandbox is a 404, not a 401.
    let r = bin
        .http
        .get(format!("{}/v1/sandboxes/nope/proxy/44772/ping", bin.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert_eq!(
        r.json::<Value>().await.unwrap()["code"],
        "DOCKER::SANDBOX_NOT_FOUND"
    );
}

#[tokio::test]
async fn create_validates_like_the_server() {
    let bin = Bin::spawn(&["--max-timeout-seconds", "3600"]);
    let base = json!({
        "image": {"uri": "python:3.12-slim"},
        "entrypoint": ["tail", "-f", "/dev/null"],
        "resourceLimits": {"cpu": "1", "memory": "1Gi"},
    });
    let with = |extra: Value| {
        let mut b = base.clone();
        for (k, v) in extra.as_object().unwrap() {
            if v.is_null() {
                b.as_object_mut().unwrap().remove(k);
            } else {
                b[k] = v.clone();
            }
        }
        b
    };
    let post = |body: Value| bin.call(Method::POST, "/v1/sandboxes", Some(body));
    // pydantic: 422 with FastAPI's detail list.
    let (st, v) = post(with(json!({"timeout": 30}))).await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(v["detail"][0]["loc"], json!(["body", "timeout"]));
    assert_eq!(v["detail"][0]["type"], "greater_than_equal");
    let (st, v) = post(with(json!({"entrypoint": null}))).await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        v["detail"][0]["msg"]
            .as_str()
            .unwrap()
            .contains("Entrypoint is required")
    );
    let (st, _) = post(with(json!({"resourceLimits": null}))).await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY);
    let (st, _) = post(with(json!({"snapshotId": "s1"}))).await;
    assert_eq!(
        st,
        StatusCode::UNPROCESSABLE_ENTITY,
        "image and snapshotId together"
    );
    let (st, _) = post(with(json!({"entrypoint": []}))).await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY);
    let r = bin
        .req(Method::POST, "/v1/sandboxes")
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    // The service: 400 {code, message}.
    let (st, v) = post(with(json!({"timeout": 99_999}))).await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    assert_eq!(v["code"], "SANDBOX::INVALID_PARAMETER");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("exceeds configured maximum of 3600s")
    );
    let (st, v) = post(with(json!({"metadata": {"opensandbox.io/id": "x"}}))).await;
    assert_eq!(
        (st, v["code"].as_str()),
        (
            StatusCode::BAD_REQUEST,
            Some("SANDBOX::INVALID_METADATA_LABEL")
        )
    );
    let (st, v) = post(with(json!({"metadata": {"ok": "a".repeat(64)}}))).await;
    assert_eq!(
        (st, v["code"].as_str()),
        (
            StatusCode::BAD_REQUEST,
            Some("SANDBOX::INVALID_METADATA_LABEL")
        )
    );
    let (st, v) = post(with(json!({"metadata": {"bad key": "v"}}))).await;
    assert_eq!(
        (st, v["code"].as_str()),
        (
            StatusCode::BAD_REQUEST,
            Some("SANDBOX::INVALID_METADATA_LABEL")
        )
    );
    let (st, v) = post(with(json!({"snapshotId": "missing", "image": null}))).await;
    assert_eq!(
        (st, v["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("SNAPSHOT::NOT_FOUND"))
    );
    assert_eq!(
        bin.stats().await["created"],
        0,
        "no refused create made a sandbox"
    );
    // A valid one, and a timeout of exactly the maximum.
    let (st, v) = post(with(json!({"timeout": 3600, "env": {"A": "1", "B": null}}))).await;
    assert_eq!(st, StatusCode::ACCEPTED, "{v}");
    assert_eq!(v["status"]["state"], "Running");
    assert!(v.get("image").is_none(), "a create answer has no image");
    // timeout null: manual cleanup, no expiresAt.
    let (st, v) = post(with(json!({"timeout": null}))).await;
    assert_eq!(st, StatusCode::ACCEPTED);
    assert!(v.get("expiresAt").is_none());
}

#[tokio::test]
async fn get_list_filter_page_and_delete() {
    let bin = Bin::spawn(&[]);
    let first = bin
        .create(json!({"metadata": {"created-by": "langflow", "example.com/run": "a"}}))
        .await;
    let second = bin
        .create(json!({"metadata": {"created-by": "langflow", "example.com/run": "b"}}))
        .await;
    let third = bin
        .create(json!({"metadata": {"created-by": "other"}}))
        .await;
    let (ida, idb, idc) = (
        first["id"].as_str().unwrap(),
        second["id"].as_str().unwrap(),
        third["id"].as_str().unwrap(),
    );
    let (st, v) = bin
        .call(Method::GET, &format!("/v1/sandboxes/{ida}"), None)
        .await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(v["image"]["uri"], "python:3.12-slim");
    assert_eq!(v["metadata"]["example.com/run"], "a");
    assert!(v["expiresAt"].is_string() && v["createdAt"].is_string());
    assert_eq!(v["entrypoint"], json!(["tail", "-f", "/dev/null"]));
    // The same route without /v1.
    let (st, _) = bin
        .call(Method::GET, &format!("/sandboxes/{ida}"), None)
        .await;
    assert_eq!(st, StatusCode::OK);
    // metadata=<urlencoded k=v&k2=v2>: AND, each side decoded once more (the SDK quotes the key
    // "example.com/run" as example.com%2Frun, and the whole value is encoded again).
    let ids = |v: &Value| -> Vec<String> {
        v["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["id"].as_str().unwrap().to_owned())
            .collect()
    };
    let (_, v) = bin
        .call(
            Method::GET,
            "/v1/sandboxes?metadata=created-by%3Dlangflow%26example.com%252Frun%3Da",
            None,
        )
        .await;
    assert_eq!(ids(&v), vec![ida.to_owned()]);
    let (_, v) = bin
        .call(
            Method::GET,
            "/v1/sandboxes?metadata=created-by%3Dlangflow",
            None,
        )
        .await;
    assert_eq!(
        ids(&v),
        vec![idb.to_owned(), ida.to_owned()],
        "newest first"
    );
    let (st, v) = bin
        .call(Method::GET, "/v1/sandboxes?metadata=novalue", None)
        .await;
    assert_eq!(
        (st, v["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("INVALID_METADATA_FORMAT"))
    );
    // Paging.
    let (_, v) = bin
        .call(Method::GET, "/v1/sandboxes?pageSize=2&page=2", None)
        .await;
    assert_eq!(ids(&v), vec![ida.to_owned()]);
    assert_eq!(
        v["pagination"],
        json!({"page": 2, "pageSize": 2, "totalItems": 3, "totalPages": 2, "hasNextPage": false})
    );
    let (st, _) = bin
        .call(Method::GET, "/v1/sandboxes?pageSize=500", None)
        .await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY);
    // state= is repeatable (OR) and case-insensitive.
    let (st, _) = bin
        .call(Method::POST, &format!("/v1/sandboxes/{idc}/pause"), None)
        .await;
    assert_eq!(st, StatusCode::ACCEPTED);
    let (_, v) = bin
        .call(Method::GET, "/v1/sandboxes?state=Paused", None)
        .await;
    assert_eq!(ids(&v), vec![idc.to_owned()]);
    let (_, v) = bin
        .call(
            Method::GET,
            "/v1/sandboxes?state=paused&state=Running",
            None,
        )
        .await;
    assert_eq!(v["pagination"]["totalItems"], 3);
    // Delete: 204, then 404 for get and for a second delete.
    let (st, v) = bin
        .call(Method::DELETE, &format!("/v1/sandboxes/{ida}"), None)
        .await;
    assert_eq!((st, v), (StatusCode::NO_CONTENT, Value::Null));
    let (st, v) = bin
        .call(Method::GET, &format!("/v1/sandboxes/{ida}"), None)
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    assert_eq!(v["code"], "DOCKER::SANDBOX_NOT_FOUND");
    let (st, _) = bin
        .call(Method::DELETE, &format!("/sandboxes/{ida}"), None)
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    let s = bin.stats().await;
    assert_eq!(
        (
            s["created"].as_u64(),
            s["deleted"].as_u64(),
            s["live"].as_u64()
        ),
        (Some(3), Some(1), Some(2))
    );
    assert_eq!(s["requests"]["create"], 3);
}

#[tokio::test]
async fn metadata_patch_is_a_json_merge_patch() {
    let bin = Bin::spawn(&[]);
    let id = bin
        .create(json!({"metadata": {"keep": "1", "drop": "2"}}))
        .await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let path = format!("/v1/sandboxes/{id}/metadata");
    let (st, v) = bin
        .call(
            Method::PATCH,
            &path,
            Some(json!({"drop": null, "new": "3", "keep": "4"})),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["metadata"], json!({"keep": "4", "new": "3"}));
    let (st, v) = bin
        .call(Method::PATCH, &path, Some(json!({"opensandbox.io/x": "1"})))
        .await;
    assert_eq!(
        (st, v["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("INVALID_METADATA_LABEL"))
    );
    let (st, v) = bin
        .call(Method::PATCH, &path, Some(json!({"k": "bad value"})))
        .await;
    assert_eq!(
        (st, v["code"].as_str()),
        (
            StatusCode::BAD_REQUEST,
            Some("SANDBOX::INVALID_METADATA_LABEL")
        )
    );
    let (_, v) = bin
        .call(Method::GET, &format!("/v1/sandboxes/{id}"), None)
        .await;
    assert_eq!(
        v["metadata"],
        json!({"keep": "4", "new": "3"}),
        "a refused patch changes nothing"
    );
    let (st, _) = bin
        .call(
            Method::PATCH,
            "/v1/sandboxes/nope/metadata",
            Some(json!({"a": "b"})),
        )
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND);
}

fn rfc3339_in(secs: i64) -> String {
    let t = time::OffsetDateTime::now_utc() + time::Duration::seconds(secs);
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap()
}

#[tokio::test]
async fn renew_accepts_shorter_and_beyond_the_maximum_but_not_the_past() {
    let bin = Bin::spawn(&["--max-timeout-seconds", "3600"]);
    let id = bin.create_id().await;
    let path = format!("/v1/sandboxes/{id}/renew-expiration");
    let (st, v) = bin
        .call(
            Method::POST,
            &path,
            Some(json!({"expiresAt": rfc3339_in(120)})),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "shorter than the 600 s it had: {v}");
    let got = v["expiresAt"].as_str().unwrap().to_owned();
    let (st, _) = bin
        .call(
            Method::POST,
            &path,
            Some(json!({"expiresAt": rfc3339_in(3 * 86_400)})),
        )
        .await;
    assert_eq!(
        st,
        StatusCode::OK,
        "three days, beyond max_sandbox_timeout_seconds"
    );
    let (_, v) = bin
        .call(Method::GET, &format!("/v1/sandboxes/{id}"), None)
        .await;
    assert_ne!(v["expiresAt"].as_str().unwrap(), got);
    let (st, v) = bin
        .call(
            Method::POST,
            &path,
            Some(json!({"expiresAt": rfc3339_in(-10)})),
        )
        .await;
    assert_eq!(
        (st, v["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("DOCKER::INVALID_EXPIRATION"))
    );
    let (st, _) = bin
        .call(Method::POST, &path, Some(json!({"expiresAt": "soon"})))
        .await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY);
    let manual = bin.create(json!({"timeout": null})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (st, _) = bin
        .call(
            Method::POST,
            &format!("/v1/sandboxes/{manual}/renew-expiration"),
            Some(json!({"expiresAt": rfc3339_in(60)})),
        )
        .await;
    assert_eq!(st, StatusCode::CONFLICT);
}

/// Expires sandbox `id` a second from now and polls it until it is gone (404); returns the
/// states it showed after `Running`, in order, each once, with what the proxy answered for
/// execd's `/ping` in that state.
async fn expire_and_watch(bin: &Bin, id: &str) -> Vec<(Value, StatusCode)> {
    let (st, _) = bin
        .call(
            Method::POST,
            &format!("/v1/sandboxes/{id}/renew-expiration"),
            Some(json!({"expiresAt": rfc3339_in(1)})),
        )
        .await;
    assert_eq!(st, StatusCode::OK);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut seen: Vec<(Value, StatusCode)> = Vec::new();
    loop {
        let (st, v) = bin
            .call(Method::GET, &format!("/v1/sandboxes/{id}"), None)
            .await;
        if st == StatusCode::NOT_FOUND {
            return seen;
        }
        assert_eq!(st, StatusCode::OK, "{v}");
        if v["status"]["state"] != "Running" && seen.last().map(|(s, _)| s) != Some(&v["status"]) {
            let (ping, _) = bin
                .call(
                    Method::GET,
                    &format!("/v1/sandboxes/{id}/proxy/44772/ping"),
                    None,
                )
                .await;
            seen.push((v["status"].clone(), ping));
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still there after its expiry"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn an_expired_docker_sandbox_shows_failed_then_is_deleted() {
    // As the real 1.1.1 server on Docker: the expiry kills the container (exit 137), a GET
    // shows `Failed` until it is removed, then 404.
    let bin = Bin::spawn(&["--expiry-failed-ms", "1000"]);
    let id = bin.create_id().await;
    let keep = bin.create_id().await;
    let seen = expire_and_watch(&bin, &id).await;
    assert_eq!(seen.len(), 1, "{seen:?}");
    let (status, ping) = &seen[0];
    assert_eq!(
        (&status["state"], &status["reason"], &status["message"]),
        (
            &json!("Failed"),
            &json!("CONTAINER_EXITED_ERROR"),
            &json!("Sandbox container exited with code 137.")
        )
    );
    assert_eq!(
        *ping,
        StatusCode::BAD_GATEWAY,
        "execd is gone with the container"
    );
    let s = bin.stats().await;
    assert_eq!(
        (s["expired"].as_u64(), s["live"].as_u64()),
        (Some(1), Some(1))
    );
    let (st, _) = bin
        .call(Method::GET, &format!("/v1/sandboxes/{keep}"), None)
        .await;
    assert_eq!(st, StatusCode::OK);
}

#[tokio::test]
async fn an_expired_sandbox_is_gone_at_once_on_kubernetes_or_when_asked() {
    for args in [
        &["--runtime", "kubernetes", "--pending-ms", "50"][..],
        &["--expiry-failed-ms", "0"][..],
    ] {
        let bin = Bin::spawn(args);
        let id = bin.create_id().await;
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let (_, v) = bin
                .call(Method::GET, &format!("/v1/sandboxes/{id}"), None)
                .await;
            if v["status"]["state"] == "Running" {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "{v}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let seen = expire_and_watch(&bin, &id).await;
        assert!(seen.is_empty(), "{args:?}: {seen:?}");
        assert_eq!(bin.stats().await["expired"].as_u64(), Some(1), "{args:?}");
    }
}

#[tokio::test]
async fn pause_and_resume_on_docker() {
    let bin = Bin::spawn(&[]);
    let id = bin.create_id().await;
    let (st, v) = bin
        .call(Method::POST, &format!("/v1/sandboxes/{id}/pause"), None)
        .await;
    assert_eq!((st, v), (StatusCode::ACCEPTED, Value::Null));
    let (_, v) = bin
        .call(Method::GET, &format!("/v1/sandboxes/{id}"), None)
        .await;
    assert_eq!(v["status"]["state"], "Paused");
    let (st, v) = bin
        .call(Method::POST, &format!("/v1/sandboxes/{id}/pause"), None)
        .await;
    assert_eq!(
        (st, v["code"].as_str()),
        (StatusCode::CONFLICT, Some("DOCKER::SANDBOX_NOT_RUNNING"))
    );
    let (st, _) = bin
        .call(Method::POST, &format!("/v1/sandboxes/{id}/resume"), None)
        .await;
    assert_eq!(st, StatusCode::ACCEPTED);
    let (_, v) = bin
        .call(Method::GET, &format!("/v1/sandboxes/{id}"), None)
        .await;
    assert_eq!(v["status"]["state"], "Running");
    let (st, v) = bin
        .call(Method::POST, &format!("/v1/sandboxes/{id}/resume"), None)
        .await;
    assert_eq!(
        (st, v["code"].as_str()),
        (StatusCode::CONFLICT, Some("DOCKER::SANDBOX_NOT_PAUSED"))
    );
}

#[tokio::test]
async fn endpoints_point_at_the_proxy_and_carry_the_sidecar_header() {
    let bin = Bin::spawn(&[]);
    let id = bin
        .create(json!({"networkPolicy": {"defaultAction": "deny", "egress": []}}))
        .await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let hostport = bin.url.trim_start_matches("http://").to_owned();
    let (st, v) = bin
        .call(
            Method::GET,
            &format!("/v1/sandboxes/{id}/endpoints/44772"),
            None,
        )
        .await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(
        v,
        json!({"endpoint": format!("{hostport}/sandboxes/{id}/proxy/44772")})
    );
    let (_, v) = bin
        .call(
            Method::GET,
            &format!("/v1/sandboxes/{id}/endpoints/44772?use_server_proxy=true"),
            None,
        )
        .await;
    assert_eq!(
        v["endpoint"],
        format!("{hostport}/v1/sandboxes/{id}/proxy/44772")
    );
    let (_, v) = bin
        .call(
            Method::GET,
            &format!("/sandboxes/{id}/endpoints/44772?use_server_proxy=true"),
            None,
        )
        .await;
    assert_eq!(
        v["endpoint"],
        format!("{hostport}/sandboxes/{id}/proxy/44772"),
        "the mount of the call"
    );
    let (_, v) = bin
        .call(
            Method::GET,
            &format!("/v1/sandboxes/{id}/endpoints/18080"),
            None,
        )
        .await;
    assert!(
        v["headers"]["OPENSANDBOX-EGRESS-AUTH"]
            .as_str()
            .is_some_and(|t| t.len() >= 16),
        "{v}"
    );
    // The endpoint really serves execd.
    let r = bin
        .http
        .get(format!(
            "http://{}/ping",
            v["endpoint"].as_str().unwrap().replace("18080", "44772")
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let (st, _) = bin
        .call(
            Method::GET,
            &format!("/v1/sandboxes/{id}/endpoints/0"),
            None,
        )
        .await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    let (st, _) = bin
        .call(
            Method::GET,
            &format!("/v1/sandboxes/{id}/endpoints/44772?use_server_proxy=true&expires=1"),
            None,
        )
        .await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    let (st, _) = bin
        .call(Method::GET, "/v1/sandboxes/nope/endpoints/44772", None)
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn snapshots_become_ready_and_restore_the_files() {
    let bin = Bin::spawn(&["--snapshot-ms", "300"]);
    let id = bin.create_id().await;
    let x = bin.sh(&id, "echo kept > /workspace/f.txt").await;
    assert_eq!(x.exit_code(), Some(0));
    let (st, snap) = bin
        .call(
            Method::POST,
            &format!("/v1/sandboxes/{id}/snapshots"),
            Some(json!({"name": "s1"})),
        )
        .await;
    assert_eq!(st, StatusCode::ACCEPTED, "{snap}");
    assert_eq!(snap["status"]["state"], "Creating");
    assert_eq!(
        (snap["sandboxId"].as_str(), snap["name"].as_str()),
        (Some(id.as_str()), Some("s1"))
    );
    let sid = snap["id"].as_str().unwrap().to_owned();
    // Not ready yet: a restore is a 409.
    let (st, v) = bin
        .call(
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"snapshotId": sid, "resourceLimits": {"cpu": "1"}, "timeout": 600})),
        )
        .await;
    assert_eq!(
        (st, v["code"].as_str()),
        (StatusCode::CONFLICT, Some("SNAPSHOT::NOT_READY"))
    );
    // The source changes after the snapshot; the restore must not see that.
    bin.sh(&id, "echo later > /workspace/f.txt").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (_, v) = bin
        .call(Method::GET, &format!("/v1/snapshots/{sid}"), None)
        .await;
    assert_eq!(v["status"]["state"], "Ready");
    let (_, v) = bin
        .call(
            Method::GET,
            &format!("/v1/snapshots?sandboxId={id}&state=Ready"),
            None,
        )
        .await;
    assert_eq!(v["items"].as_array().unwrap().len(), 1);
    let restored = bin
        .call(
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"snapshotId": sid, "resourceLimits": {"cpu": "1"}, "timeout": 600})),
        )
        .await
        .1;
    let rid = restored["id"].as_str().unwrap().to_owned();
    assert_eq!(restored["entrypoint"], json!(["tail", "-f", "/dev/null"]));
    let (_, v) = bin
        .call(Method::GET, &format!("/v1/sandboxes/{rid}"), None)
        .await;
    assert_eq!(v["snapshotId"], sid);
    assert!(v.get("image").is_none());
    let x = bin
        .sh(&rid, "cat /workspace/f.txt; echo $OPENSANDBOX_ID")
        .await;
    assert_eq!(x.stdout(), vec!["kept".to_owned(), rid.clone()]);
    let (st, _) = bin
        .call(Method::DELETE, &format!("/v1/snapshots/{sid}"), None)
        .await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    let (st, _) = bin
        .call(Method::GET, &format!("/v1/snapshots/{sid}"), None)
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn inspect_is_plain_text_without_a_runtime_line_on_docker() {
    let bin = Bin::spawn(&["--secure-runtime", "kata"]);
    let id = bin
        .create(json!({"env": {"API_TOKEN": "s3cret", "PLAIN": "v"}}))
        .await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = bin
        .req(
            Method::GET,
            &format!("/v1/sandboxes/{id}/diagnostics/inspect"),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
    let text = r.text().await.unwrap();
    assert!(!text.contains("Runtime Class"), "{text}");
    assert!(text.contains(&format!("OPENSANDBOX_ID={id}")));
    assert!(
        text.contains("API_TOKEN=***") && !text.contains("s3cret"),
        "secrets are masked: {text}"
    );
    assert!(text.contains("PLAIN=v"));
}

#[tokio::test]
async fn the_sdk_metrics_report_is_accepted_under_v1() {
    let bin = Bin::spawn(&[]);
    let (st, _) = bin
        .call(
            Method::POST,
            "/v1/metrics/events",
            Some(json!({"eventType": "sandbox.create", "createDurationMs": 5, "success": true})),
        )
        .await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    let r = bin
        .http
        .post(format!("{}/v1/metrics/events", bin.url))
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        StatusCode::UNAUTHORIZED,
        "it needs the key like any route: {KEY}"
    );
}
