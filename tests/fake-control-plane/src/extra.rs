//! Access tokens, templates, networks and disks (computer use is in `computer`).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;

use crate::computer;
use crate::exec::{frame, stream_response};
use crate::guest::{require_running, with_sandbox};
use crate::jsend::{ApiError, ApiResult, ok, page};
use crate::request::{Req, opt_str, paging};
use crate::state::{App, Disk, Inner, Mount, Network, Status, Template, Token};
use crate::util::{map_guest_file, now_rfc3339, random_id};

/// Routes for tokens, templates, networks, disks and (through `desktop`) computer use.
pub(crate) async fn dispatch(app: &Arc<App>, req: &mut Req) -> ApiResult {
    match req.name {
        "token_create" => token_issue(app, req, false),
        "token_rotate" => token_issue(app, req, true),
        "token_get" => with_sandbox(app, req.sid(), |sb| {
            let Some(t) = &sb.token else {
                return ok(json!({"enabled": false}));
            };
            let mut v = json!({"enabled": t.enabled, "created_at": t.created_at});
            if t.enabled {
                let tail: String = t
                    .value
                    .chars()
                    .rev()
                    .take(4)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect();
                v["token_hint"] = json!(format!("skp_sb...{tail}"));
            }
            if let Some(r) = &t.rotated_at {
                v["rotated_at"] = json!(r);
            }
            ok(v)
        }),
        "token_delete" => {
            let mut inner = app.lock();
            let sb = inner
                .sandbox_mut(req.sid())
                .ok_or_else(|| ApiError::not_found("sandbox not found"))?;
            let old = sb.token.as_mut().map(|t| {
                t.enabled = false;
                t.value.clone()
            });
            if let Some(old) = old {
                inner.tokens.remove(&old);
            }
            ok(json!({"enabled": false}))
        }
        "template_list" => {
            let (limit, offset) = paging(req)?;
            let rows = app
                .lock()
                .templates
                .iter()
                .map(|t| t.to_json(false))
                .collect();
            page(rows, limit, offset)
        }
        "template_create" => template_create(app, req).await,
        "template_get" => {
            let include = req
                .q("include")
                .is_some_and(|v| v.split(',').any(|x| x == "dockerfile"));
            let inner = app.lock();
            let t = find_template(&inner.templates, req.sub())?;
            ok(t.to_json(include))
        }
        "template_delete" => {
            let mut inner = app.lock();
            let before = inner.templates.len();
            let sub = req.sub().to_owned();
            inner.templates.retain(|t| t.id != sub && t.name != sub);
            if inner.templates.len() == before {
                return Err(ApiError::not_found("template not found"));
            }
            ok(json!({"deleted": true}))
        }
        "template_logs" => {
            let inner = app.lock();
            let t = find_template(&inner.templates, req.sub())?;
            let mut text = t.logs.join("\n");
            if !text.is_empty() {
                text.push('\n');
            }
            Ok(axum::response::Response::builder()
                .status(200)
                .header("content-type", "text/plain; charset=utf-8")
                .body(axum::body::Body::from(text))
                .unwrap_or_default())
        }
        "template_follow" => template_follow(app, req),
        "network_list" => {
            let (limit, offset) = paging(req)?;
            let inner = app.lock();
            let rows = inner
                .networks
                .iter()
                .map(|n| network_json(&inner, n, false))
                .collect();
            page(rows, limit, offset)
        }
        "network_create" => {
            let body = req.json().await?;
            let name = opt_str(&body, "name")?
                .filter(|n| !n.is_empty())
                .ok_or_else(|| ApiError::bad_request("name", "is required"))?;
            let mut inner = app.lock();
            if inner.networks.iter().any(|n| n.name == name) {
                return Err(ApiError::fail_field(
                    409,
                    "name",
                    "a network with this name exists",
                ));
            }
            let n = Network {
                id: format!("net_{}", random_id(16)),
                name,
                created_at: now_rfc3339(),
            };
            let v = network_json(&inner, &n, true);
            inner.networks.push(n);
            ok(v)
        }
        "network_get" => {
            let inner = app.lock();
            let n = inner
                .networks
                .iter()
                .find(|n| n.id == req.sub())
                .ok_or_else(|| ApiError::not_found("network not found"))?;
            ok(network_json(&inner, n, true))
        }
        "network_delete" => {
            let mut inner = app.lock();
            let nid = req.sub().to_owned();
            if !inner.networks.iter().any(|n| n.id == nid) {
                return Err(ApiError::not_found("network not found"));
            }
            if inner
                .sandboxes
                .iter()
                .any(|s| s.status.is_live() && s.networks.contains(&nid))
            {
                return Err(ApiError::conflict(
                    "network still has members; detach them first",
                ));
            }
            inner.networks.retain(|n| n.id != nid);
            ok(json!({"deleted": true}))
        }
        "network_attach" => {
            let body = req.json().await?;
            let nid = opt_str(&body, "id")?
                .filter(|n| !n.is_empty())
                .ok_or_else(|| ApiError::bad_request("id", "is required"))?;
            let mut inner = app.lock();
            if !inner.networks.iter().any(|n| n.id == nid) {
                return Err(ApiError::not_found("network not found"));
            }
            let sb = inner
                .sandbox_mut(req.sid())
                .ok_or_else(|| ApiError::not_found("sandbox not found"))?;
            if !sb.status.is_live() {
                return Err(ApiError::conflict(format!(
                    "sandbox is {}",
                    sb.status.as_str()
                )));
            }
            if !sb.networks.contains(&nid) {
                sb.networks.push(nid.clone());
            }
            ok(json!({"ok": true, "id": sb.id, "network_id": nid}))
        }
        "network_detach" => {
            let mut inner = app.lock();
            let sb = inner
                .sandbox_mut(req.sid())
                .ok_or_else(|| ApiError::not_found("sandbox not found"))?;
            let nid = req.sub().to_owned();
            if !sb.networks.contains(&nid) {
                return Err(ApiError::not_found(
                    "the sandbox is not attached to this network",
                ));
            }
            sb.networks.retain(|n| *n != nid);
            ok(json!({"ok": true, "id": sb.id, "network_id": nid}))
        }
        "disk_list" => {
            let (limit, offset) = paging(req)?;
            let rows = app.lock().disks.iter().map(Disk::to_json).collect();
            page(rows, limit, offset)
        }
        "disk_create" => disk_create(app, req).await,
        "disk_get" => {
            let inner = app.lock();
            ok(find_disk(&inner.disks, req.sub())?.to_json())
        }
        "disk_delete" => {
            let mut inner = app.lock();
            let id = find_disk(&inner.disks, req.sub())?.id.clone();
            inner.disks.retain(|d| d.id != id);
            for sb in &mut inner.sandboxes {
                sb.mounts.retain(|m| m.disk_id != id);
            }
            ok(json!({"deleted": true}))
        }
        "disk_patch" => {
            let body = req.json().await?;
            let key = credentials(&body)?;
            let mut inner = app.lock();
            let id = find_disk(&inner.disks, req.sub())?.id.clone();
            let d = inner
                .disks
                .iter_mut()
                .find(|d| d.id == id)
                .ok_or_else(|| ApiError::not_found("disk not found"))?;
            d.access_key = key;
            ok(d.to_json())
        }
        "sandbox_disks" => {
            let (limit, offset) = paging(req)?;
            let inner = app.lock();
            let sb = inner
                .sandbox(req.sid())
                .ok_or_else(|| ApiError::not_found("sandbox not found"))?;
            let rows = sb
                .mounts
                .iter()
                .map(|m| {
                    let d = inner.disks.iter().find(|d| d.id == m.disk_id);
                    json!({
                        "disk_id": m.disk_id,
                        "name": d.map(|d| d.name.clone()).unwrap_or_default(),
                        "kind": "s3",
                        "config": d.map_or(Value::Null, |d| d.config.clone()),
                        "mount_path": m.target,
                        "sub_path": m.sub_path,
                        "mount_status": "mounted",
                        "mount_error": "",
                    })
                })
                .collect();
            page(rows, limit, offset)
        }
        "disk_attach" => disk_attach(app, req).await,
        "disk_detach" => {
            let mount_path = req
                .q("mount_path")
                .filter(|m| !m.is_empty())
                .ok_or_else(|| ApiError::bad_request("mount_path", "is required"))?
                .to_owned();
            let mut inner = app.lock();
            let sb = inner
                .sandbox_mut(req.sid())
                .ok_or_else(|| ApiError::not_found("sandbox not found"))?;
            let before = sb.mounts.len();
            let did = req.sub().to_owned();
            sb.mounts
                .retain(|m| !(m.disk_id == did && m.target == mount_path));
            if sb.mounts.len() == before {
                return Err(ApiError::not_found("no such mount on this sandbox"));
            }
            ok(json!({"detached": true}))
        }
        "computer" => computer::dispatch(app, req).await,
        _ => Err(ApiError::not_found("no such route")),
    }
}

fn token_issue(app: &App, req: &Req, rotate: bool) -> ApiResult {
    let mut inner = app.lock();
    let value = format!("skp_sb_{}", random_id(32));
    let sb = inner
        .sandbox_mut(req.sid())
        .ok_or_else(|| ApiError::not_found("sandbox not found"))?;
    if !sb.status.is_live() {
        return Err(ApiError::conflict(format!(
            "sandbox is {}",
            sb.status.as_str()
        )));
    }
    let now = now_rfc3339();
    let old = sb
        .token
        .as_ref()
        .filter(|t| t.enabled)
        .map(|t| t.value.clone());
    let token = if rotate {
        let Some(t) = sb.token.as_mut().filter(|t| t.enabled) else {
            return Err(ApiError::not_found("sandbox access token not found"));
        };
        t.value.clone_from(&value);
        t.rotated_at = Some(now);
        t.clone()
    } else {
        if old.is_some() {
            return Err(ApiError::conflict("an enabled access token already exists"));
        }
        let t = Token {
            value: value.clone(),
            enabled: true,
            created_at: now,
            rotated_at: None,
        };
        sb.token = Some(t.clone());
        t
    };
    let sid = sb.id.clone();
    if let Some(old) = old {
        inner.tokens.remove(&old);
    }
    inner.tokens.insert(value, sid);
    let mut v = json!({"token": token.value, "enabled": true, "created_at": token.created_at});
    if let Some(r) = token.rotated_at {
        v["rotated_at"] = json!(r);
    }
    ok(v)
}

fn find_template<'a>(ts: &'a [Template], key: &str) -> Result<&'a Template, ApiError> {
    ts.iter()
        .find(|t| t.id == key || t.name == key)
        .ok_or_else(|| ApiError::not_found("template not found"))
}

fn find_disk<'a>(ds: &'a [Disk], key: &str) -> Result<&'a Disk, ApiError> {
    ds.iter()
        .find(|d| d.id == key || d.name == key)
        .ok_or_else(|| ApiError::not_found("disk not found"))
}

fn network_json(inner: &Inner, n: &Network, members: bool) -> Value {
    let rows: Vec<Value> = inner
        .sandboxes
        .iter()
        .filter(|s| s.status != Status::Destroyed && s.networks.contains(&n.id))
        .map(|s| {
            json!({"sandbox_id": s.id, "status": s.status.as_str(), "ip": s.ip, "name": s.name.clone().unwrap_or_default()})
        })
        .collect();
    let mut v =
        json!({"id": n.id, "name": n.name, "created_at": n.created_at, "member_count": rows.len()});
    if members {
        v["members"] = Value::Array(rows);
    }
    v
}

/// Template build stage length.
const BUILD_STEP: Duration = Duration::from_millis(100);

async fn template_create(app: &Arc<App>, req: &mut Req) -> ApiResult {
    let body = req.json().await?;
    let name = opt_str(&body, "name")?
        .filter(|n| !n.is_empty())
        .ok_or_else(|| ApiError::bad_request("name", "is required"))?;
    let dockerfile = opt_str(&body, "dockerfile")?
        .filter(|n| !n.trim().is_empty())
        .ok_or_else(|| ApiError::bad_request("dockerfile", "is required"))?;
    let base = opt_str(&body, "base")?.unwrap_or_default();
    let t = Template {
        id: format!("tpl_{}", random_id(16)),
        name,
        base,
        dockerfile,
        status: "pending",
        created_at: now_rfc3339(),
        built_at: None,
        logs: Vec::new(),
    };
    let v = t.to_json(false);
    let id = t.id.clone();
    {
        let mut inner = app.lock();
        if inner.templates.iter().any(|x| x.name == t.name) {
            return Err(ApiError::fail_field(
                409,
                "name",
                "a template with this name exists",
            ));
        }
        inner.templates.push(t);
    }
    let app = app.clone();
    tokio::spawn(async move {
        let step = |app: &App, f: &dyn Fn(&mut Template)| {
            let mut inner = app.lock();
            if let Some(t) = inner.templates.iter_mut().find(|t| t.id == id) {
                f(t);
            }
        };
        tokio::time::sleep(BUILD_STEP).await;
        let lines: Vec<String> = {
            let inner = app.lock();
            inner
                .templates
                .iter()
                .find(|t| t.id == id)
                .map(|t| {
                    t.dockerfile
                        .lines()
                        .filter(|l| !l.trim().is_empty())
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default()
        };
        step(&app, &|t| {
            t.status = "building";
            t.logs
                .push(format!("building template {} (attempt 1)", t.name));
        });
        let total = lines.len();
        let mut failed = false;
        for (i, line) in lines.iter().enumerate() {
            tokio::time::sleep(BUILD_STEP / 2).await;
            let text = format!("Step {}/{total} : {}", i + 1, line.trim());
            step(&app, &|t| t.logs.push(text.clone()));
            if line.trim() == "RUN false" || line.trim() == "RUN exit 1" {
                failed = true;
                step(&app, &|t| {
                    t.logs
                        .push("error: the command returned a non-zero code: 1".into());
                });
                break;
            }
        }
        tokio::time::sleep(BUILD_STEP).await;
        step(&app, &|t| {
            if failed {
                t.status = "failed";
                t.logs.push("build failed".into());
            } else {
                t.status = "ready";
                t.built_at = Some(now_rfc3339());
                t.logs.push("build complete".into());
            }
        });
    });
    ok(v)
}

fn template_follow(app: &Arc<App>, req: &Req) -> ApiResult {
    let id = {
        let inner = app.lock();
        find_template(&inner.templates, req.sub())?.id.clone()
    };
    let (tx, rx) = mpsc::channel::<Bytes>(32);
    let app2 = app.clone();
    tokio::spawn(async move {
        let mut sent = 0;
        loop {
            let snapshot = {
                let inner = app2.lock();
                inner
                    .templates
                    .iter()
                    .find(|t| t.id == id)
                    .map(|t| (t.logs[sent..].to_vec(), t.status))
            };
            let Some((lines, status)) = snapshot else {
                let gone = json!({"final": true, "status": "failed", "line": "template deleted", "level": "error", "attempt": 1, "ts": now_rfc3339()});
                let _ = tx.send(frame(false, &gone)).await;
                return;
            };
            for line in lines {
                sent += 1;
                let f = json!({"ts": now_rfc3339(), "level": "info", "line": line, "attempt": 1, "final": false, "status": status});
                if tx.send(frame(false, &f)).await.is_err() {
                    return;
                }
            }
            if matches!(status, "ready" | "failed") {
                let _ = tx
                    .send(frame(false, &json!({"ts": now_rfc3339(), "level": "info", "line": "", "attempt": 1, "final": true, "status": status})))
                    .await;
                return;
            }
            tokio::select! {
                () = tx.closed() => return,
                () = app2.shutdown.cancelled() => return,
                () = tokio::time::sleep(Duration::from_millis(25)) => {},
            }
        }
    });
    Ok(stream_response(false, rx))
}

fn credentials(body: &Map<String, Value>) -> Result<String, ApiError> {
    let c = body
        .get("credentials")
        .and_then(Value::as_object)
        .ok_or_else(|| ApiError::bad_request("credentials", "is required"))?;
    let ak = c
        .get("access_key")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let sk = c
        .get("secret_key")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if ak.is_empty() || sk.is_empty() {
        return Err(ApiError::bad_request(
            "credentials",
            "access_key and secret_key are required",
        ));
    }
    Ok(ak.to_owned())
}

fn valid_disk_name(n: &str) -> bool {
    let mut c = n.chars();
    n.len() <= 63
        && c.next()
            .is_some_and(|x| x.is_ascii_lowercase() || x.is_ascii_digit())
        && c.all(|x| x.is_ascii_lowercase() || x.is_ascii_digit() || x == '-')
}

async fn disk_create(app: &Arc<App>, req: &mut Req) -> ApiResult {
    let body = req.json().await?;
    let name = opt_str(&body, "name")?.unwrap_or_default();
    if !valid_disk_name(&name) {
        return Err(ApiError::bad_request(
            "name",
            "must match ^[a-z0-9][a-z0-9-]{0,62}$",
        ));
    }
    let kind = opt_str(&body, "kind")?.unwrap_or_else(|| "s3".into());
    if kind != "s3" {
        return Err(ApiError::bad_request("kind", "only s3 is supported"));
    }
    let config = body
        .get("config")
        .and_then(Value::as_object)
        .ok_or_else(|| ApiError::bad_request("config", "is required"))?;
    for k in ["bucket", "endpoint"] {
        if config
            .get(k)
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            return Err(ApiError::bad_request("config", format!("{k} is required")));
        }
    }
    let mut cfg = json!({"bucket": config["bucket"], "endpoint": config["endpoint"]});
    if let Some(r) = config
        .get("region")
        .and_then(Value::as_str)
        .filter(|r| !r.is_empty())
    {
        cfg["region"] = json!(r);
    }
    if let Some(p) = config.get("use_path_style").and_then(Value::as_bool) {
        cfg["use_path_style"] = json!(p);
    }
    let key = credentials(&body)?;
    let mut inner = app.lock();
    if inner.disks.iter().any(|d| d.name == name) {
        return Err(ApiError::fail_field(
            409,
            "name",
            "a disk with this name exists",
        ));
    }
    let d = Disk {
        id: format!("disk_{}", random_id(26)),
        name,
        config: cfg,
        created_at: now_rfc3339(),
        access_key: key,
    };
    let v = d.to_json();
    inner.disks.push(d);
    ok(v)
}

async fn disk_attach(app: &Arc<App>, req: &mut Req) -> ApiResult {
    let body = req.json().await?;
    let disk_id = opt_str(&body, "disk_id")?
        .filter(|d| !d.is_empty())
        .ok_or_else(|| ApiError::bad_request("disk_id", "is required"))?;
    let mount_path = opt_str(&body, "mount_path")?
        .filter(|d| d.starts_with('/'))
        .ok_or_else(|| ApiError::bad_request("mount_path", "must be an absolute path"))?;
    let sub_path = opt_str(&body, "sub_path")?.unwrap_or_default();
    if sub_path.starts_with('/') || sub_path.split('/').any(|p| p == "..") {
        return Err(ApiError::bad_request(
            "sub_path",
            "must be relative and must not contain '..'",
        ));
    }
    let mut inner = app.lock();
    let disk_id = find_disk(&inner.disks, &disk_id)?.id.clone();
    let sb = inner
        .sandbox_mut(req.sid())
        .ok_or_else(|| ApiError::not_found("sandbox not found"))?;
    if sb.status != Status::Running {
        return Err(ApiError::conflict(format!(
            "sandbox is {}; live attach needs a running sandbox",
            sb.status.as_str()
        )));
    }
    require_running(sb)?;
    if sb
        .mounts
        .iter()
        .any(|m| m.disk_id == disk_id && m.target == mount_path)
    {
        return Err(ApiError::conflict("this disk is already mounted there"));
    }
    let host =
        map_guest_file(&mount_path, &sb.dir).map_err(|e| ApiError::bad_request("mount_path", e))?;
    let _ = std::fs::create_dir_all(host);
    sb.mounts.push(Mount {
        disk_id: disk_id.clone(),
        target: mount_path.clone(),
        sub_path,
    });
    ok(json!({"id": sb.id, "ok": true, "disk_id": disk_id, "mount_path": mount_path}))
}
