//! The checks, run in order against one control plane, one guest at a time.
//!
//! Guests: a deny-all guest (exec, files, pause/resume, destroy), then an allow-all guest that
//! reuses its name (list, pagination, address rules), then a guest allowed only a hostname,
//! then one allowed only `1.1.1.1/32` and, against a real endpoint, one allowed only the bare
//! `1.1.1.1` (is a bare IP enforced?).
//! Every guest is named `<prefix>-...` and registered the moment its create is answered; the
//! caller destroys what is left and sweeps the prefix, whatever happens here.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use createos_api::{
    Client, CreateSandboxRequest, DownloadOptions, Error, ExecEvent, ExecOptions,
    ListSandboxesOptions, RetryOptions, RunCommandRequest, Sandbox, SandboxStatus, WaitOptions,
};
use futures::{StreamExt, TryStreamExt};

use crate::registry::Registry;
use crate::report::Report;

/// The rule the product sends for "no network": IANA-reserved and unroutable.
pub(crate) const DENY_ALL: &str = "240.0.0.0/4";
const ENV_KEY: &str = "LC_PROBE";
const ENV_VALUE: &str = "lc-env-value-7f3e";
/// Budget of every wait for a state (`wait_until_*`, the destroyed poll).
const STATE_BUDGET: Duration = Duration::from_secs(120);
/// HTTP timeout of each exec.
const EXEC_TIMEOUT: Duration = Duration::from_secs(60);
const FILE_PATH: &str = "/workspace/lc-check/sub/dir/blob.bin";
const TEXT_PATH: &str = "/workspace/lc-check/note.txt";
const TEXT: &str = "lc-file-contents\n";

/// Why enforcement probes are skipped against a loopback target.
pub(crate) const FAKE_NO_ENFORCEMENT: &str = "the fake does not enforce egress";

/// Everything the checks share.
pub(crate) struct Ctx {
    /// The client for the target, with the key.
    pub client: Client,
    /// The target's base URL.
    pub base_url: String,
    /// Whether the target is on loopback (the fake): then nothing probes the network.
    pub loopback: bool,
    /// Every guest name starts with `<prefix>-`.
    pub prefix: String,
    /// Rootfs of the guests.
    pub rootfs: String,
    /// Shape of the guests (`None`: the smallest in the catalog).
    pub shape: Option<String>,
    /// How long the heartbeat check stays quiet.
    pub quiet: Duration,
    /// The suite's guests.
    pub registry: Arc<Registry>,
    /// The verdicts.
    pub report: Arc<Mutex<Report>>,
}

impl Ctx {
    fn report(&self) -> std::sync::MutexGuard<'_, Report> {
        self.report
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn check(&self, id: &str, pass: bool, expected: &str, measured: &str) {
        self.report().check(id, pass, expected, measured);
    }

    fn skip(&self, id: &str, reason: &str) {
        self.report().skip(id, reason);
    }

    fn block(&self, reason: String) {
        self.report().block(reason);
    }

    /// `<prefix>-<suffix>`.
    pub(crate) fn name(&self, suffix: &str) -> String {
        format!("{}-{suffix}", self.prefix)
    }

    /// `<prefix>-nnn...` of exactly `len` characters.
    fn name_of_len(&self, len: usize) -> String {
        let head = format!("{}-", self.prefix);
        let fill = len.saturating_sub(head.len());
        format!("{head}{}", "n".repeat(fill))
    }

    /// Creates a guest and registers it before anything else can happen.
    /// The create runs in a task of its own: if the suite is interrupted meanwhile, the answer
    /// still reaches the registry (a real create may hold until the guest runs), and cleanup
    /// waits for it before destroying.
    async fn create(&self, req: CreateSandboxRequest) -> Result<Sandbox, Error> {
        let name = req.name.clone();
        let client = self.client.clone();
        let registry = Arc::clone(&self.registry);
        let guard = registry.begin_create();
        let task = tokio::spawn(async move {
            // A POST is retried only on 429/503, which the contract says were not processed.
            let answer = client.create_sandbox(req).await;
            if let Ok(sb) = &answer {
                registry.created(sb.id(), &name);
            }
            drop(guard);
            answer
        });
        match task.await {
            Ok(answer) => answer,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }

    /// DELETE; the registry notes an accepted one (or a guest already gone).
    async fn destroy(&self, sb: &Sandbox) -> Result<SandboxStatus, Error> {
        match sb.destroy().await {
            Ok(st) => {
                self.registry.destroyed(sb.id());
                Ok(st)
            }
            Err(e) => {
                if e.status().is_some_and(|s| s.as_u16() == 404) {
                    self.registry.destroyed(sb.id());
                }
                Err(e)
            }
        }
    }

    /// Destroys a guest a check did not expect to exist (best effort; cleanup sweeps too).
    async fn discard(&self, sb: &Sandbox) {
        let _ = self.destroy(sb).await;
    }
}

/// A short description of an error: HTTP status, JSend status and message, or the error.
pub(crate) fn describe(e: &Error) -> String {
    let text = match e.as_api() {
        Some(api) => format!(
            "HTTP {} ({}): {}",
            api.status.as_u16(),
            jsend_status(&api.body),
            api.message
        ),
        None => e.to_string(),
    };
    clip(&text, 240)
}

/// The JSend `status` of an error body (`fail`, `error`), or `not JSend`.
fn jsend_status(body: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("status").and_then(|s| s.as_str()).map(str::to_owned))
        .unwrap_or_else(|| "not JSend".to_owned())
}

fn clip(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_owned()
    } else {
        let mut out: String = s.chars().take(max).collect();
        out.push('…');
        out
    }
}

fn http_status(e: &Error) -> Option<u16> {
    e.status().map(|s| s.as_u16())
}

fn is_4xx(e: &Error) -> bool {
    http_status(e).is_some_and(|s| (400..500).contains(&s) && s != 429)
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

fn exec_opts() -> ExecOptions {
    ExecOptions::timeout(EXEC_TIMEOUT)
}

/// Runs the whole suite. Returning early is fine: unreached checks are skipped by the caller.
pub(crate) async fn run(ctx: &Ctx) {
    let Some(shape) = account(ctx).await else {
        return;
    };
    if !deny_all_guest(ctx, &shape).await {
        return;
    }
    if !allow_all_guest(ctx, &shape).await {
        return;
    }
    hostname_guest(ctx, &shape).await;
    single_address_guests(ctx, &shape).await;
}

// ---- account, catalog, auth --------------------------------------------------------------------

/// Checks that need no guest; returns the shape the guests use.
async fn account(ctx: &Ctx) -> Option<String> {
    match ctx.client.health().await {
        Ok(h) => ctx.check("health.up", h.up, "up: true", &format!("up: {}", h.up)),
        Err(e) => ctx.check("health.up", false, "up: true", &describe(&e)),
    }

    let expected = "HTTP 401 with a JSend fail/error envelope";
    match Client::builder()
        .base_url(&ctx.base_url)
        .api_key("lc-invalid-key-0000")
        .retry(RetryOptions::none())
        .build()
    {
        Ok(bad) => match bad.whoami().await {
            Ok(_) => ctx.check("auth.invalid-key", false, expected, "accepted (HTTP 200)"),
            Err(e) => {
                let env = e
                    .as_api()
                    .map(|a| jsend_status(&a.body))
                    .unwrap_or_default();
                let pass = http_status(&e) == Some(401) && (env == "fail" || env == "error");
                ctx.check("auth.invalid-key", pass, expected, &describe(&e));
            }
        },
        Err(e) => ctx.check("auth.invalid-key", false, expected, &describe(&e)),
    }

    match ctx.client.whoami().await {
        Ok(w) => ctx.check(
            "auth.whoami",
            !w.user_id.is_empty(),
            "a non-empty user_id",
            &format!(
                "user_id of {} characters, {} sandboxes",
                w.user_id.chars().count(),
                w.stats.total
            ),
        ),
        Err(e) => {
            ctx.check("auth.whoami", false, "a non-empty user_id", &describe(&e));
            ctx.block(format!("the key was not accepted: {}", describe(&e)));
            return None;
        }
    }

    let expected = "HTTP 404 with a JSend fail/error envelope";
    match ctx.client.get_sandbox("sbx-lc-does-not-exist").await {
        Ok(sb) => ctx.check(
            "envelope.not-found",
            false,
            expected,
            &format!("HTTP 200, status {}", sb.status()),
        ),
        Err(e) => {
            let env = e
                .as_api()
                .map(|a| jsend_status(&a.body))
                .unwrap_or_default();
            let pass = http_status(&e) == Some(404) && (env == "fail" || env == "error");
            ctx.check("envelope.not-found", pass, expected, &describe(&e));
        }
    }

    let expected = "both answer without a key";
    match Client::builder().base_url(&ctx.base_url).build() {
        Ok(keyless) => {
            let shapes = keyless.list_shapes().await;
            let rootfs = keyless.list_root_file_systems().await;
            let measured = format!(
                "shapes: {}; rootfs: {}",
                shapes
                    .as_ref()
                    .map_or_else(describe, |s| format!("{} rows", s.len())),
                rootfs
                    .as_ref()
                    .map_or_else(describe, |r| format!("{} names", r.rootfs.len()))
            );
            ctx.check(
                "catalog.public",
                shapes.is_ok() && rootfs.is_ok(),
                expected,
                &measured,
            );
        }
        Err(e) => ctx.check("catalog.public", false, expected, &describe(&e)),
    }

    let shapes = match ctx.client.list_shapes().await {
        Ok(s) => s,
        Err(e) => {
            let m = describe(&e);
            ctx.check("shapes.fields", false, "a catalog of shapes", &m);
            ctx.block(format!("the shape catalog could not be read: {m}"));
            return None;
        }
    };
    let bad: Vec<String> = shapes
        .iter()
        .filter(|s| s.id.is_empty() || s.vcpu == 0 || s.mem_mib == 0 || !shape_id_ok(&s.id, s.vcpu))
        .map(|s| format!("{}({} vcpu, {} MiB)", s.id, s.vcpu, s.mem_mib))
        .collect();
    let listed: Vec<String> = shapes
        .iter()
        .map(|s| format!("{}={}MiB", s.id, s.mem_mib))
        .collect();
    ctx.check(
        "shapes.fields",
        !shapes.is_empty() && bad.is_empty(),
        "every row well-formed",
        &if bad.is_empty() {
            format!("{} rows: {}", shapes.len(), listed.join(", "))
        } else {
            format!("malformed: {}", bad.join(", "))
        },
    );
    let floor = shapes
        .iter()
        .filter(|s| s.mem_mib >= 4096)
        .min_by_key(|s| s.mem_mib);
    ctx.check(
        "shapes.memory-floor",
        floor.is_some_and(|s| s.id == "s-2vcpu-4gb" && s.mem_mib == 4096),
        "s-2vcpu-4gb (4096 MiB)",
        &floor.map_or_else(
            || "no shape with mem_mib >= 4096".to_owned(),
            |s| format!("{} ({} MiB)", s.id, s.mem_mib),
        ),
    );

    match ctx.client.list_root_file_systems().await {
        Ok(r) => ctx.check(
            "rootfs.devbox",
            r.rootfs.iter().any(|n| n == "devbox:1"),
            "devbox:1 listed",
            &format!("{:?}, default {:?}", r.rootfs, r.default),
        ),
        Err(e) => ctx.check("rootfs.devbox", false, "devbox:1 listed", &describe(&e)),
    }

    let shape = ctx.shape.clone().or_else(|| {
        shapes
            .iter()
            .filter(|s| !s.id.is_empty() && s.mem_mib > 0)
            .min_by_key(|s| s.mem_mib)
            .map(|s| s.id.clone())
    });
    if shape.is_none() {
        ctx.block("the shape catalog is empty".to_owned());
    }
    shape
}

/// `s-<vcpu>vcpu-<M>mb` or `s-<vcpu>vcpu-<M>gb`.
fn shape_id_ok(id: &str, vcpu: u32) -> bool {
    let Some(rest) = id.strip_prefix("s-") else {
        return false;
    };
    let Some((cpu, mem)) = rest.split_once("vcpu-") else {
        return false;
    };
    let mem_digits = mem
        .strip_suffix("mb")
        .or_else(|| mem.strip_suffix("gb"))
        .unwrap_or("");
    cpu.parse::<u32>().is_ok_and(|n| n == vcpu)
        && !mem_digits.is_empty()
        && mem_digits.bytes().all(|b| b.is_ascii_digit())
}

// ---- the deny-all guest ------------------------------------------------------------------------

/// The deny-all guest: create read-back, names, exec, files, enforcement, pause/resume, destroy.
/// Returns whether the suite can go on (the guest's name must be free again for the next one).
async fn deny_all_guest(ctx: &Ctx, shape: &str) -> bool {
    let name = ctx.name_of_len(22);
    let req = CreateSandboxRequest::new(shape)
        .rootfs(&ctx.rootfs)
        .name(&name)
        .egress([DENY_ALL])
        .env(ENV_KEY, ENV_VALUE)
        .auto_pause_after_seconds(60);
    let expected = "`running` (or `creating`), then `running`";
    let sb = match ctx.create(req).await {
        Ok(sb) => sb,
        Err(e) => {
            let m = describe(&e);
            ctx.check("create.running", false, expected, &m);
            ctx.block(format!("the deny-all guest could not be created: {m}"));
            return false;
        }
    };
    let answered = sb.status();
    // What the create response itself said.
    let created_egress = sb.info().egress.map(sorted);
    match sb
        .wait_until_running(WaitOptions::timeout(STATE_BUDGET))
        .await
    {
        Ok(info) => ctx.check(
            "create.running",
            matches!(answered, SandboxStatus::Running | SandboxStatus::Creating),
            expected,
            &format!("answered `{answered}`, then `{}`", info.status),
        ),
        Err(e) => {
            let m = format!("answered `{answered}`, then {}", describe(&e));
            ctx.check("create.running", false, expected, &m);
            ctx.block(format!("the deny-all guest never ran: {m}"));
            ctx.discard(&sb).await;
            return false;
        }
    }

    readback(ctx, &sb, shape, &name).await;
    match sb.egress().await {
        Ok(rules) => ctx.check(
            "egress.create-response-is-readback",
            created_egress.as_ref() == Some(&sorted(rules.clone())),
            "the create response's egress equal to GET .../egress",
            &format!("create response {created_egress:?}, GET .../egress {rules:?}"),
        ),
        Err(e) => ctx.check(
            "egress.create-response-is-readback",
            false,
            "the create response's egress equal to GET .../egress",
            &format!(
                "create response {created_egress:?}, GET .../egress {}",
                describe(&e)
            ),
        ),
    }
    names(ctx, shape, &name).await;
    exec_checks(ctx, &sb).await;
    file_checks(ctx, &sb).await;
    enforcement_deny_all(ctx, &sb).await;
    pause_resume(ctx, &sb).await;
    destroy_checks(ctx, &sb, shape, &name).await
}

async fn readback(ctx: &Ctx, sb: &Sandbox, shape: &str, name: &str) {
    let info = match sb.refresh().await {
        Ok(i) => i,
        Err(e) => {
            let m = describe(&e);
            for id in [
                "create.name-22",
                "create.shape",
                "create.envs-names-only",
                "create.auto-pause",
            ] {
                ctx.check(id, false, "a readable guest", &m);
            }
            return;
        }
    };
    ctx.check(
        "create.name-22",
        info.name.as_deref() == Some(name) && name.len() == 22,
        &format!("{name:?} (22 characters)"),
        &format!("{:?}", info.name),
    );
    ctx.check(
        "create.shape",
        info.shape.as_deref() == Some(shape),
        &format!("shape {shape:?}"),
        &format!("shape {:?}, {:?} MiB", info.shape, info.mem_mib),
    );
    let json = serde_json::to_string(&info).unwrap_or_default();
    let leaked = json.contains(ENV_VALUE);
    ctx.check(
        "create.envs-names-only",
        info.envs == [ENV_KEY] && !leaked,
        &format!("envs [{ENV_KEY:?}], value absent"),
        &format!(
            "envs {:?}, value {}",
            info.envs,
            if leaked { "PRESENT" } else { "absent" }
        ),
    );
    ctx.check(
        "create.auto-pause",
        info.auto_pause_after_seconds == Some(60),
        "Some(60)",
        &format!("{:?}", info.auto_pause_after_seconds),
    );
    let expected = format!("[{DENY_ALL:?}] from both");
    let projection = info.egress.clone().map(sorted);
    let want = vec![DENY_ALL.to_owned()];
    match sb.egress().await {
        Ok(rules) => {
            let rules = sorted(rules);
            ctx.check(
                "egress.deny-all-readback",
                rules == want && projection.as_ref() == Some(&want),
                &expected,
                &format!("GET .../egress {rules:?}, projection {projection:?}"),
            );
        }
        Err(e) => ctx.check(
            "egress.deny-all-readback",
            false,
            &expected,
            &format!("GET .../egress {}, projection {projection:?}", describe(&e)),
        ),
    }
}

/// Name rules and the auto-pause minimum; each probe that is (wrongly) accepted is destroyed.
async fn names(ctx: &Ctx, shape: &str, taken: &str) {
    let req = CreateSandboxRequest::new(shape)
        .rootfs(&ctx.rootfs)
        .name(taken)
        .auto_pause_after_seconds(60);
    refused(ctx, "name.unique", req, "HTTP 409", |e| {
        http_status(e) == Some(409)
    })
    .await;

    let long = ctx.name_of_len(23);
    let req = CreateSandboxRequest::new(shape)
        .rootfs(&ctx.rootfs)
        .name(&long)
        .auto_pause_after_seconds(60);
    refused(ctx, "name.max-length", req, "a 4xx (the fake: 400)", is_4xx).await;

    let req = CreateSandboxRequest::new(shape)
        .rootfs(&ctx.rootfs)
        .name(ctx.name("ap"))
        .auto_pause_after_seconds(59);
    refused(
        ctx,
        "auto-pause.minimum",
        req,
        "a 4xx (the fake: 400)",
        is_4xx,
    )
    .await;
}

/// A create that must be refused; `ok` judges the error.
async fn refused(
    ctx: &Ctx,
    id: &str,
    req: CreateSandboxRequest,
    expected: &str,
    ok: impl Fn(&Error) -> bool,
) {
    match ctx.create(req).await {
        Ok(sb) => {
            ctx.check(
                id,
                false,
                expected,
                &format!("accepted (guest {})", sb.id()),
            );
            ctx.discard(&sb).await;
        }
        Err(e) => ctx.check(id, ok(&e), expected, &describe(&e)),
    }
}

/// Runs a buffered command, rendering a failure as text.
async fn exec(sb: &Sandbox, req: RunCommandRequest) -> Result<createos_api::CommandResult, String> {
    sb.run_command(req, exec_opts())
        .await
        .map(|r| r.result)
        .map_err(|e| describe(&e))
}

fn show(r: &Result<createos_api::CommandResult, String>) -> String {
    match r {
        Ok(c) => {
            let mut s = format!(
                "exit {}, stdout {:?}, stderr {:?}",
                c.exit_code,
                clip(&c.stdout, 120),
                clip(&c.stderr, 120)
            );
            if let Some(err) = c.error.as_deref().filter(|e| !e.is_empty()) {
                let _ = write!(s, ", error {err:?}");
            }
            s
        }
        Err(e) => e.clone(),
    }
}

async fn exec_checks(ctx: &Ctx, sb: &Sandbox) {
    let r = exec(sb, RunCommandRequest::new("echo").arg("hello")).await;
    ctx.check(
        "exec.buffered",
        matches!(&r, Ok(c) if c.exit_code == 0 && c.stdout == "hello\n"),
        "exit 0, stdout \"hello\\n\"",
        &show(&r),
    );

    let r = exec(
        sb,
        RunCommandRequest::new("sh").args(["-c", "echo out; echo err >&2; exit 3"]),
    )
    .await;
    ctx.check(
        "exec.exit-code",
        matches!(&r, Ok(c) if c.exit_code == 3 && c.stdout == "out\n" && c.stderr == "err\n"),
        "HTTP 200, exit 3, stdout \"out\\n\", stderr \"err\\n\"",
        &show(&r),
    );

    let r = exec(
        sb,
        RunCommandRequest::new("echo").arg(format!("${ENV_KEY}")),
    )
    .await;
    let literal = format!("${ENV_KEY}\n");
    ctx.check(
        "exec.no-shell",
        matches!(&r, Ok(c) if c.exit_code == 0 && c.stdout == literal),
        &format!("stdout {literal:?}"),
        &show(&r),
    );

    let r = exec(sb, RunCommandRequest::new("printenv").arg(ENV_KEY)).await;
    let want = format!("{ENV_VALUE}\n");
    ctx.check(
        "env.at-create",
        matches!(&r, Ok(c) if c.exit_code == 0 && c.stdout == want),
        &format!("stdout {want:?}"),
        &show(&r),
    );

    let r = sb
        .run_command(
            RunCommandRequest::new("printenv")
                .arg("LC_UNDECLARED")
                .env("LC_UNDECLARED", "x"),
            exec_opts(),
        )
        .await;
    match r {
        Ok(resp) => ctx.check(
            "env.undeclared",
            false,
            "a 4xx (the fake: 400)",
            &format!("accepted: {}", show(&Ok(resp.result))),
        ),
        Err(e) => ctx.check(
            "env.undeclared",
            is_4xx(&e),
            "a 4xx (the fake: 400)",
            &describe(&e),
        ),
    }

    // Domain-allowlist runs declare the proxy variables empty at create and set each run's
    // token in the exec env: that works only if an exec's env overrides a declared value.
    let r = exec(
        sb,
        RunCommandRequest::new("printenv")
            .arg(ENV_KEY)
            .env(ENV_KEY, "lc-override"),
    )
    .await;
    ctx.check(
        "env.override-declared",
        matches!(&r, Ok(c) if c.exit_code == 0 && c.stdout == "lc-override\n"),
        "stdout \"lc-override\\n\"",
        &show(&r),
    );

    let r = exec(
        sb,
        RunCommandRequest::new("timeout").args([
            "--signal=TERM",
            "--kill-after=5s",
            "1",
            "sh",
            "-c",
            "echo partial; sleep 30",
        ]),
    )
    .await;
    ctx.check(
        "exec.timeout-124",
        matches!(&r, Ok(c) if c.exit_code == 124 && c.stdout == "partial\n"),
        "exit 124, stdout \"partial\\n\"",
        &show(&r),
    );

    // The same spelling sandbox-core uses, with a program that ignores TERM.
    let r = exec(
        sb,
        RunCommandRequest::new("timeout").args([
            "--signal=TERM",
            "--kill-after=1s",
            "1",
            "sh",
            "-c",
            "trap '' TERM; echo partial; while :; do sleep 0.2; done",
        ]),
    )
    .await;
    ctx.check(
        "exec.timeout-kill-137",
        matches!(&r, Ok(c) if c.exit_code == 137 && c.stdout == "partial\n"),
        "exit 137, stdout \"partial\\n\"",
        &show(&r),
    );

    let r = stream(
        sb,
        RunCommandRequest::new("sh").args(["-c", "echo one; echo two >&2; exit 4"]),
        Duration::from_secs(60),
    )
    .await;
    let expected = "stdout \"one\\n\", stderr \"two\\n\", then exactly one exit 4, last";
    match r {
        Ok(s) => ctx.check(
            "exec.stream",
            s.stdout == "one\n" && s.stderr == "two\n" && s.exits == [4] && s.exit_last,
            expected,
            &s.show(),
        ),
        Err(m) => ctx.check("exec.stream", false, expected, &m),
    }

    let quiet = ctx.quiet.as_secs().max(1);
    let r = stream(
        sb,
        RunCommandRequest::new("sh").args(["-c", &format!("sleep {quiet}; echo done")]),
        ctx.quiet + Duration::from_secs(60),
    )
    .await;
    let expected = format!("at least one heartbeat in {quiet} s of silence, then exit 0");
    match r {
        Ok(s) => ctx.check(
            "exec.stream-heartbeat",
            s.heartbeats >= 1 && s.exits == [0] && s.stdout == "done\n",
            &expected,
            &s.show(),
        ),
        Err(m) => ctx.check("exec.stream-heartbeat", false, &expected, &m),
    }
}

/// What a command stream carried.
#[derive(Debug, Default)]
struct Streamed {
    stdout: String,
    stderr: String,
    exits: Vec<i64>,
    errors: Vec<String>,
    heartbeats: usize,
    exit_last: bool,
}

impl Streamed {
    fn show(&self) -> String {
        format!(
            "stdout {:?}, stderr {:?}, exits {:?}{}, {} heartbeat(s){}",
            clip(&self.stdout, 120),
            clip(&self.stderr, 120),
            self.exits,
            if self.exit_last {
                " (last)"
            } else {
                " (not last)"
            },
            self.heartbeats,
            if self.errors.is_empty() {
                String::new()
            } else {
                format!(", errors {:?}", self.errors)
            }
        )
    }
}

/// Streams a command to its end, within `budget`.
async fn stream(
    sb: &Sandbox,
    req: RunCommandRequest,
    budget: Duration,
) -> Result<Streamed, String> {
    let mut events = sb
        .stream_command(req, exec_opts())
        .await
        .map_err(|e| describe(&e))?;
    let mut s = Streamed::default();
    let read = async {
        while let Some(ev) = events.next().await {
            let ev = ev.map_err(|e| describe(&e))?;
            s.exit_last = matches!(ev, ExecEvent::Exit { .. });
            match ev {
                ExecEvent::Stdout { data } => s.stdout.push_str(&data),
                ExecEvent::Stderr { data } => s.stderr.push_str(&data),
                ExecEvent::Exit { exit_code } => s.exits.push(exit_code),
                ExecEvent::Error { message } => s.errors.push(message),
                ExecEvent::Heartbeat => s.heartbeats += 1,
                _ => {}
            }
        }
        Ok::<(), String>(())
    };
    match tokio::time::timeout(budget, read).await {
        Ok(Ok(())) => Ok(s),
        Ok(Err(m)) => Err(format!("{m} (after {})", s.show())),
        Err(_) => Err(format!("no end of stream within {budget:?} ({})", s.show())),
    }
}

/// 1 MiB in which every byte value occurs.
fn blob() -> Vec<u8> {
    (0..1024 * 1024u32)
        .map(|i| u8::try_from((i * 7 + i / 256) % 256).unwrap_or(0))
        .collect()
}

async fn file_checks(ctx: &Ctx, sb: &Sandbox) {
    let files = sb.files();
    let data = blob();
    let expected = format!("bytes {}, path {FILE_PATH:?}", data.len());
    let uploaded = match files.upload(FILE_PATH, data.clone()).await {
        Ok(u) => {
            let pass = u.bytes == data.len() as u64 && u.path == FILE_PATH;
            ctx.check(
                "files.upload",
                pass,
                &expected,
                &format!("bytes {}, path {:?}", u.bytes, u.path),
            );
            true
        }
        Err(e) => {
            ctx.check("files.upload", false, &expected, &describe(&e));
            false
        }
    };

    let expected = format!(
        "{} identical bytes, Content-Length {}",
        data.len(),
        data.len()
    );
    if uploaded {
        let got = match files
            .download(FILE_PATH, DownloadOptions::max_bytes(4 << 20))
            .await
        {
            Ok(d) => {
                let len = d.content_length();
                d.bytes().await.map(|b| (len, b)).map_err(|e| describe(&e))
            }
            Err(e) => Err(describe(&e)),
        };
        match got {
            Ok((len, bytes)) => ctx.check(
                "files.download",
                bytes.as_ref() == data.as_slice() && len == Some(data.len() as u64),
                &expected,
                &format!(
                    "{} bytes ({}), Content-Length {len:?}",
                    bytes.len(),
                    if bytes.as_ref() == data.as_slice() {
                        "identical"
                    } else {
                        "DIFFERENT"
                    }
                ),
            ),
            Err(m) => ctx.check("files.download", false, &expected, &m),
        }
    } else {
        ctx.skip("files.download", "the upload failed");
    }

    let expected = format!("cat prints {TEXT:?}");
    match files.upload(TEXT_PATH, TEXT).await {
        Ok(_) => {
            let r = exec(sb, RunCommandRequest::new("cat").arg(TEXT_PATH)).await;
            ctx.check(
                "files.exec-sees-upload",
                matches!(&r, Ok(c) if c.exit_code == 0 && c.stdout == TEXT),
                &expected,
                &show(&r),
            );
        }
        Err(e) => ctx.check(
            "files.exec-sees-upload",
            false,
            &expected,
            &format!("upload: {}", describe(&e)),
        ),
    }

    match files
        .download(
            "/workspace/lc-check/missing.bin",
            DownloadOptions::default(),
        )
        .await
    {
        Ok(d) => ctx.check(
            "files.missing",
            false,
            "HTTP 404",
            &format!("HTTP 200, Content-Length {:?}", d.content_length()),
        ),
        Err(e) => ctx.check(
            "files.missing",
            http_status(&e) == Some(404),
            "HTTP 404",
            &describe(&e),
        ),
    }
}

/// Connect probes from the deny-all guest. Never run against loopback: the fake's guest
/// commands are local processes, and this machine must not reach the internet.
async fn enforcement_deny_all(ctx: &Ctx, sb: &Sandbox) {
    if ctx.loopback {
        ctx.skip("egress.deny-all-blocks-public", FAKE_NO_ENFORCEMENT);
        ctx.skip("egress.link-local-hole", FAKE_NO_ENFORCEMENT);
        return;
    }
    let r = exec(sb, connect_probe("1.1.1.1", 443)).await;
    ctx.check(
        "egress.deny-all-blocks-public",
        matches!(&r, Ok(c) if c.stdout.trim() == "blocked"),
        "stdout \"blocked\"",
        &show(&r),
    );
    let script = "timeout 5 bash -c 'exec 3<>/dev/tcp/169.254.169.254/80 && \
                  printf \"GET / HTTP/1.0\\r\\nHost: 169.254.169.254\\r\\n\\r\\n\" >&3 && \
                  head -c 12 <&3'";
    let r = exec(sb, RunCommandRequest::new("bash").args(["-c", script])).await;
    ctx.check(
        "egress.link-local-hole",
        matches!(&r, Ok(c) if c.stdout.starts_with("HTTP/")),
        "an HTTP status line from 169.254.169.254:80",
        &show(&r),
    );
}

/// `bash -c` printing `open` or `blocked` for a TCP connect within 5 s.
fn connect_probe(host: &str, port: u16) -> RunCommandRequest {
    let script = format!(
        "if timeout 5 bash -c 'echo > /dev/tcp/{host}/{port}' 2>/dev/null; \
         then echo open; else echo blocked; fi"
    );
    RunCommandRequest::new("bash").args(["-c".to_owned(), script])
}

async fn pause_resume(ctx: &Ctx, sb: &Sandbox) {
    let expected = "`pausing` or `paused`, then `paused`";
    let answered = match sb.pause().await {
        Ok(i) => i.status,
        Err(e) => {
            let m = describe(&e);
            ctx.check("pause.paused", false, expected, &m);
            for id in [
                "pause.exec-409",
                "pause.files-409",
                "resume.running",
                "resume.state-kept",
            ] {
                ctx.skip(id, "the guest could not be paused");
            }
            return;
        }
    };
    match sb
        .wait_until_paused(WaitOptions::timeout(STATE_BUDGET))
        .await
    {
        Ok(i) => ctx.check(
            "pause.paused",
            matches!(answered, SandboxStatus::Pausing | SandboxStatus::Paused),
            expected,
            &format!("answered `{answered}`, then `{}`", i.status),
        ),
        Err(e) => ctx.check(
            "pause.paused",
            false,
            expected,
            &format!("answered `{answered}`, then {}", describe(&e)),
        ),
    }

    match sb
        .run_command(RunCommandRequest::new("echo").arg("x"), exec_opts())
        .await
    {
        Ok(r) => ctx.check(
            "pause.exec-409",
            false,
            "HTTP 409",
            &format!("accepted: {}", show(&Ok(r.result))),
        ),
        Err(e) => ctx.check(
            "pause.exec-409",
            http_status(&e) == Some(409),
            "HTTP 409",
            &describe(&e),
        ),
    }

    let expected = "HTTP 409 \"sandbox is paused; resume it before accessing files\"";
    match sb
        .files()
        .download(TEXT_PATH, DownloadOptions::default())
        .await
    {
        Ok(_) => ctx.check("pause.files-409", false, expected, "HTTP 200"),
        Err(e) => ctx.check(
            "pause.files-409",
            http_status(&e) == Some(409)
                && e.as_api().is_some_and(|a| {
                    a.message == "sandbox is paused; resume it before accessing files"
                }),
            expected,
            &describe(&e),
        ),
    }

    let expected = "`resuming` (or `running`), then `running`";
    match sb.resume().await {
        Ok(i) => {
            let answered = i.status;
            match sb
                .wait_until_running(WaitOptions::timeout(STATE_BUDGET))
                .await
            {
                Ok(i) => ctx.check(
                    "resume.running",
                    matches!(answered, SandboxStatus::Resuming | SandboxStatus::Running),
                    expected,
                    &format!("answered `{answered}`, then `{}`", i.status),
                ),
                Err(e) => ctx.check(
                    "resume.running",
                    false,
                    expected,
                    &format!("answered `{answered}`, then {}", describe(&e)),
                ),
            }
        }
        Err(e) => ctx.check("resume.running", false, expected, &describe(&e)),
    }

    let r = exec(sb, RunCommandRequest::new("cat").arg(TEXT_PATH)).await;
    ctx.check(
        "resume.state-kept",
        matches!(&r, Ok(c) if c.exit_code == 0 && c.stdout == TEXT),
        &format!("cat prints {TEXT:?}"),
        &show(&r),
    );
}

/// DELETE, the name while `destroying`, idempotence, the final state. Returns whether the
/// guest reached `destroyed` (its name is needed again).
async fn destroy_checks(ctx: &Ctx, sb: &Sandbox, shape: &str, name: &str) -> bool {
    let expected = "`destroying` or `destroyed`";
    match ctx.destroy(sb).await {
        Ok(st) => ctx.check(
            "destroy.answer",
            matches!(st, SandboxStatus::Destroying | SandboxStatus::Destroyed),
            expected,
            &format!("`{st}`"),
        ),
        Err(e) => {
            let m = describe(&e);
            ctx.check("destroy.answer", false, expected, &m);
            ctx.block(format!("the deny-all guest could not be destroyed: {m}"));
            return false;
        }
    }

    // The name is held until `destroyed`. Only provable while the guest is still destroying:
    // if the probe is accepted and the guest has meanwhile become destroyed, nothing is shown.
    let before = sb.refresh().await.map(|i| i.status);
    if matches!(before, Ok(SandboxStatus::Destroying)) {
        let req = CreateSandboxRequest::new(shape)
            .rootfs(&ctx.rootfs)
            .name(name)
            .auto_pause_after_seconds(60);
        match ctx.create(req).await {
            Err(e) => ctx.check(
                "name.held-while-destroying",
                http_status(&e) == Some(409),
                "HTTP 409",
                &describe(&e),
            ),
            Ok(dup) => {
                let after = sb.refresh().await.map(|i| i.status);
                if matches!(after, Ok(SandboxStatus::Destroying)) {
                    ctx.check(
                        "name.held-while-destroying",
                        false,
                        "HTTP 409",
                        &format!(
                            "accepted (guest {}) while the old one was destroying",
                            dup.id()
                        ),
                    );
                } else {
                    ctx.skip(
                        "name.held-while-destroying",
                        "the old guest finished destroying during the probe",
                    );
                }
                ctx.discard(&dup).await;
                // Do not reuse the name while `dup` may still hold it.
                let _ = wait_gone(&dup).await;
            }
        }
    } else {
        ctx.skip(
            "name.held-while-destroying",
            &format!(
                "the guest was already {} when probed",
                before.map_or_else(|e| describe(&e), |s| format!("`{s}`"))
            ),
        );
    }

    match sb.destroy().await {
        Ok(st) => ctx.check(
            "destroy.idempotent",
            matches!(st, SandboxStatus::Destroying | SandboxStatus::Destroyed),
            expected,
            &format!("`{st}`"),
        ),
        Err(e) => ctx.check("destroy.idempotent", false, expected, &describe(&e)),
    }

    let gone = wait_gone(sb).await;
    let pass = matches!(gone.as_deref(), Ok("`destroyed`" | "HTTP 404"));
    ctx.check(
        "destroy.final",
        pass,
        "`destroyed` or HTTP 404",
        &gone.clone().unwrap_or_else(|m| m),
    );

    match sb
        .run_command(RunCommandRequest::new("echo").arg("x"), exec_opts())
        .await
    {
        Ok(r) => ctx.check(
            "destroy.exec-refused",
            false,
            "a 4xx (the fake: 409)",
            &format!("accepted: {}", show(&Ok(r.result))),
        ),
        Err(e) => ctx.check(
            "destroy.exec-refused",
            is_4xx(&e),
            "a 4xx (the fake: 409)",
            &describe(&e),
        ),
    }
    if !pass {
        ctx.block("the deny-all guest never reached `destroyed`".to_owned());
    }
    pass
}

/// Polls until the guest reads `destroyed` or 404 (bounded); `Err` describes the last answer.
async fn wait_gone(sb: &Sandbox) -> Result<String, String> {
    let deadline = Instant::now() + STATE_BUDGET;
    loop {
        let last = match sb.refresh().await {
            Ok(i) if i.status == SandboxStatus::Destroyed => return Ok("`destroyed`".into()),
            Err(e) if http_status(&e) == Some(404) => return Ok("HTTP 404".into()),
            Ok(i) if matches!(i.status, SandboxStatus::Running | SandboxStatus::Paused) => {
                return Err(format!("came back `{}`", i.status));
            }
            Ok(i) => format!("`{}`", i.status),
            Err(e) => describe(&e),
        };
        if Instant::now() >= deadline {
            return Err(format!("still {last} after {STATE_BUDGET:?}"));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

// ---- the allow-all guest -----------------------------------------------------------------------

async fn allow_all_guest(ctx: &Ctx, shape: &str) -> bool {
    let name = ctx.name_of_len(22);
    let req = CreateSandboxRequest::new(shape)
        .rootfs(&ctx.rootfs)
        .name(&name)
        .egress(["*"])
        .auto_pause_after_seconds(60);
    let sb = match ctx.create(req).await {
        Ok(sb) => {
            ctx.check(
                "name.reusable",
                true,
                "the create is accepted",
                &format!("accepted, `{}`", sb.status()),
            );
            sb
        }
        Err(e) => {
            let m = describe(&e);
            ctx.check("name.reusable", false, "the create is accepted", &m);
            ctx.block(format!("the allow-all guest could not be created: {m}"));
            return false;
        }
    };
    if let Err(e) = sb
        .wait_until_running(WaitOptions::timeout(STATE_BUDGET))
        .await
    {
        ctx.block(format!("the allow-all guest never ran: {}", describe(&e)));
        ctx.discard(&sb).await;
        return false;
    }

    let expected = "[\"*\"] (or [])";
    match sb.egress().await {
        Ok(rules) => ctx.check(
            "egress.allow-all-readback",
            rules == ["*"] || rules.is_empty(),
            expected,
            &format!("{rules:?}"),
        ),
        Err(e) => ctx.check("egress.allow-all-readback", false, expected, &describe(&e)),
    }

    list_checks(ctx, &sb, &name).await;

    let rules = vec!["10.0.0.0/8".to_owned(), "151.101.192.223:443".to_owned()];
    let expected = format!("{rules:?} from PUT and GET");
    match sb.set_egress(rules.clone()).await {
        Ok(put) => {
            let got = sb.egress().await.map(sorted).map_err(|e| describe(&e));
            ctx.check(
                "egress.address-rules",
                sorted(put.clone()) == rules && got.as_ref() == Ok(&rules),
                &expected,
                &format!("PUT {put:?}, GET {got:?}"),
            );
        }
        Err(e) => ctx.check("egress.address-rules", false, &expected, &describe(&e)),
    }

    let bad = vec!["300.1.2.3/8".to_owned()];
    let expected = format!("accepted and echoed as {bad:?}");
    match sb.set_egress(bad.clone()).await {
        Ok(put) => ctx.check(
            "egress.unparsable-rule",
            put == bad,
            &expected,
            &format!("accepted, echoed {put:?}"),
        ),
        Err(e) => ctx.check("egress.unparsable-rule", false, &expected, &describe(&e)),
    }

    let ok = finish_guest(ctx, &sb, "allow-all").await;
    if !ok {
        ctx.block("the allow-all guest never reached `destroyed`".to_owned());
    }
    ok
}

/// Pages of one row are walked this far at most (an account may run many other guests).
const MAX_WALK: usize = 200;

async fn list_checks(ctx: &Ctx, sb: &Sandbox, name: &str) {
    let expected = format!("one running row named {name:?}, id {}", sb.id());
    let all: Result<Vec<Sandbox>, Error> = ctx
        .client
        .list_sandboxes(ListSandboxesOptions {
            limit: Some(500),
            ..ListSandboxesOptions::default()
        })
        .try_collect()
        .await;
    match all {
        Ok(rows) => {
            let live: Vec<String> = rows
                .iter()
                .filter(|r| r.name().as_deref() == Some(name) && !r.status().is_terminal())
                .map(|r| format!("{} `{}`", r.id(), r.status()))
                .collect();
            let pass = live.len() == 1
                && rows.iter().any(|r| {
                    r.id() == sb.id()
                        && r.name().as_deref() == Some(name)
                        && r.status() == SandboxStatus::Running
                });
            ctx.check(
                "list.by-name",
                pass,
                &expected,
                &format!(
                    "non-terminal rows with the name: {live:?} (of {} rows)",
                    rows.len()
                ),
            );
        }
        Err(e) => ctx.check("list.by-name", false, &expected, &describe(&e)),
    }

    let walk = |limit: u32| {
        ctx.client
            .list_sandboxes(ListSandboxesOptions {
                limit: Some(limit),
                ..ListSandboxesOptions::status(SandboxStatus::Running)
            })
            .take(MAX_WALK)
            .map_ok(|s| (s.id().to_owned(), s.status()))
            .try_collect::<Vec<_>>()
    };
    let expected = "the same rows both ways, no duplicates, all `running`, ours included";
    match (walk(1).await, walk(500).await) {
        (Ok(small), Ok(big)) => {
            let mut ids: Vec<&str> = small.iter().map(|(i, _)| i.as_str()).collect();
            ids.sort_unstable();
            let before = ids.len();
            ids.dedup();
            let dups = before - ids.len();
            let mut big_ids: Vec<&str> = big.iter().map(|(i, _)| i.as_str()).collect();
            big_ids.sort_unstable();
            let others = small
                .iter()
                .chain(&big)
                .filter(|(_, s)| *s != SandboxStatus::Running)
                .count();
            let pass = dups == 0 && ids == big_ids && others == 0 && ids.contains(&sb.id());
            ctx.check(
                "list.pagination",
                pass,
                expected,
                &format!(
                    "limit=1: {} rows ({dups} duplicates); limit=500: {} rows; {others} not running",
                    small.len(),
                    big.len()
                ),
            );
        }
        (Err(e), _) | (_, Err(e)) => ctx.check("list.pagination", false, expected, &describe(&e)),
    }
}

/// Destroys a guest and waits until it is gone (one guest at a time). Returns whether it is.
async fn finish_guest(ctx: &Ctx, sb: &Sandbox, what: &str) -> bool {
    if let Err(e) = ctx.destroy(sb).await {
        ctx.block(format!(
            "the {what} guest could not be destroyed: {}",
            describe(&e)
        ));
        return false;
    }
    wait_gone(sb).await.is_ok()
}

// ---- the hostname guest ------------------------------------------------------------------------

async fn hostname_guest(ctx: &Ctx, shape: &str) {
    let req = CreateSandboxRequest::new(shape)
        .rootfs(&ctx.rootfs)
        .name(ctx.name("host"))
        .egress(["pypi.org"])
        .auto_pause_after_seconds(60);
    let expected = "[\"pypi.org\"]";
    let sb = match ctx.create(req).await {
        Ok(sb) => sb,
        Err(e) => {
            let m = describe(&e);
            ctx.check(
                "egress.hostname-echoed",
                false,
                expected,
                &format!("create: {m}"),
            );
            ctx.block(format!("the hostname guest could not be created: {m}"));
            return;
        }
    };
    match sb.egress().await {
        Ok(rules) => ctx.check(
            "egress.hostname-echoed",
            rules == ["pypi.org"],
            expected,
            &format!("{rules:?}"),
        ),
        Err(e) => ctx.check("egress.hostname-echoed", false, expected, &describe(&e)),
    }
    if ctx.loopback {
        ctx.skip("egress.hostname-not-enforced", FAKE_NO_ENFORCEMENT);
    } else {
        match sb
            .wait_until_running(WaitOptions::timeout(STATE_BUDGET))
            .await
        {
            Ok(_) => {
                let r = exec(&sb, connect_probe("1.1.1.1", 443)).await;
                ctx.check(
                    "egress.hostname-not-enforced",
                    matches!(&r, Ok(c) if c.stdout.trim() == "open"),
                    "stdout \"open\"",
                    &show(&r),
                );
            }
            Err(e) => ctx.check(
                "egress.hostname-not-enforced",
                false,
                "stdout \"open\"",
                &describe(&e),
            ),
        }
    }
    let _ = finish_guest(ctx, &sb, "hostname").await;
}

// ---- single-address guests ---------------------------------------------------------------------

/// The one address the single-address guests may reach, and one they may not.
const ALLOWED: &str = "1.1.1.1";
const UNLISTED: &str = "1.0.0.1";

/// A guest allowed only `1.1.1.1/32` (the spelling the product sends): its read-back, and,
/// against a real endpoint, whether the rule is enforced. Then, against a real endpoint only,
/// a guest allowed only the bare `1.1.1.1`: the open question of `createos-api.md` §4.1.
async fn single_address_guests(ctx: &Ctx, shape: &str) {
    let cidr = format!("{ALLOWED}/32");
    let req = CreateSandboxRequest::new(shape)
        .rootfs(&ctx.rootfs)
        .name(ctx.name("c32"))
        .egress([cidr.as_str()])
        .auto_pause_after_seconds(60);
    let expected = format!("[{cidr:?}] or [{ALLOWED:?}] from both");
    let sb = match ctx.create(req).await {
        Ok(sb) => sb,
        Err(e) => {
            let m = describe(&e);
            ctx.check(
                "egress.single-address-readback",
                false,
                &expected,
                &format!("create: {m}"),
            );
            ctx.block(format!("the /32 guest could not be created: {m}"));
            return;
        }
    };
    let created = sb.info().egress;
    let read = sb.egress().await.map_err(|e| describe(&e));
    let same = |r: &[String]| r == [cidr.as_str()] || r == [ALLOWED];
    ctx.check(
        "egress.single-address-readback",
        created.as_deref().is_some_and(same) && read.as_deref().is_ok_and(same),
        &expected,
        &format!("create response {created:?}, GET .../egress {read:?}"),
    );
    enforced(ctx, &sb, "egress.cidr32-enforced").await;
    if !finish_guest(ctx, &sb, "/32").await {
        ctx.block("the /32 guest never reached `destroyed`".to_owned());
        return;
    }

    if ctx.loopback {
        ctx.skip("egress.bare-ip-enforced", FAKE_NO_ENFORCEMENT);
        return;
    }
    let req = CreateSandboxRequest::new(shape)
        .rootfs(&ctx.rootfs)
        .name(ctx.name("bare"))
        .egress([ALLOWED])
        .auto_pause_after_seconds(60);
    match ctx.create(req).await {
        Ok(sb) => {
            enforced(ctx, &sb, "egress.bare-ip-enforced").await;
            let _ = finish_guest(ctx, &sb, "bare-address").await;
        }
        Err(e) => ctx.check(
            "egress.bare-ip-enforced",
            false,
            "the create is accepted",
            &describe(&e),
        ),
    }
}

/// Records `id`: the guest reaches [`ALLOWED`]`:443` and not [`UNLISTED`]`:443`. Skipped
/// against loopback (the fake does not enforce egress, and this machine must not probe out).
async fn enforced(ctx: &Ctx, sb: &Sandbox, id: &str) {
    if ctx.loopback {
        ctx.skip(id, FAKE_NO_ENFORCEMENT);
        return;
    }
    let expected = format!("{ALLOWED}:443 \"open\", {UNLISTED}:443 \"blocked\"");
    if let Err(e) = sb
        .wait_until_running(WaitOptions::timeout(STATE_BUDGET))
        .await
    {
        ctx.check(id, false, &expected, &describe(&e));
        return;
    }
    let listed = exec(sb, connect_probe(ALLOWED, 443)).await;
    let unlisted = exec(sb, connect_probe(UNLISTED, 443)).await;
    let said = |r: &Result<createos_api::CommandResult, String>, word: &str| matches!(r, Ok(c) if c.stdout.trim() == word);
    ctx.check(
        id,
        said(&listed, "open") && said(&unlisted, "blocked"),
        &expected,
        &format!(
            "{ALLOWED}:443 {}; {UNLISTED}:443 {}",
            show(&listed),
            show(&unlisted)
        ),
    );
}

#[cfg(test)]
mod tests {
    use super::shape_id_ok;

    #[test]
    fn shape_ids() {
        assert!(shape_id_ok("s-1vcpu-256mb", 1));
        assert!(shape_id_ok("s-2vcpu-4gb", 2));
        assert!(!shape_id_ok("s-2vcpu-4gb", 4));
        assert!(!shape_id_ok("s-2vcpu-4tb", 2));
        assert!(!shape_id_ok("small", 1));
        assert!(!shape_id_ok("s-xvcpu-gb", 1));
    }
}
