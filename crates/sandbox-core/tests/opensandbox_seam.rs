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

/// A kept guest's spec (the component's Guest Reuse labels it).
fn kept_spec(name: &str) -> GuestSpec {
    let mut s = spec(name, EgressPolicy::AllowAll);
    s.labels = s.labels.with(Labels::KEPT, "true");
    s
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

/// Seconds from now until the sandbox's expiry, as the server reports it.
async fn expires_in(p: &OpenSandbox, id: &str) -> i64 {
    let sb = p.inner().client().get_sandbox(id).await.unwrap();
    (sb.expires().unwrap() - opensandbox_api::OffsetDateTime::now_utc()).whole_seconds()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kept_name_has_one_holder_whose_expiry_is_renewed_and_never_shortened() {
    let fake = fake(Config::default()).await;
    let p = provider(&fake, &[("OPEN_SANDBOX_MAX_RENEW_SECONDS", "1800")]);
    let name = "lf-c-seamkept";
    let first = p.create(kept_spec(name)).await.unwrap();
    // Another worker creating the same kept guest gives its own sandbox up (409: adopt).
    let e = p.create(kept_spec(name)).await.unwrap_err();
    assert!(e.is_conflict(), "{e}");
    assert_eq!(fake.stats().live, 1);
    let found = p.find(name.into()).await.unwrap().unwrap();
    assert_eq!(found.id, first.id);
    // The declared keys (never the values) come back from the label.
    assert_eq!(found.envs, Some(vec!["GREETING".to_owned()]));
    // A duplicate that raced past that check: the lookup keeps the oldest, deletes the newer.
    let s = p.inner().settings();
    let dup = p
        .inner()
        .client()
        .create_sandbox(
            &opensandbox_api::CreateSandbox::from_image(s.image.clone(), s.entrypoint.clone())
                .lifetime(opensandbox_api::Lifetime::After(Duration::from_secs(600)))
                .resource("memory", "512Mi")
                .metadata("lf-name", name)
                .metadata(Labels::CREATED_BY, Labels::CREATED_BY_US),
        )
        .await
        .unwrap();
    assert_eq!(fake.stats().live, 2);
    assert_eq!(p.find(name.into()).await.unwrap().unwrap().id, first.id);
    assert_eq!(fake.stats().live, 1);
    assert!(p.inner().client().get_sandbox(&dup.id).await.is_err());
    // Created for max(900 s, budget + backstop); a shorter renewal leaves it as it is.
    let at_create = expires_in(&p, &first.id).await;
    assert!((880..=900).contains(&at_create), "{at_create}");
    p.keep_alive(first.id.clone(), Duration::from_secs(300))
        .await
        .unwrap();
    assert!(expires_in(&p, &first.id).await >= at_create - 5);
    // A longer one pushes it out, clamped to OPEN_SANDBOX_MAX_RENEW_SECONDS.
    p.keep_alive(first.id.clone(), Duration::from_secs(7200))
        .await
        .unwrap();
    let renewed = expires_in(&p, &first.id).await;
    assert!((1780..=1800).contains(&renewed), "{renewed}");
    // Gone: the lookup finds nothing, a renewal is a 404 (the caller creates it again).
    p.destroy(first.id.clone()).await.unwrap();
    let e = p
        .keep_alive(first.id.clone(), Duration::from_secs(600))
        .await
        .unwrap_err();
    assert!(e.is_not_found(), "{e}");
    assert!(
        p.find(name.into())
            .await
            .unwrap()
            .is_none_or(|g| g.is_terminal())
    );
    assert_eq!(fake.stats().live, 0);
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_background_process_outlives_its_start_and_the_sweep_spares_kept_guests() {
    let fake = fake(Config::default()).await;
    let p = provider(&fake, &[]);
    let one_shot = p
        .create(spec("lf-seamspawn0000000000", EgressPolicy::AllowAll))
        .await
        .unwrap();
    let kept = p.create(kept_spec("lf-c-seamspared")).await.unwrap();
    p.wait_ready(one_shot.id.clone(), deadline()).await.unwrap();
    let pid = p
        .spawn_process(
            one_shot.id.clone(),
            sandbox_core::provider::ProcessSpec {
                cmd: "sh".into(),
                args: vec![
                    "-c".into(),
                    "sleep 0.5; echo late > /tmp/lf-spawned.txt".into(),
                ],
                cwd: "/tmp".into(),
            },
        )
        .await
        .unwrap();
    assert!(!pid.is_empty());
    // It answered at once and the process went on: its file appears afterwards.
    let mut body = Vec::new();
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if let Ok(d) = p
            .download(one_shot.id.clone(), "/tmp/lf-spawned.txt".into(), Some(100))
            .await
        {
            body = d.body.map(|c| c.unwrap().to_vec()).concat().await;
            if !body.is_empty() {
                break;
            }
        }
    }
    assert_eq!(body, b"late\n");
    // The orphan sweep (`reap --provider opensandbox`) leaves the kept guest to its own reap.
    let swept = p.inner().sweep(Duration::ZERO, false).await.unwrap();
    assert_eq!(swept, std::slice::from_ref(&one_shot.id));
    assert!(p.get(kept.id.clone()).await.is_ok());
    p.destroy(kept.id).await.unwrap();
    assert_eq!(fake.stats().live, 0);
    fake.shutdown().await;
}
