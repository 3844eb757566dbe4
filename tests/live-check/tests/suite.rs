//! Runs the real `createos-live-check` binary against a fake control plane started by each
//! test: every check passes, a broken fact is reported with both values and the fake's file,
//! no key means exit 3 and no request, and SIGINT mid-suite leaves no guest behind.

use std::process::Stdio;
use std::time::Duration;

use createos_fake::{FakeOptions, FakeServer};
use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};

const KEY: &str = "lc-test-secret-key-5b1d";

/// A fake whose heartbeats and transitions are quick enough for a short run.
async fn fake(faults: &str, latency: Duration) -> FakeServer {
    FakeServer::start(FakeOptions {
        api_key: KEY.to_owned(),
        faults: faults.to_owned(),
        latency,
        heartbeat: Duration::from_millis(200),
        resume_delay: Duration::from_millis(150),
        destroy_delay: Duration::from_millis(500),
        ..FakeOptions::default()
    })
    .await
    .expect("fake starts")
}

/// The binary, pointed at `base_url`, with `key` (or none) and a clean environment.
fn command(base_url: &str, key: Option<&str>) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_createos-live-check"));
    cmd.args(["--quiet-secs", "1"])
        .env("CREATEOS_LIVE_BASE_URL", base_url)
        .env_remove("CREATEOS_LIVE_API_KEY")
        .env_remove("CREATEOS_API_KEY")
        .env_remove("CREATEOS_SANDBOX_API_KEY");
    for proxy in [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
    ] {
        cmd.env_remove(proxy);
    }
    if let Some(k) = key {
        cmd.env("CREATEOS_LIVE_API_KEY", k);
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// Waits (bounded) for the child and returns `(exit code, stdout, stderr)`.
async fn finish(mut child: Child) -> (Option<i32>, String, String) {
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let read = async {
        let (mut o, mut e) = (String::new(), String::new());
        let (r1, r2) = tokio::join!(out.read_to_string(&mut o), err.read_to_string(&mut e));
        r1.expect("read stdout");
        r2.expect("read stderr");
        let status = child.wait().await.expect("wait");
        (status.code(), o, e)
    };
    tokio::time::timeout(Duration::from_secs(300), read)
        .await
        .expect("the suite ends")
}

/// Whether the totals line reads `passed` passes and `failed` failures, allowing the one
/// timing-dependent check (a name probe while the fake is still `destroying`, 500 ms) to have
/// been skipped instead of passed on a slow machine.
fn totals_are(out: &str, passed: usize, failed: usize) -> bool {
    let exact = format!("checks: {passed} passed, {failed} failed, 5 skipped");
    let slow = format!("checks: {} passed, {failed} failed, 6 skipped", passed - 1);
    out.contains(&exact)
        || (out.contains(&slow)
            && verdict(out, "name.held-while-destroying").is_some_and(|l| l.starts_with("SKIP")))
}

/// The verdict line of a check (`PASS  id: ...`), if printed.
fn verdict<'a>(out: &'a str, id: &str) -> Option<&'a str> {
    out.lines().find(|l| {
        l.get(6..)
            .is_some_and(|rest| rest.starts_with(&format!("{id}:")))
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn every_check_passes_against_the_fake_and_no_guest_is_left() {
    let fake = fake("", Duration::ZERO).await;
    let child = command(&fake.url(), Some(KEY)).spawn().expect("spawn");
    let (code, out, err) = finish(child).await;
    assert_eq!(code, Some(0), "stdout:\n{out}\nstderr:\n{err}");
    assert!(!out.contains("FAIL"), "{out}");
    assert!(totals_are(&out, 50, 0), "{out}");
    for id in [
        "egress.deny-all-blocks-public",
        "egress.link-local-hole",
        "egress.hostname-not-enforced",
        "egress.cidr32-enforced",
        "egress.bare-ip-enforced",
    ] {
        let line = verdict(&out, id).unwrap_or_else(|| panic!("{id} missing:\n{out}"));
        assert!(line.starts_with("SKIP"), "{line}");
    }
    assert_eq!(
        out.matches("reason: the fake does not enforce egress")
            .count(),
        5,
        "{out}"
    );
    let line = verdict(&out, "egress.single-address-readback").expect("reported");
    assert!(line.starts_with("PASS"), "{line}");
    let stats = fake.stats();
    assert_eq!(stats.live, 0, "{stats:?}");
    // Against loopback the bare-address guest is never created (it only serves enforcement).
    assert_eq!(stats.created, 4, "{stats:?}");
    assert!(
        out.contains("created 4, destroyed 4, guest-seconds "),
        "{out}"
    );
    assert!(out.contains("sweep: 0 leftover guest(s)"), "{out}");
    assert!(!out.contains(KEY) && !err.contains(KEY), "the key leaked");
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_broken_fact_is_reported_with_both_values_and_the_fakes_file() {
    // The first GET .../egress (the deny-all read-back) answers 418: that fact breaks, and
    // only that one.
    let fake = fake("egress_get=418#1", Duration::ZERO).await;
    let child = command(&fake.url(), Some(KEY)).spawn().expect("spawn");
    let (code, out, err) = finish(child).await;
    assert_eq!(code, Some(1), "stdout:\n{out}\nstderr:\n{err}");
    let line = verdict(&out, "egress.deny-all-readback").expect("reported");
    assert!(line.starts_with("FAIL"), "{line}");
    let block: Vec<&str> = out
        .lines()
        .skip_while(|l| !l.starts_with("FAIL  egress.deny-all-readback"))
        .take(4)
        .collect();
    let block = block.join("\n");
    assert!(
        block.contains("expected: [\"240.0.0.0/4\"] from both"),
        "{block}"
    );
    assert!(
        block.contains("measured: GET .../egress HTTP 418"),
        "{block}"
    );
    assert!(
        block.contains("projection Some([\"240.0.0.0/4\"])"),
        "{block}"
    );
    assert!(
        block.contains("disagrees with the fake: tests/fake-control-plane/src/handlers.rs"),
        "{block}"
    );
    assert!(totals_are(&out, 49, 1), "{out}");
    assert_eq!(fake.stats().live, 0);
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn without_a_key_it_says_so_exits_3_and_sends_nothing() {
    let fake = fake("", Duration::ZERO).await;
    let child = command(&fake.url(), None).spawn().expect("spawn");
    let (code, out, err) = finish(child).await;
    assert_eq!(code, Some(3), "stdout:\n{out}\nstderr:\n{err}");
    assert!(err.contains("CREATEOS_LIVE_API_KEY"), "{err}");
    assert!(err.contains("nothing was checked"), "{err}");
    let sent: u64 = fake.stats().requests.values().sum();
    assert_eq!(sent, 0);
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sigint_mid_suite_destroys_every_guest() {
    // Latency keeps the suite busy long enough to be interrupted while a guest exists.
    let fake = fake("", Duration::from_millis(40)).await;
    let child = command(&fake.url(), Some(KEY)).spawn().expect("spawn");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while fake.stats().created == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no guest was ever created"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        fake.stats().live,
        1,
        "one guest exists when the signal is sent"
    );
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id().expect("pid")).expect("pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).expect("SIGINT");
    let (code, out, err) = finish(child).await;
    assert_eq!(code, Some(130), "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("SIGINT: stopping the suite"), "{out}");
    assert!(out.contains("not reached: interrupted by SIGINT"), "{out}");
    let stats = fake.stats();
    assert_eq!(
        stats.live, 0,
        "a guest outlived the interrupted suite: {stats:?}"
    );
    let n = stats.created;
    assert!(
        out.contains(&format!("created {n}, destroyed {n}, guest-seconds ")),
        "{out}\n{stats:?}"
    );
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_create_refused_once_with_503_is_retried_and_the_suite_passes() {
    // 503 carries `Retry-After: 0` in the fake; the contract retries 503 for every method.
    let fake = fake("create=503#1", Duration::ZERO).await;
    let child = command(&fake.url(), Some(KEY)).spawn().expect("spawn");
    let (code, out, err) = finish(child).await;
    assert_eq!(code, Some(0), "stdout:\n{out}\nstderr:\n{err}");
    assert!(totals_are(&out, 50, 0), "{out}");
    // Answered creates: four guests, three refused probes, and the name probe while
    // `destroying` when it ran; plus the one refused with 503.
    let held = verdict(&out, "name.held-while-destroying").expect("reported");
    let answered = if held.starts_with("PASS") { 8 } else { 7 };
    assert_eq!(
        fake.stats().requests.get("create"),
        Some(&(answered + 1)),
        "{out}"
    );
    assert_eq!(fake.stats().live, 0);
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_guest_that_cannot_be_deleted_is_named_and_fails_the_run() {
    let fake = fake("delete=400", Duration::ZERO).await;
    let child = command(&fake.url(), Some(KEY)).spawn().expect("spawn");
    let (code, out, err) = finish(child).await;
    assert_eq!(code, Some(1), "stdout:\n{out}\nstderr:\n{err}");
    let line = verdict(&out, "destroy.answer").expect("reported");
    assert!(line.starts_with("FAIL"), "{line}");
    assert!(out.contains("cleanup: guests possibly left: [("), "{out}");
    assert!(out.contains("sweep: 1 leftover guest(s)"), "{out}");
    assert!(
        out.contains("created 1, destroyed 0, guest-seconds "),
        "{out}"
    );
    assert_eq!(fake.stats().live, 1);
    fake.shutdown().await;
}
