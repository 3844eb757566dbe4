//! The OpenSandbox provider behind sandbox-core's `Provider` seam, against the OpenSandbox
//! fake: the neutral operations work, the checks refuse, and nothing is left.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use opensandbox_fake::{Config, EgressMode, FakeOptions, FakeServer, NetworkMode};
use sandbox_core::egress::EgressPolicy;
use sandbox_core::provider::{
    CallFailure, EgressCheck, ExecFrame, ExecRequest, GuestSpec, Isolation, Labels, Lifetime,
    Provider, ProviderKind, Size,
};
use sandbox_opensandbox::{OpenSandbox, OpenSandboxSettings};

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

/// The provider for `fake`, with the operator's word that no sandbox reaches the server:
/// the fake's "sandboxes" are processes of this host, so nothing tells them apart from it.
/// Tests of the server guard unset it (`("OPEN_SANDBOX_SERVER_UNREACHABLE", "")`).
fn provider(fake: &FakeServer, extra: &[(&str, &str)]) -> OpenSandbox {
    let mut vars = vec![("OPEN_SANDBOX_SERVER_UNREACHABLE", "true")];
    vars.extend_from_slice(extra);
    provider_at(&fake.url(), &vars)
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
    // An egress policy on a host-mode server: the server's 400 comes back as a refusal that
    // names the server setting, and nothing was made.
    let e = p
        .create(spec("lf-seam-5", EgressPolicy::DenyAll))
        .await
        .unwrap_err();
    assert_eq!(e.failure, CallFailure::Config, "{e}");
    assert!(
        e.message.contains("network_mode = \"bridge\""),
        "{}",
        e.message
    );
    assert_eq!(fake.stats().live, 0);
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_single_sandbox_harness_settings_still_run_the_identity_canary() {
    let fake = fake(Config {
        network_mode: NetworkMode::Host,
        ..Config::default()
    })
    .await;
    let settings = settings_at(&fake.url(), &[("OPEN_SANDBOX_SERVER_UNREACHABLE", "true")]);
    assert!(!settings.host_network_accepted());
    let p = OpenSandbox::new(settings.for_single_sandbox_harness()).unwrap();
    // One sandbox: the shared endpoint is accepted and the canary answers with its own id.
    let first = p
        .create(spec("lf-seam-6", EgressPolicy::AllowAll))
        .await
        .unwrap();
    p.wait_ready(first.id.clone(), deadline()).await.unwrap();
    // A second one while the first lives: host mode routes its commands into the first, and
    // the canary refuses it.
    let second = p
        .create(spec("lf-seam-7", EgressPolicy::AllowAll))
        .await
        .unwrap();
    let e = p
        .wait_ready(second.id.clone(), deadline())
        .await
        .unwrap_err();
    assert_eq!(e.failure, CallFailure::Config, "{e}");
    assert!(e.message.contains(&first.id), "{}", e.message);
    p.destroy(second.id).await.unwrap();
    p.destroy(first.id).await.unwrap();
    assert_eq!(fake.stats().live, 0);
    fake.shutdown().await;
}

/// The real 1.1.1 server on Docker kills an expired sandbox's container and removes it a
/// moment later; in between it shows `Failed` (`CONTAINER_EXITED_ERROR`, exit 137). The fake
/// does the same (`expiry_failed_ms`); here the lifecycle meets it mid-run.
#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_that_expires_mid_run_shows_failed_and_the_lifecycle_copes() {
    use sandbox_core::error::{ErrorKind, Redactor};
    use sandbox_core::exec::{Command, ExecLimits};
    use sandbox_core::guest::{ExecInput, Guest, GuestContext};
    use sandbox_core::orphans::{SweepConfig, sweep_provider};
    use sandbox_core::provider::GuestStatus;
    use sandbox_core::reaper::{Reaper, ReaperConfig};
    use sandbox_core::retry::Backoff;
    use std::sync::Arc;

    let fake = fake(Config {
        expiry_failed_ms: 2000,
        ..Config::default()
    })
    .await;
    let os = provider(&fake, &[("OPEN_SANDBOX_ALLOW_CONTAINER_ISOLATION", "true")]);
    let client = os.inner().client().clone();
    let p: Arc<dyn Provider> = Arc::new(os);
    let backoff = Backoff {
        base: Duration::from_millis(10),
        max: Duration::from_millis(50),
        budget: Duration::from_secs(2),
    };
    let reaper = Reaper::new(ReaperConfig {
        backoff,
        lookup_patience: Duration::from_millis(300),
    });
    let cx = GuestContext::with_provider(p.clone(), reaper, Redactor::new(KEY), backoff);
    let guest = Guest::create(
        &cx,
        &sandbox_core::guest::GuestSpec {
            shape: "512Mi".into(),
            rootfs: String::new(),
            envs: BTreeMap::new(),
            egress: EgressPolicy::AllowAll,
            auto_pause_after_seconds: 300,
        },
        "lf-",
        deadline(),
    )
    .await
    .unwrap();
    let id = guest.id().to_owned();
    let limits = ExecLimits {
        budget: Duration::from_secs(20),
        kill_after: Duration::from_secs(1),
        host_grace: Duration::from_secs(2),
    };
    let run = guest
        .exec(
            &Command::shell("echo started; sleep 30; echo never"),
            &limits,
            &ExecInput::default(),
            deadline(),
        )
        .await
        .unwrap();
    // The server's own expiry, a second from now (as the `timeout` it was created with would).
    client
        .renew_expiration(&id, Duration::from_secs(1), Duration::from_secs(1))
        .await
        .unwrap();
    let started = std::time::Instant::now();
    // The container is killed: the program's stream ends without an exit status, which is
    // "may have run", not a result, and not a 20 s wait.
    let e = guest.capture(run, &limits, 1 << 16).await.unwrap_err();
    eprintln!("the run ended: {e} after {:?}", started.elapsed());
    assert_eq!(e.kind(), ErrorKind::OutcomeUnknown, "{e}");
    assert!(started.elapsed() < Duration::from_secs(5));
    // In between, the provider reads it as failed (terminal) ...
    let info = p.get(id.clone()).await.unwrap();
    assert_eq!(info.status, GuestStatus::Failed, "{info:?}");
    assert!(info.is_terminal());
    // ... a readiness wait on it ends at once instead of at its deadline ...
    let waited = std::time::Instant::now();
    let e = p.wait_ready(id.clone(), deadline()).await.unwrap_err();
    assert!(e.message.contains("Failed"), "{e}");
    assert!(waited.elapsed() < Duration::from_secs(2));
    // ... the orphan sweep leaves it to the server, which is already removing it ...
    let report = sweep_provider(
        &*p,
        false,
        &SweepConfig {
            orphan_age: Duration::ZERO,
            ..SweepConfig::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(
        (report.examined, report.deleted.len()),
        (1, 0),
        "{report:?}"
    );
    // ... and destroying it (Failed now, or already gone) succeeds.
    guest.destroy().await.unwrap();
    assert!(p.get(id).await.unwrap_err().is_not_found());
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

/// Issue 45: two deployments sharing a server (each its own `OPEN_SANDBOX_CREATED_BY`) never
/// find, adopt or delete each other's kept sandboxes under the same name.
#[tokio::test(flavor = "multi_thread")]
async fn kept_sandboxes_belong_to_one_deployment() {
    let fake = fake(Config::default()).await;
    let a = provider(&fake, &[("OPEN_SANDBOX_CREATED_BY", "deploy-a")]);
    let b = provider(&fake, &[("OPEN_SANDBOX_CREATED_BY", "deploy-b")]);
    let name = "lf-c-shared-name";
    let theirs = a.create(kept_spec(name)).await.unwrap();
    assert_eq!(b.find(name.into()).await.unwrap(), None);
    // B's own kept guest under the same name is B's: created, not a 409 to adopt A's.
    let ours = b.create(kept_spec(name)).await.unwrap();
    assert_ne!(ours.id, theirs.id);
    assert_eq!(fake.stats().live, 2);
    assert_eq!(b.find(name.into()).await.unwrap().unwrap().id, ours.id);
    assert_eq!(a.find(name.into()).await.unwrap().unwrap().id, theirs.id);
    // Neither lookup deleted the other's as a duplicate.
    assert_eq!(fake.stats().live, 2);
    a.destroy(theirs.id).await.unwrap();
    b.destroy(ours.id).await.unwrap();
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

/// A context on `p` whose control-plane budget is `budget` (fast retries).
fn context_with_budget(
    p: std::sync::Arc<dyn Provider>,
    budget: Duration,
) -> sandbox_core::guest::GuestContext {
    use sandbox_core::error::Redactor;
    use sandbox_core::reaper::{Reaper, ReaperConfig};
    use sandbox_core::retry::Backoff;
    let backoff = Backoff {
        base: Duration::from_millis(10),
        max: Duration::from_millis(50),
        budget,
    };
    let reaper = Reaper::new(ReaperConfig {
        backoff,
        lookup_patience: Duration::from_millis(300),
    });
    sandbox_core::guest::GuestContext::with_provider(p, reaper, Redactor::new(KEY), backoff)
}

fn one_shot_spec(rootfs: &str) -> sandbox_core::guest::GuestSpec {
    sandbox_core::guest::GuestSpec {
        shape: "512Mi".into(),
        rootfs: rootfs.into(),
        envs: BTreeMap::new(),
        egress: EgressPolicy::AllowAll,
        auto_pause_after_seconds: 300,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_image_the_server_cannot_pull_is_refused_at_once_naming_the_setting() {
    // The fake holds only the default image; the real Docker server answers 500
    // DOCKER::SANDBOX_IMAGE_PULL_FAILED for any other.
    let fake = fake(Config::default()).await;
    refused_once_for_an_unpullable_image(&fake, "OpenSandbox").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kubernetes_pod_that_cannot_pull_its_image_is_the_same_refusal() {
    // The 1.1.1 server on Kubernetes waits in the create; OpenSandbox's controller marks the
    // pod Failed in ErrImagePull and the create answers 500 KUBERNETES::POD_FAILED ("...
    // primary reason=ErrImagePull ..."). Before, that was a transient failure retried for the
    // whole control-plane budget, saying "retrying later may succeed".
    let fake = fake(Config {
        runtime: opensandbox_fake::Runtime::Kubernetes,
        ..Config::default()
    })
    .await;
    refused_once_for_an_unpullable_image(&fake, "primary reason=ErrImagePull").await;
}

/// A run asking `fake` for an image it cannot pull is refused at once (one create, no retry,
/// never "retrying later"), naming `OPEN_SANDBOX_IMAGE`, the image and `says`; the backend's
/// own create says the same; nothing is left.
async fn refused_once_for_an_unpullable_image(fake: &FakeServer, says: &str) {
    use sandbox_core::error::ErrorKind;
    use sandbox_core::guest::Guest;
    use std::sync::Arc;

    let os = provider(
        fake,
        &[("OPEN_SANDBOX_IMAGE", "registry.internal/lf:missing")],
    );
    let cx = context_with_budget(Arc::new(os.clone()), Duration::from_secs(20));
    let started = std::time::Instant::now();
    let err = Guest::create(&cx, &one_shot_spec(""), "lf-", deadline())
        .await
        .unwrap_err();
    let msg = err.message();
    assert_eq!(err.kind(), ErrorKind::Refused, "{msg}");
    assert!(msg.contains("OPEN_SANDBOX_IMAGE"), "{msg}");
    assert!(msg.contains("registry.internal/lf:missing"), "{msg}");
    assert!(msg.contains(says), "{msg}");
    assert!(!msg.to_lowercase().contains("retrying later"), "{msg}");
    assert!(started.elapsed() < Duration::from_secs(3), "not retried");
    assert_eq!(fake.stats().requests.get("create"), Some(&1));
    let spec = sandbox_opensandbox::SandboxSpec {
        egress: sandbox_opensandbox::Egress::Unrestricted,
        memory_mb: 512,
        surface: "backend",
        run_budget: Duration::from_secs(10),
    };
    let err = os.inner().create(&spec).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Refused, "{err}");
    assert!(err.message().contains("OPEN_SANDBOX_IMAGE"), "{err}");
    assert_eq!(fake.stats().requests.get("create"), Some(&2));
    assert_eq!(fake.stats().live, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn readiness_waits_open_sandbox_ready_seconds_whatever_the_control_plane_budget() {
    use sandbox_core::error::ErrorKind;
    use sandbox_core::guest::Guest;
    use std::sync::Arc;

    // A Kubernetes pod that stays Pending 2.5 s.
    let fake = fake(Config {
        runtime: opensandbox_fake::Runtime::Kubernetes,
        pending_ms: 2500,
        ..Config::default()
    })
    .await;
    // OPEN_SANDBOX_READY_SECONDS=6 waits it out, though the control-plane budget is 1 s. The
    // surfaces see the provider through the observation's wrapper: it says the same.
    let p: Arc<dyn Provider> = Arc::new(provider(&fake, &[("OPEN_SANDBOX_READY_SECONDS", "6")]));
    let p = sandbox_core::observed::ObservedProvider::wrap(
        p,
        sandbox_core::observe::Observation::new(),
    );
    assert_eq!(
        p.readiness().map(|r| (r.budget, r.setting)),
        Some((Duration::from_secs(6), "OPEN_SANDBOX_READY_SECONDS"))
    );
    let cx = context_with_budget(p, Duration::from_secs(1));
    let soon = tokio::time::Instant::now() + Duration::from_secs(1);
    let guest = Guest::create(&cx, &one_shot_spec(""), "lf-", soon)
        .await
        .unwrap();
    guest.destroy().await.unwrap();
    // OPEN_SANDBOX_READY_SECONDS=1 gives up after about 1 s, though the budget is 20 s, and
    // says which setting to raise.
    let p: Arc<dyn Provider> = Arc::new(provider(&fake, &[("OPEN_SANDBOX_READY_SECONDS", "1")]));
    let cx = context_with_budget(p, Duration::from_secs(20));
    let started = std::time::Instant::now();
    let err = Guest::create(&cx, &one_shot_spec(""), "lf-", deadline())
        .await
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(err.kind(), ErrorKind::Transient, "{err}");
    let msg = err.message();
    assert!(msg.contains("OpenSandbox"), "{msg}");
    assert!(msg.contains("OPEN_SANDBOX_READY_SECONDS=1"), "{msg}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(fake.stats().live, 0, "the late sandbox was destroyed");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lifetime_above_the_servers_maximum_names_the_setting_that_sets_it() {
    use sandbox_core::error::ErrorKind;
    use sandbox_core::guest::Guest;
    use std::sync::Arc;

    // The server's max_sandbox_timeout_seconds is 600; the default lifetime is 900 s.
    let fake = fake(Config {
        max_timeout_seconds: 600,
        ..Config::default()
    })
    .await;
    let os = provider(&fake, &[]);
    let cx = context_with_budget(Arc::new(os.clone()), Duration::from_secs(20));
    let err = Guest::create(&cx, &one_shot_spec(""), "lf-", deadline())
        .await
        .unwrap_err();
    let msg = err.message();
    assert_eq!(err.kind(), ErrorKind::Refused, "{msg}");
    assert!(
        msg.contains("OPEN_SANDBOX_SANDBOX_TIMEOUT_SECONDS=900s"),
        "{msg}"
    );
    assert!(msg.contains("max_sandbox_timeout_seconds"), "{msg}");
    // A setting within the maximum creates.
    let os = provider(&fake, &[("OPEN_SANDBOX_SANDBOX_TIMEOUT_SECONDS", "600")]);
    let cx = context_with_budget(Arc::new(os), Duration::from_secs(20));
    let guest = Guest::create(&cx, &one_shot_spec(""), "lf-", deadline())
        .await
        .unwrap();
    guest.destroy().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_create_the_server_answered_500_leaves_nothing_to_look_up() {
    use sandbox_core::error::ErrorKind;
    use sandbox_core::guest::Guest;
    use std::sync::Arc;

    // Every create is answered 500 with the server's own error body.
    let fake = FakeServer::start(FakeOptions {
        api_key: KEY.into(),
        faults: "create=500".into(),
        ..FakeOptions::default()
    })
    .await
    .unwrap();
    let os = provider(&fake, &[]);
    let cx = context_with_budget(Arc::new(os), Duration::from_secs(1));
    let started = std::time::Instant::now();
    let soon = tokio::time::Instant::now() + Duration::from_secs(1);
    let err = Guest::create(&cx, &one_shot_spec(""), "lf-", soon)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Transient, "{err}");
    eprintln!(
        "DEBUG {:?} {:?} {err}",
        started.elapsed(),
        fake.stats().requests
    );
    assert!(started.elapsed() < Duration::from_secs(3));
    // Each create was followed by one lookup of its nonce, which found nothing: no name is
    // left for the reaper to keep listing by label, so shutdown has nothing to wait for.
    let stats = fake.stats();
    let creates = stats.requests.get("create").copied().unwrap_or(0);
    assert!(creates >= 1);
    assert_eq!(stats.requests.get("list").copied().unwrap_or(0), creates);
    assert_eq!(cx.reaper.registered(), 0);
    let shutdown = std::time::Instant::now();
    cx.reaper.shutdown(Duration::from_secs(20)).await;
    assert!(shutdown.elapsed() < Duration::from_secs(1));
    assert_eq!(
        fake.stats().requests.get("list").copied().unwrap_or(0),
        creates
    );
}

/// This host's address on its default route, if it has one that is not loopback: what a test
/// names a fake bound to `0.0.0.0` by, so the plugin sees a server on another host.
fn routable_address() -> Option<std::net::IpAddr> {
    let probe = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    probe.connect("192.0.2.1:9").ok()?; // TEST-NET-1: no packet is sent by connect().
    let ip = probe.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

/// Issue 45: unrestricted egress never lets a guest reach the server. On a server this host
/// reaches over loopback, only the operator's word (`OPEN_SANDBOX_SERVER_UNREACHABLE`) lets
/// it run, with no policy; without it nothing is created. On a server elsewhere, the sandbox
/// gets allow-by-default with a rule denying the server, read back like any policy, and a
/// server without the sidecar is refused naming the way out.
#[tokio::test(flavor = "multi_thread")]
async fn unrestricted_egress_denies_the_server_or_needs_the_operators_word() {
    let fake = fake(Config::default()).await;
    let guarded = provider(&fake, &[("OPEN_SANDBOX_SERVER_UNREACHABLE", "")]);
    let e = guarded
        .create(spec("lf-seam-g1", EgressPolicy::AllowAll))
        .await
        .unwrap_err();
    assert_eq!(e.failure, CallFailure::Config, "{e}");
    assert!(
        e.message.contains("OPEN_SANDBOX_SERVER_UNREACHABLE=true"),
        "{e}"
    );
    assert!(e.message.contains("loopback"), "{e}");
    assert_eq!(fake.stats().created, 0);
    // With the word: no policy, as before.
    let fenced = provider(&fake, &[]);
    let info = fenced
        .create(spec("lf-seam-g2", EgressPolicy::AllowAll))
        .await
        .unwrap();
    fenced.destroy(info.id).await.unwrap();
    assert_eq!(fake.stats().policies, [serde_json::Value::Null]);
    fake.shutdown().await;

    let Some(ip) = routable_address() else {
        eprintln!("skipped the remote half: this host has no address off loopback");
        return;
    };
    let remote = FakeServer::start_at(
        FakeOptions {
            api_key: KEY.into(),
            config: Config {
                ping_ms: 200,
                ..Config::default()
            },
            ..FakeOptions::default()
        },
        std::net::SocketAddr::new(std::net::IpAddr::from([0, 0, 0, 0]), 0),
    )
    .await
    .unwrap();
    let port = remote.addr().port();
    let host = std::net::SocketAddr::new(ip, port).to_string();
    let domain = format!("http://{host}");
    // Plain http off loopback: a test fake.
    let p = provider_at(&domain, &[("OPEN_SANDBOX_ALLOW_PLAIN_HTTP", "true")]);
    let info = p
        .create(spec("lf-seam-g3", EgressPolicy::AllowAll))
        .await
        .unwrap();
    p.wait_ready(info.id.clone(), deadline()).await.unwrap();
    assert_eq!(
        p.verify_egress(info.id.clone(), EgressPolicy::AllowAll)
            .await
            .unwrap(),
        EgressCheck::Matches
    );
    let held = remote.stats().policies;
    let shown = ip.to_string();
    assert_eq!(
        held,
        [serde_json::json!({"defaultAction": "allow",
            "egress": [{"action": "deny", "target": shown}]})]
    );
    p.destroy(info.id).await.unwrap();
    // No sidecar to enforce the rule: the read-back differs, naming the server's [egress] and
    // the operator's word.
    remote
        .set_config(Config {
            sidecar_absent: true,
            ..remote.config()
        })
        .unwrap();
    let info = p
        .create(spec("lf-seam-g4", EgressPolicy::AllowAll))
        .await
        .unwrap();
    match p
        .verify_egress(info.id.clone(), EgressPolicy::AllowAll)
        .await
        .unwrap()
    {
        EgressCheck::Differs(why) => {
            assert!(why.contains("[egress]"), "{why}");
            assert!(
                why.contains("OPEN_SANDBOX_SERVER_UNREACHABLE=true"),
                "{why}"
            );
        }
        EgressCheck::Matches => panic!("no sidecar accepted"),
    }
    p.destroy(info.id).await.unwrap();
    assert_eq!(remote.stats().live, 0);
    remote.shutdown().await;
}

/// The provider for a server at `domain`, with `extra` settings on top.
fn provider_at(domain: &str, extra: &[(&str, &str)]) -> OpenSandbox {
    OpenSandbox::new(settings_at(domain, extra)).unwrap()
}

/// The settings for a server at `domain`, with `extra` settings on top.
fn settings_at(domain: &str, extra: &[(&str, &str)]) -> OpenSandboxSettings {
    let mut vars: BTreeMap<String, String> = BTreeMap::from([
        ("OPEN_SANDBOX_DOMAIN".into(), domain.to_owned()),
        ("OPEN_SANDBOX_API_KEY".into(), KEY.into()),
        ("OPEN_SANDBOX_IDLE_SECONDS".into(), "4".into()),
    ]);
    for (k, v) in extra {
        vars.insert((*k).into(), (*v).into());
    }
    OpenSandboxSettings::from_lookup(move |n| vars.get(n).cloned()).unwrap()
}
