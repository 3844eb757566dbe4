//! The CreateOS Sandbox component against the fake control plane, whose guests run as real
//! local processes: guest reuse (one guest over runs, resume of a paused guest, egress drift
//! refused, a create race adopted, a policy change addressing another guest, a short
//! auto-pause backstop raised for a longer run, a kept guest destroyed when its program's end
//! was not observed), fresh guests destroyed on every path, commands no exec argument can carry
//! refused before any request, returned files (caps, hostile archives), faults, the reap
//! of old reused guests, and separation: one kept guest per session, only the current run's
//! files returned (also from runs overlapping in one kept guest), reuse refused without a
//! flow id.

#![allow(clippy::too_many_lines, clippy::many_single_char_names)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use createos_fake::{FakeOptions, FakeServer};
use futures::StreamExt;
use futures::future::BoxFuture;
use langflow_component::{
    ArchiveLimits, ComponentInputs, ComponentOptions, ComponentOutput, Reuse, SandboxComponent,
    SurfaceOptions,
};
use sandbox_core::control::{
    AgedGuest, CallError, ControlPlane, CreateGuest, Download, ExecRequest, ExecStream, GuestInfo,
};
use sandbox_core::reaper::ReaperConfig;
use sandbox_core::retry::Backoff;
use sandbox_core::session::{Connector, Session};
use sandbox_core::shapes::Shape;
use sandbox_core::{ErrorKind, SandboxError};
use sandbox_createos::CreateOsControlPlane;
use secrecy::SecretString;

/// A key long enough that any fragment of it in a message is a leak worth catching.
const KEY: &str = "kq7Zr2xVw9Lm4Tn8Yp3B";

/// Short retries, so faults resolve in seconds.
fn quick() -> Backoff {
    let millis = Duration::from_millis;
    Backoff {
        budget: Duration::from_secs(6),
        max: millis(200),
        base: millis(20),
    }
}

async fn fake_with(faults: &str, latency_ms: u64) -> FakeServer {
    FakeServer::start(FakeOptions {
        api_key: KEY.to_owned(),
        faults: faults.to_owned(),
        latency: Duration::from_millis(latency_ms),
        heartbeat: Duration::from_millis(300),
        resume_delay: Duration::from_millis(200),
        ..FakeOptions::default()
    })
    .await
    .expect("fake control plane starts")
}

/// What a test does to the control plane between the component and the fake.
#[derive(Clone, Default)]
enum Twist {
    /// Nothing.
    #[default]
    None,
    /// Downloads arrive without a declared length, in small chunks.
    UnsizedDownloads,
    /// Every download answers these bytes instead of the guest's file.
    Archive(Bytes),
}

/// The HTTP control plane, twisted as the test says.
struct Hostile {
    http: Arc<dyn ControlPlane>,
    twist: Twist,
}

impl ControlPlane for Hostile {
    fn download(
        &self,
        id: String,
        path: String,
        max_bytes: Option<u64>,
    ) -> BoxFuture<'_, Result<Download, CallError>> {
        match self.twist.clone() {
            Twist::None => self.http.download(id, path, max_bytes),
            Twist::Archive(bytes) => Box::pin(async move {
                Ok(Download {
                    content_length: Some(bytes.len() as u64),
                    body: futures::stream::iter([Ok(bytes)]).boxed(),
                })
            }),
            Twist::UnsizedDownloads => Box::pin(async move {
                // No cap asked of the server: only the component's counting can stop it.
                let whole = self.http.download(id, path, None).await?;
                let small = whole
                    .body
                    .map(|c| {
                        c.map(|b| {
                            futures::stream::iter(
                                b.chunks(256)
                                    .map(|p| Ok(Bytes::copy_from_slice(p)))
                                    .collect::<Vec<_>>(),
                            )
                        })
                    })
                    .filter_map(|c| async move { c.ok() })
                    .flatten()
                    .boxed();
                Ok(Download {
                    content_length: None,
                    body: small,
                })
            }),
        }
    }
    fn exec_stream(
        &self,
        i: String,
        r: ExecRequest,
    ) -> BoxFuture<'_, Result<ExecStream, CallError>> {
        self.http.exec_stream(i, r)
    }
    fn create(&self, r: CreateGuest) -> BoxFuture<'_, Result<GuestInfo, CallError>> {
        self.http.create(r)
    }
    fn upload(&self, i: String, p: String, d: Bytes) -> BoxFuture<'_, Result<(), CallError>> {
        self.http.upload(i, p, d)
    }
    fn find_by_name(&self, n: String) -> BoxFuture<'_, Result<Option<GuestInfo>, CallError>> {
        self.http.find_by_name(n)
    }
    fn egress(&self, i: String) -> BoxFuture<'_, Result<Option<Vec<String>>, CallError>> {
        self.http.egress(i)
    }
    fn get(&self, i: String) -> BoxFuture<'_, Result<GuestInfo, CallError>> {
        self.http.get(i)
    }
    fn resume(&self, i: String) -> BoxFuture<'_, Result<GuestInfo, CallError>> {
        self.http.resume(i)
    }
    fn set_auto_pause(&self, i: String, s: u32) -> BoxFuture<'_, Result<GuestInfo, CallError>> {
        self.http.set_auto_pause(i, s)
    }
    fn destroy(&self, i: String) -> BoxFuture<'_, Result<(), CallError>> {
        self.http.destroy(i)
    }
    fn list_guests(&self, p: String) -> BoxFuture<'_, Result<Vec<GuestInfo>, CallError>> {
        self.http.list_guests(p)
    }
    fn list_guests_aged(&self, p: String) -> BoxFuture<'_, Result<Vec<AgedGuest>, CallError>> {
        self.http.list_guests_aged(p)
    }
    fn check_credential(&self) -> BoxFuture<'_, Result<String, CallError>> {
        self.http.check_credential()
    }
    fn list_shapes(&self) -> BoxFuture<'_, Result<Vec<Shape>, CallError>> {
        self.http.list_shapes()
    }
}

/// The options of a component pointed at `fake` through `twist`, with `extra` settings.
fn options(fake: &FakeServer, twist: Twist, extra: &[(&str, &str)]) -> ComponentOptions {
    let mut env: HashMap<String, String> = HashMap::new();
    env.insert("CREATEOS_SANDBOX_API_KEY".into(), KEY.into());
    env.insert("CREATEOS_SANDBOX_BASE_URL".into(), fake.url());
    env.insert(
        "LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS".into(),
        "true".into(),
    );
    for (k, v) in extra {
        env.insert((*k).into(), (*v).into());
    }
    let connector: Connector = Arc::new(move |s, timeout| {
        let key = s.require_key()?;
        let http: Arc<dyn ControlPlane> =
            Arc::new(CreateOsControlPlane::new(key, &s.base_url, timeout)?);
        Ok(Arc::new(Hostile {
            http,
            twist: twist.clone(),
        }) as Arc<dyn ControlPlane>)
    });
    ComponentOptions {
        surface: SurfaceOptions {
            env: Arc::new(move |k| env.get(k).cloned()),
            session: Some(Session::new(connector, Duration::from_secs(2))),
            backoff: quick(),
            kill_after: Duration::from_millis(200),
            host_grace: Duration::from_millis(800),
            reaper: ReaperConfig {
                backoff: quick(),
                lookup_patience: Duration::from_secs(3),
            },
            shutdown_timeout: Duration::from_secs(5),
            orphan_sweep: false,
            ..SurfaceOptions::default()
        },
        ..ComponentOptions::default()
    }
}

fn component_with(fake: &FakeServer, twist: Twist, extra: &[(&str, &str)]) -> SandboxComponent {
    SandboxComponent::with_options(options(fake, twist, extra))
}

fn component(fake: &FakeServer) -> SandboxComponent {
    component_with(fake, Twist::None, &[])
}

/// The fake runs guest commands in the guest directory (cwd `/workspace`), so programs use
/// relative paths: `count` is `/workspace/count`.
const COUNTER: &str = "import os\n\
    n = int(open('count').read()) if os.path.exists('count') else 0\n\
    open('count', 'w').write(str(n + 1))\n\
    print('RUN_COUNT', n + 1)\n";

fn inputs(code: &str, reuse: Reuse) -> ComponentInputs {
    ComponentInputs {
        flow_id: "flow-7".into(),
        component_id: "CreateOSSandbox-x1y2z".into(),
        python_code: code.into(),
        reuse,
        timeout_seconds: 20,
        ..ComponentInputs::default()
    }
}

async fn run(c: &SandboxComponent, i: &ComponentInputs) -> ComponentOutput {
    match c.run(i).await {
        Ok(out) => out,
        Err(e) => panic!("run failed: {e}"),
    }
}

fn api(fake: &FakeServer) -> createos_api::Client {
    createos_api::Client::builder()
        .api_key(SecretString::from(KEY))
        .base_url(fake.url())
        .build()
        .unwrap()
}

/// No message shows the key or any 6-character piece of it.
fn assert_no_key(text: &str) {
    for start in 0..=KEY.len() - 6 {
        let piece = &KEY[start..start + 6];
        assert!(!text.contains(piece), "key fragment {piece:?} in: {text}");
    }
}

async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..200 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("never true: {what}");
}

#[tokio::test(flavor = "multi_thread")]
async fn reuse_on_one_guest_serves_three_runs() {
    let fake = fake_with("", 0).await;
    let c = component(&fake);
    let i = inputs(COUNTER, Reuse::Flow);
    let mut names = Vec::new();
    for n in 1..=3 {
        let out = run(&c, &i).await;
        assert_eq!(out.result, format!("RUN_COUNT {n}"), "{out:?}");
        assert_eq!(out.exit_code, 0);
        assert!(out.kept);
        assert_eq!(out.reused_guest, n > 1, "run {n}");
        assert!(out.sandbox_name.starts_with("lf-c-"));
        names.push(out.sandbox_name);
    }
    assert!(names.iter().all(|n| n == &names[0]), "{names:?}");
    let s = fake.stats();
    assert_eq!(s.created, 1, "one guest for three runs");
    assert_eq!(s.live, 1, "kept, not destroyed");
    // Shutdown leaves a kept guest alone.
    c.shutdown().await;
    assert_eq!(fake.stats().live, 1);
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_paused_guest_is_resumed_and_keeps_its_files() {
    let fake = fake_with("", 0).await;
    let c = component(&fake);
    let i = inputs(COUNTER, Reuse::Flow);
    let first = run(&c, &i).await;
    // Idle past the auto-pause backstop (timeout + 120 s): the fake pauses the guest.
    fake.advance_clock(Duration::from_secs(200));
    let info = api(&fake)
        .sandbox_handle(first.sandbox_id.clone())
        .refresh()
        .await
        .unwrap();
    assert_eq!(info.status.as_str(), "paused");
    let second = run(&c, &i).await;
    assert_eq!(second.result, "RUN_COUNT 2", "{second:?}");
    assert_eq!(second.sandbox_id, first.sandbox_id);
    assert!(second.reused_guest);
    assert_eq!(fake.stats().requests.get("resume").copied(), Some(1));
    assert_eq!(fake.stats().created, 1);
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_guest_whose_egress_drifted_is_refused_and_left_alone() {
    let fake = fake_with("", 0).await;
    let c = component(&fake);
    let i = inputs(COUNTER, Reuse::Flow);
    let first = run(&c, &i).await;
    api(&fake)
        .sandbox_handle(first.sandbox_id.clone())
        .set_egress(["*"])
        .await
        .unwrap();
    let e = c.run(&i).await.unwrap_err();
    assert!(e.kind().is_unavailable(), "{e}");
    assert!(e.message().contains("egress"), "{e}");
    assert!(e.message().contains("not used"), "{e}");
    // Nothing ran in it, and it was not destroyed: it is left as it is.
    let s = fake.stats();
    assert_eq!(s.created, 1);
    assert_eq!(s.live, 1);
    assert_eq!(s.requests.get("exec_stream").copied(), Some(1));
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn two_runs_racing_to_create_share_the_winner() {
    // Latency makes both runs look the name up (and find nothing) before either creates.
    let fake = fake_with("", 150).await;
    let c = component(&fake);
    let i = inputs(COUNTER, Reuse::Flow);
    let (a, b) = tokio::join!(c.run(&i), c.run(&i));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.sandbox_id, b.sandbox_id);
    let mut counts = [a.result.clone(), b.result.clone()];
    counts.sort();
    assert_eq!(counts, ["RUN_COUNT 1", "RUN_COUNT 2"]);
    let s = fake.stats();
    assert_eq!(s.created, 1, "exactly one guest under the name");
    assert_eq!(
        s.requests.get("create").copied(),
        Some(2),
        "the loser got 409"
    );
    assert!(
        a.reused_guest != b.reused_guest,
        "one created it, one adopted it"
    );
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn allow_network_on_off_on_uses_guests_a_b_a() {
    let fake = fake_with("", 0).await;
    let c = component(&fake);
    let mut ids = Vec::new();
    for allow in [false, true, false] {
        let i = ComponentInputs {
            allow_network: allow,
            ..inputs(COUNTER, Reuse::Flow)
        };
        ids.push(run(&c, &i).await);
    }
    assert_eq!(ids[0].sandbox_id, ids[2].sandbox_id);
    assert_ne!(ids[0].sandbox_id, ids[1].sandbox_id);
    assert_eq!(ids[2].result, "RUN_COUNT 2", "guest A kept its counter");
    assert_eq!(ids[1].result, "RUN_COUNT 1");
    let rules = |id: &str| {
        let api = api(&fake);
        let id = id.to_owned();
        async move { api.sandbox_handle(id).refresh().await.unwrap().egress }
    };
    assert_eq!(
        rules(&ids[0].sandbox_id).await,
        Some(vec!["240.0.0.0/4".to_owned()])
    );
    assert_eq!(rules(&ids[1].sandbox_id).await, Some(vec!["*".to_owned()]));
    assert_eq!(fake.stats().created, 2);
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn reuse_off_destroys_the_guest_on_success_on_failure_and_on_timeout() {
    let fake = fake_with("", 0).await;
    let c = component(&fake);
    let ok = run(&c, &inputs(COUNTER, Reuse::Off)).await;
    assert!(!ok.kept && !ok.reused_guest);
    assert!(ok.sandbox_name.starts_with("lf-") && !ok.sandbox_name.starts_with("lf-c-"));
    assert_eq!(fake.stats().live, 0);
    // A fresh guest every time: the counter starts over.
    assert_eq!(
        run(&c, &inputs(COUNTER, Reuse::Off)).await.result,
        "RUN_COUNT 1"
    );
    let failed = run(
        &c,
        &inputs("import sys\nprint('partial')\nsys.exit(3)", Reuse::Off),
    )
    .await;
    assert_eq!(failed.exit_code, 3);
    assert_eq!(failed.result, "partial");
    assert!(
        failed
            .error
            .as_deref()
            .is_some_and(|e| e.contains("code 3")),
        "{failed:?}"
    );
    assert_eq!(fake.stats().live, 0);
    let slow = ComponentInputs {
        timeout_seconds: 1,
        ..inputs(
            "import time\nprint('started', flush=True)\ntime.sleep(30)",
            Reuse::Off,
        )
    };
    let timed = run(&c, &slow).await;
    assert!(timed.timed_out, "{timed:?}");
    assert_eq!(timed.exit_code, -1);
    assert_eq!(timed.result, "started");
    assert!(
        timed
            .error
            .as_deref()
            .is_some_and(|e| e.contains("timed out"))
    );
    assert_eq!(fake.stats().live, 0);
    // An infrastructure failure after create destroys it too.
    fake.set_faults("exec_stream=500").unwrap();
    let e = c.run(&inputs(COUNTER, Reuse::Off)).await.unwrap_err();
    assert_no_key(&e.to_string());
    assert_eq!(fake.stats().live, 0, "{e}");
    assert_eq!(fake.stats().created, 5);
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_shell_command_runs_with_sh_instead_of_the_code() {
    let fake = fake_with("", 0).await;
    let c = component(&fake);
    let i = ComponentInputs {
        command: "echo from-sh; echo err >&2; exit 4".into(),
        ..inputs("print('not me')", Reuse::Off)
    };
    let out = run(&c, &i).await;
    assert_eq!(out.result, "from-sh");
    assert_eq!(out.stderr, "err");
    assert_eq!(out.exit_code, 4);
    assert_eq!(
        fake.stats().requests.get("upload"),
        None,
        "no program file for a command"
    );
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn refusals_name_the_nodes_inputs_and_create_nothing() {
    let fake = fake_with("", 0).await;
    let strict = component_with(
        &fake,
        Twist::None,
        &[(
            "LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS",
            "false",
        )],
    );
    let e = strict.run(&inputs(COUNTER, Reuse::Off)).await.unwrap_err();
    assert!(e.message().contains("Allow Network"), "{e}");
    assert!(e.message().contains("169.254.0.0/16"), "{e}");
    // The refusal can be resolved on the node itself, and says so first.
    assert!(
        e.message()
            .contains("Set Accept Link-Local Egress (accept_egress_exceptions) on the node"),
        "{e}"
    );
    assert!(
        e.message()
            .contains("LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS=true"),
        "{e}"
    );
    assert_eq!(fake.stats().created, 0);
    let accepted = run(
        &strict,
        &ComponentInputs {
            accept_egress_exceptions: true,
            ..inputs("print('accepted on the node')", Reuse::Off)
        },
    )
    .await;
    assert_eq!(accepted.result, "accepted on the node");
    assert_eq!(fake.stats().created, 1);
    strict.shutdown().await;
    fake.reset();
    let c = component(&fake);
    let cases: Vec<(ComponentInputs, &str)> = vec![
        (
            ComponentInputs {
                timeout_seconds: 0,
                ..inputs(COUNTER, Reuse::Off)
            },
            "timeout_seconds",
        ),
        (inputs("   ", Reuse::Off), "python_code"),
        (
            ComponentInputs {
                shape: "no-such-shape".into(),
                ..inputs(COUNTER, Reuse::Off)
            },
            "Shape (shape)=no-such-shape",
        ),
        (
            ComponentInputs {
                shape: "bad shape!".into(),
                ..inputs(COUNTER, Reuse::Off)
            },
            "Shape (shape)",
        ),
    ];
    for (i, needle) in cases {
        let e = c.run(&i).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Refused, "{e}");
        assert!(e.message().contains(needle), "{needle}: {e}");
    }
    assert_eq!(fake.stats().created, 0);
    fake.shutdown().await;
}

/// A program that writes returned files (relative to `/workspace`).
const WRITES_FILES: &str = "import os\n\
    os.makedirs('artifacts/sub', exist_ok=True)\n\
    open('artifacts/report.txt', 'w').write('hello files\\n')\n\
    open('artifacts/sub/data.bin', 'wb').write(bytes([0, 255, 1]))\n\
    os.symlink('/etc/passwd', 'artifacts/passwd-link')\n\
    os.link('artifacts/report.txt', 'artifacts/hard-link')\n\
    os.mkfifo('artifacts/a-fifo')\n\
    print('wrote')\n";

fn with_files(code: &str, reuse: Reuse) -> ComponentInputs {
    ComponentInputs {
        return_files: true,
        ..inputs(code, reuse)
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn files_come_back_and_links_and_fifos_do_not() {
    let fake = fake_with("", 0).await;
    let c = component(&fake);
    let out = run(&c, &with_files(WRITES_FILES, Reuse::Off)).await;
    assert_eq!(out.result, "wrote");
    let mut paths: Vec<&str> = out.files.iter().map(|f| f.path.as_str()).collect();
    paths.sort_unstable();
    // GNU tar stores the second name of a hard link as a link entry: skipped.
    assert!(
        paths == ["report.txt", "sub/data.bin"] || paths == ["hard-link", "sub/data.bin"],
        "{paths:?} {:?}",
        out.notes
    );
    let bin = out.files.iter().find(|f| f.path == "sub/data.bin").unwrap();
    assert_eq!(
        (bin.size, bin.text.as_deref(), bin.base64.as_deref()),
        (3, None, Some("AP8B"))
    );
    let notes = out.notes.join("\n");
    assert!(notes.contains("symbolic link"), "{notes}");
    assert!(notes.contains("hard link"), "{notes}");
    assert!(notes.contains("FIFO"), "{notes}");
    assert_eq!(fake.stats().live, 0);
    // Nothing asked, nothing archived.
    let plain = run(
        &c,
        &inputs(
            WRITES_FILES.replace("artifacts", "elsewhere").as_str(),
            Reuse::Off,
        ),
    )
    .await;
    assert!(plain.files.is_empty() && plain.notes.is_empty());
    // Asked, but no directory: a note.
    let none = run(&c, &with_files("print('no files')", Reuse::Off)).await;
    assert!(none.files.is_empty());
    assert_eq!(
        none.notes.len(),
        0,
        "the directory is made before the program: {:?}",
        none.notes
    );
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn more_than_256_files_are_cut_with_a_note() {
    let fake = fake_with("", 0).await;
    let c = component(&fake);
    let code = "import os\nos.makedirs('artifacts', exist_ok=True)\n\
        for i in range(300):\n    open(f'artifacts/f{i:03}.txt', 'w').write(str(i))\n";
    let out = run(&c, &with_files(code, Reuse::Off)).await;
    assert_eq!(out.files.len(), 256, "{:?}", out.notes);
    assert!(
        out.notes.iter().any(|n| n.contains("more than 256 files")),
        "{:?}",
        out.notes
    );
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_archive_cap_binds_from_content_length_and_mid_stream() {
    let fake = fake_with("", 0).await;
    // Random bytes do not compress: the archive is about as large as the file.
    let code = "import os\nos.makedirs('artifacts', exist_ok=True)\n\
        open('artifacts/noise.bin', 'wb').write(os.urandom(64 * 1024))\nprint('ok')\n";
    for twist in [Twist::None, Twist::UnsizedDownloads] {
        let c = component_with(&fake, twist.clone(), &[]);
        let small_cap = SandboxComponent::with_options(ComponentOptions {
            max_archive_bytes: 16 * 1024,
            ..options(&fake, twist, &[])
        });
        let out = run(&small_cap, &with_files(code, Reuse::Off)).await;
        assert_eq!(out.result, "ok", "the program's result stands");
        assert!(out.files.is_empty());
        let note = out.notes.join("\n");
        assert!(note.contains("16384-byte cap"), "{note}");
        assert_no_key(&note);
        assert_eq!(fake.stats().live, 0);
        // With the default 5 MiB cap the same file comes back.
        let out = run(&c, &with_files(code, Reuse::Off)).await;
        assert_eq!(out.files.len(), 1, "{:?}", out.notes);
        assert_eq!(out.files[0].size, 64 * 1024);
    }
    fake.shutdown().await;
}

/// A ustar header filled through `tar::Header`'s raw fields, so hostile names and link
/// targets survive as written (the checked setters would refuse them).
fn raw_header(name: &[u8], kind: u8, size: usize, link: &[u8]) -> tar::Header {
    let mut header = tar::Header::new_ustar();
    header.as_old_mut().name[..name.len()].copy_from_slice(name);
    header.as_old_mut().linkname[..link.len()].copy_from_slice(link);
    header.set_mode(0o644);
    header.set_size(size as u64);
    header.set_entry_type(tar::EntryType::new(kind));
    header.set_cksum();
    header
}

/// One raw member: name, type flag, content, link target.
type Raw<'a> = (&'a [u8], u8, Vec<u8>, &'a [u8]);

/// A gzip-compressed tar of raw members, as a hostile guest could hand back.
fn crafted(members: &[Raw<'_>]) -> Bytes {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    let mut archive = tar::Builder::new(gz);
    for (name, kind, body, link) in members {
        archive
            .append(&raw_header(name, *kind, body.len(), link), body.as_slice())
            .unwrap();
    }
    Bytes::from(archive.into_inner().unwrap().finish().unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn crafted_archives_yield_safe_members_and_notes() {
    let fake = fake_with("", 0).await;
    let many: Vec<String> = (0..300).map(|i| format!("m{i}")).collect();
    let cases: Vec<(&str, Bytes, Vec<&str>, &str)> = vec![
        (
            "escapes and links",
            crafted(&[
                (b"../../etc/cron.d/x", b'0', b"evil".to_vec(), b""),
                (b"/etc/passwd", b'0', b"evil".to_vec(), b""),
                (b"ok/../../up", b'0', b"evil".to_vec(), b""),
                (b"sym", b'2', Vec::new(), b"/etc/shadow"),
                (b"hard", b'1', Vec::new(), b"/etc/shadow"),
                (b"chr", b'3', Vec::new(), b""),
                (b"blk", b'4', Vec::new(), b""),
                (b"fine.txt", b'0', b"fine".to_vec(), b""),
            ]),
            vec!["fine.txt"],
            "climbs out",
        ),
        (
            "too many members",
            crafted(
                &many
                    .iter()
                    .map(|n| (n.as_bytes(), b'0', b"x".to_vec(), b"".as_slice()))
                    .collect::<Vec<_>>(),
            ),
            Vec::new(),
            "more than 256 files",
        ),
        (
            "a gzip bomb",
            crafted(&[
                (b"first.txt", b'0', b"first".to_vec(), b""),
                (b"bomb", b'0', vec![0u8; 64 * 1024 * 1024], b""),
            ]),
            vec!["first.txt"],
            "size limit",
        ),
        (
            "not an archive",
            Bytes::from_static(b"\x1f\x8b garbage that is no gzip stream"),
            Vec::new(),
            "could not be read",
        ),
    ];
    for (what, archive, want, note) in cases {
        let c = component_with(&fake, Twist::Archive(archive.clone()), &[]);
        let out = run(&c, &with_files("print('x')", Reuse::Off)).await;
        let paths: Vec<&str> = out.files.iter().map(|f| f.path.as_str()).collect();
        if what == "too many members" {
            assert_eq!(paths.len(), 256, "{what}");
        } else {
            assert_eq!(paths, want, "{what}: {:?}", out.notes);
        }
        assert!(
            out.notes.iter().any(|n| n.contains(note)),
            "{what}: {:?}",
            out.notes
        );
        assert_eq!(fake.stats().live, 0, "{what}");
        assert!(
            archive.len() < 1024 * 1024,
            "{what}: {} bytes",
            archive.len()
        );
    }
    // The unpacked limit bounds what a bomb costs.
    assert_eq!(
        ArchiveLimits::default().max_unpacked_bytes,
        16 * 1024 * 1024
    );
    fake.shutdown().await;
}

/// Every fault at every call a one-shot run makes: no live guest afterwards (the reaper may
/// finish a destroy just after the run returns) and no piece of the key in any message.
#[tokio::test(flavor = "multi_thread")]
async fn faults_leave_no_live_one_shot_guest_and_no_key_in_errors() {
    let fake = fake_with("", 0).await;
    let specs = [
        "create=429#1",
        "create=503+ra=none#2",
        "create=429+ra=1#1",
        "create=500#1",
        "create=reset#1",
        "create=reset-after#1",
        "create=stall#1",
        "upload=503#1",
        "create=drop-egress;egress_get=reset#1",
        "exec_stream=429#1",
        "exec_stream=503+ra=0#1",
        "exec_stream=500#1",
        "exec_stream=reset",
        "exec_stream=stall",
        "exec_stream=stall-mid",
        "download=429#1",
        "download=503+ra=none",
        "download=500",
        "download=reset",
        "download=stall",
        "delete=503#2",
        "delete=reset#1",
        "*=echo-headers@0.3",
    ];
    for spec in specs {
        fake.reset();
        fake.set_faults(spec).unwrap();
        let c = component(&fake);
        let i = ComponentInputs {
            timeout_seconds: 2,
            ..with_files(
                "import os\nos.makedirs('artifacts', exist_ok=True)\n\
                 open('artifacts/a.txt','w').write('a')\nprint('ran')",
                Reuse::Off,
            )
        };
        let outcome = tokio::time::timeout(Duration::from_secs(40), c.run(&i))
            .await
            .unwrap_or_else(|_| panic!("{spec}: the run did not end"));
        let text = match &outcome {
            Ok(out) => format!("{out:?} {}", out.notes.join(" ")),
            Err(e) => format!("{e} {e:?}"),
        };
        assert_no_key(&text);
        fake.set_faults("").unwrap();
        // Destroys that failed under the fault are retried by the reaper.
        wait_until(&format!("{spec}: no live guest ({text})"), || {
            fake.stats().live == 0
        })
        .await;
        c.shutdown().await;
        if let Err(e) = outcome {
            check_kind(spec, &e);
        }
    }
    fake.shutdown().await;
}

/// A failure before the program was dispatched never says the code may have run.
fn check_kind(spec: &str, e: &SandboxError) {
    let before_dispatch = ["create", "upload", "egress_get"];
    if before_dispatch.iter().any(|route| spec.starts_with(route)) {
        assert_ne!(e.kind(), ErrorKind::OutcomeUnknown, "{spec}: {e}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn reap_deletes_old_reused_guests_and_keeps_young_and_one_shot_ones() {
    let fake = fake_with("", 0).await;
    let c = component(&fake);
    let old = run(&c, &inputs(COUNTER, Reuse::Flow)).await;
    let old_done = std::time::Instant::now();
    // A one-shot guest that is still running is never touched by this reap.
    let api = api(&fake);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let young_start = std::time::Instant::now();
    let young = run(
        &c,
        &ComponentInputs {
            component_id: "CreateOSSandbox-other".into(),
            ..inputs(COUNTER, Reuse::Flow)
        },
    )
    .await;
    // The age limit sits between the two guests' ages, whatever the young run cost on a
    // loaded machine: the young guest is at most `young_start.elapsed()` old, the old one at
    // least 1.5 s older than that.
    let limit = || {
        let limit = young_start.elapsed() + Duration::from_millis(700);
        assert!(old_done.elapsed() > limit + Duration::from_millis(700));
        limit
    };
    let dry = c.reap_reused(limit(), true).await.unwrap();
    assert_eq!(dry.deleted.len(), 1);
    assert_eq!(fake.stats().live, 2, "a dry run deletes nothing");
    let older_than = limit();
    let report = c.reap_reused(older_than, false).await.unwrap();
    let deleted: Vec<&str> = report.deleted.iter().map(|g| g.name.as_str()).collect();
    let kept: Vec<&str> = report.kept.iter().map(|g| g.name.as_str()).collect();
    assert_eq!(deleted, [old.sandbox_name.as_str()]);
    assert_eq!(kept, [young.sandbox_name.as_str()]);
    assert!(report.deleted[0].age.unwrap() >= older_than);
    let gone = api
        .sandbox_handle(old.sandbox_id.clone())
        .refresh()
        .await
        .unwrap();
    assert!(
        matches!(gone.status.as_str(), "destroying" | "destroyed"),
        "{}",
        gone.status.as_str()
    );
    // The next run of that node simply creates its guest again.
    let again = run(&c, &inputs(COUNTER, Reuse::Flow)).await;
    assert_eq!(again.result, "RUN_COUNT 1");
    assert!(!again.reused_guest);
    fake.shutdown().await;
}

/// Whether the guest `id` is gone or going (destroyed, destroying, or unknown).
async fn gone(api: &createos_api::Client, id: &str) -> bool {
    api.get_sandbox(id).await.map_or(true, |s| {
        matches!(
            s.status(),
            createos_api::SandboxStatus::Destroyed | createos_api::SandboxStatus::Destroying
        )
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn reuse_off_runs_take_warm_pool_guests_once_and_reuse_on_never_does() {
    let fake = fake_with("", 0).await;
    let api = api(&fake);
    let c = component_with(&fake, Twist::None, &[("CREATEOS_SANDBOX_WARM_POOL", "1")]);
    let i = inputs("print('hi')", Reuse::Off);
    // The first run warms the pool for its policy (a miss, served by a guest of its own).
    let cold = run(&c, &i).await;
    assert_eq!(cold.result, "hi");
    wait_until("a ready pool guest", || c.pool_stats().ready == 1).await;
    // Pool guests belong to no run: a worker settling its runs' guests does not wait for them.
    assert_eq!(c.registered_guests(), 0);
    let created = fake.stats().created;
    let warm = run(&c, &i).await;
    assert_eq!(warm.result, "hi");
    let st = c.pool_stats();
    assert_eq!((st.hits, st.misses), (1, 1), "{st:?}");
    assert_ne!(warm.sandbox_id, cold.sandbox_id);
    // The run created nothing (the refill after it may have), and its guest is gone.
    assert!(fake.stats().created <= created + 1);
    assert!(
        gone(&api, &warm.sandbox_id).await,
        "a pooled guest outlived its run"
    );
    // Reuse on is a named, kept guest: never from the pool.
    let kept = run(&c, &inputs(COUNTER, Reuse::Flow)).await;
    assert!(
        kept.sandbox_name.starts_with("lf-c-"),
        "{}",
        kept.sandbox_name
    );
    assert_eq!(c.pool_stats().hits, 1);
    // Shutdown destroys the pool (the kept guest stays, as always).
    wait_until("the pool refilled", || c.pool_stats().ready == 1).await;
    c.shutdown().await;
    wait_until("only the kept guest left", || fake.stats().live == 1).await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pooled_guest_paused_behind_the_pools_back_is_replaced_not_resumed() {
    let fake = fake_with("", 0).await;
    let api = api(&fake);
    let c = component_with(&fake, Twist::None, &[("CREATEOS_SANDBOX_WARM_POOL", "1")]);
    let i = inputs("print('still works')", Reuse::Off);
    run(&c, &i).await;
    wait_until("a ready pool guest", || c.pool_stats().ready == 1).await;
    let running = fake.guest_ids("running");
    assert_eq!(running.len(), 1);
    let pooled = running[0].clone();
    api.sandbox_handle(pooled.clone()).pause().await.unwrap();
    let out = run(&c, &i).await;
    assert_eq!(out.result, "still works");
    assert_ne!(out.sandbox_id, pooled);
    assert!(c.pool_stats().discarded >= 1);
    assert_eq!(fake.stats().requests.get("resume").copied().unwrap_or(0), 0);
    assert!(gone(&api, &pooled).await, "the paused pool guest stays");
    c.shutdown().await;
    wait_until("no live guest", || fake.stats().live == 0).await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_forked_workers_component_keeps_no_pool() {
    let fake = fake_with("", 0).await;
    let mut opts = options(&fake, Twist::None, &[("CREATEOS_SANDBOX_WARM_POOL", "4")]);
    opts.surface.pool_allowed = false;
    let c = SandboxComponent::with_options(opts);
    for _ in 0..2 {
        assert_eq!(run(&c, &inputs("print(1)", Reuse::Off)).await.result, "1");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(fake.stats().created, 2, "guests were created ahead of time");
    assert_eq!(c.pool_stats().size, 0);
    c.shutdown().await;
    fake.shutdown().await;
}

/// Requests of every route the fake has received.
fn total_requests(fake: &FakeServer) -> u64 {
    fake.stats().requests.values().sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_command_no_argument_can_carry_is_refused_before_any_request() {
    let fake = fake_with("", 0).await;
    let c = component(&fake);
    let limit = langflow_component::MAX_COMMAND_BYTES;
    let over = format!("echo ok #{}", "x".repeat(limit));
    let far_over = format!("echo ok #{}", "x".repeat(200 * 1024));
    let cases = [
        ("a NUL byte", "echo a\0b".to_owned(), "NUL"),
        ("one byte over", over, "bytes"),
        ("past Linux's 128 KiB", far_over, "bytes"),
    ];
    for reuse in [Reuse::Off, Reuse::Flow] {
        for (what, command, needle) in &cases {
            let i = ComponentInputs {
                command: command.clone(),
                ..inputs("print('not me')", reuse)
            };
            let e = c.run(&i).await.unwrap_err();
            assert!(e.kind().is_unavailable(), "{what}: {e}");
            let m = e.message();
            assert!(m.contains("Command (command)"), "{what}: {m}");
            assert!(m.contains(needle), "{what}: {m}");
            assert!(m.contains(&limit.to_string()), "{what}: {m}");
            assert!(m.contains("Python Code"), "{what}: {m}");
            assert!(m.len() < 1000, "{what}: the command is not echoed back");
        }
    }
    assert_eq!(total_requests(&fake), 0, "{:?}", fake.stats().requests);
    // A command of exactly the limit runs (with Return Files' preparation added to it too).
    let at_limit = format!("echo ok #{}", "x".repeat(limit - "echo ok #".len()));
    assert_eq!(at_limit.len(), limit);
    let i = ComponentInputs {
        command: at_limit,
        return_files: true,
        ..inputs("print('not me')", Reuse::Off)
    };
    let out = run(&c, &i).await;
    assert_eq!((out.result.as_str(), out.exit_code), ("ok", 0), "{out:?}");
    // Python Code is uploaded, never carried in the exec request: no such limit there.
    let big = format!("# {}\nprint('big')", "x".repeat(200 * 1024));
    assert_eq!(run(&c, &inputs(&big, Reuse::Off)).await.result, "big");
    fake.shutdown().await;
}

/// Whether the guest `id` is destroyed or being destroyed, by the fake's account.
async fn destroyed(fake: &FakeServer, id: &str) -> bool {
    let info = api(fake).sandbox_handle(id.to_owned()).refresh().await;
    info.is_ok_and(|i| matches!(i.status.as_str(), "destroying" | "destroyed"))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_host_deadline_with_no_frame_destroys_the_kept_guest() {
    let fake = fake_with("", 0).await;
    let c = component(&fake);
    // A silent program (no output) behind a stream that goes quiet, and an exec request that
    // is never answered: nothing arrives before the host deadline either way.
    for spec in ["exec_stream=stall-mid", "exec_stream=stall"] {
        fake.reset();
        let i = ComponentInputs {
            timeout_seconds: 1,
            ..inputs("import time\ntime.sleep(60)", Reuse::Flow)
        };
        let with_code = |code: &str| ComponentInputs {
            python_code: code.into(),
            ..i.clone()
        };
        let made = run(&c, &with_code("pass")).await;
        assert!(made.kept, "{made:?}");
        fake.set_faults(spec).unwrap();
        let e = tokio::time::timeout(Duration::from_secs(30), c.run(&i))
            .await
            .unwrap_or_else(|_| panic!("{spec}: the run did not end"))
            .unwrap_err();
        fake.set_faults("").unwrap();
        assert_eq!(e.kind(), ErrorKind::OutcomeUnknown, "{spec}: {e}");
        assert!(e.message().contains("may have run"), "{spec}: {e}");
        assert!(
            e.message()
                .contains(&format!("{} was destroyed", made.sandbox_name)),
            "{spec}: the error names the kept guest and says it is gone: {e}"
        );
        assert!(
            destroyed(&fake, &made.sandbox_id).await,
            "{spec}: the kept guest is still alive"
        );
        assert_eq!(fake.stats().live, 0, "{spec}");
        // The next run creates the guest again.
        let again = run(&c, &with_code("print('fresh')")).await;
        assert_eq!(again.result, "fresh");
        assert!(!again.reused_guest && again.sandbox_id != made.sandbox_id);
    }
    // A host deadline after output is a timeout result, and the guest is destroyed too.
    fake.reset();
    fake.set_faults("exec_stream=stall-mid").unwrap();
    let i = ComponentInputs {
        timeout_seconds: 1,
        ..inputs("print('started', flush=True)", Reuse::Flow)
    };
    let out = run(&c, &i).await;
    fake.set_faults("").unwrap();
    assert!(out.timed_out && !out.kept, "{out:?}");
    assert!(destroyed(&fake, &out.sandbox_id).await);
    fake.shutdown().await;
}

/// The kept guest's idle auto-pause backstop, as the fake reports it.
async fn backstop(fake: &FakeServer, id: &str) -> Option<u64> {
    api(fake)
        .sandbox_handle(id.to_owned())
        .refresh()
        .await
        .unwrap()
        .auto_pause_after_seconds
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kept_guest_adopted_by_a_longer_run_gets_its_backstop_raised_first() {
    let fake = fake_with("", 0).await;
    let c = component(&fake);
    let short = ComponentInputs {
        timeout_seconds: 10,
        ..inputs(COUNTER, Reuse::Flow)
    };
    let first = run(&c, &short).await;
    let id = first.sandbox_id.clone();
    assert_eq!(backstop(&fake, &id).await, Some(130), "timeout + 120");
    // A long, quiet run: the control plane's activity clock is touched only when the exec is
    // accepted, so 300 idle-looking seconds pass the old backstop (130 s) mid-run.
    let long = ComponentInputs {
        timeout_seconds: 600,
        ..inputs(
            "import time\ntime.sleep(3)\nprint('slept through')",
            Reuse::Flow,
        )
    };
    let execs = fake
        .stats()
        .requests
        .get("exec_stream")
        .copied()
        .unwrap_or(0);
    let running = c.run(&long);
    let clock = async {
        wait_until("the long run's exec", || {
            fake.stats()
                .requests
                .get("exec_stream")
                .copied()
                .unwrap_or(0)
                > execs
        })
        .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        fake.advance_clock(Duration::from_secs(300));
    };
    let (out, ()) = tokio::join!(
        tokio::time::timeout(Duration::from_secs(30), running),
        clock
    );
    let out = out
        .expect("the long run was paused mid-run by the short run's backstop")
        .unwrap();
    assert_eq!(out.result, "slept through", "{out:?}");
    assert!(out.reused_guest);
    assert_eq!(backstop(&fake, &id).await, Some(720), "600 + 120, raised");
    assert_eq!(fake.stats().requests.get("patch").copied(), Some(1));
    // A shorter run later leaves the longer backstop alone (it only costs idle time).
    run(&c, &short).await;
    assert_eq!(backstop(&fake, &id).await, Some(720));
    assert_eq!(fake.stats().requests.get("patch").copied(), Some(1));
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_backstop_that_cannot_be_raised_runs_nothing() {
    let fake = fake_with("", 0).await;
    let c = component(&fake);
    let first = run(
        &c,
        &ComponentInputs {
            timeout_seconds: 10,
            ..inputs(COUNTER, Reuse::Flow)
        },
    )
    .await;
    let execs = fake.stats().requests.get("exec_stream").copied();
    let long = ComponentInputs {
        timeout_seconds: 600,
        ..inputs(COUNTER, Reuse::Flow)
    };
    for (spec, unavailable) in [("patch=500", false), ("patch=403", true)] {
        fake.set_faults(spec).unwrap();
        let e = c.run(&long).await.unwrap_err();
        assert_ne!(e.kind(), ErrorKind::OutcomeUnknown, "{spec}: {e}");
        assert_eq!(e.kind().is_unavailable(), unavailable, "{spec}: {e}");
        assert!(e.message().contains("auto-pause"), "{spec}: {e}");
        assert_no_key(e.message());
        assert_eq!(
            fake.stats().requests.get("exec_stream").copied(),
            execs,
            "{spec}: nothing was dispatched"
        );
    }
    fake.set_faults("").unwrap();
    // The guest was left as it is: alive, its files intact, its backstop unchanged.
    assert_eq!(backstop(&fake, &first.sandbox_id).await, Some(130));
    let out = run(&c, &long).await;
    assert_eq!(out.result, "RUN_COUNT 2");
    assert_eq!(out.sandbox_id, first.sandbox_id);
    fake.shutdown().await;
}

// ---- Separation: what one run of a kept guest may see of another's ----

/// The files of a run, by path, with their text.
fn returned(out: &ComponentOutput) -> Vec<(String, String)> {
    let mut files: Vec<(String, String)> = out
        .files
        .iter()
        .map(|f| (f.path.clone(), f.text.clone().unwrap_or_default()))
        .collect();
    files.sort();
    files
}

#[tokio::test(flavor = "multi_thread")]
async fn return_files_in_a_kept_guest_hands_back_only_what_this_run_wrote() {
    let fake = fake_with("", 0).await;
    let c = component(&fake);
    let first = run(
        &c,
        &with_files(
            "import os\nos.makedirs('artifacts', exist_ok=True)\n\
             open('artifacts/old.txt', 'w').write('one')\n\
             open('artifacts/report.txt', 'w').write('first')\nprint('ran')\n",
            Reuse::Flow,
        ),
    )
    .await;
    assert_eq!(
        returned(&first),
        [
            ("old.txt".into(), "one".into()),
            ("report.txt".into(), "first".into())
        ]
    );
    // Run 2 rewrites one file and adds one; the program does not even see run 1's files.
    let second = run(
        &c,
        &with_files(
            "import os\nos.makedirs('artifacts', exist_ok=True)\n\
             print(sorted(os.listdir('artifacts')))\n\
             open('artifacts/report.txt', 'w').write('second')\n\
             open('artifacts/new.txt', 'w').write('two')\n",
            Reuse::Flow,
        ),
    )
    .await;
    assert_eq!(second.sandbox_id, first.sandbox_id, "one kept guest");
    assert_eq!(
        second.result, "[]",
        "run 1's files are not in run 2's directory"
    );
    assert_eq!(
        returned(&second),
        [
            ("new.txt".into(), "two".into()),
            ("report.txt".into(), "second".into())
        ],
        "{:?}",
        second.notes
    );
    // A run that writes nothing gets nothing back.
    let third = run(&c, &with_files("print('quiet')", Reuse::Flow)).await;
    assert!(third.files.is_empty(), "{:?}", third.files);
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn files_an_older_version_left_in_a_kept_guest_are_never_returned() {
    let fake = fake_with("", 0).await;
    let c = component(&fake);
    // What an earlier version leaves: a real /workspace/artifacts directory with old files.
    let legacy = ComponentInputs {
        command: "rm -rf /workspace/artifacts && mkdir -p /workspace/artifacts && \
                  echo old > /workspace/artifacts/legacy.txt && echo made"
            .into(),
        ..inputs("", Reuse::Flow)
    };
    assert_eq!(run(&c, &legacy).await.result, "made");
    let next = run(
        &c,
        &with_files(
            "import os\nprint(sorted(os.listdir('artifacts')))\n\
             open(os.path.join(os.environ['ARTIFACTS_DIR'], 'mine.txt'), 'w').write('me')\n",
            Reuse::Flow,
        ),
    )
    .await;
    assert_eq!(next.result, "[]", "{next:?}");
    assert_eq!(returned(&next), [("mine.txt".into(), "me".into())]);
    fake.shutdown().await;
}

/// Writes its own file to `$ARTIFACTS_DIR` and one through `artifacts/`, once the other run
/// (`OTHER`) has started too, so the two runs surely overlap.
const OVERLAPPING: &str = "import os, time\n\
    open('started-ME', 'w').close()\n\
    for _ in range(400):\n\
    \x20   if os.path.exists('started-OTHER'):\n\
    \x20       break\n\
    \x20   time.sleep(0.05)\n\
    open(os.path.join(os.environ['ARTIFACTS_DIR'], 'mine.txt'), 'w').write('ME')\n\
    os.makedirs('artifacts', exist_ok=True)\n\
    open('artifacts/via-link-ME.txt', 'w').write('ME')\n\
    print('ME', os.path.exists('started-OTHER'))\n";

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_runs_in_one_kept_guest_each_get_their_own_files() {
    let fake = fake_with("", 0).await;
    // Two workers of one flow: two components, one kept guest.
    let (w1, w2) = (component(&fake), component(&fake));
    let code = |me: &str, other: &str| {
        with_files(
            &OVERLAPPING.replace("ME", me).replace("OTHER", other),
            Reuse::Flow,
        )
    };
    let (a, b) = (code("alpha", "beta"), code("beta", "alpha"));
    let (a, b) = tokio::join!(w1.run(&a), w2.run(&b));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.sandbox_id, b.sandbox_id, "one kept guest");
    assert_eq!(
        (a.result.as_str(), b.result.as_str()),
        ("alpha True", "beta True")
    );
    // Each gets its own directory's file; what went through the shared path while both ran
    // is returned to neither.
    assert_eq!(
        returned(&a),
        [("mine.txt".into(), "alpha".into())],
        "{:?}",
        a.notes
    );
    assert_eq!(
        returned(&b),
        [("mine.txt".into(), "beta".into())],
        "{:?}",
        b.notes
    );
    for out in [&a, &b] {
        let notes = out.notes.join("\n");
        assert!(
            notes.contains("another run") && notes.contains("ARTIFACTS_DIR"),
            "{notes}"
        );
    }
    // Alone again, the shared path is this run's own once more.
    let alone = run(
        &w1,
        &with_files(
            "import os\nos.makedirs('artifacts', exist_ok=True)\n\
             open('artifacts/solo.txt', 'w').write('solo')\n",
            Reuse::Flow,
        ),
    )
    .await;
    assert_eq!(
        returned(&alone),
        [("solo.txt".into(), "solo".into())],
        "{:?}",
        alone.notes
    );
    assert!(alone.notes.is_empty(), "{:?}", alone.notes);
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn with_an_empty_flow_id_two_flows_never_share_a_guest() {
    let fake = fake_with("", 0).await;
    let c = component(&fake);
    // Two unsaved flows made from one template: the node id is the same, the flow id empty.
    let unsaved = |code: &str| ComponentInputs {
        flow_id: String::new(),
        ..inputs(code, Reuse::Flow)
    };
    for code in ["print('flow one')", "print('flow two')"] {
        let e = c.run(&unsaved(code)).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Refused, "{e}");
        let m = e.message();
        assert!(
            m.contains("Guest Reuse (session_mode)") && m.contains("flow id"),
            "{m}"
        );
        assert!(m.contains("off"), "the way out: {m}");
    }
    assert_eq!(
        fake.stats().created,
        0,
        "nothing was created for a refused run"
    );
    // Without reuse, an unsaved flow runs as always, in a guest of its own.
    let out = run(
        &c,
        &ComponentInputs {
            reuse: Reuse::Off,
            ..unsaved("print('fresh')")
        },
    )
    .await;
    assert_eq!(out.result, "fresh");
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn session_mode_keeps_one_guest_per_session() {
    let fake = fake_with("", 0).await;
    let c = component(&fake);
    let in_session = |session: &str| ComponentInputs {
        session_id: session.into(),
        ..inputs(COUNTER, Reuse::Session)
    };
    let a1 = run(&c, &in_session("chat-a")).await;
    let b1 = run(&c, &in_session("chat-b")).await;
    let a2 = run(&c, &in_session("chat-a")).await;
    // One session, one guest, its files carried over; another session, another guest.
    assert_eq!(a1.sandbox_name, a2.sandbox_name);
    assert_eq!(
        (a1.result.as_str(), a2.result.as_str()),
        ("RUN_COUNT 1", "RUN_COUNT 2")
    );
    assert!(a2.kept && a2.reused_guest);
    assert_ne!(a1.sandbox_name, b1.sandbox_name);
    assert_eq!(
        b1.result, "RUN_COUNT 1",
        "session b does not see session a's files"
    );
    // The flow's own guest (Guest Reuse: flow) is yet another one.
    let flow = run(&c, &inputs(COUNTER, Reuse::Flow)).await;
    assert_eq!(flow.result, "RUN_COUNT 1");
    assert!(![&a1.sandbox_name, &b1.sandbox_name].contains(&&flow.sandbox_name));
    // A hostile session id is only ever a digest in the name.
    let hostile = "../Evil Session/\u{0}\n; rm -rf / #".repeat(40);
    let h = run(&c, &in_session(&hostile)).await;
    assert!(
        h.sandbox_name.starts_with("lf-c-") && h.sandbox_name.len() <= 22,
        "{h:?}"
    );
    assert!(
        h.sandbox_name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'),
        "{}",
        h.sandbox_name
    );
    assert_eq!(fake.stats().created, 4);
    assert_eq!(fake.stats().live, 4, "every session's guest is kept");
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn session_mode_without_a_session_id_or_a_flow_id_is_refused() {
    let fake = fake_with("", 0).await;
    let c = component(&fake);
    let e = c.run(&inputs(COUNTER, Reuse::Session)).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Refused, "{e}");
    assert!(e.message().contains("Guest Reuse (session_mode)"), "{e}");
    assert!(e.message().contains("session id"), "{e}");
    let e = c
        .run(&ComponentInputs {
            flow_id: String::new(),
            session_id: "chat-a".into(),
            ..inputs(COUNTER, Reuse::Session)
        })
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Refused, "{e}");
    assert!(e.message().contains("flow id"), "{e}");
    assert_eq!(total_requests(&fake), 0, "refused before any request");
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_program_that_remakes_the_artifacts_directory_still_gets_its_files() {
    let fake = fake_with("", 0).await;
    let c = component(&fake);
    // How a program written for a kept guest of 0.2.0 empties the directory first.
    let remake = |name: &str| ComponentInputs {
        command: format!(
            "rm -rf /workspace/artifacts && mkdir -p /workspace/artifacts && \
             ls /workspace/artifacts && echo {name} > /workspace/artifacts/{name}.txt && \
             echo done"
        ),
        return_files: true,
        ..inputs("", Reuse::Flow)
    };
    let first = run(&c, &remake("first")).await;
    assert_eq!(first.result, "done");
    assert_eq!(returned(&first), [("first.txt".into(), "first\n".into())]);
    let second = run(&c, &remake("second")).await;
    assert_eq!(second.sandbox_id, first.sandbox_id);
    assert_eq!(second.result, "done", "the directory starts empty");
    assert_eq!(
        returned(&second),
        [("second.txt".into(), "second\n".into())]
    );
    assert!(second.notes.is_empty(), "{:?}", second.notes);
    fake.shutdown().await;
}
