//! Delegated sandbox access tokens: lifecycle and scope.

mod common;

use common::Fx;
use reqwest::Method;
use serde_json::json;

#[tokio::test(flavor = "multi_thread")]
async fn token_lifecycle_and_delegated_scope() {
    let fx = Fx::new().await;
    let id = fx.create(json!({})).await;
    let other = fx.create(json!({})).await;
    let path = format!("/v1/sandboxes/{id}/access-token");
    let none = fx.post(&format!("{path}/rotate"), json!({})).await;
    assert_eq!(none.status, 404);
    assert_eq!(
        none.body,
        json!({"status": "fail", "data": "sandbox access token not found"})
    );
    let created = fx.post(&path, json!({})).await;
    let token = created.data()["token"].as_str().unwrap().to_owned();
    assert!(token.starts_with("skp_sb_"));
    assert_eq!(created.data()["enabled"], true);
    assert!(created.data()["created_at"].is_string());
    assert_eq!(
        fx.post(&path, json!({})).await.status,
        409,
        "one enabled token per guest"
    );
    let meta = fx.get(&path).await;
    assert_eq!(meta.data()["enabled"], true);
    let hint = meta.data()["token_hint"].as_str().unwrap();
    assert!(
        hint.starts_with("skp_sb...") && token.ends_with(&hint[9..]),
        "{hint}"
    );
    assert!(
        !meta.text.contains(&token),
        "metadata never carries the plaintext"
    );

    // The delegated token operates its own guest only.
    let exec = fx
        .send(
            Method::POST,
            &format!("/v1/sandboxes/{id}/exec"),
            Some(&token),
            Some(json!({"cmd": "echo", "args": ["delegated"]})),
        )
        .await;
    assert_eq!(exec.data()["result"]["stdout"], "delegated\n");
    assert_eq!(
        fx.send(
            Method::GET,
            &format!("/v1/sandboxes/{id}"),
            Some(&token),
            None
        )
        .await
        .status,
        200
    );
    for (m, p) in [
        (Method::GET, format!("/v1/sandboxes/{other}")),
        (Method::GET, "/v1/whoami".to_owned()),
        (Method::GET, "/v1/sandboxes".to_owned()),
        (Method::GET, path.clone()),
        (Method::POST, format!("{path}/rotate")),
        (Method::GET, format!("/v1/sandboxes/{id}/egress")),
    ] {
        let r = fx.send(m.clone(), &p, Some(&token), None).await;
        assert_eq!(r.status, 403, "{m} {p}: {r:?}");
        assert_eq!(r.body["status"], "error");
    }
    let ex_other = fx
        .send(
            Method::POST,
            &format!("/v1/sandboxes/{other}/exec"),
            Some(&token),
            Some(json!({"cmd": "true"})),
        )
        .await;
    assert_eq!(ex_other.status, 403);

    // Rotation revokes the old token.
    let rotated = fx.post(&format!("{path}/rotate"), json!({})).await;
    let new = rotated.data()["token"].as_str().unwrap().to_owned();
    assert_ne!(new, token);
    assert!(rotated.data()["rotated_at"].is_string());
    assert_eq!(
        fx.send(
            Method::GET,
            &format!("/v1/sandboxes/{id}"),
            Some(&token),
            None
        )
        .await
        .status,
        401
    );
    assert_eq!(
        fx.send(
            Method::GET,
            &format!("/v1/sandboxes/{id}"),
            Some(&new),
            None
        )
        .await
        .status,
        200
    );
    // Disabling is idempotent and revokes too.
    for _ in 0..2 {
        let d = fx.delete(&path).await;
        assert_eq!(d.data(), &json!({"enabled": false}));
    }
    assert_eq!(
        fx.send(
            Method::GET,
            &format!("/v1/sandboxes/{id}"),
            Some(&new),
            None
        )
        .await
        .status,
        401
    );
    assert_eq!(fx.get(&path).await.data()["enabled"], false);
    // A new token can be created after disabling.
    assert_eq!(fx.post(&path, json!({})).await.status, 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn delegated_token_can_destroy_its_guest() {
    let fx = Fx::new().await;
    let id = fx.create(json!({})).await;
    let token = fx
        .post(&format!("/v1/sandboxes/{id}/access-token"), json!({}))
        .await
        .data()["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let d = fx
        .send(
            Method::DELETE,
            &format!("/v1/sandboxes/{id}"),
            Some(&token),
            None,
        )
        .await;
    assert_eq!(d.data()["status"], "destroying");
    // A destroyed guest's token no longer authenticates.
    let again = fx
        .send(
            Method::GET,
            &format!("/v1/sandboxes/{id}"),
            Some(&token),
            None,
        )
        .await;
    assert_eq!(again.status, 401);
}
