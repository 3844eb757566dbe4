//! Allowed Domains against the fake control plane (no root: what the component sends and
//! what the program sees is checked; the enforcing e2e test proves the firewall).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use createos_fake::{FakeOptions, FakeServer};
use langflow_component::{
    ComponentInputs, ComponentOptions, Reuse, SandboxComponent, SurfaceOptions,
};
use sandbox_core::gateway::{ENV_GATEWAY_SECRET, ENV_GATEWAY_URL, Gateway, Secret};
use sandbox_core::retry::Backoff;
use secrecy::SecretString;

const KEY: &str = "kq7Zr2xVw9Lm4Tn8Yp3B";
const GW_SECRET: &str = "gw-secret-0123456789abcdef0123456789abcdef";

async fn fake() -> FakeServer {
    FakeServer::start(FakeOptions {
        api_key: KEY.to_owned(),
        ..FakeOptions::default()
    })
    .await
    .expect("fake control plane starts")
}

fn component(fake: &FakeServer, gateway: bool) -> SandboxComponent {
    let mut env: HashMap<String, String> = HashMap::from([
        ("CREATEOS_SANDBOX_API_KEY".to_owned(), KEY.to_owned()),
        ("CREATEOS_SANDBOX_BASE_URL".to_owned(), fake.url()),
        (
            "LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS".to_owned(),
            "true".to_owned(),
        ),
    ]);
    if gateway {
        env.insert(
            ENV_GATEWAY_URL.to_owned(),
            "http://10.0.0.5:3128".to_owned(),
        );
        env.insert(ENV_GATEWAY_SECRET.to_owned(), GW_SECRET.to_owned());
    }
    let quick = Backoff {
        base: Duration::from_millis(20),
        max: Duration::from_millis(200),
        budget: Duration::from_secs(6),
    };
    SandboxComponent::with_options(ComponentOptions {
        surface: SurfaceOptions {
            env: Arc::new(move |k| env.get(k).cloned()),
            backoff: quick,
            orphan_sweep: false,
            ..SurfaceOptions::default()
        },
        ..ComponentOptions::default()
    })
}

const PRINT_PROXY: &str = "import json, os\n\
    print(json.dumps({k: v for k, v in os.environ.items() if 'proxy' in k.lower()}))\n";

fn inputs(domains: &str, allow_network: bool) -> ComponentInputs {
    ComponentInputs {
        flow_id: "flow-9".into(),
        component_id: "CreateOSSandbox-gw001".into(),
        python_code: PRINT_PROXY.into(),
        reuse: Reuse::Flow,
        allow_network,
        allowed_domains: domains.into(),
        timeout_seconds: 20,
        ..ComponentInputs::default()
    }
}

async fn egress_of(fake: &FakeServer, id: &str) -> Option<Vec<String>> {
    let api = createos_api::Client::builder()
        .api_key(SecretString::from(KEY))
        .base_url(fake.url())
        .build()
        .unwrap();
    api.sandbox_handle(id.to_owned())
        .refresh()
        .await
        .unwrap()
        .egress
}

/// The proxy variables the program printed, checked: a token for `guest`, granting `want`.
fn check_token(printed: &str, guest: &str, want: &[&str]) {
    let seen: HashMap<String, Option<String>> = serde_json::from_str(printed).unwrap();
    let gateway = Gateway::new(
        "10.0.0.5:3128".parse().unwrap(),
        Secret::new(GW_SECRET.as_bytes().to_vec()).unwrap(),
        None,
    );
    let cred = gateway
        .check_proxy_env(&|k| seen.get(k).cloned().flatten(), SystemTime::now())
        .unwrap();
    assert_eq!(cred.guest, guest);
    assert_eq!(cred.domains, want);
}

#[tokio::test(flavor = "multi_thread")]
async fn allowed_domains_reach_only_the_gateway_and_are_part_of_the_kept_guest_identity() {
    let fake = fake().await;
    let c = component(&fake, true);
    let a = c.run(&inputs("pypi.org", true)).await.unwrap();
    assert_eq!(a.exit_code, 0, "{}", a.stderr);
    assert!(a.kept);
    check_token(&a.result, &a.sandbox_name, &["pypi.org"]);
    assert_eq!(
        egress_of(&fake, &a.sandbox_id).await,
        Some(vec!["10.0.0.5:3128".to_owned()])
    );
    // The same list (any order, any case) is the same guest, with a token of its own run.
    let again = c.run(&inputs(" PyPI.org ", true)).await.unwrap();
    assert_eq!(again.sandbox_id, a.sandbox_id);
    assert!(again.reused_guest);
    check_token(&again.result, &a.sandbox_name, &["pypi.org"]);
    // Another list is another guest.
    let b = c
        .run(&inputs("pypi.org,*.pythonhosted.org", true))
        .await
        .unwrap();
    assert_ne!(b.sandbox_id, a.sandbox_id);
    check_token(
        &b.result,
        &b.sandbox_name,
        &["*.pythonhosted.org", "pypi.org"],
    );
    // Allow Network off keeps its meaning: deny-all, no proxy, the list unused.
    let off = c.run(&inputs("pypi.org", false)).await.unwrap();
    assert_ne!(off.sandbox_id, a.sandbox_id);
    assert_eq!(off.result, "{}");
    assert_eq!(
        egress_of(&fake, &off.sandbox_id).await,
        Some(vec!["240.0.0.0/4".to_owned()])
    );
    c.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn allowed_domains_without_a_gateway_or_with_a_bad_entry_are_refused_before_any_request() {
    let fake = fake().await;
    for (gateway, domains, needles) in [
        (false, "pypi.org", vec!["Allowed Domains", ENV_GATEWAY_URL]),
        (
            true,
            "pypi.org, 169.254.169.254",
            vec!["Allowed Domains", "\"169.254.169.254\""],
        ),
        (true, "*", vec!["Allowed Domains", "\"*\""]),
    ] {
        let c = component(&fake, gateway);
        let e = c.run(&inputs(domains, true)).await.unwrap_err();
        assert!(e.kind().is_unavailable(), "{e}");
        for needle in needles {
            assert!(e.to_string().contains(needle), "{needle}: {e}");
        }
        assert!(!e.to_string().contains(GW_SECRET));
    }
    assert_eq!(fake.stats().requests.values().sum::<u64>(), 0);
    fake.shutdown().await;
}
