//! `LANGFLOW_SANDBOX_BACKEND=opensandbox`'s Rust half against the OpenSandbox fake.

use std::collections::BTreeMap;

use langflow_backend::LfxPolicy;
use langflow_backend::opensandbox::{OpenSandboxBackend, capabilities_with};
use opensandbox_fake::{Config, FakeOptions, FakeServer, Runtime, SecureRuntime};

const KEY: &str = "backend-os-key-41";

fn lookup(
    url: String,
    extra: &'static [(&'static str, &'static str)],
) -> impl Fn(&str) -> Option<String> + Send + Sync + 'static {
    move |name| match name {
        "OPEN_SANDBOX_DOMAIN" => Some(url.clone()),
        "OPEN_SANDBOX_API_KEY" => Some(KEY.into()),
        _ => extra
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| (*v).to_owned()),
    }
}

#[test]
fn isolation_is_declared_only_when_attested() {
    let caps = capabilities_with(|_| None);
    assert_eq!(caps.isolation, "container");
    assert!(caps.supports_deny_all_egress && caps.supports_domain_allowlist);
    let caps = capabilities_with(|n| {
        (n == "OPEN_SANDBOX_ATTEST_ISOLATION").then(|| "hardware-virtualized".to_owned())
    });
    assert_eq!(caps.isolation, "hardware-virtualized");
    let caps =
        capabilities_with(|n| (n == "OPEN_SANDBOX_ATTEST_ISOLATION").then(|| "vm".to_owned()));
    assert_eq!(caps.isolation, "none");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_gets_its_own_sandbox_and_leaves_none() {
    let fake = FakeServer::start(FakeOptions {
        api_key: KEY.into(),
        config: Config {
            runtime: Runtime::Kubernetes,
            secure_runtime: SecureRuntime::Kata,
            pending_ms: 100,
            ping_ms: 200,
            ..Config::default()
        },
        ..FakeOptions::default()
    })
    .await
    .unwrap();
    let backend = OpenSandboxBackend::new();
    let attested: &'static [(&str, &str)] = &[
        ("OPEN_SANDBOX_ATTEST_ISOLATION", "hardware-virtualized"),
        ("OPEN_SANDBOX_RUNTIME_CLASS", "kata-qemu"),
    ];
    let policy = LfxPolicy::default();
    for n in 0..2 {
        let out = backend
            .run_with(
                &format!("import math\nprint(math.factorial(5) + {n})\n"),
                None,
                &policy,
                lookup(fake.url(), attested),
            )
            .await
            .unwrap();
        assert_eq!(out.stdout.to_string(), format!("{}\n", 120 + n));
        assert_eq!(out.exit_code, 0);
        assert_eq!(fake.stats().live, 0);
    }
    assert_eq!(fake.stats().created, 2);
    let out = backend
        .run_with(
            "raise SystemExit('nope')",
            Some(BTreeMap::new()),
            &policy,
            lookup(fake.url(), attested),
        )
        .await
        .unwrap();
    assert_eq!(out.exit_code, 1);
    assert!(out.stderr.to_string().contains("nope"));
    assert_eq!(fake.stats().live, 0);
    fake.shutdown().await;
}
