//! The OpenSandbox *provider* against a real `opensandbox-server` 1.1.1 on Docker
//! (`scripts/opensandbox-harness` sets it up and runs this test after the client's own,
//! `crates/opensandbox-api/tests/real_server.rs`). Without `OPENSANDBOX_HARNESS_URL` it is
//! skipped and says why.
//!
//! Everything goes through `Arc<dyn Provider>` and, where sandbox-core has one, its lifecycle
//! (`GuestContext`, `Guest::create`, exec, capture, upload, download, destroy, the orphan
//! sweep), so the gates run as a surface runs them.
//!
//! What this server is, and so what can honestly be exercised: Docker in `bridge` network
//! mode (`scripts/opensandbox-server`, which the harness uses where it can start a Docker
//! daemon with a bridge) or, where it cannot, `host` mode (`OPENSANDBOX_HARNESS_NETWORK=host`);
//! runc containers; no egress sidecar. So:
//!
//! - the gates that must fire here do, and each leaves no sandbox: in host mode the shared
//!   execd endpoint (default settings); an egress policy (a host-mode server refuses it, and so
//!   does a bridge-mode server without an `[egress]` image); and an isolation attestation
//!   whose probe finds the host's kernel (`runc`);
//! - the rest runs with unrestricted egress and container isolation (reported as such, which
//!   lfx refuses; the component and the executor need `OPEN_SANDBOX_ALLOW_CONTAINER_ISOLATION`,
//!   set here). In bridge mode with the provider's own settings (each sandbox has its own
//!   endpoint, and the endpoint check passes); in host mode with the settings of a
//!   single-sandbox harness (`OpenSandboxSettings::for_single_sandbox_harness`: the endpoint
//!   check is skipped, the identity canary still runs). One sandbox lives at a time.
//!
//! Steps: the three refusals; create and readiness (`Running`, `/ping`, the canary); exec
//! streamed, exit codes and the guest's timeout; upload and download (whole, and over a cap);
//! destroy (404 after); the orphan sweep by `created-by` metadata and age; the server's own
//! expiry (`timeout`, 60 s) during a run: the run ends as "may have run", then the provider
//! sees the guest `Failed`, then gone. Each step prints its time; the last lines are a table of
//! them.
//!
//! Settings: `OPENSANDBOX_HARNESS_URL`, `OPENSANDBOX_HARNESS_API_KEY`,
//! `OPENSANDBOX_HARNESS_IMAGE` (an image already on the Docker host, with `sh` and
//! `timeout`), `OPENSANDBOX_HARNESS_NETWORK` (`bridge` or `host`, the server's
//! `[docker] network_mode`; default `host`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use sandbox_core::ErrorKind;
use sandbox_core::egress::EgressPolicy;
use sandbox_core::error::Redactor;
use sandbox_core::exec::{Command, EXIT_TIMED_OUT, ExecLimits};
use sandbox_core::guest::{ExecInput, ExecStep, Guest, GuestContext, GuestSpec};
use sandbox_core::names::{ONE_SHOT_PREFIX, mint_name};
use sandbox_core::orphans::{SweepConfig, sweep_provider};
use sandbox_core::provider::{ExecFrame, GuestStatus, Isolation, Labels, Lifetime, Provider, Size};
use sandbox_core::reaper::{Reaper, ReaperConfig};
use sandbox_core::retry::Backoff;
use sandbox_opensandbox::{OpenSandbox, OpenSandboxSettings};
use tokio::time::Instant;

/// The `created-by` value of every sandbox here: the harness removes containers carrying it
/// when a run ends, whatever happened.
const CREATED_BY: &str = "opensandbox-harness";

struct Harness {
    url: String,
    key: String,
    image: String,
    /// The server's `[docker] network_mode` is `bridge` (else `host`).
    bridge: bool,
    times: Vec<(String, Duration)>,
}

fn required(name: &str) -> String {
    match std::env::var(name) {
        Ok(v) if !v.is_empty() => v,
        _ => panic!(
            "OPENSANDBOX_HARNESS_URL is set but {name} is not: set it too, or run \
             scripts/opensandbox-harness, which sets all three"
        ),
    }
}

impl Harness {
    fn from_env() -> Option<Harness> {
        let url = std::env::var("OPENSANDBOX_HARNESS_URL")
            .ok()
            .filter(|v| !v.is_empty())?;
        Some(Harness {
            url,
            key: required("OPENSANDBOX_HARNESS_API_KEY"),
            image: required("OPENSANDBOX_HARNESS_IMAGE"),
            bridge: match std::env::var("OPENSANDBOX_HARNESS_NETWORK").as_deref() {
                Ok("bridge") => true,
                Ok("host") | Err(_) => false,
                Ok(other) => {
                    panic!("OPENSANDBOX_HARNESS_NETWORK must be bridge or host, not {other:?}")
                }
            },
            times: Vec::new(),
        })
    }

    /// The provider's settings for this server, plus `extra`.
    fn settings(&self, extra: &[(&str, &str)]) -> OpenSandboxSettings {
        let mut vars: BTreeMap<String, String> = BTreeMap::from([
            ("OPEN_SANDBOX_DOMAIN".into(), self.url.clone()),
            ("OPEN_SANDBOX_API_KEY".into(), self.key.clone()),
            ("OPEN_SANDBOX_IMAGE".into(), self.image.clone()),
            ("OPEN_SANDBOX_CPU".into(), "500m".into()),
            ("OPEN_SANDBOX_CREATED_BY".into(), CREATED_BY.into()),
            ("OPEN_SANDBOX_READY_SECONDS".into(), "30".into()),
            ("OPEN_SANDBOX_IDLE_SECONDS".into(), "10".into()),
            ("OPEN_SANDBOX_SANDBOX_TIMEOUT_SECONDS".into(), "600".into()),
            // The harness's server listens on loopback only and runs the harness's own
            // programs: unrestricted egress runs without a sidecar, on this word.
            ("OPEN_SANDBOX_SERVER_UNREACHABLE".into(), "true".into()),
        ]);
        for (k, v) in extra {
            vars.insert((*k).into(), (*v).into());
        }
        OpenSandboxSettings::from_lookup(move |n| vars.get(n).cloned()).expect("settings")
    }

    /// The settings a guest runs with here: the provider's own in bridge mode; in host mode
    /// those of a single-sandbox harness (the shared endpoint's check skipped).
    fn run_settings(&self, extra: &[(&str, &str)]) -> OpenSandboxSettings {
        let settings = self.settings(extra);
        if self.bridge {
            settings
        } else {
            settings.for_single_sandbox_harness()
        }
    }

    /// Notes how long `name` took since `start`, and prints it.
    fn took(&mut self, name: &str, start: Instant) -> Duration {
        let d = start.elapsed();
        eprintln!("provider: {name:<48} {:>8.1} ms", d.as_secs_f64() * 1e3);
        self.times.push((name.to_owned(), d));
        d
    }
}

fn provider(settings: OpenSandboxSettings) -> Arc<dyn Provider> {
    Arc::new(OpenSandbox::new(settings).expect("a provider for the harness"))
}

fn backoff() -> Backoff {
    Backoff {
        base: Duration::from_millis(100),
        max: Duration::from_secs(1),
        budget: Duration::from_secs(10),
    }
}

fn context(provider: Arc<dyn Provider>, key: &str) -> (GuestContext, Reaper) {
    let reaper = Reaper::new(ReaperConfig {
        backoff: backoff(),
        lookup_patience: Duration::from_secs(10),
    });
    let cx = GuestContext::with_provider(provider, reaper.clone(), Redactor::new(key), backoff());
    (cx, reaper)
}

fn spec(egress: EgressPolicy) -> GuestSpec {
    GuestSpec {
        shape: "512Mi".into(),
        rootfs: String::new(),
        envs: BTreeMap::from([("LF_HARNESS_GREETING".to_owned(), "hello there".to_owned())]),
        egress,
        auto_pause_after_seconds: 300,
    }
}

fn soon(secs: u64) -> Instant {
    Instant::now() + Duration::from_secs(secs)
}

/// Every one-shot guest of ours on the server (the sweep's and `reap`'s listing).
async fn ours(p: &dyn Provider) -> Vec<String> {
    p.list_ours(ONE_SHOT_PREFIX.to_owned())
        .await
        .expect("list_ours")
        .into_iter()
        .map(|g| g.info.id)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_provider_against_a_real_opensandbox_server() {
    let Some(h) = Harness::from_env() else {
        eprintln!(
            "skipped: OPENSANDBOX_HARNESS_URL is not set (scripts/opensandbox-harness runs this \
             test against a real opensandbox-server 1.1.1 on Docker)"
        );
        return;
    };
    eprintln!("provider: server {}, image {}", h.url, h.image);
    let cleanup = provider(h.settings(&[]));
    let total = std::time::Instant::now();
    let outcome = tokio::spawn(async move {
        let mut h = h;
        steps(&mut h).await;
        h
    })
    .await;
    match outcome {
        Ok(h) => {
            eprintln!(
                "\nprovider: every step passed in {:.1} s",
                total.elapsed().as_secs_f64()
            );
            for (name, d) in &h.times {
                eprintln!("  {name:<48} {:>8.1} ms", d.as_secs_f64() * 1e3);
            }
        }
        Err(failure) => {
            for id in ours(&*cleanup).await {
                let _ = cleanup.destroy(id).await;
            }
            std::panic::resume_unwind(failure.into_panic());
        }
    }
}

#[allow(clippy::too_many_lines)] // one scenario, step by step, as the harness prints it
async fn steps(h: &mut Harness) {
    let key = h.key.clone();
    assert!(
        ours(&*provider(h.settings(&[]))).await.is_empty(),
        "sandboxes of ours are already on the server"
    );

    // --- the gates that must fire on this server, each leaving nothing ---
    let strict = provider(h.settings(&[]));
    assert_eq!(strict.isolation(), Isolation::Container);
    let (cx, _reaper) = context(strict.clone(), &key);
    if !h.bridge {
        // Default settings: the shared execd endpoint of host network mode is refused in the
        // readiness check, before any user code, and the guest is destroyed.
        let start = Instant::now();
        let err = Guest::create(
            &cx,
            &spec(EgressPolicy::AllowAll),
            ONE_SHOT_PREFIX,
            soon(60),
        )
        .await
        .expect_err("a host-mode server is refused");
        assert_eq!(err.kind(), ErrorKind::Refused, "{err}");
        assert!(err.message().contains("network_mode"), "{err}");
        assert!(ours(&*strict).await.is_empty(), "the refused guest is left");
        h.took("refused: host-mode endpoint (guest destroyed)", start);
        eprintln!("provider:   {}", err.message());
    }

    // An egress policy: a host-mode server rejects it, and so does a bridge-mode server
    // without an [egress] image; nothing is made.
    let start = Instant::now();
    let err = Guest::create(&cx, &spec(EgressPolicy::DenyAll), ONE_SHOT_PREFIX, soon(60))
        .await
        .expect_err("an egress policy on a server without a sidecar is refused");
    assert_eq!(err.kind(), ErrorKind::Refused, "{err}");
    let names = if h.bridge {
        "[egress] image"
    } else {
        "network_mode = \"bridge\""
    };
    assert!(err.message().contains(names), "{err}");
    assert!(ours(&*strict).await.is_empty(), "a guest is left");
    h.took("refused: egress policy, no sidecar (no create)", start);
    eprintln!("provider:   {}", err.message());

    // An isolation attestation on runc: the probe finds the kernel the operator names as the
    // host's, and refuses before any user code.
    let host_kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .expect("the host kernel release")
        .trim()
        .to_owned();
    let attested = provider(h.run_settings(&[
        ("OPEN_SANDBOX_ATTEST_ISOLATION", "hardware-virtualized"),
        ("OPEN_SANDBOX_HOST_KERNEL", host_kernel.as_str()),
    ]));
    assert_eq!(attested.isolation(), Isolation::HardwareVirtualized);
    let (acx, _areaper) = context(attested.clone(), &key);
    let start = Instant::now();
    let err = Guest::create(
        &acx,
        &spec(EgressPolicy::AllowAll),
        ONE_SHOT_PREFIX,
        soon(60),
    )
    .await
    .expect_err("an attested runc guest is refused");
    assert_eq!(err.kind(), ErrorKind::Refused, "{err}");
    assert!(err.message().contains("OPEN_SANDBOX_HOST_KERNEL"), "{err}");
    assert!(
        ours(&*attested).await.is_empty(),
        "the refused guest is left"
    );
    h.took("refused: attested, but the host's kernel", start);
    eprintln!("provider:   {}", err.message());

    // --- a guest through the lifecycle: container isolation knowingly accepted ---
    let settings = h.run_settings(&[("OPEN_SANDBOX_ALLOW_CONTAINER_ISOLATION", "true")]);
    settings
        .require_isolation_for("executor")
        .expect("the opt-in lets the executor run");
    h.settings(&[])
        .require_isolation_for("executor")
        .expect_err("without the opt-in the executor refuses");
    let prov = provider(settings);
    assert_eq!(prov.isolation(), Isolation::Container);
    let (cx, reaper) = context(prov.clone(), &key);
    let start = Instant::now();
    let guest = Guest::create(
        &cx,
        &spec(EgressPolicy::AllowAll),
        ONE_SHOT_PREFIX,
        soon(60),
    )
    .await
    .expect("create, Running, /ping and the identity canary");
    h.took("create + ready (Running, /ping, canary)", start);
    let id = guest.id().to_owned();
    assert!(guest.name().starts_with(ONE_SHOT_PREFIX));
    assert_eq!(
        prov.find(guest.name().to_owned())
            .await
            .unwrap()
            .map(|g| g.id),
        Some(id.clone()),
        "found again by its name in metadata"
    );

    let limits = ExecLimits {
        budget: Duration::from_secs(20),
        kill_after: Duration::from_secs(1),
        host_grace: Duration::from_secs(5),
    };
    let input = ExecInput {
        env: BTreeMap::from([("LF_HARNESS_GREETING".to_owned(), "hello there".to_owned())]),
        stdin: String::new(),
    };
    let run_shell = |script: &str| Command::shell(script);

    // Streamed: each line arrives while the command still runs.
    let start = Instant::now();
    let mut run = guest
        .exec(
            &run_shell(
                "echo \"$LF_HARNESS_GREETING from $OPENSANDBOX_ID\"; \
                 for i in 1 2 3; do echo \"line $i\"; echo \"err $i\" >&2; sleep 0.5; done",
            ),
            &limits,
            &input,
            soon(10),
        )
        .await
        .expect("exec");
    let (mut stdout, mut stderr, mut at) = (String::new(), String::new(), Vec::new());
    let exit = loop {
        match run.next().await {
            ExecStep::Frame(ExecFrame::Stdout(s)) => {
                at.push(start.elapsed());
                stdout.push_str(&s);
            }
            ExecStep::Frame(ExecFrame::Stderr(s)) => stderr.push_str(&s),
            ExecStep::Frame(ExecFrame::Exit(c)) => break c,
            ExecStep::Frame(_) => {}
            other => panic!("the stream ended without an exit: {other:?}"),
        }
    };
    let ended = start.elapsed();
    drop(run);
    assert_eq!(exit, 0);
    assert_eq!(
        stdout,
        format!("hello there from {id}\nline 1\nline 2\nline 3\n")
    );
    assert_eq!(stderr, "err 1\nerr 2\nerr 3\n");
    assert!(
        ended >= Duration::from_millis(1400) && at[1] + Duration::from_millis(900) < ended,
        "not streamed: lines at {at:?}, end at {ended:?}"
    );
    eprintln!("provider:   lines arrived at {at:?} (end {ended:?})");
    h.took("exec: streamed 3 lines over 1.5 s", start);

    // Exit codes, captured as a surface captures them.
    let start = Instant::now();
    for (script, want) in [("exit 3", 3), ("false", 1), ("true", 0), ("exit 124", 124)] {
        let run = guest
            .exec(&run_shell(script), &limits, &input, soon(10))
            .await
            .unwrap();
        let outcome = guest.capture(run, &limits, 1 << 16).await.unwrap();
        assert_eq!(outcome.exit_code, want, "{script}: {outcome:?}");
    }
    h.took("exec: exit codes 3, 1, 0, 124 (early: its own)", start);

    // The guest clock: `timeout(1)` ends the program at its budget; lfx reads -1.
    let start = Instant::now();
    let short = ExecLimits {
        budget: Duration::from_secs(1),
        kill_after: Duration::from_secs(1),
        host_grace: Duration::from_secs(3),
    };
    let run = guest
        .exec(
            &run_shell("echo before; sleep 30; echo after"),
            &short,
            &input,
            soon(10),
        )
        .await
        .unwrap();
    let outcome = guest.capture(run, &short, 1 << 16).await.unwrap();
    let took = h.took("exec: 1 s budget (timeout(1), exit -1)", start);
    assert_eq!(outcome.exit_code, EXIT_TIMED_OUT, "{outcome:?}");
    assert!(
        !outcome.host_timed_out,
        "the guest clock, not the host's, ended it"
    );
    assert_eq!(outcome.stdout.text.to_string(), "before\n");
    assert!(took < Duration::from_secs(4), "{took:?}");

    // Output over the cap keeps its tail, after a marker.
    let run = guest
        .exec(&run_shell("seq 1 20000"), &limits, &input, soon(10))
        .await
        .unwrap();
    let outcome = guest.capture(run, &limits, 1000).await.unwrap();
    assert!(
        outcome.stdout.truncated && outcome.stdout.text.to_string().ends_with("19999\n20000\n")
    );

    // Files: upload (parents made), read back in the guest, downloaded whole, refused over a
    // cap.
    let mut data: Vec<u8> = (0..=255u8).cycle().take(64 * 1024).collect();
    data.extend((0..192 * 1024).map(|i: u32| i.wrapping_mul(2_654_435_761).to_be_bytes()[1]));
    let data = Bytes::from(data);
    let start = Instant::now();
    guest
        .upload("/workspace/provider/in/data.bin", data.clone(), soon(20))
        .await
        .expect("upload");
    h.took("upload: 256 KiB (parents made)", start);
    let run = guest
        .exec(
            &run_shell("wc -c < /workspace/provider/in/data.bin"),
            &limits,
            &input,
            soon(10),
        )
        .await
        .unwrap();
    let outcome = guest.capture(run, &limits, 1 << 16).await.unwrap();
    assert_eq!(
        outcome.stdout.text.to_string().trim(),
        data.len().to_string()
    );
    let start = Instant::now();
    let got = guest
        .download("/workspace/provider/in/data.bin", 1 << 20, soon(20))
        .await
        .expect("download");
    h.took("download: 256 KiB", start);
    assert!(got == data, "the download differs from the upload");
    let err = guest
        .download("/workspace/provider/in/data.bin", 1000, soon(20))
        .await
        .expect_err("over the cap");
    assert_eq!(err.kind(), ErrorKind::Refused, "{err}");
    assert!(err.message().contains("cap"), "{err}");

    // Destroy: gone from the server (404), and a second destroy is fine.
    let start = Instant::now();
    guest.destroy().await.expect("destroy");
    h.took("destroy", start);
    let err = prov.get(id.clone()).await.expect_err("gone");
    assert!(err.is_not_found(), "{err}");
    prov.destroy(id.clone())
        .await
        .expect("a second destroy is idempotent");
    assert!(ours(&*prov).await.is_empty());
    let report = reaper.shutdown(Duration::from_secs(10)).await;
    eprintln!("provider:   reaper at shutdown: {report:?}");

    // --- the orphan sweep: a guest whose process forgot it, found by metadata and age ---
    let start = Instant::now();
    let name = mint_name(ONE_SHOT_PREFIX);
    let orphan = prov
        .create(neutral_spec(&name, Duration::from_secs(300)))
        .await
        .expect("create an orphan");
    prov.wait_ready(orphan.id.clone(), soon(30)).await.unwrap();
    h.took("create + ready through the seam (orphan)", start);
    let start = Instant::now();
    let young = sweep_provider(&*prov, false, &sweep_config(Duration::from_secs(3600)))
        .await
        .unwrap();
    assert!(
        young.deleted.is_empty(),
        "a young guest was swept: {young:?}"
    );
    assert_eq!(young.examined, 1, "{young:?}");
    prov.get(orphan.id.clone()).await.expect("still there");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let old = sweep_provider(&*prov, false, &sweep_config(Duration::from_secs(1)))
        .await
        .unwrap();
    assert_eq!(
        old.deleted
            .iter()
            .map(|outcome| outcome.id.as_str())
            .collect::<Vec<_>>(),
        [orphan.id.as_str()],
        "{old:?}"
    );
    assert!(old.failed.is_empty(), "{old:?}");
    assert!(
        prov.get(orphan.id.clone())
            .await
            .unwrap_err()
            .is_not_found()
    );
    h.took("orphan sweep (age 1 h: none; 1 s: it)", start);

    // --- the server's own expiry (`timeout`, 60 s, its minimum), seen through the provider ---
    let ttl_provider = OpenSandbox::new(h.run_settings(&[
        ("OPEN_SANDBOX_SANDBOX_TIMEOUT_SECONDS", "60"),
        ("OPEN_SANDBOX_ALLOW_CONTAINER_ISOLATION", "true"),
    ]))
    .unwrap();
    let client = ttl_provider.inner().client().clone();
    let prov: Arc<dyn Provider> = Arc::new(ttl_provider);
    let (tcx, treaper) = context(prov.clone(), &key);
    // A run budget of 25 s: the provider keeps the server-side lifetime above it, at the
    // setting's 60 s.
    let ttl_spec = GuestSpec {
        auto_pause_after_seconds: 25,
        ..spec(EgressPolicy::AllowAll)
    };
    let guest = Guest::create(&tcx, &ttl_spec, ONE_SHOT_PREFIX, soon(60))
        .await
        .expect("create the expiring guest");
    let ttl_id = guest.id().to_owned();
    let start = Instant::now();
    let raw = client.get_sandbox(&ttl_id).await.unwrap();
    let (created, expires) = (raw.created().unwrap(), raw.expires().unwrap());
    let lifetime = (expires - created).as_seconds_f64();
    assert!(
        (lifetime - 60.0).abs() < 5.0,
        "a {lifetime} s lifetime for a 60 s timeout"
    );
    // A program still running at the expiry: the server kills the container, the stream ends
    // without an exit status, and the lifecycle says the code may have run.
    let long = ExecLimits {
        budget: Duration::from_secs(100),
        kill_after: Duration::from_secs(1),
        host_grace: Duration::from_secs(5),
    };
    let run = guest
        .exec(
            &run_shell("echo started; sleep 100; echo never"),
            &long,
            &input,
            soon(10),
        )
        .await
        .unwrap();
    let err = guest
        .capture(run, &long, 1 << 16)
        .await
        .expect_err("the expiry ends the run");
    let ended = (opensandbox_api::OffsetDateTime::now_utc() - expires).as_seconds_f64();
    eprintln!("provider:   the run ended {ended:+.2} s after its expiresAt: {err}");
    assert_eq!(err.kind(), ErrorKind::OutcomeUnknown, "{err}");
    assert!(
        ended > -1.0 && ended < 10.0,
        "the run ended {ended} s after expiresAt"
    );
    let mut after_running: Vec<(f64, GuestStatus)> = Vec::new();
    let gone_at = loop {
        let now = opensandbox_api::OffsetDateTime::now_utc();
        match prov.get(ttl_id.clone()).await {
            Ok(g) if g.status == GuestStatus::Running => {
                assert!(after_running.is_empty(), "Running again: {g:?}");
            }
            Ok(g) => {
                assert!(
                    (now - expires).as_seconds_f64() > -1.0,
                    "left Running before its expiry: {g:?}"
                );
                if after_running.last().map(|(_, s)| s) != Some(&g.status) {
                    // What the sweep and `find` make of a guest in this state.
                    assert!(
                        g.is_terminal(),
                        "an expiring guest that is not terminal: {g:?}"
                    );
                    after_running.push(((now - expires).as_seconds_f64(), g.status));
                }
            }
            Err(err) if err.is_not_found() => break now,
            Err(err) => panic!("get during the expiry wait: {err}"),
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "not expired after 120 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let late = (gone_at - expires).as_seconds_f64();
    h.took("expiry mid-run (timeout 60 s; waited)", start);
    for (at, status) in &after_running {
        eprintln!("provider:   {status:?} {at:+.2} s after its expiresAt");
    }
    eprintln!("provider:   gone (404) {late:+.2} s after its expiresAt");
    assert!(
        late > -1.0 && late < 10.0,
        "expired {late} s after expiresAt"
    );
    guest
        .destroy()
        .await
        .expect("destroying an expired guest is fine");
    treaper.shutdown(Duration::from_secs(10)).await;
    assert!(ours(&*prov).await.is_empty());
}

/// A neutral create request for the guest `name`: unrestricted egress, 512 MiB, a budget of
/// `budget` (the provider keeps the server-side lifetime above it).
fn neutral_spec(name: &str, budget: Duration) -> sandbox_core::provider::GuestSpec {
    sandbox_core::provider::GuestSpec {
        name: name.to_owned(),
        image: String::new(),
        size: Size {
            id: "512Mi".into(),
            vcpu: 1,
            mem_mib: 512,
        },
        envs: BTreeMap::new(),
        egress: EgressPolicy::AllowAll,
        lifetime: Lifetime {
            budget,
            idle_backstop: budget,
        },
        labels: Labels::ours().with(Labels::SURFACE, "backend"),
    }
}

fn sweep_config(orphan_age: Duration) -> SweepConfig {
    SweepConfig {
        orphan_age,
        ..SweepConfig::default()
    }
}
