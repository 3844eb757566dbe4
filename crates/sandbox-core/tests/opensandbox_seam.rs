//! The OpenSandbox provider behind sandbox-core's `Provider` seam, against the OpenSandbox
//! fake: the neutral operations work, the checks refuse, and nothing is left.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use opensandbox_fake::{Config, EgressMode, FakeOptions, FakeServer, NetworkMode};
use sandbox_core::egress::EgressPolicy;
use sandbox_core::provider::opensandbox::{OpenSandbox, OpenSandboxSettings};
use sandbox_core::provider::{
    CallFailure, EgressCheck, ExecFrame, ExecRequest, GuestSpec, Isolation, Labels, Lifetime,
    Provider, ProviderKind, Size,
};

const KEY: &str = "seam-key-77c1d0";

async fn fake(config: Config) -> FakeServer {
    FakeServer::start(FakeOptions {
        api_key: KEY.into(),
        config: Config {
            ping_ms: 200,
            ..config
        },
        ..FakeOptions::default()
    })
    .await
    .unwrap()
}

fn provider(fake: &FakeServer, extra: &[(&str, &str)]) -> OpenSandbox {
    let mut vars: BTreeMap<String, String> = BTreeMap::from([
        ("OPEN_SANDBOX_DOMAIN".into(), fake.url()),
        ("OPEN_SANDBOX_API_KEY".into(), KEY.into()),
        ("OPEN_SANDBOX_IDLE_SECONDS".into(), "4".into()),
    ]);
    for (k, v) in extra {
        vars.insert((*k).into(), (*v).into());
    }
    OpenSandbox::new(OpenSandboxSettings::from_lookup(move |n| vars.get(n).cloned()).unwrap())
        .unwrap()
}

fn spec(name: &str, egress: EgressPolicy) -> GuestSpec {
    GuestSpec {
        name: name.into(),
        image: String::new(),
        size: Size {
            id: "512Mi".into(),
            vcpu: 1,
            mem_mib: 512,
        },
        envs: BTreeMap::from([("GREETING".to_owned(), "hi".to_owned())]),
        egress,
        lifetime: Lifetime {
            budget: Duration::from_secs(60),
            idle_backstop: Duration::from_secs(120),
        },
        labels: Labels::ours().with(Labels::SURFACE, "backend"),
    }
}

fn deadline() -> tokio::time::Instant {
    tokio::time::Instant::now() + Duration::from_secs(20)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_neutral_operations_work_and_nothing_is_left() {
    let fake = fake(Config::default()).await;
    let p = provider(&fake, &[]);
    assert_eq!(p.kind(), ProviderKind::OpenSandbox);
    assert_eq!(p.isolation(), Isolation::Container);
    assert!(p.check().await.unwrap().starts_with("opensandbox at "));
    assert!(p.sizes().await.unwrap().iter().any(|s| s.mem_mib == 4096));
    let info = p
        .create(spec("lf-seam-1", EgressPolicy::DenyAll))
        .await
        .unwrap();
    let found = p.find("lf-seam-1".into()).await.unwrap().unwrap();
    assert_eq!(found.id, info.id);
    assert_eq!(p.find("lf-nothing".into()).await.unwrap(), None);
    p.wait_ready(info.id.clone(), deadline()).await.unwrap();
    assert_eq!(
        p.verify_egress(info.id.clone(), EgressPolicy::DenyAll)
            .await
            .unwrap(),
        EgressCheck::Matches
    );
    p.upload(info.id.clone(), "/workspace/in/a.txt".into(), "abc".into())
        .await
        .unwrap();
    let d = p
        .download(info.id.clone(), "/workspace/in/a.txt".into(), Some(100))
        .await
        .unwrap();
    let body: Vec<u8> = d.body.map(|c| c.unwrap().to_vec()).concat().await;
    assert_eq!(body, b"abc");
    let frames: Vec<ExecFrame> = p
        .exec_stream(
            info.id.clone(),
            ExecRequest {
                cmd: "sh".into(),
                args: vec![
                    "-c".into(),
                    "echo \"$GREETING\"; cat; echo oops >&2; exit 4".into(),
                ],
                env: BTreeMap::new(),
                stdin: "from stdin\n".into(),
                timeout: Duration::from_secs(10),
            },
        )
        .await
        .unwrap()
        .map(Result::unwrap)
        .filter(|f| futures::future::ready(*f != ExecFrame::Heartbeat))
        .collect()
        .await;
    assert_eq!(
        frames,
        [
            ExecFrame::Stdout("hi\n".into()),
            ExecFrame::Stdout("from stdin\n".into()),
            ExecFrame::Stderr("oops\n".into()),
            ExecFrame::Exit(4),
        ]
    );
    let ours = p.list_ours("lf-seam".into()).await.unwrap();
    assert_eq!(ours.len(), 1);
    assert!(ours[0].created_at.is_some());
    assert!(p.list_ours("lf-other".into()).await.unwrap().is_empty());
    p.keep_alive(info.id.clone(), Duration::from_secs(600))
        .await
        .unwrap();
    p.destroy(info.id.clone()).await.unwrap();
    p.destroy(info.id.clone()).await.unwrap();
    assert_eq!(fake.stats().live, 0);
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn refusals_come_back_as_such() {
    let fake = fake(Config {
        egress_mode: EgressMode::Dns,
        ..Config::default()
    })
    .await;
    let p = provider(&fake, &[]);
    let info = p
        .create(spec("lf-seam-2", EgressPolicy::DenyAll))
        .await
        .unwrap();
    p.wait_ready(info.id.clone(), deadline()).await.unwrap();
    match p
        .verify_egress(info.id.clone(), EgressPolicy::DenyAll)
        .await
        .unwrap()
    {
        EgressCheck::Differs(why) => assert!(why.contains("dns+nft"), "{why}"),
        EgressCheck::Matches => panic!("dns mode accepted"),
    }
    p.destroy(info.id).await.unwrap();
    let rules = EgressPolicy::Rules(vec![
        sandbox_core::egress::validate_address_rule("10.0.0.0/8").unwrap(),
    ]);
    let e = p.create(spec("lf-seam-3", rules)).await.unwrap_err();
    assert_eq!(e.failure, CallFailure::Config);
    fake.set_config(Config {
        network_mode: NetworkMode::Host,
        ..fake.config()
    })
    .unwrap();
    let info = p
        .create(spec("lf-seam-4", EgressPolicy::AllowAll))
        .await
        .unwrap();
    let e = p.wait_ready(info.id.clone(), deadline()).await.unwrap_err();
    assert!(e.message.contains("network_mode"), "{e}");
    p.destroy(info.id).await.unwrap();
    assert_eq!(fake.stats().live, 0);
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_domain_allowlist_is_the_sandboxs_own_rules_read_back_and_checked() {
    let fake = fake(Config::default()).await;
    let p = provider(&fake, &[]);
    let policy = EgressPolicy::only_domains("LIST", &["pypi.org", "*.example.com"]).unwrap();
    let info = p.create(spec("lf-seam-d1", policy.clone())).await.unwrap();
    p.wait_ready(info.id.clone(), deadline()).await.unwrap();
    assert_eq!(
        p.verify_egress(info.id.clone(), policy.clone())
            .await
            .unwrap(),
        EgressCheck::Matches
    );
    // The sidecar holds deny plus exactly those names.
    let held = fake.stats().policies;
    assert_eq!(held.len(), 1, "{held:?}");
    assert_eq!(held[0]["defaultAction"], "deny");
    let mut targets: Vec<&str> = held[0]["egress"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            assert_eq!(r["action"], "allow");
            r["target"].as_str().unwrap()
        })
        .collect();
    targets.sort_unstable();
    assert_eq!(targets, ["*.example.com", "pypi.org"]);
    // A read-back of other names differs.
    let other = EgressPolicy::only_domains("LIST", &["pypi.org"]).unwrap();
    assert!(matches!(
        p.verify_egress(info.id.clone(), other).await.unwrap(),
        EgressCheck::Differs(_)
    ));
    p.destroy(info.id).await.unwrap();
    // `dns` mode and a missing sidecar: the read-back differs, naming the server setting.
    for config in [
        Config {
            egress_mode: EgressMode::Dns,
            ..Config::default()
        },
        Config {
            sidecar_absent: true,
            ..Config::default()
        },
    ] {
        fake.set_config(config).unwrap();
        let info = p.create(spec("lf-seam-d2", policy.clone())).await.unwrap();
        match p
            .verify_egress(info.id.clone(), policy.clone())
            .await
            .unwrap()
        {
            EgressCheck::Differs(why) => assert!(why.contains("[egress]"), "{why}"),
            EgressCheck::Matches => panic!("accepted"),
        }
        p.destroy(info.id).await.unwrap();
    }
    assert_eq!(fake.stats().live, 0);
    fake.shutdown().await;
}
