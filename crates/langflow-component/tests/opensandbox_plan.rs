//! The component on OpenSandbox (`ComponentOptions::provider`): refused before any I/O unless
//! the server's isolation is attested or container isolation is accepted, and never asking
//! for a CreateOS key; Guest Reuse on the OpenSandbox fake.

use std::collections::HashMap;
use std::sync::Arc;

use std::time::Duration;

use langflow_component::{
    ComponentInputs, ComponentOptions, ProviderKind, Reuse, SandboxComponent, SurfaceOptions,
};
use opensandbox_fake::{Config, FakeOptions, FakeServer, PolicyDrift};
use sandbox_core::ErrorKind;
use sandbox_core::provider::Provider;
use sandbox_core::session::{ProviderConnector, Session};
use sandbox_opensandbox::{OpenSandbox, OpenSandboxSettings};

fn on_opensandbox(env: &[(&'static str, &'static str)]) -> SandboxComponent {
    let env: HashMap<&'static str, &'static str> = env.iter().copied().collect();
    SandboxComponent::with_options(ComponentOptions {
        surface: SurfaceOptions {
            env: Arc::new(move |k: &str| env.get(k).map(|v| (*v).to_owned())),
            orphan_sweep: false,
            ..SurfaceOptions::default()
        },
        provider: ProviderKind::OpenSandbox,
        ..ComponentOptions::default()
    })
}

#[tokio::test]
async fn without_attestation_or_the_opt_in_the_run_is_refused_naming_both_settings() {
    let component = on_opensandbox(&[
        // Nothing listens here: a refusal must come before any call.
        ("OPEN_SANDBOX_DOMAIN", "http://127.0.0.1:9"),
        ("OPEN_SANDBOX_API_KEY", "os-key-never-shown"),
    ]);
    let inputs = ComponentInputs {
        flow_id: "f".into(),
        component_id: "CreateOSSandbox-os01".into(),
        python_code: "print(1)".into(),
        reuse: Reuse::Off,
        timeout_seconds: 20,
        ..ComponentInputs::default()
    };
    let err = component.run(&inputs).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Refused, "{err}");
    let msg = err.message();
    assert!(
        msg.contains("sandbox component")
            && msg.contains("OPEN_SANDBOX_ATTEST_ISOLATION=hardware-virtualized")
            && msg.contains("OPEN_SANDBOX_ALLOW_CONTAINER_ISOLATION=true"),
        "{msg}"
    );
    assert!(!msg.contains("os-key-never-shown") && !msg.contains("CREATEOS_SANDBOX_API_KEY"));
}

/// A component on the OpenSandbox fake at `url` (container isolation accepted: the fake is
/// no VM), with its own session.
fn on_fake(url: &str) -> SandboxComponent {
    let vars = fake_vars(url);
    let for_provider = Arc::clone(&vars);
    let connector: ProviderConnector = Arc::new(move |_, _| {
        let vars = Arc::clone(&for_provider);
        let settings = OpenSandboxSettings::from_lookup(move |k: &str| vars.get(k).cloned())?;
        Ok(Arc::new(OpenSandbox::new(settings)?) as Arc<dyn Provider>)
    });
    SandboxComponent::with_options(ComponentOptions {
        surface: SurfaceOptions {
            env: Arc::new(move |k: &str| vars.get(k).cloned()),
            session: Some(Session::with_provider_connector(
                connector,
                Duration::from_secs(10),
            )),
            orphan_sweep: false,
            ..SurfaceOptions::default()
        },
        provider: ProviderKind::OpenSandbox,
        ..ComponentOptions::default()
    })
}

const KEY: &str = "os-reuse-key-5e1d";

fn fake_vars(url: &str) -> Arc<HashMap<String, String>> {
    let vars: HashMap<String, String> = [
        ("OPEN_SANDBOX_DOMAIN", url),
        ("OPEN_SANDBOX_API_KEY", KEY),
        ("OPEN_SANDBOX_ALLOW_CONTAINER_ISOLATION", "true"),
        ("OPEN_SANDBOX_IDLE_SECONDS", "10"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    Arc::new(vars)
}

fn kept_run(reuse: Reuse, session: &str, code: &str) -> ComponentInputs {
    ComponentInputs {
        flow_id: "flow-os-reuse".into(),
        session_id: session.into(),
        component_id: "CreateOSSandbox-os01".into(),
        python_code: code.into(),
        reuse,
        timeout_seconds: 20,
        ..ComponentInputs::default()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn guest_reuse_on_opensandbox_keeps_one_sandbox_per_key_and_replaces_a_deleted_one() {
    let fake = FakeServer::start(FakeOptions {
        api_key: KEY.into(),
        config: Config {
            ping_ms: 200,
            ..Config::default()
        },
        ..FakeOptions::default()
    })
    .await
    .unwrap();
    let component = on_fake(&fake.url());
    let write = "open('kept.txt', 'w').write('from run one')\nprint('wrote')";
    let read =
        "import os\nprint(open('kept.txt').read() if os.path.exists('kept.txt') else 'no file')";
    let first = component
        .run(&kept_run(Reuse::Flow, "s1", write))
        .await
        .unwrap();
    assert_eq!((first.result.as_str(), first.exit_code), ("wrote", 0));
    assert!(first.kept && !first.reused_guest, "{first:?}");
    assert!(first.sandbox_name.starts_with("lf-c-"));
    // The same flow (another session: `flow` ignores it) finds the sandbox and its file.
    let second = component
        .run(&kept_run(Reuse::Flow, "s2", read))
        .await
        .unwrap();
    assert_eq!(second.result, "from run one");
    assert!(second.kept && second.reused_guest);
    assert_eq!(second.sandbox_id, first.sandbox_id);
    assert_eq!(fake.stats().created, 1);
    assert_eq!(fake.stats().live, 1);
    // Guest Reuse `session`: a sandbox per session; a new session key gets a new one.
    let a = component
        .run(&kept_run(Reuse::Session, "chat-a", write))
        .await
        .unwrap();
    let b = component
        .run(&kept_run(Reuse::Session, "chat-b", read))
        .await
        .unwrap();
    assert_ne!(a.sandbox_id, first.sandbox_id);
    assert_ne!(b.sandbox_id, a.sandbox_id);
    assert_eq!(b.result, "no file");
    assert_eq!(fake.stats().created, 3);
    // Deleted behind its back (or expired): the next run creates it again, without the file.
    let vars = fake_vars(&fake.url());
    let client = OpenSandboxSettings::from_lookup(move |k: &str| vars.get(k).cloned())
        .unwrap()
        .client()
        .unwrap();
    client.delete_sandbox(&first.sandbox_id).await.unwrap();
    let again = component
        .run(&kept_run(Reuse::Flow, "s3", read))
        .await
        .unwrap();
    assert_eq!(again.result, "no file");
    assert!(again.kept && !again.reused_guest);
    assert_ne!(again.sandbox_id, first.sandbox_id);
    assert_eq!(again.sandbox_name, first.sandbox_name);
    // A run without reuse leaves nothing of its own.
    let off = component
        .run(&kept_run(Reuse::Off, "s4", "print(1)"))
        .await
        .unwrap();
    assert!(!off.kept);
    for _ in 0..100 {
        if fake.stats().live == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(fake.stats().live, 3);
    // reap: younger than the limit is kept; at 0 s every kept sandbox goes.
    let listed = component
        .reap_reused(Duration::from_secs(3600), false)
        .await
        .unwrap();
    assert!(
        listed.deleted.is_empty() && listed.kept.len() == 3,
        "{listed:?}"
    );
    let reaped = component.reap_reused(Duration::ZERO, false).await.unwrap();
    assert_eq!(reaped.deleted.len(), 3, "{reaped:?}");
    assert_eq!(fake.stats().live, 0);
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kept_sandbox_whose_policy_drifted_is_destroyed_not_used() {
    let fake = FakeServer::start(FakeOptions {
        api_key: KEY.into(),
        config: Config {
            ping_ms: 200,
            ..Config::default()
        },
        ..FakeOptions::default()
    })
    .await
    .unwrap();
    let component = on_fake(&fake.url());
    let first = component
        .run(&kept_run(Reuse::Flow, "s1", "print('first')"))
        .await
        .unwrap();
    assert!(first.kept);
    // The sidecar now reads back another policy than deny-all, for every sandbox.
    fake.set_config(Config {
        policy_drift: PolicyDrift::DefaultAllow,
        ..fake.config()
    })
    .unwrap();
    let err = component
        .run(&kept_run(Reuse::Flow, "s2", "print('never runs')"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Refused, "{err}");
    assert!(err.message().contains("destroyed"), "{err}");
    // The drifted one was destroyed, and so was its replacement, which read back wrong too.
    assert_eq!(fake.stats().created, 2);
    assert_eq!(fake.stats().live, 0);
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kept_sandbox_that_expired_is_replaced_and_an_adopted_one_is_renewed() {
    let fake = FakeServer::start(FakeOptions {
        api_key: KEY.into(),
        config: Config {
            ping_ms: 200,
            // As the real Docker server: an expired sandbox shows Failed before it is gone.
            expiry_failed_ms: 60_000,
            ..Config::default()
        },
        ..FakeOptions::default()
    })
    .await
    .unwrap();
    let component = on_fake(&fake.url());
    let vars = fake_vars(&fake.url());
    let client = OpenSandboxSettings::from_lookup(move |k: &str| vars.get(k).cloned())
        .unwrap()
        .client()
        .unwrap();
    let write = "open('kept.txt', 'w').write('old')\nprint('wrote')";
    let read =
        "import os\nprint(open('kept.txt').read() if os.path.exists('kept.txt') else 'no file')";
    let first = component
        .run(&kept_run(Reuse::Flow, "s1", write))
        .await
        .unwrap();
    // Its server-side lifetime runs out (as an idle kept sandbox's does).
    client
        .renew_expiration(
            &first.sandbox_id,
            Duration::from_secs(1),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    for _ in 0..100 {
        let sb = client.get_sandbox(&first.sandbox_id).await.unwrap();
        if *sb.state() == opensandbox_api::SandboxState::Failed {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let again = component
        .run(&kept_run(Reuse::Flow, "s2", read))
        .await
        .unwrap();
    assert_eq!(again.result, "no file");
    assert!(again.kept && !again.reused_guest);
    assert_ne!(again.sandbox_id, first.sandbox_id);
    // The expired one was deleted, not left for its Failed minute.
    assert!(client.get_sandbox(&first.sandbox_id).await.is_err());
    // The next run adopts the new one and pushes its expiry out again.
    client
        .renew_expiration(
            &again.sandbox_id,
            Duration::from_secs(120),
            Duration::from_secs(600),
        )
        .await
        .unwrap();
    let third = component
        .run(&kept_run(Reuse::Flow, "s3", "print('still here')"))
        .await
        .unwrap();
    assert!(third.reused_guest && third.sandbox_id == again.sandbox_id);
    let sb = client.get_sandbox(&again.sandbox_id).await.unwrap();
    let left = (sb.expires().unwrap() - opensandbox_api::OffsetDateTime::now_utc()).whole_seconds();
    assert!(left >= 880, "{left}");
    component.reap_reused(Duration::ZERO, false).await.unwrap();
    assert_eq!(fake.stats().live, 0);
    fake.shutdown().await;
}

/// A failed exec on OpenSandbox is told in OpenSandbox's name, never CreateOS's: a rejected
/// exec and one whose connection broke after dispatch (each fault lets the sandbox's first
/// command, the provider's probe, through). The other exec failures are the provider double's
/// (sandbox-core's `provider_double.rs`).
#[tokio::test(flavor = "multi_thread")]
async fn exec_failures_name_opensandbox_not_createos() {
    let fake = FakeServer::start(FakeOptions {
        api_key: KEY.into(),
        config: Config {
            ping_ms: 200,
            ..Config::default()
        },
        ..FakeOptions::default()
    })
    .await
    .unwrap();
    let component = on_fake(&fake.url());
    let cases = [
        ("command=400#1>1", "OpenSandbox exec was rejected: "),
        (
            "command=reset#1>1",
            "OpenSandbox exec failed after the program was dispatched",
        ),
    ];
    for (faults, want) in cases {
        fake.set_faults(faults).unwrap();
        let mut inputs = kept_run(Reuse::Off, "s-faults", "print(1)");
        inputs.timeout_seconds = 1;
        let text = component.run(&inputs).await.unwrap_err().to_string();
        assert!(text.contains(want), "{faults}: {text}");
        assert!(!text.contains("CreateOS"), "{faults}: {text}");
        assert!(!text.contains(KEY), "{faults}: {text}");
    }
    fake.shutdown().await;
}
