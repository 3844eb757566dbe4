//! The real-server harness: this client against a real `opensandbox-server` 1.1.1 on Docker,
//! with the harness's own execd double in every sandbox (`scripts/opensandbox-harness` sets it
//! all up and runs this test). Without `OPENSANDBOX_HARNESS_URL` it is skipped and says why.
//!
//! One sandbox at a time: create, execd readiness, the identity canary, exec (streamed output,
//! exit codes, the server-side timeout, the client's deadline, the idle clock fed by pings),
//! pause (an exec gets no answer: the idle clock ends it) and resume, upload, download (whole
//! and ranged), renew, list by metadata, delete; then the orphan sweep (by metadata and age) on
//! a second sandbox and the server's TTL expiry on a third. Each step prints its time; the last
//! lines are a table of them.
//!
//! Settings: `OPENSANDBOX_HARNESS_URL` (the server, e.g. `http://127.0.0.1:8080`),
//! `OPENSANDBOX_HARNESS_API_KEY`, `OPENSANDBOX_HARNESS_IMAGE` (an image already on the Docker
//! host: the server must not pull).

use std::time::{Duration, Instant};

use futures::StreamExt;
use opensandbox_api::{
    ByteRange, Client, CreateSandbox, Deletion, DownloadOptions, ErrorKind, ExecEvent, ExitStatus,
    Lifetime, NewDirectory, OffsetDateTime, RunCommand, SandboxFilter, SandboxInfo, SandboxState,
    StreamOptions, UploadFile,
};

/// The `created-by` metadata of every sandbox the harness makes (the script removes
/// containers carrying it as a label when a run ends).
const CREATED_BY: &str = "opensandbox-harness";

/// Where the harness is and what it may use.
struct Harness {
    client: Client,
    url: String,
    key: String,
    image: String,
    /// This run's id, in every sandbox's `harness-run` metadata.
    run: String,
    /// Step names and times, in order.
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
        let key = required("OPENSANDBOX_HARNESS_API_KEY");
        let image = required("OPENSANDBOX_HARNESS_IMAGE");
        let client = Client::builder()
            .domain(url.as_str())
            .api_key(key.as_str())
            .build()
            .expect("a client for OPENSANDBOX_HARNESS_URL");
        Some(Harness {
            client,
            url,
            key,
            image,
            run: format!("{:012x}", rand::random::<u64>() >> 16),
            times: Vec::new(),
        })
    }

    /// Notes how long `name` took since `start`, and prints it.
    fn took(&mut self, name: &str, start: Instant) -> Duration {
        let d = start.elapsed();
        eprintln!("harness: {name:<44} {:>8.1} ms", d.as_secs_f64() * 1e3);
        self.times.push((name.to_owned(), d));
        d
    }

    /// A create request for this run: the image, `sleep infinity`, the smallest limits and
    /// the metadata the sweep finds.
    fn request(&self, role: &str, lifetime: Duration) -> CreateSandbox {
        CreateSandbox::from_image(self.image.as_str(), ["sleep", "infinity"])
            .resource("cpu", "500m")
            .resource("memory", "256Mi")
            .metadata("created-by", CREATED_BY)
            .metadata("harness-run", self.run.as_str())
            .metadata("harness-role", role)
            .lifetime(Lifetime::After(lifetime))
    }

    fn run_filter(&self) -> SandboxFilter {
        SandboxFilter::metadata("created-by", CREATED_BY).and_metadata("harness-run", &self.run)
    }

    /// Creates a sandbox and checks the server's answer.
    async fn create(&mut self, role: &str, lifetime: Duration) -> SandboxInfo {
        let start = Instant::now();
        let info = self
            .client
            .create_sandbox(&self.request(role, lifetime))
            .await
            .expect("create");
        self.took(&format!("create ({role}, POST answered)"), start);
        // Docker answers synchronously, after the container started.
        assert_eq!(info.state(), &SandboxState::Running, "{info:?}");
        let got = self.client.get_sandbox(&info.id).await.expect("get");
        assert_eq!(
            got.metadata.get("harness-role").map(String::as_str),
            Some(role)
        );
        let (created, expires) = (got.created().unwrap(), got.expires().unwrap());
        let ttl = (expires - created).as_seconds_f64();
        assert!(
            (ttl - lifetime.as_secs_f64()).abs() < 5.0,
            "expiresAt - createdAt = {ttl} s for a {lifetime:?} timeout"
        );
        got
    }

    /// The orphan sweep: deletes this run's sandboxes created at least `min_age` ago, as a
    /// provider's sweep does with `created-by` alone. Returns the ids it deleted.
    async fn sweep(&self, min_age: Duration) -> Vec<String> {
        let cutoff = OffsetDateTime::now_utc() - min_age;
        let mut deleted = Vec::new();
        for sb in self
            .client
            .list_all_sandboxes(&self.run_filter())
            .await
            .expect("list")
        {
            let created = sb.created().expect("createdAt");
            if created <= cutoff {
                let gone = self.client.delete_sandbox(&sb.id).await.expect("delete");
                assert_eq!(gone, Deletion::Deleted);
                deleted.push(sb.id);
            }
        }
        deleted
    }
}

/// Runs `command` and collects it (1 MiB cap).
async fn collect(
    h: &Harness,
    id: &str,
    command: RunCommand,
    options: StreamOptions,
) -> opensandbox_api::Result<opensandbox_api::CommandOutput> {
    h.client
        .execd(id)
        .run(&command, options)
        .await?
        .collect_output(1 << 20)
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn against_a_real_opensandbox_server() {
    let Some(mut h) = Harness::from_env() else {
        eprintln!(
            "skipped: OPENSANDBOX_HARNESS_URL is not set (scripts/opensandbox-harness runs this \
             test against a real opensandbox-server 1.1.1 on Docker)"
        );
        return;
    };
    eprintln!(
        "harness: server {}, image {}, run {}",
        h.url, h.image, h.run
    );
    let total = Instant::now();
    let (client, filter) = (h.client.clone(), h.run_filter());
    let outcome = tokio::spawn(async move {
        steps(&mut h).await;
        h
    })
    .await;
    match outcome {
        Ok(h) => {
            eprintln!(
                "\nharness: every step passed in {:.1} s",
                total.elapsed().as_secs_f64()
            );
            for (name, d) in &h.times {
                eprintln!("  {name:<44} {:>8.1} ms", d.as_secs_f64() * 1e3);
            }
        }
        Err(failure) => {
            // Whatever this run made goes, then the failure is reported.
            if let Ok(left) = client.list_all_sandboxes(&filter).await {
                for sb in left {
                    let _ = client.delete_sandbox(&sb.id).await;
                }
            }
            std::panic::resume_unwind(failure.into_panic());
        }
    }
}

async fn steps(h: &mut Harness) {
    // A wrong key is refused before anything else is looked at.
    let start = Instant::now();
    let wrong = Client::builder()
        .domain(h.url.as_str())
        .api_key(format!("{}-wrong", h.key))
        .build()
        .unwrap();
    let err = wrong
        .list_sandboxes(&SandboxFilter::default(), 1)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Auth, "{err}");
    assert!(!err.to_string().contains(&h.key), "the key leaked: {err}");
    assert!(
        !format!("{err:?}").contains(&h.key),
        "the key leaked: {err:?}"
    );
    h.took("wrong key refused (401)", start);

    // No sandbox of this run may exist yet: the list must be able to come back empty.
    assert!(
        h.client
            .list_all_sandboxes(&h.run_filter())
            .await
            .unwrap()
            .is_empty()
    );

    // --- the main sandbox ---
    let sb = h.create("main", Duration::from_secs(600)).await;
    let id = sb.id.clone();
    let execd = h.client.execd(&id);
    let start = Instant::now();
    execd
        .wait_until_ready(Duration::from_secs(30), Duration::from_millis(100))
        .await
        .expect("execd answers /ping through the proxy");
    h.took("execd ready (/ping through the proxy)", start);

    // The identity canary: the server injects OPENSANDBOX_ID; a host-mode server with two
    // sandboxes would answer with the other one's.
    let start = Instant::now();
    let out = collect(
        h,
        &id,
        RunCommand::shell("echo \"$OPENSANDBOX_ID\""),
        StreamOptions::default(),
    )
    .await
    .unwrap();
    assert_eq!(out.stdout.trim_end(), id);
    assert_eq!(out.exit, ExitStatus::Code(0));
    h.took("exec: identity canary ($OPENSANDBOX_ID)", start);

    // Streamed: each line reaches the client while the command still runs.
    let start = Instant::now();
    let mut stream = execd
        .run(
            &RunCommand::shell(
                "for i in 1 2 3; do echo \"line $i\"; echo \"err $i\" >&2; sleep 0.5; done",
            )
            .cwd("/tmp"),
            StreamOptions::default(),
        )
        .await
        .unwrap();
    let mut stdout_at = Vec::new();
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let mut saw_init = false;
    while let Some(event) = stream.next().await {
        match event.unwrap() {
            ExecEvent::Init { command_id } => saw_init = !command_id.is_empty(),
            ExecEvent::Stdout { text, .. } => {
                stdout_at.push(start.elapsed());
                stdout.push(text);
            }
            ExecEvent::Stderr { text, .. } => stderr.push(text),
            _ => {}
        }
    }
    let ended = start.elapsed();
    assert!(saw_init);
    assert_eq!(stdout, ["line 1", "line 2", "line 3"]);
    assert_eq!(stderr, ["err 1", "err 2", "err 3"]);
    assert_eq!(stream.exit_status(), ExitStatus::Code(0));
    assert!(
        ended >= Duration::from_millis(1400) && stdout_at[0] + Duration::from_millis(900) < ended,
        "not streamed: first line at {:?}, end at {ended:?}",
        stdout_at[0]
    );
    eprintln!("harness:   lines arrived at {stdout_at:?} (end {ended:?})");
    h.took("exec: streamed 3 lines over 1.5 s", start);

    // Exit codes as the SDK derives them; one that cannot start has none.
    let start = Instant::now();
    for (command, want) in [
        (RunCommand::shell("exit 3"), ExitStatus::Code(3)),
        (RunCommand::shell("false"), ExitStatus::Code(1)),
        (RunCommand::shell("true"), ExitStatus::Code(0)),
        (RunCommand::argv(["/no/such/program"]), ExitStatus::Unknown),
    ] {
        let out = collect(h, &id, command.clone(), StreamOptions::default())
            .await
            .unwrap();
        assert_eq!(out.exit, want, "{command:?}: {out:?}");
    }
    h.took("exec: exit codes 3, 1, 0, cannot start", start);

    // Per-line frames collect with their line breaks, per stream.
    let start = Instant::now();
    let out = collect(
        h,
        &id,
        RunCommand::shell("printf 'a\\nb\\n'; echo c; echo e1 >&2; echo e2 >&2")
            .env("HARNESS_VAR", "v"),
        StreamOptions::default(),
    )
    .await
    .unwrap();
    assert_eq!(
        (out.stdout.as_str(), out.stderr.as_str()),
        ("a\nb\nc", "e1\ne2")
    );
    h.took("exec: collected output keeps line breaks", start);

    // The server-side timeout (execd kills the process group, reports -1).
    let start = Instant::now();
    let out = collect(
        h,
        &id,
        RunCommand::shell("echo before; sleep 30; echo after").timeout(Duration::from_secs(1)),
        StreamOptions::default(),
    )
    .await
    .unwrap();
    let d = h.took("exec: timeout 1 s (execd kills, exit -1)", start);
    assert_eq!(out.exit, ExitStatus::Code(-1), "{out:?}");
    assert_eq!(out.stdout, "before");
    assert!(d < Duration::from_secs(5), "{d:?}");

    // The client's own deadline: the stream ends, the connection closes, execd kills the
    // command's process group.
    let start = Instant::now();
    let err = collect(
        h,
        &id,
        RunCommand::shell("sleep 31; echo never"),
        StreamOptions {
            deadline: Some(Duration::from_secs(1)),
            ..StreamOptions::default()
        },
    )
    .await
    .unwrap_err();
    let d = h.took("exec: client deadline 1 s", start);
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    assert!(d < Duration::from_secs(3), "{d:?}");
    let start = Instant::now();
    let out = collect(
        h,
        &id,
        RunCommand::shell(
            "for i in $(seq 1 50); do found=; for p in /proc/[0-9]*; do \
             case \"$(tr '\\0' ' ' < $p/cmdline 2>/dev/null)\" in 'sleep 31 '*) found=$p;; esac; \
             done; [ -z \"$found\" ] && { echo gone; exit 0; }; sleep 0.1; done; echo alive",
        ),
        StreamOptions::default(),
    )
    .await
    .unwrap();
    assert_eq!(out.stdout, "gone", "the abandoned command still runs");
    h.took("exec: abandoned command killed", start);

    // The idle clock is fed by execd's pings through the proxy: a 7 s silence passes a 5 s
    // idle limit.
    let start = Instant::now();
    let mut stream = execd
        .run(
            &RunCommand::shell("sleep 7; echo awake"),
            StreamOptions {
                idle_timeout: Duration::from_secs(5),
                ..StreamOptions::default()
            },
        )
        .await
        .unwrap();
    let (mut pings, mut text) = (0, String::new());
    while let Some(event) = stream.next().await {
        match event.expect("pings keep the stream alive") {
            ExecEvent::Ping => pings += 1,
            ExecEvent::Stdout { text: t, .. } => text.push_str(&t),
            _ => {}
        }
    }
    assert_eq!(text, "awake");
    assert!(pings >= 2, "{pings} pings in 7 s");
    h.took("exec: 7 s silent, 5 s idle limit, pings", start);

    // Paused (Docker's freezer): an exec gets no answer at all, so the idle clock ends it;
    // after resume the sandbox works again. Whether the command sent while paused ran after
    // the resume is reported, not asserted (a provider destroys such a sandbox instead).
    let start = Instant::now();
    h.client.pause_sandbox(&id).await.unwrap();
    let paused = Instant::now();
    loop {
        let info = h.client.get_sandbox(&id).await.unwrap();
        if info.state() == &SandboxState::Paused {
            break;
        }
        assert!(paused.elapsed() < Duration::from_secs(10), "{info:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let err = collect(
        h,
        &id,
        RunCommand::shell("touch /tmp/sent-while-paused"),
        StreamOptions {
            idle_timeout: Duration::from_secs(2),
            ..StreamOptions::default()
        },
    )
    .await
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Idle, "{err}");
    h.took("pause; exec on it ends by the 2 s idle clock", start);
    let start = Instant::now();
    h.client.resume_sandbox(&id).await.unwrap();
    h.client
        .wait_until_running(&id, Duration::from_secs(10), Duration::from_millis(100))
        .await
        .unwrap();
    execd
        .wait_until_ready(Duration::from_secs(10), Duration::from_millis(100))
        .await
        .unwrap();
    h.took("resume; execd answers again", start);
    let out = collect(
        h,
        &id,
        RunCommand::shell(
            "sleep 1; if [ -e /tmp/sent-while-paused ]; then echo ran; else echo 'did not run'; fi",
        ),
        StreamOptions::default(),
    )
    .await
    .unwrap();
    assert_eq!(out.exit, ExitStatus::Code(0));
    eprintln!(
        "harness:   the command sent while paused {} after the resume",
        out.stdout
    );

    // Upload, then read it back three ways: through a command, whole, and ranged.
    let mut data: Vec<u8> = (0..=255u8).cycle().take(64 * 1024).collect();
    data.extend((0..192 * 1024).map(|_| rand::random::<u8>()));
    let start = Instant::now();
    execd
        .make_dirs(&[NewDirectory::new("/workspace/harness", 0o755)])
        .await
        .unwrap();
    execd
        .upload(&[
            UploadFile::new("/workspace/harness/data.bin", data.clone()).mode(0o640),
            UploadFile::new("/workspace/harness/note.txt", "uploaded by the harness\n"),
        ])
        .await
        .unwrap();
    h.took("upload: 256 KiB + a text file (multipart)", start);
    let info = execd
        .file_info(&["/workspace/harness/data.bin"])
        .await
        .unwrap();
    let info = &info["/workspace/harness/data.bin"];
    assert_eq!(info.size, data.len() as u64);
    assert_eq!(info.permissions(), Some(0o640));
    let out = collect(
        h,
        &id,
        RunCommand::shell("cat note.txt; wc -c < data.bin; stat -c %a data.bin")
            .cwd("/workspace/harness"),
        StreamOptions::default(),
    )
    .await
    .unwrap();
    assert_eq!(
        out.stdout,
        format!("uploaded by the harness\n{}\n640", data.len())
    );
    let listed = execd.list_dir("/workspace/harness", 1).await.unwrap();
    let names: Vec<&str> = listed.iter().map(|f| f.path.as_str()).collect();
    assert!(
        names.contains(&"/workspace/harness/data.bin")
            && names.contains(&"/workspace/harness/note.txt"),
        "{names:?}"
    );

    let start = Instant::now();
    let whole = execd
        .download(
            "/workspace/harness/data.bin",
            DownloadOptions::capped(1 << 20),
        )
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    h.took("download: 256 KiB whole", start);
    assert!(
        whole[..] == data[..],
        "the download differs from the upload"
    );
    let start = Instant::now();
    let ranged = execd
        .download(
            "/workspace/harness/data.bin",
            DownloadOptions::capped(1 << 20).range(ByteRange {
                start: 100_000,
                end: Some(100_999),
            }),
        )
        .await
        .unwrap();
    let range = ranged.content_range().expect("206 with Content-Range");
    assert_eq!(
        (range.start, range.end, range.total),
        (100_000, 100_999, Some(data.len() as u64))
    );
    let part = ranged.bytes().await.unwrap();
    assert!(part[..] == data[100_000..101_000]);
    h.took("download: 1000 bytes ranged (206)", start);
    let err = execd
        .download("/workspace/harness/data.bin", DownloadOptions::capped(1000))
        .await;
    let err = match err {
        Ok(d) => d.bytes().await.unwrap_err(),
        Err(e) => e,
    };
    assert_eq!(err.kind(), ErrorKind::TooLarge, "{err}");

    // Renew (the client clamps; the server accepts a shorter expiry).
    let start = Instant::now();
    let renewal = h
        .client
        .renew_expiration(&id, Duration::from_secs(7200), Duration::from_secs(300))
        .await
        .unwrap();
    assert!(renewal.clamped);
    let got = h.client.get_sandbox(&id).await.unwrap();
    let left = (got.expires().unwrap() - OffsetDateTime::now_utc()).as_seconds_f64();
    assert!((290.0..=301.0).contains(&left), "{left} s left after renew");
    h.took("renew (clamped to 300 s)", start);

    // List by metadata (AND), with state.
    let start = Instant::now();
    let found = h
        .client
        .list_all_sandboxes(
            &h.run_filter()
                .and_metadata("harness-role", "main")
                .state(SandboxState::Running),
        )
        .await
        .unwrap();
    assert_eq!(
        found.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
        [id.as_str()]
    );
    let none = h
        .client
        .list_all_sandboxes(&h.run_filter().and_metadata("harness-role", "other"))
        .await
        .unwrap();
    assert!(none.is_empty(), "{none:?}");
    h.took("list by metadata (found 1, then 0)", start);

    // Delete: gone at once, a second delete is a 404.
    let start = Instant::now();
    assert_eq!(
        h.client.delete_sandbox(&id).await.unwrap(),
        Deletion::Deleted
    );
    h.took("delete", start);
    let err = h.client.get_sandbox(&id).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    assert_eq!(
        h.client.delete_sandbox(&id).await.unwrap(),
        Deletion::AlreadyGone
    );
    assert!(
        h.client
            .list_all_sandboxes(&h.run_filter())
            .await
            .unwrap()
            .is_empty()
    );

    // --- the orphan sweep, on a sandbox nobody remembers ---
    let orphan = h.create("orphan", Duration::from_secs(600)).await;
    let start = Instant::now();
    assert!(
        h.sweep(Duration::from_secs(3600)).await.is_empty(),
        "a young sandbox was swept"
    );
    h.client.get_sandbox(&orphan.id).await.expect("still there");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let swept = h.sweep(Duration::from_secs(1)).await;
    assert_eq!(swept, std::slice::from_ref(&orphan.id));
    let err = h.client.get_sandbox(&orphan.id).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    h.took("orphan sweep (age 1 h: none; 1 s: it)", start);

    // --- TTL expiry: the server deletes a sandbox at its timeout (60 s, the minimum) ---
    let ttl = h.create("ttl", Duration::from_secs(60)).await;
    let expires = ttl.expires().unwrap();
    let start = Instant::now();
    h.client
        .execd(&ttl.id)
        .wait_until_ready(Duration::from_secs(30), Duration::from_millis(100))
        .await
        .unwrap();
    // Quiet until shortly before the expiry, then poll. On expiry the server kills the
    // container and then removes it: in between, a GET shows it `Failed`
    // (`CONTAINER_EXITED_ERROR`, exit 137).
    let until = expires - OffsetDateTime::now_utc() - time::Duration::seconds(2);
    if until.is_positive() {
        tokio::time::sleep(until.unsigned_abs()).await;
    }
    let mut left_running: Option<(OffsetDateTime, String)> = None;
    let gone_at = loop {
        let now = OffsetDateTime::now_utc();
        match h.client.get_sandbox(&ttl.id).await {
            Ok(info) if info.state() == &SandboxState::Running => {
                assert!(left_running.is_none(), "Running again: {info:?}");
            }
            Ok(info) => {
                assert!(
                    now > expires - time::Duration::seconds(1),
                    "left Running before its expiry: {info:?}"
                );
                left_running.get_or_insert((
                    now,
                    format!("{} ({:?})", info.status.state, info.status.reason),
                ));
            }
            Err(e) if e.kind() == ErrorKind::NotFound => break now,
            Err(e) => panic!("get during the TTL wait: {e}"),
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "not expired after 120 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let late = (gone_at - expires).as_seconds_f64();
    h.took("TTL expiry (timeout 60 s; waited)", start);
    if let Some((at, state)) = &left_running {
        eprintln!(
            "harness:   {state} {:+.2} s after its expiresAt",
            (*at - expires).as_seconds_f64()
        );
    }
    eprintln!("harness:   gone (404) {late:+.2} s after its expiresAt");
    assert!(
        late > -1.0 && late < 10.0,
        "expired {late} s after expiresAt"
    );
    assert!(
        h.client
            .list_all_sandboxes(&h.run_filter())
            .await
            .unwrap()
            .is_empty()
    );
}
