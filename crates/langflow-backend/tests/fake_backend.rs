//! The backend over HTTP against the fake control plane, whose guests run as real local
//! processes: real `timeout(1)`, real exit statuses, real output. Every test ends with the
//! fake reporting no live guest.

#![allow(clippy::too_many_lines, clippy::type_complexity)]

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use createos_fake::{FakeOptions, FakeServer};
use langflow_backend::SurfaceOptions;
use langflow_backend::{Backend, BackendError, BackendOptions, DoctorLevel, LfxPolicy, RunOutput};
use sandbox_core::reaper::ReaperConfig;
use sandbox_core::retry::Backoff;

const KEY: &str = "lf-fake-key-7f3a9c2e51";

async fn fake_with(faults: &str) -> FakeServer {
    FakeServer::start(FakeOptions {
        api_key: KEY.to_owned(),
        faults: faults.to_owned(),
        heartbeat: Duration::from_millis(500),
        ..FakeOptions::default()
    })
    .await
    .expect("fake control plane starts")
}

fn env_for(fake: &FakeServer, extra: &[(&str, &str)]) -> HashMap<String, String> {
    let mut m: HashMap<String, String> = HashMap::new();
    m.insert("CREATEOS_SANDBOX_API_KEY".into(), KEY.into());
    m.insert("CREATEOS_SANDBOX_BASE_URL".into(), fake.url());
    m.insert(
        "LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS".into(),
        "true".into(),
    );
    for (k, v) in extra {
        if v.is_empty() {
            m.remove(*k);
        } else {
            m.insert((*k).to_owned(), (*v).to_owned());
        }
    }
    m
}

fn options(env: HashMap<String, String>) -> BackendOptions {
    let quick = Backoff {
        base: Duration::from_millis(20),
        max: Duration::from_millis(200),
        budget: Duration::from_secs(4),
    };
    BackendOptions {
        surface: SurfaceOptions {
            env: Arc::new(move |k| env.get(k).cloned()),
            request_timeout: Duration::from_secs(1),
            backoff: quick,
            kill_after: Duration::from_millis(500),
            host_grace: Duration::from_millis(1500),
            shutdown_timeout: Duration::from_secs(5),
            reaper: ReaperConfig {
                backoff: quick,
                lookup_patience: Duration::from_millis(300),
            },
            ..SurfaceOptions::default()
        },
    }
}

/// [`options`] with the package's default backoff (a 30 s retry budget), as a deployment
/// has unless it sets `CREATEOS_CONTROL_PLANE_RETRY_SECONDS`.
fn default_backoff_options(env: HashMap<String, String>) -> BackendOptions {
    let mut o = options(env);
    o.surface.backoff = Backoff::default();
    o
}

fn backend(fake: &FakeServer, extra: &[(&str, &str)]) -> Backend {
    Backend::with_options(options(env_for(fake, extra)))
}

fn policy(timeout: u32) -> LfxPolicy {
    LfxPolicy {
        timeout_seconds: timeout,
        ..LfxPolicy::default()
    }
}

/// Shuts the backend down, waits (bounded) for the fake to see every guest deleted, and
/// asserts none is left.
async fn finish(b: Backend, fake: FakeServer) {
    b.shutdown().await;
    let mut live = fake.stats().live;
    for _ in 0..100 {
        if live == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        live = fake.stats().live;
    }
    assert_eq!(live, 0, "guests leaked: {:?}", fake.stats());
    fake.shutdown().await;
}

fn requests(fake: &FakeServer, route: &str) -> u64 {
    fake.stats().requests.get(route).copied().unwrap_or(0)
}

async fn print1(b: &Backend) -> Result<RunOutput, BackendError> {
    b.run("print(1)", None, &policy(10)).await
}

#[tokio::test]
async fn print_one_end_to_end() {
    let fake = fake_with("").await;
    let b = backend(&fake, &[]);
    let out = print1(&b).await.unwrap();
    assert_eq!(out.stdout, "1\n");
    assert_eq!(out.stderr, "");
    assert_eq!(out.exit_code, 0);
    assert!(!out.stdout_truncated && !out.stderr_truncated);
    assert!(out.guest.starts_with("lf-") && out.guest.len() <= 22);
    // create, then the exec carrying the program: the create response showed the egress
    // policy (that is the read-back), and `print(1)` fits in the exec request. Destroy
    // happens off the critical path.
    assert_eq!(out.timings.requests, Some(2));
    assert_eq!(requests(&fake, "egress_get"), 0);
    assert_eq!(requests(&fake, "upload"), 0);
    assert_eq!(out.timings.destroy_ms, None);
    // The credential check and the catalog happen once per process.
    print1(&b).await.unwrap();
    assert_eq!(requests(&fake, "whoami"), 1);
    assert_eq!(requests(&fake, "shapes"), 1);
    assert_eq!(requests(&fake, "create"), 2);
    finish(b, fake).await;
}

#[tokio::test]
async fn a_create_response_without_egress_is_read_back_and_a_large_program_uploaded() {
    // No `egress` in the create response: it proves nothing, so the run reads the egress back
    // (and, not carrying the program in the exec, uploads it beside the read-back).
    let fake = fake_with("create=drop-egress").await;
    let b = backend(&fake, &[]);
    let out = print1(&b).await.unwrap();
    assert_eq!(out.stdout, "1\n");
    assert_eq!(out.timings.requests, Some(4));
    assert_eq!(requests(&fake, "egress_get"), 1);
    assert_eq!(requests(&fake, "upload"), 1);
    finish(b, fake).await;
    // A program too large for the exec request is uploaded; the create response is still
    // the read-back.
    let fake = fake_with("").await;
    let b = backend(&fake, &[]);
    let big = format!("print(1)\n#{}\n", "x".repeat(40 * 1024));
    let out = b.run(&big, None, &policy(10)).await.unwrap();
    assert_eq!(out.stdout, "1\n");
    assert_eq!(out.timings.requests, Some(3));
    assert_eq!(requests(&fake, "egress_get"), 0);
    assert_eq!(requests(&fake, "upload"), 1);
    finish(b, fake).await;
}

#[tokio::test]
async fn inline_destroy_reports_its_time() {
    let fake = fake_with("").await;
    let mut o = options(env_for(&fake, &[]));
    o.surface.background_destroy = false;
    let b = Backend::with_options(o);
    let out = print1(&b).await.unwrap();
    assert!(out.timings.destroy_ms.is_some());
    assert_eq!(out.timings.requests, Some(3));
    assert_eq!(fake.stats().live, 0, "destroyed before returning");
    finish(b, fake).await;
}

#[tokio::test]
async fn env_is_declared_at_create_and_visible() {
    let fake = fake_with("").await;
    let b = backend(&fake, &[]);
    let env = BTreeMap::from([("GREETING".to_owned(), "hej".to_owned())]);
    let out = b
        .run(
            "import os; print(os.environ['GREETING'])",
            Some(env),
            &policy(10),
        )
        .await
        .unwrap();
    assert_eq!(out.stdout, "hej\n");
    let bad = BTreeMap::from([("NOT-OK".to_owned(), "x".to_owned())]);
    let e = b.run("print(1)", Some(bad), &policy(10)).await.unwrap_err();
    assert!(matches!(e, BackendError::Unavailable(_)));
    finish(b, fake).await;
}

#[tokio::test]
async fn failing_program_is_a_result() {
    let fake = fake_with("").await;
    let b = backend(&fake, &[]);
    let out = b
        .run(
            "import sys; print('out'); sys.stderr.write('bad thing\\n'); sys.exit(3)",
            None,
            &policy(10),
        )
        .await
        .unwrap();
    assert_eq!(out.exit_code, 3);
    assert_eq!(out.stdout, "out\n");
    assert!(out.stderr.to_string().contains("bad thing"));
    finish(b, fake).await;
}

#[tokio::test]
async fn timeout_term_is_minus_one_with_partial_output() {
    let fake = fake_with("").await;
    let b = backend(&fake, &[]);
    let out = b
        .run(
            "import time\nprint('started')\ntime.sleep(30)\nprint('never')",
            None,
            &policy(1),
        )
        .await
        .unwrap();
    assert_eq!(out.exit_code, -1, "{out:?}");
    assert_eq!(out.stdout, "started\n");
    finish(b, fake).await;
}

#[tokio::test]
async fn timeout_that_needed_kill_is_minus_one() {
    let fake = fake_with("").await;
    let b = backend(&fake, &[]);
    let code = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n\
                print('stubborn')\nwhile True:\n    time.sleep(0.05)";
    let out = b.run(code, None, &policy(1)).await.unwrap();
    assert_eq!(out.exit_code, -1, "{out:?}");
    assert_eq!(out.stdout, "stubborn\n");
    finish(b, fake).await;
}

#[tokio::test]
async fn kill_inside_the_budget_stays_137() {
    let fake = fake_with("").await;
    let b = backend(&fake, &[]);
    let out = b
        .run(
            "import os, signal\nprint('before', flush=True)\nos.kill(os.getpid(), signal.SIGKILL)",
            None,
            &policy(20),
        )
        .await
        .unwrap();
    assert_eq!(out.exit_code, 137, "{out:?}");
    assert_eq!(out.stdout, "before\n");
    finish(b, fake).await;
}

#[tokio::test]
async fn output_is_capped_per_stream_keeping_the_tail() {
    let fake = fake_with("").await;
    let b = backend(&fake, &[("CREATEOS_SANDBOX_MAX_OUTPUT_BYTES", "65536")]);
    let code = "import sys\nfor i in range(200000):\n    print(f'line {i:06d}')\n\
                sys.stderr.write('e' * 100000 + '\\nlast-err\\n')";
    let out = b.run(code, None, &policy(30)).await.unwrap();
    assert_eq!(out.exit_code, 0);
    assert!(out.stdout_truncated && out.stderr_truncated);
    let (stdout, stderr) = (out.stdout.to_string(), out.stderr.to_string());
    assert!(stdout.starts_with("[... "), "{}", &stdout[..40]);
    assert!(stdout.ends_with("line 199999\n"));
    assert!(stdout.len() <= 65536 + 64);
    assert!(stderr.ends_with("last-err\n"));
    finish(b, fake).await;
}

#[tokio::test]
async fn refusals_happen_before_any_request() {
    let fake = fake_with("").await;
    let cases: Vec<(Vec<(&str, &str)>, LfxPolicy, &str)> = vec![
        (
            vec![("CREATEOS_SANDBOX_API_KEY", "")],
            policy(10),
            "CREATEOS_SANDBOX_API_KEY",
        ),
        (
            vec![],
            LfxPolicy {
                allow_network: true,
                allowed_domains: vec!["pypi.org".into()],
                ..policy(10)
            },
            "LANGFLOW_SANDBOX_ALLOWED_DOMAINS",
        ),
        (
            vec![("LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS", "")],
            policy(10),
            "169.254.0.0/16",
        ),
        (
            vec![("CREATEOS_SANDBOX_MAX_OUTPUT_BYTES", "lots")],
            policy(10),
            "CREATEOS_SANDBOX_MAX_OUTPUT_BYTES",
        ),
        (
            vec![("LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS", "sure")],
            policy(10),
            "LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS",
        ),
        (
            vec![("CREATEOS_SANDBOX_BASE_URL", "ftp://nope")],
            policy(10),
            "CREATEOS_SANDBOX_BASE_URL",
        ),
        (vec![], policy(0), "LANGFLOW_SANDBOX_TIMEOUT_SECONDS"),
    ];
    for (extra, pol, needle) in cases {
        let b = backend(&fake, &extra);
        let e = b.run("print(1)", None, &pol).await.unwrap_err();
        let BackendError::Unavailable(msg) = &e else {
            panic!("{needle}: expected Unavailable, got {e:?}")
        };
        assert!(msg.contains(needle), "{needle}: {msg}");
        assert!(!msg.contains(KEY));
    }
    assert_eq!(fake.stats().requests.values().sum::<u64>(), 0);
    // The key falls back to CREATEOS_API_KEY.
    let b = backend(
        &fake,
        &[("CREATEOS_SANDBOX_API_KEY", ""), ("CREATEOS_API_KEY", KEY)],
    );
    assert_eq!(print1(&b).await.unwrap().stdout, "1\n");
    finish(b, fake).await;
}

#[tokio::test]
async fn shape_refusals_create_nothing() {
    let fake = fake_with("").await;
    let cases: Vec<(Vec<(&str, &str)>, u32, &str)> = vec![
        (
            vec![("CREATEOS_SANDBOX_SHAPE", "s-99vcpu-1tb")],
            192,
            "not in the CreateOS shape catalog",
        ),
        (
            vec![("CREATEOS_SANDBOX_SHAPE", "s-1vcpu-256mb")],
            512,
            "CREATEOS_SANDBOX_SHAPE",
        ),
        (vec![], 10_000_000, "no CreateOS shape has at least"),
    ];
    for (extra, mem, needle) in cases {
        let b = backend(&fake, &extra);
        let pol = LfxPolicy {
            memory_mb: mem,
            ..policy(10)
        };
        let e = b.run("print(1)", None, &pol).await.unwrap_err();
        assert!(
            matches!(&e, BackendError::Unavailable(m) if m.contains(needle)),
            "{needle}: {e:?}"
        );
    }
    assert_eq!(fake.stats().created, 0);
    finish(backend(&fake, &[]), fake).await;
}

#[tokio::test]
async fn pinned_shape_below_4096_is_honoured() {
    let fake = fake_with("").await;
    let b = backend(&fake, &[("CREATEOS_SANDBOX_SHAPE", "s-1vcpu-256mb")]);
    assert_eq!(print1(&b).await.unwrap().exit_code, 0);
    let report = b.doctor(&policy(10)).await;
    assert!(
        report
            .lines
            .iter()
            .any(|l| l.level == DoctorLevel::Ok && l.text.contains("s-1vcpu-256mb")),
        "{report}"
    );
    finish(b, fake).await;
}

#[tokio::test]
async fn bad_key_is_unavailable_and_never_echoed() {
    let fake = fake_with("").await;
    let b = backend(&fake, &[("CREATEOS_SANDBOX_API_KEY", "wrong-key-123456")]);
    let e = print1(&b).await.unwrap_err();
    let BackendError::Unavailable(msg) = &e else {
        panic!("{e:?}")
    };
    assert!(msg.contains("CREATEOS_SANDBOX_API_KEY"), "{msg}");
    assert!(!msg.contains("wrong-key-123456"));
    assert_eq!(fake.stats().created, 0);
    finish(b, fake).await;
}

#[tokio::test]
async fn key_is_redacted_when_the_server_echoes_headers() {
    for route in [
        "whoami",
        "shapes",
        "create",
        "upload",
        "egress_get",
        "exec_stream",
    ] {
        // Without `egress` in the create response the run reads it back and uploads.
        let before = if matches!(route, "upload" | "egress_get") {
            "create=drop-egress;"
        } else {
            ""
        };
        let fake = fake_with(&format!("{before}{route}=echo-headers")).await;
        let b = backend(&fake, &[]);
        let e = print1(&b).await.unwrap_err();
        let msg = e.to_string();
        assert!(!msg.contains(KEY), "{route}: key leaked: {msg}");
        assert!(
            !format!("{e:?}").contains(KEY),
            "{route}: key leaked in Debug"
        );
        finish(b, fake).await;
    }
}

#[tokio::test]
async fn lost_create_response_is_recovered_by_name() {
    let fake = fake_with("create=reset-after#1").await;
    let b = backend(&fake, &[]);
    let out = print1(&b).await.unwrap();
    assert_eq!(out.stdout, "1\n");
    assert_eq!(fake.stats().created, 2);
    // The orphan is found by listing and destroyed without waiting for shutdown.
    for _ in 0..100 {
        if fake.stats().live == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(fake.stats().live, 0);
    assert!(requests(&fake, "list") >= 1);
    finish(b, fake).await;
}

#[tokio::test]
async fn stalled_exec_stream_times_out_with_partial_output_and_destroys() {
    let fake = fake_with("exec_stream=stall-mid").await;
    let mut o = options(env_for(&fake, &[]));
    o.surface.background_destroy = true;
    let b = Backend::with_options(o);
    let out = b
        .run(
            "import time\nprint('early', flush=True)\ntime.sleep(0.3)\nprint('late')",
            None,
            &policy(1),
        )
        .await
        .unwrap();
    assert_eq!(out.exit_code, -1, "{out:?}");
    // What streamed before the control plane stalled is returned, not dropped.
    assert!(out.stdout.to_string().contains("early"), "{out:?}");
    assert!(
        out.timings.destroy_ms.is_some(),
        "a host timeout destroys inline"
    );
    assert_eq!(fake.stats().live, 0);
    finish(b, fake).await;
}

#[tokio::test]
async fn cancelled_run_destroys_its_guest() {
    let fake = fake_with("").await;
    let b = Arc::new(backend(&fake, &[]));
    let b2 = b.clone();
    let task = tokio::spawn(async move {
        b2.run("import time\ntime.sleep(60)", None, &policy(120))
            .await
    });
    for _ in 0..200 {
        if requests(&fake, "exec_stream") > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(fake.stats().live, 1);
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    // Without shutdown: the guard hands the guest to the reaper, which destroys it now.
    for _ in 0..200 {
        if fake.stats().live == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(fake.stats().live, 0);
    let b = Arc::try_unwrap(b).expect("sole owner");
    finish(b, fake).await;
}

#[tokio::test]
async fn shutdown_destroys_in_flight_guests_and_refuses_new_runs() {
    let fake = fake_with("").await;
    let b = Arc::new(backend(&fake, &[]));
    let b2 = b.clone();
    let task = tokio::spawn(async move {
        b2.run("import time\ntime.sleep(60)", None, &policy(120))
            .await
    });
    for _ in 0..200 {
        if requests(&fake, "exec_stream") > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    b.shutdown().await;
    assert_eq!(fake.stats().live, 0);
    let res = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the in-flight run ends once its guest is gone")
        .unwrap();
    assert!(
        res.is_err() || res.as_ref().is_ok_and(|o| o.exit_code != 0),
        "{res:?}"
    );
    let e = print1(&b).await.unwrap_err();
    assert!(e.to_string().contains("shut down"), "{e}");
    b.shutdown().await; // idempotent
    let b = Arc::try_unwrap(b).expect("sole owner");
    finish(b, fake).await;
}

#[test]
fn shutdown_works_from_a_fresh_runtime() {
    // As in a forked child, or an atexit hook: the runtime that ran the guest is gone.
    let rt1 = tokio::runtime::Runtime::new().unwrap();
    let fake = rt1.block_on(fake_with(""));
    let url = fake.url();
    let mut env = HashMap::new();
    env.insert("CREATEOS_SANDBOX_API_KEY".to_owned(), KEY.to_owned());
    env.insert("CREATEOS_SANDBOX_BASE_URL".to_owned(), url);
    env.insert(
        "LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS".to_owned(),
        "1".to_owned(),
    );
    let b = Backend::with_options(options(env));
    // Start a run on a second runtime and drop that runtime mid-run. A current-thread one: the
    // run's guard, dropped with the run, spawns its guest's destroy on this runtime, and a
    // multi-thread runtime's workers could finish that destroy before the runtime is dropped
    // (the guest then is not left for shutdown to find); here nothing runs after block_on.
    let rt2 = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let pol = policy(120);
    let fut = Box::pin(b.run("import time\ntime.sleep(60)", None, &pol));
    // Drop the runtime once the program runs in the guest: waiting for that, rather than a
    // fixed time, keeps the test meaningful on a loaded machine.
    let running = async {
        while fake.stats().peak_concurrent_execs == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let dropped_mid_run = rt2.block_on(async {
        tokio::time::timeout(Duration::from_secs(60), async {
            tokio::select! {
                _ = fut => false,
                () = running => true,
            }
        })
        .await
    });
    assert_eq!(dropped_mid_run, Ok(true), "the program never started");
    drop(rt2);
    assert_eq!(b.registered_guests(), 1);
    let rt3 = tokio::runtime::Runtime::new().unwrap();
    rt3.block_on(b.shutdown());
    assert_eq!(b.registered_guests(), 0);
    rt1.block_on(async {
        for _ in 0..100 {
            if fake.stats().live == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(fake.stats().live, 0);
        fake.shutdown().await;
    });
}

#[tokio::test]
async fn doctor_reports_without_creating_a_guest() {
    let fake = fake_with("").await;
    let b = backend(&fake, &[]);
    let r = b.doctor(&policy(30)).await;
    assert!(r.ok, "{r}");
    let text = r.to_string();
    assert!(text.contains("s-2vcpu-4gb"), "{text}");
    assert!(text.contains("240.0.0.0/4"), "{text}");
    assert!(text.contains("credential accepted"), "{text}");
    assert!(!text.contains(KEY));
    // Every refusal that applies is listed, not only the first.
    let b2 = backend(
        &fake,
        &[
            ("LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS", ""),
            ("CREATEOS_SANDBOX_SHAPE", "s-nope"),
        ],
    );
    let r = b2.doctor(&policy(30)).await;
    assert!(!r.ok);
    let refused: Vec<_> = r
        .lines
        .iter()
        .filter(|l| l.level == DoctorLevel::Refused)
        .collect();
    assert_eq!(refused.len(), 2, "{r}");
    let b3 = backend(&fake, &[("CREATEOS_SANDBOX_API_KEY", "")]);
    let r = b3.doctor(&policy(30)).await;
    assert!(!r.ok && r.to_string().contains("CREATEOS_SANDBOX_API_KEY"));
    let b4 = backend(&fake, &[("CREATEOS_SANDBOX_API_KEY", "not-the-right-key")]);
    let r = b4.doctor(&policy(30)).await;
    assert!(!r.ok, "{r}");
    assert!(!r.to_string().contains("not-the-right-key"));
    // The control-plane retry budget in effect: the options' own (4 s here) until the
    // operator sets one.
    assert!(text.contains("retried for 4 s"), "{text}");
    let b5 = backend(&fake, &[("CREATEOS_CONTROL_PLANE_RETRY_SECONDS", "2.5")]);
    let r = b5.doctor(&policy(30)).await;
    assert!(r.ok && r.to_string().contains("retried for 2.5 s"), "{r}");
    assert_eq!(fake.stats().created, 0);
    finish(b, fake).await;
}

#[tokio::test]
async fn concurrent_runs_share_one_backend() {
    let fake = fake_with("").await;
    let b = Arc::new(backend(&fake, &[]));
    let runs = (0..8).map(|i| {
        let b = b.clone();
        async move {
            b.run(&format!("print({i} * 2)"), None, &policy(10))
                .await
                .unwrap()
        }
    });
    let outs = futures::future::join_all(runs).await;
    for (i, o) in outs.iter().enumerate() {
        assert_eq!(o.stdout, format!("{}\n", i * 2));
    }
    assert_eq!(requests(&fake, "whoami"), 1);
    let b = Arc::try_unwrap(b).expect("sole owner");
    finish(b, fake).await;
}

/// While a run is in flight, reads its guest back through the public API and returns what
/// the control plane holds for it.
async fn inspect_in_flight(
    fake: &FakeServer,
    b: &Arc<Backend>,
    policy: LfxPolicy,
) -> createos_api::SandboxInfo {
    use futures::StreamExt as _;
    let runner = Arc::clone(b);
    let task = tokio::spawn(async move {
        runner
            .run("import time\ntime.sleep(1.5)\nprint('done')", None, &policy)
            .await
    });
    let client = createos_api::Client::builder()
        .api_key(KEY)
        .base_url(fake.url())
        .build()
        .unwrap();
    let mut seen = None;
    for _ in 0..200 {
        if requests(fake, "exec_stream") > 0 {
            // Only running guests: an earlier run's guest may still be `destroying`.
            let mut list = client.list_sandboxes(createos_api::ListSandboxesOptions::status(
                createos_api::SandboxStatus::Running,
            ));
            if let Some(guest) = list.next().await {
                seen = Some(guest.unwrap().info());
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let out = task.await.unwrap().unwrap();
    assert_eq!(out.stdout, "done\n");
    seen.expect("the guest was listed while its program ran")
}

#[tokio::test]
async fn created_guest_carries_the_policy_of_the_run() {
    let fake = fake_with("").await;
    let b = Arc::new(backend(&fake, &[]));
    // lfx defaults: network denied, 30 s, 192 MiB floor (raised to 4096 MiB).
    let denied = inspect_in_flight(&fake, &b, policy(30)).await;
    assert_eq!(denied.egress, Some(vec!["240.0.0.0/4".to_owned()]));
    assert_eq!(denied.auto_pause_after_seconds, Some(150));
    assert_eq!(denied.rootfs.as_deref(), Some("devbox:1"));
    assert_eq!(denied.shape.as_deref(), Some("s-2vcpu-4gb"));
    assert!(denied.name.as_deref().unwrap().starts_with("lf-"));
    // Network allowed, a longer budget, a bigger floor: all three reach the create call.
    let allowed = inspect_in_flight(
        &fake,
        &b,
        LfxPolicy {
            timeout_seconds: 200,
            memory_mb: 6000,
            allow_network: true,
            ..LfxPolicy::default()
        },
    )
    .await;
    assert_eq!(allowed.egress, Some(vec!["*".to_owned()]));
    assert_eq!(allowed.auto_pause_after_seconds, Some(320));
    assert_eq!(allowed.shape.as_deref(), Some("s-4vcpu-8gb"));
    let b = Arc::try_unwrap(b).expect("sole owner");
    finish(b, fake).await;
}

#[tokio::test]
async fn rootfs_setting_reaches_the_create_call() {
    let fake = fake_with("").await;
    let b = Arc::new(backend(&fake, &[("CREATEOS_SANDBOX_ROOTFS", "desktop:1")]));
    let guest = inspect_in_flight(&fake, &b, policy(30)).await;
    assert_eq!(guest.rootfs.as_deref(), Some("desktop:1"));
    let b = Arc::try_unwrap(b).expect("sole owner");
    finish(b, fake).await;
}

#[tokio::test]
async fn the_retry_setting_ends_a_run_against_a_control_plane_failing_for_good() {
    assert_eq!(Backoff::default().budget, Duration::from_secs(30));
    let fake = fake_with("create=500").await;
    let b = Backend::with_options(default_backoff_options(env_for(
        &fake,
        &[("CREATEOS_CONTROL_PLANE_RETRY_SECONDS", "2")],
    )));
    let t0 = std::time::Instant::now();
    let e = print1(&b).await.unwrap_err();
    let took = t0.elapsed();
    // It gave up as an infrastructure failure after retrying the create, not at once...
    assert!(
        matches!(&e, BackendError::Execution(m) if m.contains("HTTP 500")),
        "{e:?}"
    );
    assert!(requests(&fake, "create") >= 2, "{:?}", fake.stats());
    // ...and long before the 30 s default budget would have let it (a loose bound, not a
    // timing measurement: the setting is 2 s).
    assert!(took < Duration::from_secs(15), "took {took:?}: {e}");
    finish(b, fake).await;
}

#[tokio::test]
async fn a_bad_retry_setting_refuses_the_run_naming_it_before_any_request() {
    let fake = fake_with("").await;
    for bad in ["0", "0.5", "3601", "soon", "-2"] {
        let b = backend(&fake, &[("CREATEOS_CONTROL_PLANE_RETRY_SECONDS", bad)]);
        let e = print1(&b).await.unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("CREATEOS_CONTROL_PLANE_RETRY_SECONDS") && text.contains("1 to 3600"),
            "{bad}: {text}"
        );
        b.shutdown().await;
    }
    assert_eq!(
        fake.stats().requests.values().sum::<u64>(),
        0,
        "{:?}",
        fake.stats()
    );
    fake.shutdown().await;
}
