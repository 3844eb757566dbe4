//! Request handlers for the account, sandbox, exec and files routes.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::response::Response;
use bytes::Bytes;
use futures::StreamExt;
use nix::sys::signal::Signal;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use crate::exec::{self, Spec, stream_response};
use crate::guest::{merge_env, require_running, with_sandbox, with_sandbox_mut};
use crate::jsend::{ApiError, ApiResult, ok, page};
use crate::request::{Req, opt_bool, opt_str, opt_str_list, opt_str_map, opt_u64, paging};
use crate::state::{App, Inner, Mount, Sandbox, Status, pause_now};
use crate::util::{map_guest_file, now_rfc3339, random_id};
use crate::{extra, procs};

/// `(id, vcpu, mem_mib, default_disk_mib, cpu_quota_pct)`.
pub(crate) const SHAPES: &[(&str, u64, u64, u64, u64)] = &[
    ("s-1vcpu-256mb", 1, 256, 2048, 100),
    ("s-1vcpu-1gb", 1, 1024, 4096, 100),
    ("s-2vcpu-2gb", 2, 2048, 8192, 200),
    ("s-2vcpu-4gb", 2, 4096, 10240, 200),
    ("s-4vcpu-8gb", 4, 8192, 20480, 400),
    ("s-4vcpu-16gb", 4, 16384, 40960, 400),
];

/// The rootfs catalog.
pub(crate) const ROOTFS: &[(&str, &str)] = &[
    (
        "devbox:1",
        "Debian with bash, coreutils (GNU timeout) and python3",
    ),
    ("desktop:1", "A desktop image for computer use"),
];

/// Routes a classified request to its handler.
pub(crate) async fn dispatch(app: &Arc<App>, mut req: Req) -> ApiResult {
    match req.name {
        "healthz" => ok(json!({"up": true})),
        "readyz" => ok(json!({"ready": true, "reason": "", "scheduler_last_ok_ms_ago": 0})),
        "whoami" => whoami(app),
        "shapes" => shapes(&req),
        "rootfs" => rootfs(),
        "hosts" => hosts(app, &req),
        "list" => list(app, &req),
        "create" => create(app, &mut req).await,
        "get" => with_sandbox(app, req.sid(), |sb| ok(sb.to_json())),
        "get_by_ip" => {
            let inner = app.lock();
            let sb = inner
                .sandboxes
                .iter()
                .find(|s| {
                    s.ip == req.sub() && !matches!(s.status, Status::Destroyed | Status::Creating)
                })
                .ok_or_else(|| ApiError::not_found("sandbox not found"))?;
            ok(sb.to_json())
        }
        "patch" => patch(app, &mut req).await,
        "delete" => delete(app, req.sid()),
        "pause" => pause(app, req.sid()),
        "resume" => resume(app, req.sid()),
        "fork" => fork(app, &mut req).await,
        "resize" => resize(app, &mut req).await,
        "ssh_keys" => ssh_keys(app, &mut req).await,
        "egress_get" => with_sandbox(app, req.sid(), |sb| {
            ok(json!({"id": sb.id, "egress": sb.egress}))
        }),
        "egress_put" => egress_put(app, &mut req).await,
        "bandwidth" => with_sandbox(app, req.sid(), |sb| ok(bandwidth_view(sb))),
        "recharge" => recharge(app, &mut req).await,
        "exec" | "exec_stream" => exec_route(app, &mut req).await,
        "upload" => upload(app, &mut req).await,
        "download" => download(app, &mut req).await,
        n if n.starts_with("process_") => procs::dispatch(app, &mut req).await,
        _ => extra::dispatch(app, &mut req).await,
    }
}

fn whoami(app: &App) -> ApiResult {
    let inner = app.lock();
    let (mut running, mut paused, mut other, mut total) = (0, 0, 0, 0);
    for sb in &inner.sandboxes {
        if sb.status == Status::Destroyed {
            continue;
        }
        total += 1;
        match sb.status {
            Status::Running => running += 1,
            Status::Paused => paused += 1,
            _ => other += 1,
        }
    }
    ok(json!({
        "user_id": "usr_fake",
        "stats": {"running": running, "paused": paused, "other": other, "total": total},
    }))
}

fn shapes(req: &Req) -> ApiResult {
    let (limit, offset) = paging(req)?;
    let rows = SHAPES
        .iter()
        .map(|(id, vcpu, mem, disk, quota)| {
            json!({"id": id, "vcpu": vcpu, "mem_mib": mem, "default_disk_mib": disk, "cpu_quota_pct": quota})
        })
        .collect();
    page(rows, limit, offset)
}

fn rootfs() -> ApiResult {
    ok(json!({
        "rootfs": ROOTFS.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
        "default": ROOTFS[0].0,
        "entries": ROOTFS.iter().map(|(n, d)| json!({"name": n, "description": d, "deprecated": false})).collect::<Vec<_>>(),
    }))
}

fn hosts(app: &App, req: &Req) -> ApiResult {
    let (limit, offset) = paging(req)?;
    let inner = app.lock();
    let vms = inner
        .sandboxes
        .iter()
        .filter(|s| s.status.is_live())
        .count();
    page(
        vec![json!({
            "id": "host-fake-1",
            "status": "active",
            "free_mib": 65_536,
            "vm_count": vms,
            "rootfses": ROOTFS.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
        })],
        limit,
        offset,
    )
}

fn list(app: &App, req: &Req) -> ApiResult {
    let (limit, offset) = paging(req)?;
    let filter = match req.q("status") {
        None | Some("") => None,
        Some(s) => Some(
            Status::parse_filter(s)
                .ok_or_else(|| ApiError::bad_request("status", format!("unknown status {s:?}")))?,
        ),
    };
    let inner = app.lock();
    let rows = inner
        .sandboxes
        .iter()
        .filter(|s| filter.is_none_or(|f| s.status.as_str() == f))
        .map(Sandbox::to_json)
        .collect();
    page(rows, limit, offset)
}

fn valid_env_name(k: &str) -> bool {
    let mut chars = k.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn validate_auto_pause(v: u64) -> Result<u64, ApiError> {
    if (60..=86_400).contains(&v) {
        Ok(v)
    } else {
        Err(ApiError::bad_request(
            "auto_pause_after_seconds",
            "must be between 60 and 86400 seconds",
        ))
    }
}

fn validate_name(name: &str) -> Result<(), ApiError> {
    if name.chars().count() > 22 {
        return Err(ApiError::bad_request(
            "name",
            "must be at most 22 characters",
        ));
    }
    let mut chars = name.chars();
    let ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if ok {
        Ok(())
    } else {
        Err(ApiError::bad_request(
            "name",
            "must be lower-case letters, digits and '-', starting with a letter or digit",
        ))
    }
}

fn name_taken(inner: &Inner, name: &str) -> bool {
    inner
        .sandboxes
        .iter()
        .any(|s| s.status.holds_name() && s.name.as_deref() == Some(name))
}

/// Makes the guest directory with its mapped roots.
fn make_guest_dir(dir: &Path) -> Result<(), ApiError> {
    for sub in ["workspace", "tmp", "root"] {
        std::fs::create_dir_all(dir.join(sub)).map_err(|e| {
            ApiError::error(500, format!("could not create the guest directory: {e}"))
        })?;
    }
    Ok(())
}

fn new_sandbox(app: &App, inner: &mut Inner, shape: (&str, u64, u64, u64, u64)) -> Sandbox {
    inner.next_seq += 1;
    let seq = inner.next_seq;
    let id = format!("sbx-{}", random_id(16));
    let ip = format!("10.88.{}.{}", (seq / 250) % 250, seq % 250 + 2);
    Sandbox {
        dir: app.state_root.join(&id),
        id,
        name: None,
        status: Status::Running,
        shape: shape.0.to_owned(),
        vcpu: shape.1,
        mem_mib: shape.2,
        disk_mib: shape.3,
        rootfs: ROOTFS[0].0.to_owned(),
        ip,
        created_at: now_rfc3339(),
        running_at: Some(now_rfc3339()),
        paused_at: None,
        last_resumed_at: None,
        destroyed_at: None,
        ingress_enabled: false,
        egress: Vec::new(),
        envs: BTreeMap::new(),
        ssh_pubkeys: Vec::new(),
        forked_from: None,
        auto_pause: None,
        last_activity: app.now(),
        pgids: Vec::new(),
        bandwidth_quota: -1,
        bandwidth_used: 0,
        bandwidth_ingress: 0,
        networks: Vec::new(),
        mounts: Vec::new(),
        token: None,
        processes: BTreeMap::new(),
        desktop: None,
        epoch: 0,
        net: None,
    }
}

/// In the enforcing mode, a new guest network whose firewall holds `rules` (created off the
/// async threads: it runs `ip` and `nft`).
async fn guest_net(
    app: &Arc<App>,
    rules: &[String],
) -> Result<Option<crate::egress::GuestNet>, ApiError> {
    if app.enforcer.is_none() {
        return Ok(None);
    }
    let (app, rules) = (app.clone(), rules.to_vec());
    let made = tokio::task::spawn_blocking(move || {
        app.enforcer.as_ref().map(|e| e.attach(&rules)).transpose()
    })
    .await
    .map_err(|e| ApiError::error(500, format!("could not create the guest network: {e}")))?;
    made.map_err(|e| ApiError::error(500, format!("could not create the guest network: {e}")))
}

async fn create(app: &Arc<App>, req: &mut Req) -> ApiResult {
    let body = req.json().await?;
    let shape_id = opt_str(&body, "shape")?.filter(|s| !s.is_empty());
    let Some(shape_id) = shape_id else {
        return Err(ApiError::bad_request("shape", "is required"));
    };
    let shape = *SHAPES
        .iter()
        .find(|s| s.0 == shape_id)
        .ok_or_else(|| ApiError::bad_request("shape", format!("unknown shape {shape_id:?}")))?;
    let name = opt_str(&body, "name")?.filter(|s| !s.is_empty());
    if let Some(n) = &name {
        validate_name(n)?;
    }
    let rootfs_req = opt_str(&body, "rootfs")?.unwrap_or_default();
    let disk_mib = opt_u64(&body, "disk_mib")?.unwrap_or(0);
    let egress = opt_str_list(&body, "egress")?.unwrap_or_default();
    let envs = opt_str_map(&body, "envs")?.unwrap_or_default();
    if let Some(bad) = envs.keys().find(|k| !valid_env_name(k)) {
        return Err(ApiError::bad_request(
            "envs",
            format!("invalid variable name {bad:?}"),
        ));
    }
    let ssh = opt_str_list(&body, "ssh_pubkeys")?.unwrap_or_default();
    let ingress = opt_bool(&body, "ingress_enabled")?.unwrap_or(false);
    let auto_pause = match opt_u64(&body, "auto_pause_after_seconds")? {
        None | Some(0) => None,
        Some(v) => Some(validate_auto_pause(v)?),
    };
    if let Some(region) = opt_str(&body, "region")?
        && !region.is_empty()
        && region != "fake-local"
    {
        return Err(ApiError::bad_request("region", "must be fake-local"));
    }
    let networks: Vec<String> = match body.get("networks") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|n| n.get("id").and_then(Value::as_str).map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| ApiError::bad_request("networks", "must be a list of {id}"))?,
        Some(_) => return Err(ApiError::bad_request("networks", "must be a list of {id}")),
    };
    let mounts: Vec<Mount> = match body.get("disks") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|d| {
                Some(Mount {
                    disk_id: d.get("disk_id")?.as_str()?.to_owned(),
                    target: d.get("mount_path")?.as_str()?.to_owned(),
                    sub_path: d
                        .get("sub_path")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_owned(),
                })
            })
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                ApiError::bad_request("disks", "must be a list of {disk_id, mount_path}")
            })?,
        Some(_) => return Err(ApiError::bad_request("disks", "must be a list")),
    };
    let net = guest_net(app, &egress).await?;
    let view = {
        let mut inner = app.lock();
        let rootfs = resolve_rootfs(&inner, &rootfs_req)?;
        if let Some(n) = networks
            .iter()
            .find(|n| !inner.networks.iter().any(|x| &x.id == *n))
        {
            return Err(ApiError::not_found(format!("network {n} not found")));
        }
        if let Some(m) = mounts
            .iter()
            .find(|m| !inner.disks.iter().any(|d| d.id == m.disk_id))
        {
            return Err(ApiError::not_found(format!("disk {} not found", m.disk_id)));
        }
        if let Some(n) = &name
            && name_taken(&inner, n)
        {
            return Err(ApiError::fail_field(
                409,
                "name",
                format!("a sandbox named {n:?} already exists"),
            ));
        }
        let quota = app.max_live.load(std::sync::atomic::Ordering::SeqCst);
        if quota > 0 && inner.live() >= quota {
            inner.quota_refusals += 1;
            return Err(ApiError::error(
                429,
                format!("sandbox quota exceeded: the account allows {quota} live sandboxes"),
            ));
        }
        let mut sb = new_sandbox(app, &mut inner, shape);
        make_guest_dir(&sb.dir)?;
        sb.name = name;
        sb.rootfs = rootfs;
        if disk_mib > 0 {
            sb.disk_mib = disk_mib;
        }
        sb.egress = egress;
        sb.envs = envs;
        sb.ssh_pubkeys = dedup(ssh);
        sb.ingress_enabled = ingress;
        sb.auto_pause = auto_pause;
        sb.networks = networks;
        sb.mounts = mounts;
        if let Some(net) = net {
            sb.ip = net.addr().to_string();
            sb.net = Some(net);
        }
        if !app.create_delay.is_zero() {
            sb.status = Status::Creating;
            sb.running_at = None;
            schedule_transition(
                app,
                sb.id.clone(),
                sb.epoch,
                app.create_delay,
                Status::Creating,
                |sb, now| {
                    sb.status = Status::Running;
                    sb.running_at = Some(now_rfc3339());
                    sb.last_activity = now;
                    sb.epoch += 1;
                },
            );
        }
        let view = sb.to_json();
        inner.sandboxes.push(sb);
        inner.note_created();
        view
    };
    ok(view)
}

fn resolve_rootfs(inner: &Inner, req: &str) -> Result<String, ApiError> {
    if req.is_empty() {
        return Ok(ROOTFS[0].0.to_owned());
    }
    if ROOTFS.iter().any(|(n, _)| *n == req) {
        return Ok(req.to_owned());
    }
    if let Some(t) = inner
        .templates
        .iter()
        .find(|t| t.id == req || t.name == req)
    {
        if t.status == "ready" {
            return Ok(t.id.clone());
        }
        return Err(ApiError::bad_request(
            "rootfs",
            format!("template {req:?} is {}", t.status),
        ));
    }
    Err(ApiError::bad_request(
        "rootfs",
        format!("unknown rootfs {req:?}"),
    ))
}

fn dedup(v: Vec<String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for s in v {
        if !out.contains(&s) {
            out.push(s);
        }
    }
    out
}

async fn patch(app: &Arc<App>, req: &mut Req) -> ApiResult {
    let body = req.json().await?;
    let ingress = opt_bool(&body, "ingress_enabled")?;
    let auto = opt_u64(&body, "auto_pause_after_seconds")?
        .map(validate_auto_pause)
        .transpose()?;
    let disable = opt_bool(&body, "disable_auto_pause")?.unwrap_or(false);
    if disable && auto.is_some() {
        return Err(ApiError::bad_request(
            "disable_auto_pause",
            "cannot be combined with auto_pause_after_seconds",
        ));
    }
    let view = with_sandbox_mut(app, req.sid(), |sb| {
        if !sb.status.is_live() {
            return Err(ApiError::conflict(format!(
                "sandbox is {}",
                sb.status.as_str()
            )));
        }
        if let Some(i) = ingress {
            sb.ingress_enabled = i;
        }
        if let Some(a) = auto {
            sb.auto_pause = Some(a);
        }
        if disable {
            sb.auto_pause = None;
        }
        Ok(sb.to_json())
    })?;
    ok(view)
}

fn delete(app: &Arc<App>, id: &str) -> ApiResult {
    let view = {
        let mut inner = app.lock();
        let sb = inner
            .sandbox_mut(id)
            .ok_or_else(|| ApiError::not_found("sandbox not found"))?;
        if !sb.status.is_live() {
            return ok(json!({"id": sb.id, "status": sb.status.as_str()}));
        }
        sb.signal_all(Signal::SIGCONT);
        sb.signal_all(Signal::SIGKILL);
        sb.status = Status::Destroying;
        sb.epoch += 1;
        let epoch = sb.epoch;
        let token = sb.token.as_ref().map(|t| t.value.clone());
        let view = json!({"id": sb.id, "status": "destroying"});
        if let Some(t) = token {
            inner.tokens.remove(&t);
        }
        schedule_destroy(app, id.to_owned(), epoch);
        view
    };
    ok(view)
}

fn schedule_destroy(app: &Arc<App>, id: String, epoch: u64) {
    let app = app.clone();
    tokio::spawn(async move {
        tokio::select! {
            () = tokio::time::sleep(app.destroy_delay) => {},
            () = app.shutdown.cancelled() => return,
        }
        finish_destroy(&app, &id, epoch);
    });
}

/// Completes a destroy: the directory is removed, then the guest is `destroyed`.
pub(crate) fn finish_destroy(app: &App, id: &str, epoch: u64) {
    let (dir, net) = {
        let mut inner = app.lock();
        let Some(sb) = inner.sandbox_mut(id) else {
            return;
        };
        if sb.status != Status::Destroying || sb.epoch != epoch {
            return;
        }
        sb.signal_all(Signal::SIGKILL);
        (sb.dir.clone(), sb.net.take())
    };
    drop(net);
    let _ = std::fs::remove_dir_all(dir);
    let mut inner = app.lock();
    let Some(sb) = inner.sandbox_mut(id) else {
        return;
    };
    if sb.status != Status::Destroying || sb.epoch != epoch {
        return;
    }
    sb.status = Status::Destroyed;
    sb.destroyed_at = Some(now_rfc3339());
    inner.destroyed += 1;
}

fn pause(app: &Arc<App>, id: &str) -> ApiResult {
    let view = with_sandbox_mut(app, id, |sb| {
        match sb.status {
            Status::Running if app.pause_delay.is_zero() => pause_now(sb),
            Status::Running => {
                sb.status = Status::Pausing;
                sb.epoch += 1;
                schedule_transition(
                    app,
                    sb.id.clone(),
                    sb.epoch,
                    app.pause_delay,
                    Status::Pausing,
                    |sb, _| pause_now(sb),
                );
            }
            Status::Paused | Status::Pausing => {}
            other => {
                return Err(ApiError::conflict(format!(
                    "sandbox is {}; cannot pause",
                    other.as_str()
                )));
            }
        }
        Ok(sb.to_json())
    })?;
    ok(view)
}

fn resume(app: &Arc<App>, id: &str) -> ApiResult {
    let view = with_sandbox_mut(app, id, |sb| {
        match sb.status {
            Status::Paused => {
                sb.status = Status::Resuming;
                sb.epoch += 1;
                schedule_running(app, sb.id.clone(), sb.epoch);
            }
            Status::Running | Status::Resuming => {}
            other => {
                return Err(ApiError::conflict(format!(
                    "sandbox is {}; cannot resume",
                    other.as_str()
                )));
            }
        }
        Ok(sb.to_json())
    })?;
    ok(view)
}

fn schedule_running(app: &Arc<App>, id: String, epoch: u64) {
    let app = app.clone();
    tokio::spawn(async move {
        tokio::select! {
            () = tokio::time::sleep(app.resume_delay) => {},
            () = app.shutdown.cancelled() => return,
        }
        let now = app.now();
        let mut inner = app.lock();
        if let Some(sb) = inner.sandbox_mut(&id)
            && sb.status == Status::Resuming
            && sb.epoch == epoch
        {
            sb.status = Status::Running;
            sb.last_resumed_at = Some(now_rfc3339());
            sb.last_activity = now;
            sb.epoch += 1;
            sb.signal_all(Signal::SIGCONT);
        }
    });
}

/// After `delay`, applies `f` (given the injectable clock's time) to the guest if it is still
/// `from` at `epoch`; any state change in between (e.g. a DELETE) makes the transition stale.
fn schedule_transition(
    app: &Arc<App>,
    id: String,
    epoch: u64,
    delay: std::time::Duration,
    from: Status,
    f: impl FnOnce(&mut Sandbox, std::time::Duration) + Send + 'static,
) {
    let app = app.clone();
    tokio::spawn(async move {
        tokio::select! {
            () = tokio::time::sleep(delay) => {},
            () = app.shutdown.cancelled() => return,
        }
        let now = app.now();
        let mut inner = app.lock();
        if let Some(sb) = inner.sandbox_mut(&id)
            && sb.status == from
            && sb.epoch == epoch
        {
            f(sb, now);
        }
    });
}

async fn fork(app: &Arc<App>, req: &mut Req) -> ApiResult {
    let body = req.json().await?;
    let start_paused = opt_bool(&body, "start_paused")?.unwrap_or(false);
    let ssh = opt_str_list(&body, "ssh_pubkeys")?;
    let egress = opt_str_list(&body, "egress")?;
    let ingress = opt_bool(&body, "ingress_enabled")?;
    let envs = opt_str_map(&body, "envs")?;
    let (src_dir, new_dir, id) = {
        let mut inner = app.lock();
        let src = inner
            .sandbox(req.sid())
            .ok_or_else(|| ApiError::not_found("sandbox not found"))?;
        if !matches!(src.status, Status::Running | Status::Paused) {
            return Err(ApiError::conflict(format!(
                "sandbox is {}; cannot fork",
                src.status.as_str()
            )));
        }
        let shape = *SHAPES
            .iter()
            .find(|s| s.0 == src.shape)
            .unwrap_or(&SHAPES[0]);
        let (src_id, src_dir) = (src.id.clone(), src.dir.clone());
        // A fork is a snapshot of the whole VM, so a started desktop comes along.
        let src_desktop = src.desktop.clone();
        let (rootfs, disk, src_egress, src_envs, src_ssh, src_ingress, src_auto) = (
            src.rootfs.clone(),
            src.disk_mib,
            src.egress.clone(),
            src.envs.clone(),
            src.ssh_pubkeys.clone(),
            src.ingress_enabled,
            src.auto_pause,
        );
        let mut sb = new_sandbox(app, &mut inner, shape);
        sb.status = Status::Forking;
        sb.rootfs = rootfs;
        sb.disk_mib = disk;
        sb.egress = egress.unwrap_or(src_egress);
        let mut merged = src_envs;
        if let Some(e) = envs {
            merged.extend(e);
        }
        sb.envs = merged;
        sb.ssh_pubkeys = ssh.map_or(src_ssh, dedup);
        sb.ingress_enabled = ingress.unwrap_or(src_ingress);
        sb.auto_pause = src_auto;
        sb.forked_from = Some(src_id);
        sb.desktop = src_desktop;
        let out = (src_dir, sb.dir.clone(), sb.id.clone());
        inner.sandboxes.push(sb);
        inner.note_created();
        out
    };
    let copied = tokio::task::spawn_blocking(move || copy_dir(&src_dir, &new_dir)).await;
    let rules = with_sandbox_mut(app, &id, |sb| Ok(sb.egress.clone()))?;
    let net = guest_net(app, &rules).await;
    let view = with_sandbox_mut(app, &id, |sb| {
        let net_failed = match net {
            Ok(Some(net)) => {
                sb.ip = net.addr().to_string();
                sb.net = Some(net);
                false
            }
            Ok(None) => false,
            Err(_) => true,
        };
        if net_failed && sb.status == Status::Forking {
            sb.status = Status::Error;
        }
        if sb.status == Status::Forking {
            if matches!(copied, Ok(Ok(()))) && !app.fork_delay.is_zero() {
                schedule_transition(
                    app,
                    sb.id.clone(),
                    sb.epoch,
                    app.fork_delay,
                    Status::Forking,
                    move |sb, now| {
                        if start_paused {
                            sb.status = Status::Paused;
                            sb.paused_at = Some(now_rfc3339());
                        } else {
                            sb.status = Status::Running;
                            sb.running_at = Some(now_rfc3339());
                            sb.last_activity = now;
                        }
                        sb.epoch += 1;
                    },
                );
            } else if matches!(copied, Ok(Ok(()))) {
                sb.status = if start_paused {
                    Status::Paused
                } else {
                    Status::Running
                };
                if start_paused {
                    sb.paused_at = Some(now_rfc3339());
                }
            } else {
                sb.status = Status::Error;
            }
        }
        Ok(sb.to_json())
    })?;
    ok(view)
}

/// Recursively copies a directory tree (files, directories and symlinks).
fn copy_dir(src: &Path, dst: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dst)?;
    for entry in std::fs::read_dir(src)? {
        let entry = entry?;
        let ty = entry.file_type()?;
        let to = dst.join(entry.file_name());
        if ty.is_dir() {
            copy_dir(&entry.path(), &to)?;
        } else if ty.is_symlink() {
            let target = std::fs::read_link(entry.path())?;
            let _ = std::os::unix::fs::symlink(target, &to);
        } else if ty.is_file() {
            std::fs::copy(entry.path(), &to)?;
        }
    }
    Ok(())
}

async fn resize(app: &Arc<App>, req: &mut Req) -> ApiResult {
    let body = req.json().await?;
    let disk = opt_u64(&body, "disk_mib")?
        .ok_or_else(|| ApiError::bad_request("disk_mib", "is required"))?;
    let view = with_sandbox_mut(app, req.sid(), |sb| {
        if !sb.status.is_live() {
            return Err(ApiError::conflict(format!(
                "sandbox is {}",
                sb.status.as_str()
            )));
        }
        if disk < sb.disk_mib {
            return Err(ApiError::bad_request("disk_mib", "disks can only grow"));
        }
        sb.disk_mib = disk;
        Ok(json!({"id": sb.id, "disk_mib": sb.disk_mib}))
    })?;
    ok(view)
}

async fn ssh_keys(app: &Arc<App>, req: &mut Req) -> ApiResult {
    let body = req.json().await?;
    let keys =
        opt_str_list(&body, "keys")?.ok_or_else(|| ApiError::bad_request("keys", "is required"))?;
    let view = with_sandbox_mut(app, req.sid(), |sb| {
        for k in keys {
            let k = k.trim().to_owned();
            if !k.is_empty() && !sb.ssh_pubkeys.contains(&k) {
                sb.ssh_pubkeys.push(k);
            }
        }
        Ok(json!({"count": sb.ssh_pubkeys.len()}))
    })?;
    ok(view)
}

async fn egress_put(app: &Arc<App>, req: &mut Req) -> ApiResult {
    let body = req.json().await?;
    if !body.contains_key("egress") {
        return Err(ApiError::bad_request(
            "egress",
            "is required (null allowed)",
        ));
    }
    let rules = opt_str_list(&body, "egress")?.unwrap_or_default();
    let view = with_sandbox_mut(app, req.sid(), |sb| {
        if let Some(net) = &sb.net {
            net.apply(&rules).map_err(|e| {
                ApiError::error(500, format!("could not apply the egress rules: {e}"))
            })?;
        }
        sb.egress = rules;
        Ok(json!({"id": sb.id, "egress": sb.egress}))
    })?;
    ok(view)
}

fn bandwidth_view(sb: &Sandbox) -> Value {
    let used = i64::try_from(sb.bandwidth_used).unwrap_or(i64::MAX);
    let (remaining, capped) = if sb.bandwidth_quota < 0 {
        (-1, false)
    } else {
        let r = (sb.bandwidth_quota - used).max(0);
        (r, r == 0)
    };
    json!({
        "id": sb.id,
        "quota_bytes": sb.bandwidth_quota,
        "used_bytes": sb.bandwidth_used,
        "ingress_bytes": sb.bandwidth_ingress,
        "remaining_bytes": remaining,
        "capped": capped,
    })
}

async fn recharge(app: &Arc<App>, req: &mut Req) -> ApiResult {
    let body = req.json().await?;
    let add = opt_u64(&body, "add_bytes")?
        .filter(|v| *v > 0)
        .ok_or_else(|| ApiError::bad_request("add_bytes", "must be a positive integer"))?;
    let view = with_sandbox_mut(app, req.sid(), |sb| {
        if sb.bandwidth_quota >= 0 {
            sb.bandwidth_quota = sb
                .bandwidth_quota
                .saturating_add(i64::try_from(add).unwrap_or(i64::MAX));
        }
        Ok(bandwidth_view(sb))
    })?;
    ok(view)
}

// ---- exec ------------------------------------------------------------------------------------

async fn exec_route(app: &Arc<App>, req: &mut Req) -> ApiResult {
    let streaming = req.name == "exec_stream";
    let body = req.json().await?;
    let cmd = opt_str(&body, "cmd")?
        .filter(|c| !c.is_empty())
        .ok_or_else(|| ApiError::bad_request("cmd", "is required"))?;
    let args = opt_str_list(&body, "args")?.unwrap_or_default();
    let stdin = opt_str(&body, "stdin")?.filter(|s| !s.is_empty());
    let env = opt_str_map(&body, "env")?;
    let now = app.now();
    let (dir, env, netns) = with_sandbox_mut(app, req.sid(), |sb| {
        require_running(sb)?;
        let env = merge_env(sb, env)?;
        sb.last_activity = now;
        Ok((sb.dir.clone(), env, sb.netns()))
    })?;
    let count = app.exec_started();
    let spec = Spec {
        cmd,
        args,
        stdin: stdin.map(String::into_bytes),
        env,
        cwd: None,
        netns,
    };
    let spawned = exec::spawn(app, &dir, &spec, false);
    if let Ok(r) = &spawned {
        let pgid = r.pgid;
        let _ = with_sandbox_mut(app, req.sid(), |sb| {
            sb.pgids.push(pgid);
            Ok(())
        });
    }
    if streaming {
        let (tx, rx) = mpsc::channel::<Bytes>(32);
        match spawned {
            Ok(running) => {
                let app2 = app.clone();
                let stall_mid = req.stall_mid;
                tokio::spawn(async move {
                    let _count = count;
                    exec::run_streaming(app2, running, tx, stall_mid).await;
                });
            }
            Err(msg) => {
                drop(count);
                let _ = tx.try_send(exec::frame(app.sse, &json!({"error": msg})));
                let _ = tx.try_send(exec::frame(app.sse, &json!({"exit_code": 127})));
            }
        }
        return Ok(stream_response(app.sse, rx));
    }
    let (result, ms) = match spawned {
        Ok(running) => exec::run_buffered(running).await,
        Err(msg) => (
            json!({"stdout": "", "stderr": "", "exit_code": 127, "error": msg}),
            0,
        ),
    };
    drop(count);
    ok(json!({"result": result, "exec_ms": u64::try_from(ms).unwrap_or(u64::MAX)}))
}

// ---- files -------------------------------------------------------------------------------

fn file_target(app: &App, req: &Req) -> Result<(std::path::PathBuf, String), ApiError> {
    let path = req
        .q("path")
        .filter(|p| !p.is_empty())
        .ok_or_else(|| ApiError::bad_request("path", "is required"))?
        .to_owned();
    let dir = {
        let inner = app.lock();
        let sb = inner
            .sandbox(req.sid())
            .ok_or_else(|| ApiError::not_found("sandbox not found"))?;
        require_running(sb)?;
        sb.dir.clone()
    };
    let host = map_guest_file(&path, &dir).map_err(|e| ApiError::bad_request("path", e))?;
    Ok((host, path))
}

async fn upload(app: &Arc<App>, req: &mut Req) -> ApiResult {
    let (host, path) = file_target(app, req)?;
    if host.is_dir() {
        return Err(ApiError::bad_request("path", "is a directory"));
    }
    if let Some(parent) = host.parent() {
        tokio::fs::create_dir_all(parent).await.map_err(|e| {
            ApiError::bad_request("path", format!("cannot create parent directories: {e}"))
        })?;
    }
    let mut file = tokio::fs::File::create(&host)
        .await
        .map_err(|e| ApiError::bad_request("path", format!("cannot write: {e}")))?;
    let mut stream = req.take_body().into_data_stream();
    let mut total: u64 = 0;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|_| ApiError::bad_request("body", "upload interrupted"))?;
        total += chunk.len() as u64;
        file.write_all(&chunk)
            .await
            .map_err(|e| ApiError::error(500, format!("write failed: {e}")))?;
    }
    file.flush()
        .await
        .map_err(|e| ApiError::error(500, format!("write failed: {e}")))?;
    ok(json!({"bytes": total, "path": path}))
}

async fn download(app: &Arc<App>, req: &mut Req) -> ApiResult {
    let (host, path) = file_target(app, req)?;
    let meta = tokio::fs::metadata(&host)
        .await
        .map_err(|_| ApiError::not_found(format!("file not found: {path}")))?;
    if meta.is_dir() {
        return Err(ApiError::bad_request("path", "is a directory"));
    }
    let file = tokio::fs::File::open(&host)
        .await
        .map_err(|_| ApiError::not_found(format!("file not found: {path}")))?;
    let stream = tokio_util::io::ReaderStream::new(file);
    Ok(Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/octet-stream")
        .header(header::CONTENT_LENGTH, meta.len())
        .body(Body::from_stream(stream))
        .unwrap_or_default())
}
