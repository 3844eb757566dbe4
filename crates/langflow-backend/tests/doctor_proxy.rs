//! The doctor names the proxy a run would use: never one for a plain-http control plane.

use std::collections::HashMap;
use std::sync::Arc;

use createos_fake::{FakeOptions, FakeServer};
use langflow_backend::SurfaceOptions;
use langflow_backend::{Backend, BackendOptions, LfxPolicy};

#[tokio::test(flavor = "multi_thread")]
async fn doctor_says_plain_http_is_never_proxied() {
    let fake = FakeServer::start(FakeOptions::default()).await.unwrap();
    let mut env: HashMap<String, String> = HashMap::new();
    env.insert("CREATEOS_SANDBOX_API_KEY".into(), fake.api_key().into());
    env.insert("CREATEOS_SANDBOX_BASE_URL".into(), fake.url());
    let b = Backend::with_options(BackendOptions {
        surface: SurfaceOptions {
            env: Arc::new(move |k| env.get(k).cloned()),
            ..SurfaceOptions::default()
        },
    });
    let report = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        b.doctor(&LfxPolicy::default()),
    )
    .await
    .expect("doctor finishes");
    let proxy_lines: Vec<_> = report
        .lines
        .iter()
        .filter(|l| l.text.starts_with("proxy: "))
        .collect();
    assert_eq!(proxy_lines.len(), 1, "{report}");
    assert!(
        proxy_lines[0].text.starts_with("proxy: no proxy"),
        "{report}"
    );
    b.shutdown().await;
    fake.shutdown().await;
}
