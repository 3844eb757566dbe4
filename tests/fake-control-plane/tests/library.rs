//! The in-process library API (`FakeServer`'s methods).
//!
//! These stay in-process on purpose: `stats()`, `advance_clock()`, `set_faults()`, `reset()`,
//! `addr()` and `shutdown()` are library-only entry points that other crates' tests call
//! directly, and a child process cannot reach them. Everything observable over HTTP is tested
//! through the real binary in the other test files.

use std::time::Duration;

use createos_fake::{FakeOptions, FakeServer};
use serde_json::{Value, json};

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

async fn call(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: String,
    body: Value,
) -> (u16, Value) {
    let r = http
        .request(method, url)
        .header("X-Api-Key", "test-key")
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread")]
async fn library_hooks_drive_the_same_state_as_http() {
    let fake = FakeServer::start(FakeOptions {
        create_delay: Duration::from_millis(50),
        ..FakeOptions::default()
    })
    .await
    .unwrap();
    assert_eq!(fake.api_key(), "test-key");
    assert_eq!(fake.url(), format!("http://{}", fake.addr()));
    assert!(fake.addr().ip().is_loopback());
    let http = client();
    let post = reqwest::Method::POST;
    let (st, created) = call(
        &http,
        post.clone(),
        format!("{}/v1/sandboxes", fake.url()),
        json!({"shape": "s-1vcpu-256mb", "auto_pause_after_seconds": 60}),
    )
    .await;
    assert_eq!(st, 200);
    assert_eq!(created["data"]["status"], "creating");
    let id = created["data"]["id"].as_str().unwrap().to_owned();
    assert_eq!((fake.stats().created, fake.stats().live), (1, 1));
    tokio::time::sleep(Duration::from_millis(300)).await;
    fake.advance_clock(Duration::from_secs(61));
    let (_, got) = call(
        &http,
        reqwest::Method::GET,
        format!("{}/v1/sandboxes/{id}", fake.url()),
        Value::Null,
    )
    .await;
    assert_eq!(
        got["data"]["status"], "paused",
        "advance_clock ran the sweep"
    );
    assert!(fake.set_faults("nowhere=500").is_err());
    fake.set_faults("whoami=418#1").unwrap();
    let (st, _) = call(
        &http,
        reqwest::Method::GET,
        format!("{}/v1/whoami", fake.url()),
        Value::Null,
    )
    .await;
    assert_eq!(st, 418);
    assert_eq!(fake.stats().requests.get("whoami"), Some(&1));
    fake.reset();
    assert_eq!(fake.stats(), createos_fake::Stats::default());
    let token = fake.shutdown_token();
    fake.shutdown().await;
    assert!(token.is_cancelled());
}
