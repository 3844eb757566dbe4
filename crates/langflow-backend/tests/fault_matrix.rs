//! Every fault the fake can inject, at every call a run makes, once each: the run must end in
//! the class the error taxonomy promises, never leak the key, and never leak a guest.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use createos_fake::{FakeOptions, FakeServer};
use futures::StreamExt;
use langflow_backend::{Backend, BackendError, BackendOptions, LfxPolicy, RunOutput};
use sandbox_core::reaper::ReaperConfig;
use sandbox_core::retry::Backoff;

const KEY: &str = "lf-matrix-key-5d1c0b7a93";

const ROUTES: &[&str] = &[
    "whoami",
    "shapes",
    "create",
    "egress_get",
    "upload",
    "exec_stream",
    "delete",
];

const ACTIONS: &[&str] = &[
    "401",
    "404",
    "409",
    "429",
    "500",
    "503",
    "reset",
    "reset-after",
    "stall",
    "stall-mid",
    "echo-headers",
    "redirect",
    "text",
    "huge",
    "malformed",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// The program ran and printed `1`.
    Ran,
    /// A timeout result (-1) after the host deadline.
    TimedOut,
    /// `SandboxUnavailableError`.
    Unavailable,
    /// `SandboxExecutionError` saying the code may have run.
    MayHaveRun,
}

fn expected(route: &str, action: &str) -> Expect {
    let rejected = matches!(action, "401" | "404" | "409" | "redirect" | "huge");
    match route {
        // Destroy happens after the result; failures are retried by the reaper.
        "delete" => Expect::Ran,
        "exec_stream" => match action {
            a if rejected && a != "reset" => Expect::Unavailable,
            "429" | "503" => Expect::Ran,
            "stall" | "stall-mid" => Expect::TimedOut,
            _ => Expect::MayHaveRun,
        },
        // Everything before dispatch: 4xx fails closed, the rest is retried.
        _ if rejected => Expect::Unavailable,
        _ => Expect::Ran,
    }
}

fn options(url: String) -> BackendOptions {
    let quick = Backoff {
        base: Duration::from_millis(20),
        max: Duration::from_millis(200),
        budget: Duration::from_secs(5),
    };
    let env: HashMap<String, String> = [
        ("CREATEOS_SANDBOX_API_KEY", KEY.to_owned()),
        ("CREATEOS_SANDBOX_BASE_URL", url),
        (
            "LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS",
            "true".to_owned(),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    BackendOptions {
        env: Arc::new(move |k| env.get(k).cloned()),
        request_timeout: Duration::from_millis(800),
        backoff: quick,
        kill_after: Duration::from_millis(300),
        host_grace: Duration::from_millis(1200),
        shutdown_timeout: Duration::from_secs(5),
        reaper: ReaperConfig {
            backoff: quick,
            lookup_patience: Duration::from_millis(300),
        },
        // The `list` faults below are meant for the lost-create lookup, not the orphan sweep.
        orphan_sweep: false,
        ..BackendOptions::default()
    }
}

fn classify(res: &Result<RunOutput, BackendError>) -> Result<Expect, String> {
    match res {
        Ok(o) if o.exit_code == 0 && o.stdout == "1\n" => Ok(Expect::Ran),
        Ok(o) if o.exit_code == -1 => Ok(Expect::TimedOut),
        Ok(o) => Err(format!("unexpected result {o:?}")),
        Err(BackendError::Unavailable(_)) => Ok(Expect::Unavailable),
        Err(BackendError::Execution(m)) if m.contains("may have run") => Ok(Expect::MayHaveRun),
        Err(e) => Err(format!("unexpected error {e:?}")),
    }
}

/// Runs `print(1)` once under `faults` and returns a problem description, if any.
async fn one(faults: String, want: Expect) -> Option<String> {
    let fake = FakeServer::start(FakeOptions {
        api_key: KEY.to_owned(),
        faults: faults.clone(),
        heartbeat: Duration::from_millis(300),
        destroy_delay: Duration::from_millis(10),
        ..FakeOptions::default()
    })
    .await
    .expect("fake starts");
    let b = Backend::with_options(options(fake.url()));
    // Generous: the machine may be busy, and python3 must start well inside the budget.
    let policy = LfxPolicy {
        timeout_seconds: 5,
        ..LfxPolicy::default()
    };
    let res = b.run("print(1)", None, &policy).await;
    let mut problems = Vec::new();
    if let Err(e) = &res
        && (e.to_string().contains(KEY) || format!("{e:?}").contains(KEY))
    {
        problems.push("the key leaked into the error".to_owned());
    }
    match classify(&res) {
        Ok(got) if got == want => {}
        Ok(got) => problems.push(format!("expected {want:?}, got {got:?}: {res:?}")),
        Err(m) => problems.push(m),
    }
    // Background destroys and lost-create recovery finish on their own; shutdown flushes the rest.
    let mut live = fake.stats().live;
    for _ in 0..150 {
        if live == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        live = fake.stats().live;
    }
    b.shutdown().await;
    let stats = fake.stats();
    if stats.live != 0 {
        problems.push(format!("{} guest(s) leaked: {stats:?}", stats.live));
    }
    fake.shutdown().await;
    if problems.is_empty() {
        None
    } else {
        Some(format!("[{faults}] {}", problems.join("; ")))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_fault_at_every_call() {
    let mut cases: Vec<(String, Expect)> = Vec::new();
    for route in ROUTES {
        for action in ACTIONS {
            cases.push((format!("{route}={action}#1"), expected(route, action)));
        }
    }
    // The name lookup that recovers a lost create can itself fail: it is retried.
    for action in ["500", "503", "reset", "stall", "malformed", "401"] {
        cases.push((format!("create=reset-after#1;list={action}#1"), Expect::Ran));
    }
    let n = cases.len();
    let problems: Vec<String> = futures::stream::iter(cases)
        .map(|(f, want)| one(f, want))
        .buffer_unordered(4)
        .filter_map(|p| async move { p })
        .collect()
        .await;
    assert!(
        problems.is_empty(),
        "{} of {n} cases failed:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[tokio::test]
async fn persistent_transient_faults_become_execution_errors() {
    for route in ["whoami", "shapes", "create", "upload", "egress_get"] {
        let faults = format!("{route}=503");
        let fake = FakeServer::start(FakeOptions {
            api_key: KEY.to_owned(),
            faults,
            ..FakeOptions::default()
        })
        .await
        .unwrap();
        let mut o = options(fake.url());
        o.backoff.budget = Duration::from_millis(400);
        let b = Backend::with_options(o);
        let e = b
            .run(
                "print(1)",
                None,
                &LfxPolicy {
                    timeout_seconds: 1,
                    ..LfxPolicy::default()
                },
            )
            .await
            .unwrap_err();
        let BackendError::Execution(msg) = &e else {
            panic!("{route}: {e:?}")
        };
        assert!(!msg.contains("may have run"), "{route}: {msg}");
        assert!(
            fake.stats().requests.get(route).copied().unwrap_or(0) >= 2,
            "{route} not retried"
        );
        b.shutdown().await;
        for _ in 0..100 {
            if fake.stats().live == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(fake.stats().live, 0, "{route}");
        fake.shutdown().await;
    }
}
