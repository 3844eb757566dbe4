//! The library API other crates' tests use: `FakeServer` and `ExecdServer` in-process.

use std::time::Duration;

use opensandbox_fake::{
    Config, ExecdOptions, ExecdServer, FakeOptions, FakeServer, NetworkMode, Runtime,
};
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread")]
async fn the_server_starts_counts_reconfigures_resets_and_stops() {
    let fake = FakeServer::start(FakeOptions {
        api_key: "lib-key".into(),
        ..FakeOptions::default()
    })
    .await
    .unwrap();
    assert!(fake.url().starts_with("http://127.0.0.1:"));
    assert!(!format!("{fake:?}").contains("lib-key"));
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let body = json!({"image": {"uri": "python:3.12-slim"}, "entrypoint": ["x"], "resourceLimits": {}, "timeout": 600});
    let r = http
        .post(format!("{}/v1/sandboxes", fake.url()))
        .header("OPEN-SANDBOX-API-KEY", fake.api_key())
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let id = r.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(fake.stats().live, 1);
    assert_eq!(fake.stats().requests.get("create"), Some(&1));
    fake.set_config(Config {
        network_mode: NetworkMode::Host,
        ..fake.config()
    })
    .unwrap();
    let v: Value = http
        .get(format!("{}/v1/sandboxes/{id}/endpoints/44772", fake.url()))
        .header("OPEN-SANDBOX-API-KEY", fake.api_key())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["endpoint"], "127.0.0.1:44772");
    assert!(
        fake.set_config(Config {
            secure_runtime: opensandbox_fake::SecureRuntime::Firecracker,
            runtime: Runtime::Docker,
            ..Config::default()
        })
        .is_err()
    );
    fake.set_faults("get=503").unwrap();
    let r = http
        .get(format!("{}/v1/sandboxes/{id}", fake.url()))
        .header("OPEN-SANDBOX-API-KEY", fake.api_key())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert!(fake.set_faults("bogus").is_err());
    fake.reset();
    assert_eq!(fake.stats().live, 0);
    assert_eq!(fake.config().network_mode, NetworkMode::Bridge);
    let token = fake.shutdown_token();
    fake.shutdown().await;
    assert!(token.is_cancelled());
    assert!(
        http.get(format!("http://{}/health", "127.0.0.1:1"))
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .is_err()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_execd_server_runs_commands_in_process() {
    let execd = ExecdServer::start(ExecdOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        ping: Duration::from_millis(100),
        ..ExecdOptions::default()
    })
    .await
    .unwrap();
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let text = http
        .post(format!("http://{}/command", execd.addr()))
        .json(&json!({"argv": ["sh", "-c", "sleep 0.3; echo done"]}))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let frames: Vec<Value> = text
        .split("\n\n")
        .filter(|f| !f.is_empty())
        .map(|f| serde_json::from_str(f).unwrap())
        .collect();
    assert!(frames.iter().filter(|f| f["type"] == "ping").count() >= 2);
    assert!(
        frames
            .iter()
            .any(|f| f["type"] == "stdout" && f["text"] == "done")
    );
    assert_eq!(frames.last().unwrap()["type"], "execution_complete");
    execd.shutdown().await;
}

#[test]
fn invalid_options_are_refused_at_start() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let err = rt
        .block_on(FakeServer::start(FakeOptions {
            faults: "create=teapot".into(),
            ..FakeOptions::default()
        }))
        .unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    assert!(err.to_string().contains("teapot"));
}
