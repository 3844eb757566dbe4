//! The flow executor against the in-process fake control plane.
//!
//! The guest's `python3` is a stub script per test (the fake puts its `guest_path` first on the
//! guest `PATH`), so each test decides exactly what the "runner" writes and when; one test runs
//! the real embedded runner under a `python3` that has no lfx.

use futures::StreamExt as _;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use createos_fake::{FakeOptions, FakeServer};
use langflow_executor::{Event, Executor, ExecutorError, ExecutorOptions, FlowRequest};
use sandbox_core::reaper::ReaperConfig;
use sandbox_core::retry::Backoff;
use sandbox_core::surface::SurfaceOptions;
use serde_json::json;
use tokio::time::Instant;

const KEY: &str = "lf-exec-key-8c1f0e2d7a94b3";

struct Rig {
    fake: FakeServer,
    executor: Executor,
    _dir: tempfile::TempDir,
}

/// A fake whose guest `python3` is `script` (a shell script), and an executor pointed at it.
async fn start_rig(script: &str, extra_env: &[(&str, &str)], faults: &str) -> Rig {
    rig_with(script, extra_env, faults, |_| {}).await
}

async fn rig_with(
    script: &str,
    extra_env: &[(&str, &str)],
    faults: &str,
    tweak: impl FnOnce(&mut ExecutorOptions),
) -> Rig {
    rig_full(script, extra_env, faults, None, tweak).await
}

async fn rig_full(
    script: &str,
    extra_env: &[(&str, &str)],
    faults: &str,
    request_log: Option<&Path>,
    tweak: impl FnOnce(&mut ExecutorOptions),
) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    write_stub(dir.path(), script);
    let fake = FakeServer::start(FakeOptions {
        api_key: KEY.to_owned(),
        guest_path: vec![dir.path().to_path_buf()],
        faults: faults.to_owned(),
        heartbeat: Duration::from_millis(200),
        request_log: request_log.map(Path::to_path_buf),
        ..FakeOptions::default()
    })
    .await
    .unwrap();
    let mut env: HashMap<String, String> = [
        ("CREATEOS_SANDBOX_API_KEY", KEY.to_owned()),
        ("CREATEOS_SANDBOX_BASE_URL", fake.url()),
        ("CREATEOS_EXECUTOR_TIMEOUT_SECONDS", "20".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    for (k, v) in extra_env {
        env.insert((*k).to_owned(), (*v).to_owned());
    }
    let quick = Backoff {
        base: Duration::from_millis(50),
        max: Duration::from_millis(300),
        budget: Duration::from_secs(4),
    };
    let mut opts = ExecutorOptions {
        surface: SurfaceOptions {
            env: Arc::new(move |k| env.get(k).cloned()),
            request_timeout: Duration::from_secs(2),
            backoff: quick,
            kill_after: Duration::from_millis(300),
            host_grace: Duration::from_millis(1500),
            reaper: ReaperConfig {
                backoff: quick,
                lookup_patience: Duration::from_secs(3),
            },
            shutdown_timeout: Duration::from_secs(5),
            // Each test's counters are about its own run; one test turns the sweep on.
            orphan_sweep: false,
            ..SurfaceOptions::default()
        },
        ..ExecutorOptions::default()
    };
    tweak(&mut opts);
    Rig {
        fake,
        executor: Executor::with_options(opts),
        _dir: dir,
    }
}

fn write_stub(dir: &Path, script: &str) {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("python3");
    std::fs::write(&path, format!("#!/bin/sh\n{script}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn request(legacy: bool) -> FlowRequest {
    let options = if legacy {
        json!({"_use_arun_legacy": true})
    } else {
        json!({})
    };
    FlowRequest::from_json(
        &json!({"flow": {"data": {"nodes": [], "edges": []}}, "inputs": [{"input_value": "hi"}],
                "options": options})
        .to_string(),
    )
    .unwrap()
}

/// The outputs of a terminal event.
fn completed(event: Option<Event>) -> serde_json::Value {
    match event {
        Some(Event::Complete(outputs)) => outputs.value(),
        other => panic!("not a terminal event: {other:?}"),
    }
}

async fn settled(fake: &FakeServer) -> createos_fake::Stats {
    let until = Instant::now() + Duration::from_secs(15);
    loop {
        let s = fake.stats();
        if s.live == 0 || Instant::now() > until {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn assert_no_key(text: &str) {
    for i in 0..=KEY.len() - 8 {
        assert!(!text.contains(&KEY[i..i + 8]), "key fragment in {text}");
    }
}

/// The stub checks it was given the real runner, waits for its job as the runner does (the host
/// starts the runner before it uploads the job), then speaks the protocol.
const RUNNER_CHECK: &str = r#"case "$2 $3" in */lfx_runner.py\ --wait) ;; *) echo "bad args $*" >&2; exit 9;; esac
grep -q Graph.from_payload "$2" || { echo "not the runner" >&2; exit 9; }
n=0; while [ ! -s "$(dirname "$2")/lfx_job.json" ] && [ $n -lt 500 ]; do sleep 0.01; n=$((n+1)); done
sleep 0.05
grep -q '"protocol":2' "$(dirname "$2")/lfx_job.json" || { echo "no job" >&2; exit 9; }"#;

#[tokio::test(flavor = "multi_thread")]
async fn frames_arrive_in_order_and_live() {
    let script = format!(
        r#"{RUNNER_CHECK}
echo '{{"frame":"hello","lfx":"1.13.0","python":"3.11"}}'
echo '{{"frame":"vertex","id":"a","seq":1}}'
echo 'a guest print on stderr' >&2
sleep 2
echo 'not a frame on stdout'
echo '{{"frame":"vertex","id":"b","seq":2}}'
echo '{{"frame":"complete","outputs":[{{"inputs":{{}},"outputs":[]}}]}}'"#
    );
    let rig = start_rig(&script, &[], "").await;
    let mut run = rig
        .executor
        .start(&request(true), Some("1.13.0"))
        .await
        .unwrap();
    let t0 = Instant::now();
    let first = run.next().await.unwrap().unwrap();
    let first_at = t0.elapsed();
    let Event::Vertex(v) = first else {
        panic!("{first:?}")
    };
    assert_eq!(v.value()["id"], "a");
    // The first vertex arrives while the guest still sleeps: streamed, not buffered to the end.
    assert!(first_at < Duration::from_millis(1500), "{first_at:?}");
    assert_eq!(rig.fake.stats().live, 1);
    let Event::Vertex(v) = run.next().await.unwrap().unwrap() else {
        panic!()
    };
    assert_eq!(v.value()["id"], "b");
    assert!(t0.elapsed() >= Duration::from_secs(2));
    let last = run.next().await.unwrap().unwrap();
    let Event::Complete(outputs) = last else {
        panic!("{last:?}")
    };
    assert_eq!(outputs.value(), json!([{"inputs": {}, "outputs": []}]));
    // The guest is destroyed once the terminal event is handed over.
    assert_eq!(rig.fake.stats().live, 0);
    assert_eq!(run.next().await.unwrap(), None);
    assert_eq!(rig.fake.stats().created, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_huge_line_stops_the_run_instead_of_being_buffered() {
    // 64 KiB of frame with no end in sight, against a 4 KiB limit.
    let script = r#"echo '{"frame":"vertex","id":"a","seq":1}'
head -c 65536 /dev/zero | tr '\0' 'x'
sleep 5
echo
echo '{"frame":"complete","outputs":[]}'"#;
    let rig = rig_with(script, &[], "", |o| o.limits.frame_bytes = 4096).await;
    let mut run = rig.executor.start(&request(false), None).await.unwrap();
    assert!(matches!(run.next().await, Ok(Some(Event::Vertex(_)))));
    let t0 = Instant::now();
    let err = run.next().await.unwrap_err();
    assert!(
        t0.elapsed() < Duration::from_secs(4),
        "waited for the line's end"
    );
    let ExecutorError::Execution(msg) = &err else {
        panic!("{err:?}")
    };
    assert!(msg.contains("longer than 4096 bytes"), "{msg}");
    assert_eq!(settled(&rig.fake).await.live, 0);
    assert_eq!(run.next().await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_malformed_line_is_reported_and_skipped() {
    let script = r#"echo '{"frame":"vertex","id":'
echo '{"frame":"vertex","id":"b","seq":1}'
echo '{"frame":"complete","outputs":[]}'"#;
    let rig = start_rig(script, &[], "").await;
    let mut run = rig.executor.start(&request(false), None).await.unwrap();
    let Event::Vertex(v) = run.next().await.unwrap().unwrap() else {
        panic!()
    };
    assert_eq!(v.value()["id"], "b");
    assert_eq!(completed(run.next().await.unwrap()), json!([]));

    // With nothing but malformed output, the failure says so.
    let rig2 = start_rig("echo '{\"frame\": oops'", &[], "").await;
    let mut run = rig2.executor.start(&request(false), None).await.unwrap();
    let err = run.next().await.unwrap_err();
    assert!(err.to_string().contains("1 malformed frame line"), "{err}");
    assert!(
        err.to_string().contains("without reporting a result"),
        "{err}"
    );
    assert_eq!(settled(&rig.fake).await.live, 0);
}

/// What a flow printed before it failed is logged even when its stderr arrives after the
/// runner's error frame (the two streams are read apart; under load the frame can win).
#[tokio::test(flavor = "multi_thread")]
async fn stderr_that_arrives_after_the_error_frame_is_still_logged() {
    let script = r#"printf '{"frame":"hello","lfx":"1.13.0","python":"3.11"}\n'
printf '{"frame":"error","kind":"flow","type":"ValueError","message":"boom"}\n'
sleep 0.3
echo 'printed before the failure, arriving late' >&2
exit 1"#;
    let rig = start_rig(script, &[], "").await;
    let (logs, _guard) = capture();
    let mut run = rig.executor.start(&request(false), None).await.unwrap();
    let err = run.next().await.unwrap_err();
    assert!(matches!(err, ExecutorError::Flow { .. }), "{err:?}");
    let records = logs.0.lock().unwrap().join("\n");
    assert!(
        records.contains("guest: printed before the failure, arriving late"),
        "{records}"
    );
    assert_eq!(settled(&rig.fake).await.live, 0);
}

/// Issue 45: what the host shows of a guest's lines never depends on whether a line ends (or
/// starts) with part of the sandbox's key, so a failed run answers no guess at it: the last
/// guest output and a flow error quote every guess as the guest wrote it.
#[tokio::test(flavor = "multi_thread")]
async fn guest_lines_ending_with_part_of_the_key_come_back_as_written() {
    let guesses: Vec<&str> = [4, 9, KEY.len() - 1]
        .into_iter()
        .map(|k| &KEY[..k])
        .chain([&KEY[KEY.len() - 6..], "lf-x"])
        .collect();
    let mut lines: Vec<String> = guesses
        .iter()
        .map(|g| format!("echo 'guess {g}' >&2"))
        .collect();
    lines.push("exit 3".to_owned());
    let script = lines.join("\n");
    let rig = start_rig(&script, &[], "").await;
    let mut run = rig.executor.start(&request(false), None).await.unwrap();
    let err = run.next().await.unwrap_err().to_string();
    assert!(err.contains("Last guest output"), "{err}");
    for g in &guesses {
        assert!(
            err.contains(&format!("guess {g}")),
            "{g:?} not as written in {err}"
        );
    }
    assert!(!err.contains("[REDACTED]"), "{err}");

    // A flow error whose message ends with the key's first characters: quoted as written.
    let prefix = &KEY[..KEY.len() - 2];
    let script = format!(
        r#"printf '{{"frame":"hello","lfx":"1.13.0","python":"3.11"}}\n'
printf '{{"frame":"error","kind":"flow","type":"ValueError","message":"was it {prefix}"}}\n'
exit 1"#
    );
    let rig2 = start_rig(&script, &[], "").await;
    let mut run = rig2.executor.start(&request(false), None).await.unwrap();
    let err = run.next().await.unwrap_err();
    let ExecutorError::Flow { message, .. } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(message, &format!("was it {prefix}"));
    assert_eq!(settled(&rig.fake).await.live, 0);
    assert_eq!(settled(&rig2.fake).await.live, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_consumer_that_stops_early_leaves_no_guest() {
    let script = r#"echo '{"frame":"vertex","id":"a","seq":1}'
sleep 30
echo '{"frame":"complete","outputs":[]}'"#;
    let rig = start_rig(script, &[], "").await;
    // Dropped after the first event.
    let mut run = rig.executor.start(&request(false), None).await.unwrap();
    assert!(matches!(run.next().await, Ok(Some(Event::Vertex(_)))));
    drop(run);
    let stats = settled(&rig.fake).await;
    assert_eq!((stats.created, stats.live), (1, 0));
    // Closed explicitly: destroyed before close returns.
    let mut run = rig.executor.start(&request(false), None).await.unwrap();
    assert!(matches!(run.next().await, Ok(Some(Event::Vertex(_)))));
    run.close().await;
    assert_eq!(rig.fake.stats().live, 0);
    assert_eq!(run.next().await.unwrap(), None);
    assert_eq!(rig.executor.registered_guests(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_flow_failing_in_the_guest_is_a_flow_error() {
    let script = r#"echo '{"frame":"error","kind":"flow","type":"ValueError","message":"Error running graph: boom"}'
exit 1"#;
    let rig = start_rig(script, &[], "").await;
    let mut run = rig.executor.start(&request(true), None).await.unwrap();
    let err = run.next().await.unwrap_err();
    assert_eq!(
        err,
        ExecutorError::Flow {
            error_type: Some("ValueError".into()),
            message: "Error running graph: boom".into()
        }
    );
    assert_eq!(settled(&rig.fake).await.live, 0);
}

#[tokio::test(flavor = "multi_thread")]
#[allow(clippy::float_cmp)] // whole counts, exact in f64
async fn the_guest_clock_is_the_executor_timeout() {
    let rig = start_rig(
        "echo '{\"frame\":\"vertex\",\"id\":\"a\",\"seq\":1}'; sleep 30",
        &[("CREATEOS_EXECUTOR_TIMEOUT_SECONDS", "1")],
        "",
    )
    .await;
    let mut run = rig.executor.start(&request(false), None).await.unwrap();
    assert!(matches!(run.next().await, Ok(Some(Event::Vertex(_)))));
    let err = run.next().await.unwrap_err();
    let ExecutorError::Execution(msg) = &err else {
        panic!("{err:?}")
    };
    assert!(
        msg.contains("CREATEOS_EXECUTOR_TIMEOUT_SECONDS=1s"),
        "{msg}"
    );
    assert_eq!(settled(&rig.fake).await.live, 0);
    // Counted as timed out (runs by outcome, the guest's destroy reason), not as a program
    // that failed, although the runner had started.
    let counters = rig.executor.surface().session().observation().counters();
    let runs = |outcome: &str| {
        counters
            .value(
                "createos_runs_total",
                &[("surface", "executor"), ("outcome", outcome)],
            )
            .unwrap_or(-1.0)
    };
    assert_eq!(runs("timed_out"), 1.0);
    assert_eq!(runs("program_failed"), 0.0);
    let destroyed = counters.value(
        "createos_guests_destroyed_total",
        &[("surface", "executor"), ("reason", "timeout")],
    );
    assert_eq!(destroyed, Some(1.0));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_guest_without_lfx_says_how_to_fix_it() {
    // The real runner, under a python3 without lfx.
    let python = system_python();
    let rig = start_rig(&format!("exec {python} \"$@\""), &[], "").await;
    let mut run = rig
        .executor
        .start(&request(true), Some("1.13.0"))
        .await
        .unwrap();
    let err = run.next().await.unwrap_err();
    let ExecutorError::Unavailable(msg) = &err else {
        panic!("{err:?}")
    };
    assert!(msg.contains("lfx is not installed"), "{msg}");
    assert!(msg.contains("CREATEOS_EXECUTOR_ROOTFS"), "{msg}");
    assert!(msg.contains("CREATEOS_EXECUTOR_INSTALL_LFX=true"), "{msg}");
    assert!(msg.contains("lfx==1.13.0"), "{msg}");
    assert_eq!(settled(&rig.fake).await.live, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn refusals_come_before_any_guest_and_name_executor_settings() {
    let cases: &[(&[(&str, &str)], &str)] = &[
        (
            &[("CREATEOS_EXECUTOR_EGRESS", "pypi.org")],
            "CREATEOS_EXECUTOR_EGRESS",
        ),
        (
            &[("CREATEOS_EXECUTOR_EGRESS", "203.0.113.0/24")],
            "CREATEOS_EXECUTOR_ACCEPT_EGRESS_EXCEPTIONS",
        ),
        (
            &[("CREATEOS_EXECUTOR_SHAPE", "s-9vcpu-nope")],
            "CREATEOS_EXECUTOR_SHAPE",
        ),
        (
            &[("CREATEOS_EXECUTOR_TIMEOUT_SECONDS", "-3")],
            "CREATEOS_EXECUTOR_TIMEOUT_SECONDS",
        ),
        (
            &[("CREATEOS_SANDBOX_API_KEY", "")],
            "CREATEOS_SANDBOX_API_KEY",
        ),
    ];
    for (env, var) in cases {
        let rig = start_rig("exit 0", env, "").await;
        let err = rig.executor.start(&request(false), None).await.unwrap_err();
        let ExecutorError::Unavailable(msg) = &err else {
            panic!("{env:?}: {err:?}")
        };
        assert!(msg.contains(var), "{env:?}: {msg}");
        assert!(!msg.contains("LANGFLOW_SANDBOX"), "{env:?}: {msg}");
        assert_eq!(rig.fake.stats().created, 0, "{env:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn restricted_egress_is_sent_and_read_back() {
    // The create response showing the policy is the read-back; one without `egress` proves
    // nothing, and the guest is then read back with GET before the runner starts.
    for (faults, reads) in [("", 0), ("create=drop-egress", 1)] {
        let rig = start_rig(
            "echo '{\"frame\":\"complete\",\"outputs\":[]}'",
            &[
                ("CREATEOS_EXECUTOR_EGRESS", "203.0.113.0/24,1.1.1.1:53"),
                ("CREATEOS_EXECUTOR_ACCEPT_EGRESS_EXCEPTIONS", "true"),
            ],
            faults,
        )
        .await;
        let mut run = rig.executor.start(&request(false), None).await.unwrap();
        assert_eq!(completed(run.next().await.unwrap()), json!([]));
        let stats = rig.fake.stats();
        assert_eq!(
            stats.requests.get("egress_get").copied().unwrap_or(0),
            reads,
            "{faults}"
        );
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    Ran,
    Unavailable,
    NotStarted,
    MayHaveRun,
    TimedOut,
}

#[tokio::test(flavor = "multi_thread")]
async fn faults_at_each_call_destroy_the_guest_with_the_right_error() {
    let script = "echo '{\"frame\":\"vertex\",\"id\":\"a\",\"seq\":1}'; echo '{\"frame\":\"complete\",\"outputs\":[]}'";
    let cases: &[(&str, Want)] = &[
        ("create=429#2", Want::Ran),
        ("create=503+ra=none#1", Want::Ran),
        ("create=429+ra=1#1", Want::Ran),
        // The account at its quota for good: the run waits within its admission wait (cut
        // to its 2 s budget), then is refused as unavailable, nothing having run.
        ("create=429", Want::Unavailable),
        ("create=503+ra=none", Want::NotStarted),
        ("create=500", Want::NotStarted),
        ("create=reset", Want::NotStarted),
        ("create=stall", Want::NotStarted),
        ("create=401", Want::Unavailable),
        ("upload=503#1", Want::Ran),
        ("upload=500", Want::NotStarted),
        ("upload=reset", Want::NotStarted),
        ("upload=stall", Want::NotStarted),
        ("create=drop-egress;egress_get=500", Want::NotStarted),
        ("exec_stream=429#1", Want::Ran),
        ("exec_stream=503+ra=none#1", Want::Ran),
        ("exec_stream=429", Want::NotStarted),
        ("exec_stream=500", Want::MayHaveRun),
        ("exec_stream=reset", Want::MayHaveRun),
        ("exec_stream=stall", Want::MayHaveRun),
        // The terminal frame arrived before the stream stalled: the result stands.
        ("exec_stream=stall-mid", Want::Ran),
        ("whoami=401", Want::Unavailable),
    ];
    let runs = cases.iter().map(|(faults, want)| async move {
        let rig = start_rig(
            script,
            &[("CREATEOS_EXECUTOR_TIMEOUT_SECONDS", "2")],
            faults,
        )
        .await;
        let outcome = match rig.executor.start(&request(false), None).await {
            Err(e) => Err(e),
            Ok(mut run) => {
                let mut last = Ok(None);
                loop {
                    match run.next().await {
                        Ok(Some(ev)) => last = Ok(Some(ev)),
                        Ok(None) => break,
                        Err(e) => {
                            last = Err(e);
                            break;
                        }
                    }
                }
                last
            }
        };
        let got = match &outcome {
            Ok(Some(Event::Complete(_))) => Want::Ran,
            Ok(other) => panic!("{faults}: {other:?}"),
            Err(ExecutorError::Unavailable(_)) => Want::Unavailable,
            Err(ExecutorError::Execution(m)) if m.contains("not started") => Want::NotStarted,
            Err(ExecutorError::Execution(m)) if m.contains("may have run") => Want::MayHaveRun,
            Err(ExecutorError::Execution(m)) if m.contains("did not finish within") => {
                Want::TimedOut
            }
            Err(e) => panic!("{faults}: unexpected {e:?}"),
        };
        assert_eq!(got, *want, "{faults}: {outcome:?}");
        if let Err(e) = &outcome {
            assert_no_key(&format!("{e} {e:?}"));
        }
        let stats = settled(&rig.fake).await;
        assert_eq!(stats.live, 0, "{faults}: {stats:?}");
        rig.fake.shutdown().await;
    });
    // A few at a time: each case has a 2 s budget, which 21 concurrent fakes and runs on a
    // loaded 2-core machine can eat before the case's own fault is reached.
    futures::stream::iter(runs)
        .buffer_unordered(5)
        .collect::<Vec<()>>()
        .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_template_builds_follows_its_log_and_is_reused() {
    use langflow_executor::template;
    let fake = FakeServer::start(FakeOptions {
        api_key: KEY.to_owned(),
        ..FakeOptions::default()
    })
    .await
    .unwrap();
    let url = fake.url();
    let env: langflow_executor::EnvLookup = Arc::new(move |k| match k {
        "CREATEOS_SANDBOX_API_KEY" => Some(KEY.to_owned()),
        "CREATEOS_SANDBOX_BASE_URL" => Some(url.clone()),
        _ => None,
    });
    let session = sandbox_core::session::Session::default();
    let reqs = template::requirements(&["pandas".into()], "1.13.0").unwrap();
    let dockerfile = template::dockerfile(&reqs);
    let name = template::template_name(&dockerfile);
    let mut lines = Vec::new();
    let built = template::build(&env, &session, &name, &dockerfile, |l| {
        lines.push(l.to_owned());
    })
    .await
    .unwrap();
    assert!(built.id.starts_with("tpl_"), "{built:?}");
    assert!(
        lines.iter().any(|l| l.contains("'lfx==1.13.0' 'pandas'")),
        "{lines:?}"
    );
    // The same image again: the existing template is used, not rebuilt.
    let mut again = Vec::new();
    let second = template::build(&env, &session, &name, &dockerfile, |l| {
        again.push(l.to_owned());
    })
    .await
    .unwrap();
    assert_eq!(second, built);
    assert!(
        again.iter().any(|l| l.contains("exists already")),
        "{again:?}"
    );
    // A failed build quotes its log.
    let err = template::build(&env, &session, "lf-t-broken", "FROM x\nRUN false\n", |_| {})
        .await
        .unwrap_err();
    assert!(err.to_string().contains("failed"), "{err}");
    assert!(err.to_string().contains("non-zero code"), "{err}");
    assert_no_key(&err.to_string());
    fake.shutdown().await;

    // A rootfs the control plane does not know is refused before anything runs, naming it
    // (the e2e suite runs a flow in a built template's guest).
    let rig = start_rig(
        "echo '{\"frame\":\"complete\",\"outputs\":[]}'",
        &[("CREATEOS_EXECUTOR_ROOTFS", "tpl_does_not_exist")],
        "",
    )
    .await;
    let err = rig.executor.start(&request(false), None).await.unwrap_err();
    assert!(err.to_string().contains("tpl_does_not_exist"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_runs_paused_guest_is_swept_at_the_first_run() {
    use createos_api::{Client, CreateSandboxRequest, RetryOptions};
    // What a SIGKILLed flow run leaves: its one-shot guest, idled out to paused.
    let script = r#"echo '{"frame":"complete","outputs":[]}'"#;
    let rig = rig_with(script, &[], "", |o| o.surface.orphan_sweep = true).await;
    let client = Client::builder()
        .api_key(secrecy::SecretString::from(KEY))
        .base_url(rig.fake.url())
        .retry(RetryOptions::none())
        .build()
        .unwrap();
    let orphan = client
        .create_sandbox(CreateSandboxRequest::new("s-1vcpu-1gb").name("lf-0rphan0f0a0k1lled00"))
        .await
        .unwrap();
    orphan.pause().await.unwrap();
    let mut run = rig
        .executor
        .start(&request(true), Some("1.13.0"))
        .await
        .unwrap();
    while run.next().await.unwrap().is_some() {}
    let deadline = Instant::now() + Duration::from_secs(10);
    while client.get_sandbox(orphan.id()).await.is_ok_and(|sb| {
        !matches!(
            sb.status(),
            createos_api::SandboxStatus::Destroying | createos_api::SandboxStatus::Destroyed
        )
    }) {
        assert!(Instant::now() < deadline, "the orphan was not swept");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The run's own guest went too: nothing is live.
    assert_eq!(settled(&rig.fake).await.live, 0);
}

// --- The warm pool: preloaded runners --------------------------------------------------------

/// A python3 without lfx (the system's), for the real embedded runner.
fn system_python() -> &'static str {
    let python = ["/usr/bin/python3", "/usr/local/bin/python3"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("no system python3 to run the runner with");
    let probe = std::process::Command::new(python)
        .args(["-c", "import lfx"])
        .output()
        .unwrap();
    assert!(
        !probe.status.success(),
        "{python} has lfx; pick one without"
    );
    python
}

/// A stand-in for lfx, just enough for the real runner: it records when it was imported, and
/// each vertex it builds says so in its display name, so a test can tell whether the flow ran
/// in a process that imported lfx before the run started. A node may ask to `sleep` first, and
/// to `answer` with a text of that many bytes.
const FAKE_LFX: &[(&str, &str)] = &[
    (
        "lfx/__init__.py",
        "import time\nIMPORTED_AT = time.time()\n",
    ),
    (
        "lfx/graph/__init__.py",
        r#"import asyncio
import lfx


class _Vertex:
    def __init__(self, vid):
        self.id = vid
        self.display_name = f"imported_at={lfx.IMPORTED_AT:.6f}"


class _Result:
    """A result whose text is `answer` x's (what the runner encodes of a ResultData)."""

    def __init__(self, answer):
        self.results = {"text": "x" * answer}

    def model_dump_json(self, exclude=None):
        return '{"outputs": {}}'


class _Built:
    def __init__(self, vertex, answer):
        self.vertex = vertex
        self.result_dict = _Result(answer) if answer else None
        self.valid = True


class Graph:
    def __init__(self, nodes):
        self.nodes = nodes

    @classmethod
    def from_payload(cls, payload, **_):
        return cls(payload.get("data", payload).get("nodes", []))

    async def build_vertex(self, vid):
        answer = next((n.get("answer", 0) for n in self.nodes if n["id"] == vid), 0)
        return _Built(_Vertex(vid), answer)

    async def _arun_legacy(self, inputs, **_):
        for node in self.nodes:
            await asyncio.sleep(node.get("sleep", 0))
            await self.build_vertex(node["id"])
        return []
"#,
    ),
    ("lfx/schema/__init__.py", ""),
    ("lfx/schema/data.py", "class Data:\n    pass\n"),
    ("lfx/schema/dataframe.py", "class DataFrame:\n    pass\n"),
    (
        "lfx/schema/message.py",
        "class Message:\n    def __init__(self, text=''):\n        self.text = text\n",
    ),
];

/// The fake lfx in a directory, and a guest `python3` (the system's) that imports it.
fn fake_lfx() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    for (path, text) in FAKE_LFX {
        let p = dir.path().join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    let script = format!(
        "PYTHONPATH={} exec {} \"$@\"",
        dir.path().display(),
        system_python()
    );
    (dir, script)
}

/// A rig whose guest `python3` imports the fake lfx, with a warm pool of one and `extra`.
async fn warm_rig(extra: &[(&str, &str)], faults: &str) -> (tempfile::TempDir, Rig) {
    let (lfx, python) = fake_lfx();
    let mut env = vec![("CREATEOS_EXECUTOR_WARM_POOL", "1")];
    env.extend_from_slice(extra);
    (lfx, start_rig(&python, &env, faults).await)
}

fn nodes_request(nodes: &serde_json::Value) -> FlowRequest {
    FlowRequest::from_json(
        &json!({"flow": {"data": {"nodes": nodes, "edges": []}}, "inputs": [],
                "options": {"_use_arun_legacy": true}})
        .to_string(),
    )
    .unwrap()
}

/// Runs `request` to its end: the vertex events and the terminal event (or the error).
async fn run_to_end(
    executor: &Executor,
    request: &FlowRequest,
) -> Result<(Vec<serde_json::Value>, serde_json::Value), ExecutorError> {
    let mut run = executor.start(request, None).await?;
    let mut vertices = Vec::new();
    loop {
        match run.next().await? {
            Some(Event::Vertex(v)) => vertices.push(v.value()),
            Some(Event::Message(m)) => panic!("no message expected: {}", m.value()),
            Some(Event::Complete(outputs)) => {
                assert_eq!(run.next().await?, None);
                return Ok((vertices, outputs.value()));
            }
            None => panic!("the run ended without its terminal event"),
        }
    }
}

fn imported_at(vertex: &serde_json::Value) -> f64 {
    vertex["display_name"]
        .as_str()
        .and_then(|s| s.strip_prefix("imported_at="))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{vertex}"))
}

fn wall_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

async fn until_ready(executor: &Executor, n: usize) {
    let until = Instant::now() + Duration::from_secs(30);
    while executor.pool_stats().ready < n {
        assert!(
            Instant::now() < until,
            "the pool never got ready: {:?}",
            executor.pool_stats()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_warm_guest_runs_the_flow_in_its_preloaded_runner_once() {
    let (_lfx, rig) = warm_rig(&[], "").await;
    let request = nodes_request(&json!([{"id": "a"}, {"id": "b"}]));
    // The first run finds the pool empty (it warms for this policy from now on): cold, lfx
    // imported by the run's own runner.
    let before = wall_now();
    let (vertices, outputs) = run_to_end(&rig.executor, &request).await.unwrap();
    assert_eq!(outputs, json!([]));
    assert!(imported_at(&vertices[0]) > before, "{vertices:?}");
    until_ready(&rig.executor, 1).await;
    let pooled = rig.fake.stats().created;
    // The second run takes the warm guest: its flow runs in a runner that imported lfx before
    // the run started, and yields the same events.
    let before = wall_now();
    let (warm, outputs) = run_to_end(&rig.executor, &request).await.unwrap();
    assert_eq!(outputs, json!([]));
    let ids: Vec<&str> = warm.iter().map(|v| v["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["a", "b"]);
    assert!(imported_at(&warm[0]) < before, "{warm:?}");
    let stats = rig.executor.pool_stats();
    assert_eq!((stats.hits, stats.misses), (1, 1), "{stats:?}");
    // The warm run created nothing itself, and its guest is gone: one-shot.
    until_ready(&rig.executor, 1).await;
    assert_eq!(rig.fake.stats().created, pooled + 1);
    assert_eq!(rig.fake.stats().live, 1, "only the refilled pool guest");
    // Shutdown destroys the pool.
    rig.executor.shutdown().await;
    assert_eq!(settled(&rig.fake).await.live, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pooled_guest_that_cannot_take_the_flow_is_replaced_by_a_fresh_one() {
    for how in ["runner killed", "paused"] {
        let (_lfx, rig) = warm_rig(&[], "").await;
        let request = nodes_request(&json!([{"id": "a"}]));
        run_to_end(&rig.executor, &request).await.unwrap();
        until_ready(&rig.executor, 1).await;
        let client = createos_api::Client::builder()
            .base_url(rig.fake.url())
            .api_key(KEY)
            .allow_insecure_http(true)
            .build()
            .unwrap();
        let running = rig.fake.guest_ids("running");
        assert_eq!(running.len(), 1, "{how}: only the pool guest runs");
        let pooled = running[0].clone();
        let handle = client.sandbox_handle(pooled.clone());
        match how {
            "runner killed" => {
                for p in handle.processes().list().await.unwrap() {
                    handle
                        .processes()
                        .delete(
                            &p.process_id,
                            createos_api::ManagedProcessDeleteOptions::default(),
                        )
                        .await
                        .unwrap();
                }
            }
            _ => {
                handle.pause().await.unwrap();
            }
        }
        let before = wall_now();
        let (vertices, _) = run_to_end(&rig.executor, &request).await.unwrap();
        // The flow ran cold, on a fresh guest, and the pooled guest is gone, never resumed.
        assert!(imported_at(&vertices[0]) > before, "{how}: {vertices:?}");
        assert!(rig.executor.pool_stats().discarded >= 1, "{how}");
        let gone = client.get_sandbox(&pooled).await;
        assert!(
            gone.as_ref().map_or(true, |s| !matches!(
                s.status(),
                createos_api::SandboxStatus::Running | createos_api::SandboxStatus::Resuming
            )),
            "{how}: {:?}",
            gone.map(|s| s.status())
        );
        rig.executor.shutdown().await;
        assert_eq!(settled(&rig.fake).await.live, 0, "{how}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_image_without_lfx_never_enters_the_pool_and_runs_say_how_to_fix_it() {
    let python = format!("exec {} \"$@\"", system_python());
    let rig = start_rig(&python, &[("CREATEOS_EXECUTOR_WARM_POOL", "2")], "").await;
    for _ in 0..2 {
        let err = run_to_end(&rig.executor, &request(true)).await.unwrap_err();
        assert!(err.to_string().contains("lfx is not installed"), "{err}");
    }
    let until = Instant::now() + Duration::from_secs(20);
    while rig.executor.pool_stats().refill_failures == 0 {
        assert!(Instant::now() < until, "{:?}", rig.executor.pool_stats());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(rig.executor.pool_stats().ready, 0);
    rig.executor.shutdown().await;
    assert_eq!(settled(&rig.fake).await.live, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_warm_run_keeps_the_guest_clock_and_leaves_no_guest() {
    let (_lfx, rig) = warm_rig(&[("CREATEOS_EXECUTOR_TIMEOUT_SECONDS", "2")], "").await;
    run_to_end(&rig.executor, &nodes_request(&json!([{"id": "a"}])))
        .await
        .unwrap();
    until_ready(&rig.executor, 1).await;
    let slow = nodes_request(&json!([{"id": "a"}, {"id": "b", "sleep": 30}]));
    let err = run_to_end(&rig.executor, &slow).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("did not finish within CREATEOS_EXECUTOR_TIMEOUT_SECONDS=2s"),
        "{err}"
    );
    assert_eq!(rig.executor.pool_stats().hits, 1);
    rig.executor.shutdown().await;
    assert_eq!(settled(&rig.fake).await.live, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_process_start_leaves_runs_cold_and_working() {
    let (_lfx, rig) = warm_rig(&[], "process_create=500").await;
    let request = nodes_request(&json!([{"id": "a"}]));
    for _ in 0..3 {
        let before = wall_now();
        let (vertices, _) = run_to_end(&rig.executor, &request).await.unwrap();
        assert!(imported_at(&vertices[0]) > before);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let stats = rig.executor.pool_stats();
    assert_eq!((stats.hits, stats.ready), (0, 0), "{stats:?}");
    assert!(stats.refill_failures >= 1, "{stats:?}");
    rig.executor.shutdown().await;
    assert_eq!(settled(&rig.fake).await.live, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn faults_on_a_warm_run_give_the_right_verdict_and_leave_no_guest() {
    // (faults injected once the pool is ready, what the warm run must end with)
    let cases: &[(&str, Want)] = &[
        ("upload=503#1", Want::Ran),
        ("upload=429+ra=1#1", Want::Ran),
        ("upload=503+ra=none#1", Want::Ran),
        ("exec_stream=429#1", Want::Ran),
        ("exec_stream=503+ra=none#1", Want::Ran),
        // Refused for good before dispatch: the pooled guest is replaced, and the fresh
        // guest's run is refused the same way.
        ("exec_stream=429", Want::NotStarted),
        ("exec_stream=500", Want::MayHaveRun),
        ("exec_stream=reset", Want::MayHaveRun),
        ("exec_stream=stall", Want::MayHaveRun),
        ("upload=stall", Want::NotStarted),
    ];
    // The guest clock (5 s) ends the stalled cases; it is long enough for the cold first run of
    // several rigs at once on a loaded 2-core machine, and at most four rigs run together.
    let runs = cases.iter().map(|(faults, want)| async move {
        let (_lfx, rig) = warm_rig(&[("CREATEOS_EXECUTOR_TIMEOUT_SECONDS", "5")], "").await;
        let request = nodes_request(&json!([{"id": "a"}]));
        run_to_end(&rig.executor, &request).await.unwrap();
        until_ready(&rig.executor, 1).await;
        rig.fake.set_faults(faults).unwrap();
        let outcome = run_to_end(&rig.executor, &request).await;
        let got = match &outcome {
            Ok(_) => Want::Ran,
            Err(ExecutorError::Execution(m)) if m.contains("not started") => Want::NotStarted,
            Err(ExecutorError::Execution(m)) if m.contains("may have run") => Want::MayHaveRun,
            Err(e) => panic!("{faults}: unexpected {e:?}"),
        };
        assert_eq!(got, *want, "{faults}: {outcome:?}");
        if let Err(e) = &outcome {
            assert_no_key(&format!("{e} {e:?}"));
        }
        rig.fake.set_faults("").unwrap();
        rig.executor.shutdown().await;
        assert_eq!(settled(&rig.fake).await.live, 0, "{faults}");
    });
    futures::stream::iter(runs)
        .buffer_unordered(4)
        .collect::<Vec<()>>()
        .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_declined_process_start_is_retried_and_the_pool_fills() {
    for faults in [
        "process_create=429#1",
        "process_create=503+ra=1#1",
        "process_create=503+ra=none#1",
    ] {
        let (_lfx, rig) = warm_rig(&[], faults).await;
        run_to_end(&rig.executor, &nodes_request(&json!([{"id": "a"}])))
            .await
            .unwrap();
        until_ready(&rig.executor, 1).await;
        assert_eq!(rig.executor.pool_stats().refill_failures, 0, "{faults}");
        assert_eq!(rig.fake.stats().requests["process_create"], 2, "{faults}");
        rig.executor.shutdown().await;
        assert_eq!(settled(&rig.fake).await.live, 0, "{faults}");
    }
}

// --- Hostile frames: the host's own bounds, whatever the guest sends ------------------------

/// Writes `lines` (one frame each) to a file the stub `cat`s, and returns the directory.
fn frame_file(name: &str, lines: &[String]) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    let mut text = lines.join("\n");
    text.push('\n');
    std::fs::write(&path, text).unwrap();
    let shown = path.display().to_string();
    (dir, shown)
}

/// A run whose guest writes hello, then the frames in `lines`, then (after a pause, so the
/// host must stop it rather than wait) a terminal frame.
async fn hostile_run(lines: &[String]) -> (tempfile::TempDir, Rig, Vec<Event>, ExecutorError) {
    hostile_run_with(lines, &[]).await
}

/// [`hostile_run`] with `env` set for the executor.
async fn hostile_run_with(
    lines: &[String],
    env: &[(&str, &str)],
) -> (tempfile::TempDir, Rig, Vec<Event>, ExecutorError) {
    let (dir, path) = frame_file("frames.jsonl", lines);
    let script = format!(
        r#"echo '{{"frame":"hello","lfx":"1.13.0","python":"3.11"}}'
cat '{path}'
sleep 15
echo '{{"frame":"complete","outputs":[]}}'"#
    );
    let rig = start_rig(&script, env, "").await;
    let mut run = rig.executor.start(&request(false), None).await.unwrap();
    let mut events = Vec::new();
    let t0 = Instant::now();
    let err = loop {
        match run.next().await {
            Ok(Some(ev)) => events.push(ev),
            Ok(None) => panic!("the run ended without an error after {events:?}"),
            Err(e) => break e,
        }
    };
    // Refused as the frame arrives, not after the guest's pause.
    assert!(t0.elapsed() < Duration::from_secs(12), "{:?}", t0.elapsed());
    assert_eq!(run.next().await.unwrap(), None);
    (dir, rig, events, err)
}

/// The failure names the bound and says the guest is gone, and nothing is left live.
async fn assert_refused(rig: &Rig, err: &ExecutorError, bound: &str, limit: &str) {
    let ExecutorError::Execution(msg) = err else {
        panic!("{err:?}")
    };
    assert!(msg.contains(bound), "{msg}");
    assert!(msg.contains(limit), "{msg}");
    assert!(msg.contains("guest destroyed"), "{msg}");
    assert_eq!(settled(&rig.fake).await.live, 0);
    assert_eq!(rig.executor.registered_guests(), 0);
}

/// `n` copies of `item`, comma-separated.
fn repeated(item: &str, n: usize) -> String {
    vec![item; n].join(",")
}

fn vertex_with(id: &str, result: &str) -> String {
    format!(r#"{{"frame":"vertex","id":"{id}","seq":1,"result":{result}}}"#)
}

#[tokio::test(flavor = "multi_thread")]
async fn an_over_size_frame_is_refused_naming_the_bound() {
    // One byte over 16 MiB, of a string: refused before its end is buffered.
    let prefix = r#"{"frame":"vertex","id":"a","result":""#;
    let pad = 16 * 1024 * 1024 + 1 - prefix.len() - 2;
    let line = format!("{prefix}{}\"}}", "x".repeat(pad));
    assert_eq!(line.len(), 16 * 1024 * 1024 + 1);
    let (_dir, rig, events, err) = hostile_run(&[line]).await;
    assert!(events.is_empty(), "{events:?}");
    assert_refused(&rig, &err, "MAX_FRAME_BYTES", "16777216 bytes").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_over_deep_frame_is_refused_naming_the_bound() {
    let ok = vertex_with("ok", &format!("{}{}", "[".repeat(63), "]".repeat(63)));
    let deep = vertex_with("deep", &format!("{}{}", "[".repeat(64), "]".repeat(64)));
    let (_dir, rig, events, err) = hostile_run(&[ok, deep]).await;
    // 64 levels (the frame object and 63 arrays) pass; 65 do not.
    assert_eq!(events.len(), 1, "{events:?}");
    assert_refused(&rig, &err, "MAX_FRAME_DEPTH", "deeper than 64 levels").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_over_many_values_frame_is_refused_naming_the_bound() {
    // The frame object, its kind, id, seq and result list are 5 values: 249,995 empty objects
    // make 250,000, the bound; one more is over it.
    let at = vertex_with("at", &format!("[{}]", repeated("{}", 249_995)));
    let over = vertex_with("over", &format!("[{}]", repeated("{}", 249_996)));
    let (_dir, rig, events, err) = hostile_run(&[at, over]).await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_refused(
        &rig,
        &err,
        "MAX_FRAME_VALUES",
        "more than 250000 JSON values",
    )
    .await;
    // Tagged objects (rebuilt as lfx objects on the host) weigh more: 7,200 of them (35 each
    // with their tag and body) are over the bound in 200 KB.
    let tagged = vertex_with(
        "tagged",
        &format!("[{}]", repeated(r#"{"__lfx__":"Message","v":{}}"#, 7_200)),
    );
    let (_dir, rig, events, err) = hostile_run(&[tagged]).await;
    assert!(events.is_empty(), "{events:?}");
    assert_refused(&rig, &err, "MAX_FRAME_VALUES", "__lfx__").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn frames_summing_past_the_run_bounds_are_refused_naming_them() {
    // Five frames of 14 MiB each: every one under the frame bound, 70 MiB together.
    let big = |id: &str| vertex_with(id, &format!("\"{}\"", "y".repeat(14 * 1024 * 1024)));
    let lines: Vec<String> = ["a", "b", "c", "d", "e"].iter().map(|id| big(id)).collect();
    let (_dir, rig, events, err) = hostile_run(&lines).await;
    assert_eq!(events.len(), 4, "the first four fit in 64 MiB");
    assert_refused(
        &rig,
        &err,
        "CREATEOS_EXECUTOR_MAX_RESULT_BYTES=67108864",
        "more than 67108864 bytes in all",
    )
    .await;
    assert!(
        err.to_string()
            .contains("Raise CREATEOS_EXECUTOR_MAX_RESULT_BYTES"),
        "{err}"
    );
    // The setting moves the bound: the same five fit in 80 MiB.
    let (dir, path) = frame_file("frames.jsonl", &lines);
    let script = format!(
        r#"echo '{{"frame":"hello","lfx":"1.13.0","python":"3.11"}}'
cat '{path}'
echo '{{"frame":"complete","outputs":[]}}'
sleep 5"#
    );
    let rig = start_rig(
        &script,
        &[("CREATEOS_EXECUTOR_MAX_RESULT_BYTES", "83886080")],
        "",
    )
    .await;
    let (vertices, _) = run_to_end(&rig.executor, &request(false)).await.unwrap();
    assert_eq!(vertices.len(), 5);
    drop(dir);
    // Five frames of 240,000 values each: 1.2 million together.
    let many = |id: &str| vertex_with(id, &format!("[{}]", repeated("0", 240_000)));
    let lines: Vec<String> = ["a", "b", "c", "d", "e"]
        .iter()
        .map(|id| many(id))
        .collect();
    let (_dir, rig, events, err) = hostile_run(&lines).await;
    assert_eq!(events.len(), 4, "the first four fit in a million values");
    assert_refused(&rig, &err, "MAX_RUN_VALUES", "1000000 JSON values").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_large_legitimate_payload_arrives_whole() {
    // A vertex result of 600 KB of text and a 4,000-row table (tagged DataFrame records), both
    // carried twice as a real vertex frame carries them (results and outputs). The guest stays
    // up after its last frame: the fake stops relaying output 200 ms after a command exits.
    let text = "Lorem ipsum dolor sit amet, consectetur adipiscing elit. ".repeat(10_500);
    let rows: Vec<serde_json::Value> = (0..4_000)
        .map(|i| {
            json!({"id": i, "name": format!("row {i}"), "score": f64::from(i) / 7.0,
                        "ok": i % 2 == 0, "tags": ["a", "b"], "note": null})
        })
        .collect();
    let table = json!({"__lfx__": "DataFrame", "v": rows});
    let frame = json!({"frame": "vertex", "id": "big", "seq": 1, "result": {
        "results": {"text": {"__lfx__": "Message", "v": {"text": text}}, "table": table},
        "outputs": {"text": {"message": text, "type": "text"}, "table": {"message": rows, "type": "object"}},
    }});
    let line = frame.to_string();
    let (_dir, path) = frame_file("big.jsonl", &[line]);
    let script = format!(
        r#"echo '{{"frame":"hello","lfx":"1.13.0","python":"3.11"}}'
cat '{path}'
echo '{{"frame":"complete","outputs":[]}}'
sleep 5"#
    );
    let rig = start_rig(&script, &[], "").await;
    let (vertices, outputs) = run_to_end(&rig.executor, &request(false)).await.unwrap();
    assert_eq!(outputs, json!([]));
    assert_eq!(vertices, vec![frame]);
    assert_eq!(settled(&rig.fake).await.live, 0);
}

// --- Control characters from the guest -------------------------------------------------------

/// Every event's message and fields, formatted as the Python log bridge formats them (raw).
#[derive(Clone, Default)]
struct Captured(Arc<std::sync::Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Captured {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Fields(String);
        impl tracing::field::Visit for Fields {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                use std::fmt::Write as _;
                if field.name() == "message" {
                    let _ = write!(self.0, "{value:?}");
                } else {
                    let _ = write!(self.0, " {}={value:?}", field.name());
                }
            }
            fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
                use std::fmt::Write as _;
                let _ = write!(self.0, " {}={value}", field.name());
            }
        }
        let mut fields = Fields(String::new());
        event.record(&mut fields);
        self.0.lock().unwrap().push(fields.0);
    }
}

fn capture() -> (Captured, tracing::subscriber::DefaultGuard) {
    use tracing_subscriber::layer::SubscriberExt as _;
    let captured = Captured::default();
    let guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(captured.clone()));
    (captured, guard)
}

/// No raw control character but newline and tab; the escaped spelling is there instead.
fn assert_escaped(text: &str, escaped: &[&str]) {
    let raw: Vec<char> = text
        .chars()
        .filter(|c| c.is_control() && *c != '\n' && *c != '\t')
        .collect();
    assert!(raw.is_empty(), "raw control characters {raw:?} in {text:?}");
    for e in escaped {
        assert!(text.contains(e), "{e} missing from {text:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn control_characters_from_the_guest_are_escaped_in_logs_and_errors() {
    // ESC and BEL in a printed line, a line on stdout that is not a frame, the guest's lfx
    // version, and the flow's error message (multi-line: its newline stays). The fake relays
    // stderr and stdout from separate pipes: the pause lets the printed line arrive first.
    let script = r#"printf '\033[2J\033]0;pwned\007 cleared\n' >&2
sleep 2
printf 'stdout \033[31mred\033[0m\n'
printf '{"frame":"hello","lfx":"1.13.0\\u001b[5m","python":"3.11"}\n'
printf '{"frame":"error","kind":"flow","type":"ValueError","message":"bad \\u001b[31mthing\\u0007\\nline two\\u009b"}\n'
exit 1"#;
    let rig = start_rig(script, &[], "").await;
    let (logs, _guard) = capture();
    let mut run = rig
        .executor
        .start(&request(true), Some("1.13.0"))
        .await
        .unwrap();
    let err = run.next().await.unwrap_err();
    let ExecutorError::Flow { message, .. } = &err else {
        panic!("{err:?}")
    };
    // Its lines kept, but the second cannot start a line of the host's log.
    assert_escaped(message, &["bad \\x1b[31mthing\\x07\n  | line two\\x9b"]);
    let records = logs.0.lock().unwrap().join("\n");
    assert_escaped(
        &records,
        &[
            "guest: \\x1b[2J\\x1b]0;pwned\\x07 cleared",
            "guest: stdout \\x1b[31mred\\x1b[0m",
            "lfx 1.13.0\\x1b[5m",
        ],
    );
    assert_eq!(settled(&rig.fake).await.live, 0);

    // The guest's last lines, quoted in the error of a runner that reported nothing.
    let script = r"printf 'Traceback:\n  \033[1mboom\007\n' >&2
exit 1";
    let rig = start_rig(script, &[], "").await;
    let mut run = rig.executor.start(&request(true), None).await.unwrap();
    let err = run.next().await.unwrap_err();
    assert_escaped(&err.to_string(), &["\\x1b[1mboom\\x07"]);
    assert_eq!(settled(&rig.fake).await.live, 0);
}

// --- What the host resolves for the flow: variables, messages, history, files ----------------

#[tokio::test(flavor = "multi_thread")]
async fn message_frames_arrive_in_order_between_the_vertices() {
    let script = format!(
        r#"{RUNNER_CHECK}
echo '{{"frame":"hello","lfx":"1.13.0","python":"3.11"}}'
echo '{{"frame":"vertex","id":"chat_in","seq":1}}'
echo '{{"frame":"message","op":"store","id":"g-1","message":{{"text":"hi","sender":"User"}}}}'
echo '{{"frame":"message","op":"update","id":"g-1","message":{{"text":"hi!"}}}}'
echo '{{"frame":"message","op":"bogus","id":"g-2","message":{{}}}}'
echo '{{"frame":"vertex","id":"chat_out","seq":2}}'
echo '{{"frame":"complete","outputs":[]}}'"#
    );
    let rig = start_rig(&script, &[], "").await;
    let mut run = rig.executor.start(&request(true), None).await.unwrap();
    let mut seen = Vec::new();
    while let Some(event) = run.next().await.unwrap() {
        seen.push(match event {
            Event::Vertex(v) => format!("vertex {}", v.value()["id"]),
            Event::Message(m) => {
                let m = m.value();
                format!("{} {} {}", m["op"], m["id"], m["message"]["text"])
            }
            Event::Complete(_) => "complete".to_owned(),
        });
    }
    // The message with an unknown op is a malformed line, skipped.
    assert_eq!(
        seen,
        [
            r#"vertex "chat_in""#,
            r#""store" "g-1" "hi""#,
            r#""update" "g-1" "hi!""#,
            r#"vertex "chat_out""#,
            "complete"
        ]
    );
    assert_eq!(settled(&rig.fake).await.live, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn message_frames_past_the_run_bound_are_refused_naming_it() {
    let message = r#"{"frame":"message","op":"store","id":"m","message":{"text":"x"}}"#;
    let lines = vec![message.to_owned(); 1001];
    let (_dir, rig, events, err) = hostile_run(&lines).await;
    assert_eq!(
        events.len(),
        1000,
        "every message within the bound was handed on"
    );
    assert_refused(
        &rig,
        &err,
        "MAX_RUN_MESSAGES",
        "more than 1000 message frames",
    )
    .await;
}

const CREDENTIAL: &str = "sk-flow-credential-6e21b0c4";

/// A request whose flow has a resolved credential, a table cell from a variable and a field
/// whose resolution failed on the host.
fn request_with_variables() -> FlowRequest {
    FlowRequest::from_json(
        &json!({"flow": {"data": {"nodes": [], "edges": []}}, "inputs": [{"input_value": "hi"}],
        "options": {"_use_arun_legacy": true, "session_id": "s-42"},
        "session_id": "s-42",
        "variables": {
            "llm": {"params": {"api_key": CREDENTIAL}},
            "broken": {"error": {"type": "VariableNotFoundError", "base": "ValueError",
                                 "message": "MISSING_VAR variable not found."}}
        }})
        .to_string(),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn variable_values_travel_only_in_the_job_and_are_masked_in_what_the_guest_prints() {
    // The guest says whether the job it was given has the value and whether its environment
    // does, prints the value, and fails with it in the message.
    let script = format!(
        r#"{RUNNER_CHECK}
job="$(dirname "$2")/lfx_job.json"
grep -q '"api_key":"{CREDENTIAL}"' "$job" && echo 'the job has the credential' >&2
grep -q '"base":"ValueError"' "$job" && echo 'the job has the failed resolution' >&2
grep -q '"session_id":"s-42"' "$job" && echo 'the job has the session' >&2
env | grep -q '{CREDENTIAL}' && echo 'the environment has the credential' >&2
echo 'the flow printed {CREDENTIAL} here' >&2
sleep 1
printf '{{"frame":"hello","lfx":"1.13.0","python":"3.11"}}\n'
printf '{{"frame":"error","kind":"flow","type":"ValueError","message":"bad key {CREDENTIAL}"}}\n'
exit 1"#
    );
    let log_dir = tempfile::tempdir().unwrap();
    let log = log_dir.path().join("requests.jsonl");
    let rig = rig_full(&script, &[], "", Some(&log), |_| {}).await;
    let (logs, _guard) = capture();
    let mut run = rig
        .executor
        .start(&request_with_variables(), None)
        .await
        .unwrap();
    let err = run.next().await.unwrap_err();
    let ExecutorError::Flow {
        error_type,
        message,
    } = &err
    else {
        panic!("{err:?}")
    };
    assert_eq!(error_type.as_deref(), Some("ValueError"));
    assert_eq!(message, "bad key [REDACTED]");
    assert_eq!(settled(&rig.fake).await.live, 0);
    let records = logs.0.lock().unwrap().join("\n");
    for said in [
        "guest: the job has the credential",
        "guest: the job has the failed resolution",
        "guest: the job has the session",
        "guest: the flow printed [REDACTED] here",
    ] {
        assert!(records.contains(said), "{said} missing from {records}");
    }
    assert!(!records.contains("the environment has"), "{records}");
    assert!(!records.contains(CREDENTIAL), "{records}");
    // The control plane saw the value in the job's upload and nowhere else.
    let requests = std::fs::read_to_string(&log).unwrap();
    let carrying: Vec<String> = requests
        .lines()
        .filter(|l| l.contains(CREDENTIAL))
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            format!("{} {}", v["route"], v["query"])
        })
        .collect();
    assert_eq!(
        carrying,
        [r#""upload" [["path","/workspace/lfx_job.json"]]"#]
    );
    assert!(requests.contains(r#""route":"create""#));
}

fn request_with_files(files: &[(&Path, &str)]) -> FlowRequest {
    let files: Vec<serde_json::Value> = files
        .iter()
        .enumerate()
        .map(|(i, (host, name))| {
            json!({"host_path": host, "guest_path": format!("/workspace/lfx_files/{i}/{name}"),
                   "component": "File"})
        })
        .collect();
    FlowRequest::from_json(
        &json!({"flow": {"data": {"nodes": [], "edges": []}}, "inputs": [],
                "options": {"_use_arun_legacy": true}, "files": files})
        .to_string(),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn uploaded_files_are_written_where_the_guest_reads_them() {
    let host = tempfile::tempdir().unwrap();
    let notes = host.path().join("notes.txt");
    std::fs::write(&notes, "42 apples").unwrap();
    let script = format!(
        r#"{RUNNER_CHECK}
printf '{{"frame":"vertex","id":"%s"}}\n' "$(cat "$(dirname "$2")/lfx_files/0/notes.txt")"
echo '{{"frame":"complete","outputs":[]}}'"#
    );
    let rig = start_rig(&script, &[], "").await;
    let (vertices, _) = run_to_end(&rig.executor, &request_with_files(&[(&notes, "notes.txt")]))
        .await
        .unwrap();
    assert_eq!(vertices[0]["id"], "42 apples");
    assert_eq!(settled(&rig.fake).await.live, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_file_above_the_bound_is_refused_before_any_guest_is_created() {
    let host = tempfile::tempdir().unwrap();
    let big = host.path().join("big.pdf");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(64 * 1024 * 1024 + 1)
        .unwrap();
    let rig = start_rig("exit 9", &[], "").await;
    let err = rig
        .executor
        .start(&request_with_files(&[(&big, "big.pdf")]), None)
        .await
        .unwrap_err();
    let ExecutorError::Unavailable(msg) = &err else {
        panic!("{err:?}")
    };
    assert!(msg.contains("MAX_FILE_BYTES=67108864"), "{msg}");
    assert!(
        msg.contains(r#""big.pdf""#) && msg.contains("Nothing was created"),
        "{msg}"
    );
    let stats = rig.fake.stats();
    assert_eq!(stats.created, 0);
    assert!(stats.requests.is_empty(), "{:?}", stats.requests);
}

#[tokio::test(flavor = "multi_thread")]
async fn allowed_domains_send_the_gateway_as_egress_and_the_proxy_variables_in_the_job() {
    // The stub runner answers with the `env` of the job it was handed.
    let stub = format!(
        "while [ ! -s \"$(dirname \"$2\")/lfx_job.json\" ]; do sleep 0.01; done; sleep 0.05\n\
         exec {} -c 'import json, sys; j = json.load(open(sys.argv[1])); \
         print(json.dumps({{\"frame\": \"complete\", \"outputs\": [j.get(\"env\")]}}))' \
         \"$(dirname \"$2\")/lfx_job.json\"",
        system_python()
    );
    let secret = "exec-gw-secret-0123456789abcdef0123456789";
    let rig = start_rig(
        &stub,
        &[
            (
                "CREATEOS_EXECUTOR_ALLOWED_DOMAINS",
                "pypi.org,*.pythonhosted.org",
            ),
            ("CREATEOS_EXECUTOR_ACCEPT_EGRESS_EXCEPTIONS", "true"),
            ("CREATEOS_GATEWAY_URL", "http://10.0.0.5:3128"),
            ("CREATEOS_GATEWAY_SECRET", secret),
        ],
        "",
    )
    .await;
    let mut run = rig.executor.start(&request(false), None).await.unwrap();
    let outputs = completed(run.next().await.unwrap());
    let env = &outputs[0];
    let gateway = sandbox_core::gateway::Gateway::new(
        "10.0.0.5:3128".parse().unwrap(),
        sandbox_core::gateway::Secret::new(secret.as_bytes().to_vec()).unwrap(),
        None,
    );
    let cred = gateway
        .check_proxy_env(
            &|k| env[k].as_str().map(str::to_owned),
            std::time::SystemTime::now(),
        )
        .unwrap();
    assert!(cred.guest.starts_with("lf-"), "{}", cred.guest);
    assert_eq!(cred.domains, ["*.pythonhosted.org", "pypi.org"]);
    assert_eq!(settled(&rig.fake).await.live, 0);

    // Without a gateway the same settings are refused before any guest exists.
    let rig = start_rig(
        "exit 9",
        &[
            ("CREATEOS_EXECUTOR_ALLOWED_DOMAINS", "pypi.org"),
            ("CREATEOS_EXECUTOR_ACCEPT_EGRESS_EXCEPTIONS", "true"),
        ],
        "",
    )
    .await;
    let Err(ExecutorError::Unavailable(msg)) = rig.executor.start(&request(false), None).await
    else {
        panic!("expected a refusal")
    };
    assert!(
        msg.contains("CREATEOS_EXECUTOR_ALLOWED_DOMAINS") && msg.contains("CREATEOS_GATEWAY_URL"),
        "{msg}"
    );
    assert_eq!(rig.fake.stats().created, 0);
}

/// A request whose flow has one field that loads from the global variable `name`.
fn request_asking_for(name: &str) -> FlowRequest {
    FlowRequest::from_json(
        &json!({"flow": {"data": {"nodes": [{"id": "llm-1", "data": {"id": "llm-1", "node": {
                    "display_name": "OpenAI Model",
                    "template": {"api_key": {"load_from_db": true, "value": name,
                                             "_input_type": "SecretStrInput"}}}}}],
                "edges": []}},
                "inputs": [{"input_value": "hi"}], "options": {"_use_arun_legacy": true}})
        .to_string(),
    )
    .unwrap()
}

const GATEWAY_SECRET: &str = "gw-secret-0123456789abcdef0123456789abcdef";
const DB_PASSWORD: &str = "db-passw0rd-71c3";

#[tokio::test(flavor = "multi_thread")]
async fn a_flow_asking_for_a_plugin_setting_is_refused_before_any_guest() {
    let rig = start_rig("exit 9", &[], "").await;
    for name in [
        "CREATEOS_SANDBOX_API_KEY",
        "CREATEOS_API_KEY",
        "createos_sandbox_api_key",
        "CREATEOS_GATEWAY_SECRET",
        "CREATEOS_ADMISSION_STORE",
        "OPEN_SANDBOX_API_KEY",
        "LANGFLOW_DATABASE_URL",
        "LANGFLOW_REDIS_URL",
    ] {
        let err = rig
            .executor
            .start(&request_asking_for(name), None)
            .await
            .unwrap_err();
        let ExecutorError::Unavailable(msg) = &err else {
            panic!("{name}: {err:?}")
        };
        assert!(
            msg.contains(&format!("`{name}`"))
                && msg.contains("the field `api_key` of OpenAI Model (vertex `llm-1`)")
                && msg.contains("configures the sandbox itself"),
            "{msg}"
        );
        assert_no_key(msg);
    }
    let stats = rig.fake.stats();
    assert_eq!(stats.created, 0);
    assert!(stats.requests.is_empty(), "{:?}", stats.requests);
    // A variable of the flow's own is resolved and sent as before.
    rig.executor
        .plan()
        .and_then(|plan| {
            langflow_executor::withhold::check_request(
                &request_asking_for("OPENAI_API_KEY"),
                &plan.withheld,
            )
        })
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_plugin_secret_anywhere_in_the_request_never_reaches_the_guest() {
    // The guest would print whatever job it got; it must get none.
    let script = format!(
        r#"{RUNNER_CHECK}
cat "$(dirname "$2")/lfx_job.json" >&2
exit 1"#
    );
    let log_dir = tempfile::tempdir().unwrap();
    let log = log_dir.path().join("requests.jsonl");
    let db_url = format!("postgresql://langflow:{DB_PASSWORD}@db:5432/langflow");
    let env = [
        ("CREATEOS_GATEWAY_SECRET", GATEWAY_SECRET),
        ("LANGFLOW_DATABASE_URL", db_url.as_str()),
    ];
    let rig = rig_full(&script, &env, "", Some(&log), |_| {}).await;
    let resolved = |value: &str| {
        json!({"flow": {"data": {"nodes": [], "edges": []}}, "inputs": [{"input_value": "hi"}],
               "options": {"_use_arun_legacy": true},
               "variables": {"llm-1": {"params": {"api_key": value}}}})
    };
    let cases: Vec<(serde_json::Value, &str, &str)> = vec![
        // A variable of another name whose value is the sandbox's key (lfx's env fallback).
        (
            resolved(KEY),
            "the field `api_key` of vertex `llm-1`",
            "CREATEOS_SANDBOX_API_KEY",
        ),
        (
            resolved(&format!("Bearer {GATEWAY_SECRET}")),
            "`api_key`",
            "CREATEOS_GATEWAY_SECRET",
        ),
        (
            resolved(DB_PASSWORD),
            "`api_key`",
            "the password in LANGFLOW_DATABASE_URL",
        ),
        (
            json!({"flow": {"data": {"nodes": [], "edges": []}},
                   "inputs": [{"input_value": format!("my key is {KEY}")}]}),
            "inputs[0] (at input_value)",
            "CREATEOS_SANDBOX_API_KEY",
        ),
        (
            json!({"flow": {"data": {"nodes": [{"id": "p", "data": {"node": {"template":
                      {"template": {"value": format!("use {KEY}")}}}}}], "edges": []}}}),
            "the flow's definition (at data.nodes[0].data.node.template.template.value)",
            "CREATEOS_SANDBOX_API_KEY",
        ),
        (
            json!({"flow": {"data": {"nodes": [], "edges": []}}, "session_id": "s",
                   "memory": {"history": [{"text": format!("the key: {KEY}"), "sender": "User"}]}}),
            "a message of the session's chat history (at text)",
            "CREATEOS_SANDBOX_API_KEY",
        ),
    ];
    for (body, place, setting) in cases {
        let request = FlowRequest::from_json(&body.to_string()).unwrap();
        let err = rig.executor.start(&request, None).await.unwrap_err();
        let ExecutorError::Unavailable(msg) = &err else {
            panic!("{place}: {err:?}")
        };
        assert!(
            msg.contains(place) && msg.contains(setting),
            "{place} / {setting}: {msg}"
        );
        assert!(msg.contains("nothing was sent to a guest"), "{msg}");
        assert_no_key(msg);
        assert!(
            !msg.contains(GATEWAY_SECRET) && !msg.contains(DB_PASSWORD),
            "{msg}"
        );
    }
    assert_eq!(settled(&rig.fake).await.live, 0);
    // The control plane saw no job, and no secret in any request body.
    let requests = std::fs::read_to_string(&log).unwrap();
    let jobs = requests
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["route"] == "upload" && v["query"].to_string().contains("lfx_job.json"))
        .count();
    assert_eq!(jobs, 0, "a job was uploaded");
    for secret in [KEY, GATEWAY_SECRET, DB_PASSWORD] {
        assert!(
            !requests.contains(secret),
            "{secret} reached the control plane"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_uploaded_file_holding_the_key_is_refused_before_any_guest() {
    let host = tempfile::tempdir().unwrap();
    let notes = host.path().join("notes.txt");
    std::fs::write(&notes, format!("config:\n  key: {KEY}\n")).unwrap();
    let rig = start_rig("exit 9", &[], "").await;
    let err = rig
        .executor
        .start(&request_with_files(&[(&notes, "notes.txt")]), None)
        .await
        .unwrap_err();
    let ExecutorError::Unavailable(msg) = &err else {
        panic!("{err:?}")
    };
    assert!(
        msg.contains("the uploaded file a file input of File reads")
            && msg.contains("CREATEOS_SANDBOX_API_KEY"),
        "{msg}"
    );
    assert_no_key(msg);
    assert_eq!(rig.fake.stats().created, 0);
}

// --- Results longer than a frame line: chunked frames ----------------------------------------

/// A guest `python3` that runs the real runner over the fake lfx, and a request whose one
/// vertex answers with `answer` bytes of text.
fn answering(answer: usize) -> ((tempfile::TempDir, String), FlowRequest) {
    (
        fake_lfx(),
        nodes_request(&json!([{"id": "small"}, {"id": "big", "answer": answer}])),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_result_longer_than_a_frame_line_arrives_whole_in_pieces() {
    // 20 MB of text: one vertex frame longer than the host takes in a line (16 MiB); the real
    // runner sends it in pieces and the host puts it back together.
    let answer = 20_000_000;
    let ((_lfx, python), request) = answering(answer);
    let rig = start_rig(&python, &[], "").await;
    let (vertices, outputs) = run_to_end(&rig.executor, &request).await.unwrap();
    assert_eq!(outputs, json!([]));
    assert_eq!(
        vertices.len(),
        2,
        "{:?}",
        vertices.iter().map(|v| &v["id"]).collect::<Vec<_>>()
    );
    assert_eq!(vertices[0]["id"], "small");
    assert_eq!(vertices[1]["id"], "big");
    let text = vertices[1]["result"]["results"]["text"].as_str().unwrap();
    assert_eq!(text.len(), answer);
    assert!(text.bytes().all(|b| b == b'x'));
    assert_eq!(settled(&rig.fake).await.live, 0);
    assert_eq!(rig.executor.registered_guests(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_result_over_the_setting_is_refused_at_its_first_piece_naming_it() {
    let ((_lfx, python), request) = answering(5_000_000);
    let rig = start_rig(
        &python,
        &[("CREATEOS_EXECUTOR_MAX_RESULT_BYTES", "4194304")],
        "",
    )
    .await;
    let err = run_to_end(&rig.executor, &request).await.unwrap_err();
    let ExecutorError::Execution(msg) = &err else {
        panic!("{err:?}")
    };
    // The frame's claimed length (5 MB and its envelope) against the setting, which is named
    // with its value and the fix.
    assert!(msg.contains("a result frame of 5000"), "{msg}");
    assert!(
        msg.contains("CREATEOS_EXECUTOR_MAX_RESULT_BYTES=4194304"),
        "{msg}"
    );
    assert!(
        msg.contains("Raise CREATEOS_EXECUTOR_MAX_RESULT_BYTES (at most 1073741824)"),
        "{msg}"
    );
    assert!(msg.contains("guest destroyed"), "{msg}");
    assert_no_key(msg);
    assert_eq!(settled(&rig.fake).await.live, 0);
    assert_eq!(rig.executor.registered_guests(), 0);
}

/// `text` as the runner sends a long frame: pieces of `size` bytes, each a chunk frame line.
fn pieces(text: &str, size: usize) -> Vec<String> {
    text.as_bytes()
        .chunks(size)
        .enumerate()
        .map(|(index, piece)| {
            json!({"frame": "chunk", "index": index, "total": text.len(),
                   "data": std::str::from_utf8(piece).unwrap()})
            .to_string()
        })
        .collect()
}

fn chunk(index: u64, total: u64, data: &str) -> String {
    json!({"frame": "chunk", "index": index, "total": total, "data": data}).to_string()
}

/// The failure says the guest broke the chunking (`what`) and is gone, and nothing is left.
async fn assert_broken(rig: &Rig, err: &ExecutorError, what: &str) {
    let ExecutorError::Execution(msg) = err else {
        panic!("{err:?}")
    };
    assert!(msg.contains(what), "{what:?} not in {msg}");
    assert!(msg.contains("guest destroyed"), "{msg}");
    assert!(msg.len() < 1000, "{msg}");
    assert_eq!(settled(&rig.fake).await.live, 0);
    assert_eq!(rig.executor.registered_guests(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn pieces_from_a_hostile_guest_are_checked_before_they_cost_the_host() {
    let frame = vertex_with("v", &format!("\"{}\"", "z".repeat(3000)));
    let good = pieces(&frame, 1000);
    let before = vertex_with("before", "1");
    // A claimed total past the run's bound: refused at the first piece, naming the setting.
    let (_d, rig, events, err) = hostile_run(&[before.clone(), chunk(0, u64::MAX, "{")]).await;
    assert_eq!(events.len(), 1);
    assert_broken(&rig, &err, "a result frame of 18446744073709551615 bytes").await;
    assert!(
        err.to_string()
            .contains("CREATEOS_EXECUTOR_MAX_RESULT_BYTES=67108864"),
        "{err}"
    );
    // Out of order: a piece skipped, a piece sent twice, a frame that starts mid-way.
    for (lines, what) in [
        (
            vec![good[0].clone(), good[2].clone()],
            "piece 2 where piece 1 was due",
        ),
        (
            vec![good[0].clone(), good[0].clone()],
            "piece 0 where piece 1 was due",
        ),
        (vec![good[1].clone()], "piece 1 where piece 0 was due"),
    ] {
        let (_d, rig, events, err) = hostile_run(&lines).await;
        assert!(events.is_empty(), "{events:?}");
        assert_broken(&rig, &err, what).await;
    }
    // Pieces that disagree about the total, or overrun it.
    let total = frame.len() as u64;
    let (_d, rig, _, err) =
        hostile_run(&[good[0].clone(), chunk(1, total + 1, &frame[1000..2000])]).await;
    assert_broken(
        &rig,
        &err,
        &format!("of {total} bytes that claims {}", total + 1),
    )
    .await;
    let (_d, rig, _, err) = hostile_run(&[
        good[0].clone(),
        good[1].clone(),
        chunk(2, total, &format!("{}{}", &frame[2000..], "extra")),
    ])
    .await;
    assert_broken(&rig, &err, "add up to").await;
    // Another frame in the middle of a chunked one, and an empty piece.
    let (_d, rig, _, err) = hostile_run(&[good[0].clone(), before.clone()]).await;
    assert_broken(
        &rig,
        &err,
        "another frame in the middle of a chunked frame (1000 of its",
    )
    .await;
    let (_d, rig, _, err) = hostile_run(&[good[0].clone(), chunk(1, total, "")]).await;
    assert_broken(&rig, &err, "an empty piece").await;
    // Whole, but not a frame of the protocol.
    let (_d, rig, _, err) = hostile_run(&pieces("[1,2,3]", 2)).await;
    assert_broken(&rig, &err, "not a JSON object").await;
    let nested = chunk(0, 7, "{\"a\":1}");
    let (_d, rig, _, err) = hostile_run(&pieces(&nested, 10)).await;
    assert_broken(&rig, &err, "itself a chunk frame").await;
    let (_d, rig, _, err) = hostile_run(&pieces(r#"{"frame":"vertex","id":"#, 5)).await;
    assert_broken(&rig, &err, "not a frame").await;
    // The host's other bounds hold for a reassembled frame: 300,000 values.
    let many = vertex_with("many", &format!("[{}]", repeated("0", 300_000)));
    let (_d, rig, _, err) = hostile_run(&pieces(&many, 100_000)).await;
    assert_refused(
        &rig,
        &err,
        "MAX_FRAME_VALUES",
        "more than 250000 JSON values",
    )
    .await;
    // And a well-formed one arrives whole, in its place among the others.
    let mut lines = vec![before.clone()];
    lines.extend(good.iter().cloned());
    lines.push(before);
    let (_d, path) = frame_file("frames.jsonl", &lines);
    let script = format!(
        r#"echo '{{"frame":"hello","lfx":"1.13.0","python":"3.11"}}'
cat '{path}'
echo '{{"frame":"complete","outputs":[]}}'
sleep 5"#
    );
    let rig = start_rig(&script, &[], "").await;
    let (vertices, _) = run_to_end(&rig.executor, &request(false)).await.unwrap();
    let ids: Vec<&serde_json::Value> = vertices.iter().map(|v| &v["id"]).collect();
    assert_eq!(ids, ["before", "v", "before"]);
    assert_eq!(
        vertices[1],
        serde_json::from_str::<serde_json::Value>(&frame).unwrap()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_chunked_frame_that_never_finishes_ends_the_run_saying_so() {
    let first = chunk(0, 100_000, "{\"frame\":\"vertex\"");
    // The runner exits after its first piece.
    let script = format!(
        "echo '{{\"frame\":\"hello\",\"lfx\":\"1.13.0\",\"python\":\"3.11\"}}'\necho '{first}'\nexit 0"
    );
    let rig = start_rig(&script, &[], "").await;
    let err = run_to_end(&rig.executor, &request(false))
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains(
            "exited with status 0 without reporting a result, in the middle of a chunked frame \
             (17 of its 100000 bytes had arrived)"
        ),
        "{text}"
    );
    assert_eq!(settled(&rig.fake).await.live, 0);
    assert_eq!(rig.executor.registered_guests(), 0);
    // The runner stalls after its first piece: the guest clock ends it.
    let script = format!(
        "echo '{{\"frame\":\"hello\",\"lfx\":\"1.13.0\",\"python\":\"3.11\"}}'\necho '{first}'\nsleep 30"
    );
    let rig = start_rig(&script, &[("CREATEOS_EXECUTOR_TIMEOUT_SECONDS", "2")], "").await;
    let t0 = Instant::now();
    let err = run_to_end(&rig.executor, &request(false))
        .await
        .unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(15), "{:?}", t0.elapsed());
    assert_broken(
        &rig,
        &err,
        "in the middle of a chunked frame (17 of its 100000 bytes",
    )
    .await;
    assert!(
        err.to_string()
            .contains("CREATEOS_EXECUTOR_TIMEOUT_SECONDS=2s"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_warm_runs_long_result_arrives_whole_in_pieces_too() {
    let (_lfx, rig) = warm_rig(&[], "").await;
    // The first run finds the pool empty and warms it for the runs after.
    run_to_end(&rig.executor, &nodes_request(&json!([{"id": "a"}])))
        .await
        .unwrap();
    until_ready(&rig.executor, 1).await;
    let answer = 18_000_000;
    let request = nodes_request(&json!([{"id": "big", "answer": answer}]));
    let (vertices, _) = run_to_end(&rig.executor, &request).await.unwrap();
    assert_eq!(
        rig.executor.pool_stats().hits,
        1,
        "{:?}",
        rig.executor.pool_stats()
    );
    let text = vertices[0]["result"]["results"]["text"].as_str().unwrap();
    assert_eq!(text.len(), answer);
    rig.executor.shutdown().await;
    assert_eq!(settled(&rig.fake).await.live, 0);
}

/// An executor on OpenSandbox whose environment is `env` (and nothing else).
fn opensandbox_executor(env: &[(&'static str, &'static str)]) -> Executor {
    let env: HashMap<&'static str, &'static str> = env.iter().copied().collect();
    Executor::with_options(ExecutorOptions {
        surface: SurfaceOptions {
            env: Arc::new(move |k: &str| env.get(k).map(|v| (*v).to_owned())),
            ..SurfaceOptions::default()
        },
        provider: sandbox_core::provider::ProviderKind::OpenSandbox,
        ..ExecutorOptions::default()
    })
}

#[test]
fn on_opensandbox_the_plan_needs_attestation_or_the_opt_in_and_no_createos_key() {
    let server = [
        ("OPEN_SANDBOX_DOMAIN", "http://127.0.0.1:9"),
        ("OPEN_SANDBOX_API_KEY", "os-key-never-shown"),
    ];
    let err = opensandbox_executor(&server).plan().unwrap_err();
    let ExecutorError::Unavailable(msg) = &err else {
        panic!("{err:?}")
    };
    assert!(
        msg.contains("OPEN_SANDBOX_ATTEST_ISOLATION=hardware-virtualized")
            && msg.contains("OPEN_SANDBOX_ALLOW_CONTAINER_ISOLATION=true"),
        "{msg}"
    );
    assert!(!msg.contains("os-key-never-shown") && !msg.contains("CREATEOS_SANDBOX_API_KEY"));
    for extra in [
        ("OPEN_SANDBOX_ATTEST_ISOLATION", "hardware-virtualized"),
        ("OPEN_SANDBOX_ALLOW_CONTAINER_ISOLATION", "true"),
    ] {
        let plan = opensandbox_executor(&[server[0], server[1], extra])
            .plan()
            .unwrap();
        // The server's image (OPEN_SANDBOX_IMAGE's default, never CreateOS's rootfs), and the
        // default size in the provider's catalog.
        assert_eq!(plan.rootfs(), sandbox_opensandbox::settings::DEFAULT_IMAGE);
        assert_eq!(
            plan.executor.shape,
            langflow_executor::OPENSANDBOX_DEFAULT_SIZE
        );
    }
    let plan = opensandbox_executor(&[
        server[0],
        server[1],
        ("OPEN_SANDBOX_ATTEST_ISOLATION", "hardware-virtualized"),
        ("CREATEOS_EXECUTOR_SHAPE", "2048Mi"),
    ])
    .plan()
    .unwrap();
    assert_eq!(plan.executor.shape, "2048Mi");
    // CreateOS (the default) still needs its key.
    let err = Executor::with_options(ExecutorOptions {
        surface: SurfaceOptions {
            env: Arc::new(|_: &str| None),
            ..SurfaceOptions::default()
        },
        ..ExecutorOptions::default()
    })
    .plan()
    .unwrap_err();
    assert!(
        err.to_string().contains("CREATEOS_SANDBOX_API_KEY"),
        "{err}"
    );
}

#[test]
fn on_opensandbox_a_domain_allowlist_is_the_sandboxs_policy_with_no_gateway_grant() {
    let base = [
        ("OPEN_SANDBOX_DOMAIN", "http://127.0.0.1:9"),
        ("OPEN_SANDBOX_API_KEY", "os-key-never-shown"),
        ("OPEN_SANDBOX_ATTEST_ISOLATION", "hardware-virtualized"),
    ];
    let plan = opensandbox_executor(&[
        base[0],
        base[1],
        base[2],
        (
            "CREATEOS_EXECUTOR_ALLOWED_DOMAINS",
            "pypi.org,*.pythonhosted.org",
        ),
    ])
    .plan()
    .unwrap();
    assert_eq!(
        plan.executor.egress,
        sandbox_core::egress::EgressPolicy::Domains(vec![
            "*.pythonhosted.org".into(),
            "pypi.org".into()
        ])
    );
    // No gateway is involved: no grant, so no proxy variables reach the guest.
    assert!(plan.grant.is_none());
    // An address entry is refused before any sandbox, naming the setting.
    let err = opensandbox_executor(&[
        base[0],
        base[1],
        base[2],
        ("CREATEOS_EXECUTOR_ALLOWED_DOMAINS", "pypi.org,192.0.2.7"),
    ])
    .plan()
    .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("CREATEOS_EXECUTOR_ALLOWED_DOMAINS") && msg.contains("192.0.2.7"),
        "{msg}"
    );
    assert!(!msg.contains("os-key-never-shown"));
}
