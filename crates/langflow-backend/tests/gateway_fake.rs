//! Domain allowlists through the egress gateway, against the fake control plane (no root:
//! nothing is enforced here, what the backend sends and what the program sees is checked).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use createos_fake::{FakeOptions, FakeServer};
use langflow_backend::{Backend, BackendError, BackendOptions, LfxPolicy, capabilities_with};
use sandbox_core::gateway::{
    ENV_GATEWAY_SECRET, ENV_GATEWAY_URL, Gateway, PROXY_ENV_NAMES, Secret,
};
use sandbox_core::retry::Backoff;
use serde_json::Value;

const KEY: &str = "lf-fake-key-7f3a9c2e51";
const GW_SECRET: &str = "gw-secret-0123456789abcdef0123456789abcdef";
const GW_URL: &str = "http://10.0.0.5:3128";

struct Setup {
    fake: FakeServer,
    log: tempfile::NamedTempFile,
}

async fn setup() -> Setup {
    let log = tempfile::NamedTempFile::new().unwrap();
    let fake = FakeServer::start(FakeOptions {
        api_key: KEY.to_owned(),
        request_log: Some(log.path().to_owned()),
        ..FakeOptions::default()
    })
    .await
    .expect("fake control plane starts");
    Setup { fake, log }
}

fn backend(fake: &FakeServer, extra: &[(&str, &str)]) -> Backend {
    let mut env: HashMap<String, String> = HashMap::from([
        ("CREATEOS_SANDBOX_API_KEY".to_owned(), KEY.to_owned()),
        ("CREATEOS_SANDBOX_BASE_URL".to_owned(), fake.url()),
        (
            "LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS".to_owned(),
            "true".to_owned(),
        ),
    ]);
    for (k, v) in extra {
        env.insert((*k).to_owned(), (*v).to_owned());
    }
    let quick = Backoff {
        base: Duration::from_millis(20),
        max: Duration::from_millis(200),
        budget: Duration::from_secs(4),
    };
    Backend::with_options(BackendOptions {
        surface: langflow_backend::SurfaceOptions {
            env: Arc::new(move |k| env.get(k).cloned()),
            backoff: quick,
            background_destroy: false,
            ..langflow_backend::SurfaceOptions::default()
        },
    })
}

fn domains(list: &[&str]) -> LfxPolicy {
    LfxPolicy {
        timeout_seconds: 10,
        allow_network: true,
        allowed_domains: list.iter().map(|d| (*d).to_owned()).collect(),
        ..LfxPolicy::default()
    }
}

fn logged(log: &tempfile::NamedTempFile, route: &str) -> Vec<Value> {
    std::fs::read_to_string(log.path())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v["route"] == route)
        .map(|v| serde_json::from_str(v["body"].as_str().unwrap()).unwrap())
        .collect()
}

const PRINT_PROXY_ENV: &str = "import json, os\n\
    print(json.dumps({k: os.environ.get(k) for k in [\n\
    'HTTPS_PROXY','HTTP_PROXY','ALL_PROXY','https_proxy','http_proxy','all_proxy',\n\
    'PIP_PROXY','NO_PROXY','no_proxy']}))\n";

#[tokio::test]
async fn a_domains_run_gets_only_the_gateway_and_a_token_for_its_guest_and_list() {
    let Setup { fake, log } = setup().await;
    let gw = [(ENV_GATEWAY_URL, GW_URL), (ENV_GATEWAY_SECRET, GW_SECRET)];
    assert!(
        capabilities_with(&|k| gw
            .iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| (*v).to_owned()))
        .supports_domain_allowlist
    );
    let b = backend(&fake, &gw);
    let out = b
        .run(
            PRINT_PROXY_ENV,
            None,
            &domains(&["PyPI.org", "*.pythonhosted.org"]),
        )
        .await
        .unwrap();
    assert_eq!(out.exit_code, 0, "{}", out.stderr);
    let seen: HashMap<String, Option<String>> =
        serde_json::from_str(out.stdout.to_string().trim()).unwrap();
    let gateway = Gateway::new(
        "10.0.0.5:3128".parse().unwrap(),
        Secret::new(GW_SECRET.as_bytes().to_vec()).unwrap(),
        None,
    );
    let cred = gateway
        .check_proxy_env(&|k| seen.get(k).cloned().flatten(), SystemTime::now())
        .unwrap();
    assert_eq!(cred.guest, out.guest);
    assert_eq!(cred.domains, ["*.pythonhosted.org", "pypi.org"]);
    let token = seen["https_proxy"].clone().unwrap();
    // The token lives the run's host deadline (10 s + 5 s TERM→KILL + 15 s grace) plus 120 s
    // of slack, not longer.
    let left = cred.expires_at.duration_since(SystemTime::now()).unwrap();
    assert!(
        left <= Duration::from_secs(10 + 5 + 15 + 120) && left > Duration::from_secs(120),
        "{left:?}"
    );

    // The guest was created with the gateway's address as its only egress rule, and with the
    // proxy variables declared empty (the token travels with the exec only).
    let creates = logged(&log, "create");
    assert_eq!(creates.len(), 1);
    assert_eq!(creates[0]["egress"], serde_json::json!(["10.0.0.5:3128"]));
    let envs = creates[0]["envs"].as_object().unwrap();
    for k in PROXY_ENV_NAMES {
        assert_eq!(envs[k], "", "{k}");
    }
    assert!(!creates[0].to_string().contains(&token));
    assert!(!log_text(&log).contains(GW_SECRET));
    b.shutdown().await;
    fake.shutdown().await;
}

fn log_text(log: &tempfile::NamedTempFile) -> String {
    std::fs::read_to_string(log.path()).unwrap()
}

/// Settings, policy, and what the refusal names.
type Case<'a> = (Vec<(&'a str, &'a str)>, LfxPolicy, Vec<&'a str>);

#[tokio::test]
async fn domains_without_a_usable_gateway_or_with_a_bad_entry_are_refused_before_any_request() {
    let Setup { fake, log } = setup().await;
    let cases: Vec<Case> = vec![
        (
            vec![],
            domains(&["pypi.org"]),
            vec![
                "LANGFLOW_SANDBOX_ALLOWED_DOMAINS",
                ENV_GATEWAY_URL,
                "gateway --listen",
            ],
        ),
        (
            vec![(ENV_GATEWAY_URL, GW_URL)],
            domains(&["pypi.org"]),
            vec![ENV_GATEWAY_SECRET],
        ),
        (
            vec![
                (ENV_GATEWAY_URL, GW_URL),
                (ENV_GATEWAY_SECRET, "short-gw-secret"),
            ],
            domains(&["pypi.org"]),
            vec![ENV_GATEWAY_SECRET, "bytes"],
        ),
        (
            vec![
                (ENV_GATEWAY_URL, "http://gateway.internal:3128"),
                (ENV_GATEWAY_SECRET, GW_SECRET),
            ],
            domains(&["pypi.org"]),
            vec![ENV_GATEWAY_URL, "host name"],
        ),
        (
            vec![(ENV_GATEWAY_URL, GW_URL), (ENV_GATEWAY_SECRET, GW_SECRET)],
            domains(&["pypi.org", "10.0.0.9"]),
            vec!["LANGFLOW_SANDBOX_ALLOWED_DOMAINS", "\"10.0.0.9\""],
        ),
    ];
    for (extra, pol, needles) in cases {
        let b = backend(&fake, &extra);
        let e = b.run("print(1)", None, &pol).await.unwrap_err();
        let BackendError::Unavailable(msg) = &e else {
            panic!("expected Unavailable, got {e:?}")
        };
        for needle in needles {
            assert!(msg.contains(needle), "{needle}: {msg}");
        }
        assert!(
            !msg.contains(GW_SECRET) && !msg.contains("short-gw-secret"),
            "{msg}"
        );
        assert!(!msg.contains(KEY));
    }
    assert_eq!(fake.stats().requests.values().sum::<u64>(), 0);
    assert!(log_text(&log).is_empty());
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn doctor_reports_the_gateway_and_says_its_connect_check_is_the_hosts_view() {
    let Setup { fake, log: _log } = setup().await;
    let text = |report: &langflow_backend::DoctorReport| report.to_string();
    // Not configured: said so, and a domains policy is refused naming the setting.
    let b = backend(&fake, &[]);
    let report = b.doctor(&domains(&["pypi.org"])).await;
    let shown = text(&report);
    assert!(shown.contains("egress gateway: not configured"), "{shown}");
    assert!(!report.ok, "{shown}");
    b.shutdown().await;
    // Configured (at an address nothing answers on): its URL and egress rule, the secret's
    // length but never the secret, and a connect check labelled as the host's view.
    let b = backend(
        &fake,
        &[
            (ENV_GATEWAY_URL, "http://192.0.2.1:3128"),
            (ENV_GATEWAY_SECRET, GW_SECRET),
        ],
    );
    let report = b.doctor(&domains(&["pypi.org"])).await;
    let shown = text(&report);
    assert!(report.ok, "{shown}");
    assert!(
        shown.contains("egress gateway: http://192.0.2.1:3128"),
        "{shown}"
    );
    assert!(
        shown.contains("cannot connect to 192.0.2.1:3128"),
        "{shown}"
    );
    assert!(shown.contains("the host's view"), "{shown}");
    assert!(
        shown.contains("LANGFLOW_SANDBOX_ALLOWED_DOMAINS = pypi.org"),
        "{shown}"
    );
    assert!(!shown.contains(GW_SECRET), "{shown}");
    b.shutdown().await;
    fake.shutdown().await;
}
