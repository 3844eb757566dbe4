//! The OpenSandbox provider against the OpenSandbox fake: each gate refuses with a message
//! naming the setting to change, and no test leaves a sandbox behind.

use std::collections::BTreeMap;
use std::time::Duration;

use opensandbox_fake::{
    Config, EgressMode, FakeOptions, FakeServer, NetworkMode, PolicyDrift, Runtime, SecureRuntime,
};
use sandbox_core::ErrorKind;
use sandbox_opensandbox::{Egress, OpenSandboxProvider, OpenSandboxSettings, SandboxSpec};

const KEY: &str = "os-test-key-5e1f9a";

async fn fake(config: Config) -> FakeServer {
    FakeServer::start(FakeOptions {
        api_key: KEY.into(),
        config: Config {
            ping_ms: 200,
            pending_ms: 200,
            ..config
        },
        ..FakeOptions::default()
    })
    .await
    .unwrap()
}

fn provider(fake: &FakeServer, extra: &[(&str, &str)]) -> OpenSandboxProvider {
    let mut vars: BTreeMap<String, String> = BTreeMap::from([
        ("OPEN_SANDBOX_DOMAIN".into(), fake.url()),
        ("OPEN_SANDBOX_API_KEY".into(), KEY.into()),
        ("OPEN_SANDBOX_IDLE_SECONDS".into(), "4".into()),
        // The fake's "sandboxes" are processes of this host: nothing tells them apart from the
        // server. Tests of the server guard unset it (`("OPEN_SANDBOX_SERVER_UNREACHABLE", "")`).
        ("OPEN_SANDBOX_SERVER_UNREACHABLE".into(), "true".into()),
        ("OPEN_SANDBOX_READY_SECONDS".into(), "20".into()),
    ]);
    for (k, v) in extra {
        vars.insert((*k).into(), (*v).into());
    }
    let settings = OpenSandboxSettings::from_lookup(move |n| vars.get(n).cloned()).unwrap();
    OpenSandboxProvider::new(settings).unwrap()
}

fn spec(egress: Egress) -> SandboxSpec {
    SandboxSpec {
        egress,
        memory_mb: 256,
        surface: "backend",
        run_budget: Duration::from_secs(10),
    }
}

const ATTESTED: &[(&str, &str)] = &[
    ("OPEN_SANDBOX_ATTEST_ISOLATION", "hardware-virtualized"),
    ("OPEN_SANDBOX_RUNTIME_CLASS", "kata-fc"),
    ("OPEN_SANDBOX_HOST_KERNEL", "6.18.44-host"),
];

fn kata_k8s() -> Config {
    Config {
        runtime: Runtime::Kubernetes,
        secure_runtime: SecureRuntime::Firecracker,
        ..Config::default()
    }
}

/// Waits for background deletes (a dropped sandbox) and checks nothing is left.
async fn assert_none_left(fake: &FakeServer) {
    for _ in 0..50 {
        if fake.stats().live == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("sandboxes left: {:?}", fake.stats());
}

#[tokio::test(flavor = "multi_thread")]
async fn an_attested_kubernetes_sandbox_runs_a_program_and_is_deleted() {
    let fake = fake(kata_k8s()).await;
    let p = provider(&fake, ATTESTED);
    let mut sb = p
        .create(&spec(Egress::Domains {
            setting: "LANGFLOW_SANDBOX_ALLOWED_DOMAINS",
            domains: vec!["pypi.org".into()],
        }))
        .await
        .unwrap();
    let out = sb
        .run_python(
            "import sys\nprint('hello')\nprint()\nprint(6*7)\nsys.stderr.write('warn\\n')\nsys.exit(3)\n",
            &BTreeMap::new(),
            Duration::from_secs(10),
            1 << 20,
        )
        .await
        .unwrap();
    assert_eq!(out.stdout, "hello\n\n42\n");
    assert_eq!(out.stderr, "warn\n");
    assert_eq!(out.exit_code, 3);
    assert!(!out.stdout_truncated && !out.stderr_truncated);
    sb.destroy().await;
    assert_none_left(&fake).await;
    assert_eq!(fake.stats().created, 1);
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn output_is_capped_per_stream_and_a_timeout_is_minus_one() {
    let fake = fake(Config::default()).await;
    let p = provider(&fake, &[("OPEN_SANDBOX_ALLOW_CONTAINER_ISOLATION", "true")]);
    let mut sb = p.create(&spec(Egress::Unrestricted)).await.unwrap();
    let out = sb
        .run_python(
            "for i in range(5000): print('x' * 40)\n",
            &BTreeMap::new(),
            Duration::from_secs(10),
            4096,
        )
        .await
        .unwrap();
    assert!(out.stdout_truncated && !out.stderr_truncated);
    assert!(out.stdout.len() < 4096 + 200, "{}", out.stdout.len());
    assert_eq!(out.exit_code, 0);
    let out = sb
        .run_python(
            "import time\nprint('started', flush=True)\ntime.sleep(30)\n",
            &BTreeMap::new(),
            Duration::from_secs(1),
            4096,
        )
        .await
        .unwrap();
    assert_eq!(out.exit_code, -1);
    assert!(out.stdout.contains("started"));
    let e = sb
        .run_python(
            "print(1)",
            &BTreeMap::from([("OPEN_SANDBOX_API_KEY".to_owned(), "x".to_owned())]),
            Duration::from_secs(5),
            4096,
        )
        .await
        .unwrap_err();
    assert!(e.message().contains("OPEN_SANDBOX_"), "{e}");
    sb.destroy().await;
    assert_none_left(&fake).await;
    fake.shutdown().await;
}

async fn refused(config: Config, vars: &[(&str, &str)], egress: Egress, needle: &str) {
    let fake = fake(config).await;
    let p = provider(&fake, vars);
    let e = p.create(&spec(egress)).await.unwrap_err();
    assert!(
        e.message().contains(needle),
        "expected {needle:?} in: {}",
        e.message()
    );
    assert!(!e.message().contains(KEY));
    assert_none_left(&fake).await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn dns_only_enforcement_is_refused() {
    let config = Config {
        egress_mode: EgressMode::Dns,
        ..Config::default()
    };
    refused(config, &[], Egress::DenyAll, "[egress] mode = \"dns+nft\"").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn no_sidecar_is_refused() {
    let config = Config {
        sidecar_absent: true,
        ..Config::default()
    };
    refused(config, &[], Egress::DenyAll, "no egress sidecar").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_without_an_egress_image_is_refused() {
    let config = Config {
        egress_mode: EgressMode::None,
        ..Config::default()
    };
    refused(config, &[], Egress::DenyAll, "[egress]").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_policy_that_differs_is_refused() {
    for drift in [
        PolicyDrift::DefaultAllow,
        PolicyDrift::ExtraRule,
        PolicyDrift::DropRules,
    ] {
        let config = Config {
            policy_drift: drift,
            ..Config::default()
        };
        let want = if drift == PolicyDrift::DefaultAllow {
            "defaultAction"
        } else {
            "rules"
        };
        refused(
            config,
            &[],
            Egress::Domains {
                setting: "LANGFLOW_SANDBOX_ALLOWED_DOMAINS",
                domains: vec!["pypi.org".into()],
            },
            want,
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn cidr_rules_are_refused_before_any_create() {
    let fake = fake(Config::default()).await;
    let p = provider(&fake, &[]);
    let e = p
        .create(&spec(Egress::Domains {
            setting: "LANGFLOW_SANDBOX_ALLOWED_DOMAINS",
            domains: vec!["10.0.0.0/8".into()],
        }))
        .await
        .unwrap_err();
    assert!(
        e.message().contains("LANGFLOW_SANDBOX_ALLOWED_DOMAINS"),
        "{e}"
    );
    assert_eq!(fake.stats().created, 0);
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_runtime_class_is_refused() {
    let config = Config {
        runtime: Runtime::Kubernetes,
        secure_runtime: SecureRuntime::Kata,
        runtime_class: Some("kata-qemu".into()),
        ..Config::default()
    };
    refused(
        config,
        ATTESTED,
        Egress::DenyAll,
        "OPEN_SANDBOX_RUNTIME_CLASS",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_attested_guest_showing_gvisor_or_the_host_kernel_is_refused() {
    let gvisor = Config {
        secure_runtime: SecureRuntime::Gvisor,
        ..Config::default()
    };
    let attested = &[("OPEN_SANDBOX_ATTEST_ISOLATION", "hardware-virtualized")];
    refused(gvisor.clone(), attested, Egress::Unrestricted, "gVisor").await;
    // gVisor cannot enforce egress: the server refuses the policy.
    refused(gvisor, &[], Egress::DenyAll, "[secure_runtime]").await;
    let kata = Config {
        secure_runtime: SecureRuntime::Kata,
        guest_kernel: "6.18.44-host".into(),
        ..Config::default()
    };
    refused(
        kata,
        &[
            ("OPEN_SANDBOX_ATTEST_ISOLATION", "hardware-virtualized"),
            ("OPEN_SANDBOX_HOST_KERNEL", "6.18.44-host"),
        ],
        Egress::Unrestricted,
        "OPEN_SANDBOX_HOST_KERNEL",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_host_network_mode_server_is_refused() {
    let host = Config {
        network_mode: NetworkMode::Host,
        ..Config::default()
    };
    // With egress restricted the server itself refuses the policy in host mode.
    refused(
        host.clone(),
        &[],
        Egress::DenyAll,
        "network_mode = \"bridge\"",
    )
    .await;
    // Without: the shared endpoint gives it away.
    refused(host.clone(), &[], Egress::Unrestricted, "host network").await;
    // Even when another sandbox holds execd's port, the first exec's canary would catch it.
    let fake = fake(host).await;
    let p = provider(&fake, &[]);
    for _ in 0..2 {
        assert!(p.create(&spec(Egress::Unrestricted)).await.is_err());
    }
    assert_none_left(&fake).await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lost_create_answer_is_found_by_nonce_and_deleted() {
    let fake = fake(Config::default()).await;
    fake.set_faults("create=reset-after#1").unwrap();
    let p = provider(&fake, &[]);
    let e = p.create(&spec(Egress::DenyAll)).await.unwrap_err();
    assert!(e.message().contains("deleted"), "{e}");
    assert_eq!(fake.stats().created, 1);
    assert_none_left(&fake).await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn pending_then_a_slow_execd_is_waited_for() {
    let config = Config {
        execd_ready_ms: 1500,
        ..kata_k8s()
    };
    let fake = fake(config).await;
    let p = provider(&fake, ATTESTED);
    let sb = p.create(&spec(Egress::DenyAll)).await.unwrap();
    sb.destroy().await;
    assert_none_left(&fake).await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stalled_stream_destroys_the_sandbox() {
    let fake = fake(Config::default()).await;
    let p = provider(&fake, &[]);
    let mut sb = p.create(&spec(Egress::DenyAll)).await.unwrap();
    fake.set_faults("command=stall-mid#1").unwrap();
    let started = std::time::Instant::now();
    let e = sb
        .run_python("print(1)", &BTreeMap::new(), Duration::from_secs(30), 4096)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::OutcomeUnknown);
    assert!(e.message().contains("OPEN_SANDBOX_IDLE_SECONDS"), "{e}");
    assert!(started.elapsed() < Duration::from_secs(15));
    assert_eq!(fake.stats().live, 0);
    let e = sb
        .run_python("print(1)", &BTreeMap::new(), Duration::from_secs(5), 4096)
        .await
        .unwrap_err();
    assert!(e.message().contains("destroyed"), "{e}");
    sb.destroy().await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_paused_sandbox_hits_the_idle_deadline_and_is_destroyed() {
    let fake = fake(Config::default()).await;
    let p = provider(&fake, &[]);
    let mut sb = p.create(&spec(Egress::DenyAll)).await.unwrap();
    p.client().pause_sandbox(sb.id()).await.unwrap();
    let e = sb
        .run_python("print(1)", &BTreeMap::new(), Duration::from_secs(30), 4096)
        .await
        .unwrap_err();
    assert!(e.message().contains("destroyed"), "{e}");
    assert_none_left(&fake).await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn delete_retries_a_500_and_treats_404_as_gone() {
    let fake = fake(Config::default()).await;
    let p = provider(&fake, &[]);
    let sb = p.create(&spec(Egress::DenyAll)).await.unwrap();
    let id = sb.id().to_owned();
    fake.set_faults("delete=500#4").unwrap();
    assert_eq!(
        p.destroy(&id).await.unwrap(),
        opensandbox_api::Deletion::Deleted
    );
    assert_eq!(
        p.destroy(&id).await.unwrap(),
        opensandbox_api::Deletion::AlreadyGone
    );
    sb.destroy().await;
    assert_none_left(&fake).await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn renew_is_clamped_and_the_sweep_deletes_only_old_sandboxes_of_ours() {
    let fake = fake(Config::default()).await;
    let p = provider(&fake, &[("OPEN_SANDBOX_MAX_RENEW_SECONDS", "120")]);
    let sb = p.create(&spec(Egress::DenyAll)).await.unwrap();
    let r = p.renew(sb.id(), Duration::from_secs(86_400)).await.unwrap();
    assert!(r.clamped);
    // Someone else's sandbox (other created-by) is never touched by the sweep.
    let other = provider(&fake, &[("OPEN_SANDBOX_CREATED_BY", "someone-else")]);
    let theirs = other.create(&spec(Egress::DenyAll)).await.unwrap();
    assert!(
        p.sweep(Duration::from_secs(3600), false)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        p.sweep(Duration::ZERO, true).await.unwrap(),
        vec![sb.id().to_owned()]
    );
    assert_eq!(fake.stats().live, 2);
    let swept = p.sweep(Duration::ZERO, false).await.unwrap();
    assert_eq!(swept, vec![sb.id().to_owned()]);
    assert_eq!(fake.stats().live, 1);
    theirs.destroy().await;
    sb.destroy().await;
    assert_none_left(&fake).await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dropped_sandbox_is_deleted_in_the_background() {
    let fake = fake(Config::default()).await;
    let p = provider(&fake, &[]);
    let sb = p.create(&spec(Egress::DenyAll)).await.unwrap();
    drop(sb);
    assert_none_left(&fake).await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_backend_waits_open_sandbox_ready_seconds_and_names_it() {
    // A pod that stays Pending (a busy cluster): the wait ends at the setting, the sandbox is
    // deleted, and the message names OpenSandbox and the setting.
    let fake = FakeServer::start(FakeOptions {
        api_key: KEY.into(),
        config: Config {
            ping_ms: 200,
            pending_ms: 60_000,
            ..kata_k8s()
        },
        ..FakeOptions::default()
    })
    .await
    .unwrap();
    let p = provider(&fake, &[("OPEN_SANDBOX_READY_SECONDS", "1")]);
    let started = std::time::Instant::now();
    let err = p.create(&spec(Egress::Unrestricted)).await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(err.kind(), ErrorKind::Transient, "{err}");
    assert!(
        err.message().contains("OPEN_SANDBOX_READY_SECONDS=1s"),
        "{err}"
    );
    assert!(err.message().starts_with("OpenSandbox"), "{err}");
    assert_none_left(&fake).await;
}
