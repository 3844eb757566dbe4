//! Managed processes: the `/v1/sandboxes/{id}/processes...` routes, which start long-lived guest
//! processes (on pipes or a PTY), supervise them and follow their retained, sequenced output.
//! Each one's record ([`ManagedProc`]) is in `managed_proc`.

use std::collections::VecDeque;
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::AtomicI32;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;
use nix::sys::signal::Signal;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWriteExt};
use tokio::sync::{mpsc, watch};

use crate::exec::{self, Out, Spec, exit_code, frame, stream_response};
use crate::guest::{merge_env, require_running, with_sandbox, with_sandbox_mut};
use crate::jsend::{ApiError, ApiResult, ok};
use crate::managed_proc::{ManagedProc, ProcState, Writer};
use crate::request::{Req, opt_str, opt_str_list, opt_str_map, opt_u64};
use crate::state::App;
use crate::util::{map_guest_text, now_rfc3339, random_id};

/// Routes for `/v1/sandboxes/{id}/processes...`.
pub(crate) async fn dispatch(app: &Arc<App>, req: &mut Req) -> ApiResult {
    match req.name {
        "process_create" => create(app, req).await,
        "process_list" => with_sandbox(app, req.sid(), |sb| {
            ok(json!({"processes": sb.processes.values().map(|p| p.to_json()).collect::<Vec<_>>()}))
        }),
        "process_get" => ok(find(app, req, false)?.to_json()),
        "process_connect" => connect(app, req),
        "process_input" => input(app, req).await,
        "process_stdin_close" => {
            let p = find(app, req, true)?;
            if p.pty {
                return Err(ApiError::bad_request(
                    "stdin",
                    "stdin cannot be closed on a PTY process",
                ));
            }
            *p.stdin.lock().await = None;
            ok(json!({"ok": true}))
        }
        "process_resize" => {
            let p = find(app, req, true)?;
            if !p.pty {
                return Err(ApiError::bad_request(
                    "pty",
                    "resize needs a PTY process; this one uses pipes",
                ));
            }
            let body = req.json().await?;
            let mut st = p.lock();
            if let Some(r) = opt_u64(&body, "rows")?.filter(|r| *r > 0) {
                st.rows = r;
            }
            if let Some(c) = opt_u64(&body, "cols")?.filter(|c| *c > 0) {
                st.cols = c;
            }
            ok(json!({"ok": true, "rows": st.rows, "cols": st.cols}))
        }
        "process_signal" => {
            let p = find(app, req, true)?;
            let body = req.json().await?;
            let name = opt_str(&body, "signal")?.unwrap_or_default();
            let sig = parse_signal(&name).ok_or_else(|| {
                ApiError::bad_request("signal", format!("unknown signal {name:?}"))
            })?;
            p.signal_group(sig);
            ok(json!({"ok": true}))
        }
        "process_wait" => wait(app, req).await,
        "process_delete" => delete(app, req).await,
        _ => Err(ApiError::not_found("no such route")),
    }
}

fn parse_signal(name: &str) -> Option<Signal> {
    Some(match name {
        "SIGHUP" => Signal::SIGHUP,
        "SIGINT" => Signal::SIGINT,
        "SIGQUIT" => Signal::SIGQUIT,
        "SIGKILL" => Signal::SIGKILL,
        "SIGTERM" => Signal::SIGTERM,
        "SIGUSR1" => Signal::SIGUSR1,
        "SIGUSR2" => Signal::SIGUSR2,
        "SIGWINCH" => Signal::SIGWINCH,
        _ => return None,
    })
}

fn find(app: &App, req: &Req, running: bool) -> Result<Arc<ManagedProc>, ApiError> {
    let inner = app.lock();
    let sb = inner
        .sandbox(req.sid())
        .ok_or_else(|| ApiError::not_found("sandbox not found"))?;
    if running {
        require_running(sb)?;
    }
    sb.processes
        .get(req.sub())
        .cloned()
        .ok_or_else(|| ApiError::not_found("process not found"))
}

async fn create(app: &Arc<App>, req: &mut Req) -> ApiResult {
    let body = req.json().await?;
    let pty = match body.get("pty") {
        None | Some(Value::Null) => None,
        Some(Value::Object(m)) => {
            let rows = m.get("rows").and_then(Value::as_u64).unwrap_or(24);
            let cols = m.get("cols").and_then(Value::as_u64).unwrap_or(80);
            Some((rows, cols))
        }
        Some(_) => return Err(ApiError::bad_request("pty", "must be an object")),
    };
    let cmd = opt_str(&body, "cmd")?.filter(|c| !c.is_empty());
    let cmd = match (cmd, pty) {
        (Some(c), _) => c,
        (None, Some(_)) => "bash".to_owned(),
        (None, None) => {
            return Err(ApiError::bad_request(
                "cmd",
                "is required for a pipe process",
            ));
        }
    };
    let args = opt_str_list(&body, "args")?.unwrap_or_default();
    let cwd = opt_str(&body, "cwd")?.filter(|c| !c.is_empty());
    if let Some(c) = &cwd
        && (!c.starts_with('/') || c.split('/').any(|p| p == ".."))
    {
        return Err(ApiError::bad_request(
            "cwd",
            "must be an absolute path without '..'",
        ));
    }
    let env = opt_str_map(&body, "env")?;
    let (dir, env, netns) = {
        let inner = app.lock();
        let sb = inner
            .sandbox(req.sid())
            .ok_or_else(|| ApiError::not_found("sandbox not found"))?;
        require_running(sb)?;
        (sb.dir.clone(), merge_env(sb, env)?, sb.netns())
    };
    let spec = Spec {
        cmd: cmd.clone(),
        args: args.clone(),
        stdin: None,
        env,
        cwd: cwd.clone(),
        netns,
    };
    let (pid, rx, writer, child) = match pty {
        None => {
            let mut running =
                exec::spawn(app, &dir, &spec, true).map_err(|e| ApiError::bad_request("cmd", e))?;
            let writer: Option<Writer> = running.stdin.take().map(|s| Box::new(s) as Writer);
            (running.pgid, running.rx, writer, running.child)
        }
        Some((rows, cols)) => spawn_pty(app, &dir, &spec, rows, cols)?,
    };
    let (rows, cols) = pty.unwrap_or((0, 0));
    let (tx_changed, _) = watch::channel(0_u64);
    let proc = Arc::new(ManagedProc {
        id: format!("proc_{}", random_id(12)),
        pty: pty.is_some(),
        pid,
        pgid: AtomicI32::new(pid),
        cmd,
        args,
        cwd: cwd.unwrap_or_else(|| "/workspace".to_owned()),
        created_at: now_rfc3339(),
        st: Mutex::new(ProcState {
            state: "running",
            exit_code: None,
            signal: None,
            finished_at: None,
            leader_exited: false,
            tree_exited: false,
            output_done: false,
            chunks: VecDeque::new(),
            bytes: 0,
            newest_seq: 0,
            dropped: false,
            input_seq: 0,
            rows,
            cols,
        }),
        changed: tx_changed,
        stdin: tokio::sync::Mutex::new(writer),
    });
    with_sandbox_mut(app, req.sid(), |sb| {
        sb.processes.insert(proc.id.clone(), proc.clone());
        Ok(())
    })?;
    tokio::spawn(supervise(app.clone(), proc.clone(), child, rx));
    ok(proc.to_json())
}

fn spawn_pty(
    app: &App,
    dir: &Path,
    spec: &Spec,
    rows: u64,
    cols: u64,
) -> Result<
    (
        i32,
        mpsc::Receiver<Out>,
        Option<Writer>,
        tokio::process::Child,
    ),
    ApiError,
> {
    let ws = nix::pty::Winsize {
        ws_row: u16::try_from(rows).unwrap_or(24),
        ws_col: u16::try_from(cols).unwrap_or(80),
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let pty = nix::pty::openpty(&ws, None)
        .map_err(|e| ApiError::error(500, format!("openpty failed: {e}")))?;
    let io = |fd: &std::os::fd::OwnedFd| -> Result<Stdio, ApiError> {
        fd.try_clone()
            .map(Stdio::from)
            .map_err(|e| ApiError::error(500, format!("pty: {e}")))
    };
    let cwd = match &spec.cwd {
        Some(c) => std::path::PathBuf::from(map_guest_text(c, dir)),
        None => dir.join("workspace"),
    };
    let mut env = exec::guest_env(app, dir, &spec.env);
    env.push(("TERM".into(), "xterm".into()));
    let child = {
        let mut command = exec::guest_command(app, dir, spec, &env)
            .map_err(|e| ApiError::bad_request("cmd", e))?;
        command
            .args(spec.args.iter().map(|a| map_guest_text(a, dir)))
            .current_dir(cwd)
            .env_clear()
            .envs(env)
            .process_group(0)
            .stdin(io(&pty.slave)?)
            .stdout(io(&pty.slave)?)
            .stderr(io(&pty.slave)?);
        command
            .spawn()
            .map_err(|e| ApiError::bad_request("cmd", format!("exec: {:?}: {e}", spec.cmd)))?
    };
    drop(pty.slave);
    let pid = child.id().and_then(|p| i32::try_from(p).ok()).unwrap_or(0);
    let master = std::fs::File::from(pty.master);
    let writer = master
        .try_clone()
        .map_err(|e| ApiError::error(500, format!("pty: {e}")))?;
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(pump(tokio::fs::File::from_std(master), tx));
    Ok((
        pid,
        rx,
        Some(Box::new(tokio::fs::File::from_std(writer)) as Writer),
        child,
    ))
}

async fn pump<R: AsyncRead + Unpin>(mut r: R, tx: mpsc::Sender<Out>) {
    use tokio::io::AsyncReadExt;
    let mut buf = vec![0_u8; 16 * 1024];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if tx.send(Out::Stdout(buf[..n].to_vec())).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Collects output, records the exit and watches the process tree until it is gone.
async fn supervise(
    app: Arc<App>,
    proc: Arc<ManagedProc>,
    mut child: tokio::process::Child,
    mut rx: mpsc::Receiver<Out>,
) {
    let mut rx_open = true;
    let mut exited = false;
    let mut poll = tokio::time::interval(Duration::from_millis(25));
    loop {
        tokio::select! {
            () = app.shutdown.cancelled() => return,
            chunk = rx.recv(), if rx_open => match chunk {
                Some(Out::Stdout(b)) => proc.push_output(if proc.pty { "pty" } else { "stdout" }, b),
                Some(Out::Stderr(b)) => proc.push_output("stderr", b),
                None => rx_open = false,
            },
            st = child.wait(), if !exited => {
                exited = true;
                let mut s = proc.lock();
                s.leader_exited = true;
                s.finished_at = Some(now_rfc3339());
                if let Ok(st) = st {
                    use std::os::unix::process::ExitStatusExt;
                    s.exit_code = Some(exit_code(st));
                    s.signal = st.signal().and_then(|n| Signal::try_from(n).ok()).map(|sig| sig.as_str().to_owned());
                }
                if s.state != "terminating" {
                    s.state = "exited";
                }
                drop(s);
                proc.bump();
            },
            _ = poll.tick(), if exited => {
                if !proc.group_alive() {
                    break;
                }
            },
        }
    }
    // The tree is gone: whatever is left in the pipes arrives promptly.
    let drain = tokio::time::sleep(Duration::from_millis(200));
    tokio::pin!(drain);
    while rx_open {
        tokio::select! {
            () = &mut drain => break,
            chunk = rx.recv() => match chunk {
                Some(Out::Stdout(b)) => proc.push_output(if proc.pty { "pty" } else { "stdout" }, b),
                Some(Out::Stderr(b)) => proc.push_output("stderr", b),
                None => rx_open = false,
            },
        }
    }
    {
        let mut s = proc.lock();
        s.tree_exited = true;
        s.output_done = true;
        s.state = "exited";
    }
    *proc.stdin.lock().await = None;
    proc.bump();
}

fn connect(app: &Arc<App>, req: &Req) -> ApiResult {
    let p = find(app, req, true)?;
    let after: u64 = match req.q("after") {
        None | Some("") => 0,
        Some(v) => v
            .parse()
            .map_err(|_| ApiError::bad_request("after", "must be a non-negative integer"))?,
    };
    let (tx, rx) = mpsc::channel::<Bytes>(32);
    let sse = app.sse;
    let app2 = app.clone();
    let stall_mid = req.stall_mid;
    tokio::spawn(async move {
        let mut changes = p.changed.subscribe();
        let mut cursor = after;
        let mut hb =
            tokio::time::interval_at(tokio::time::Instant::now() + app2.heartbeat, app2.heartbeat);
        loop {
            let (frames, done, below) = {
                let st = p.lock();
                let oldest = st.chunks.front().map_or(st.newest_seq + 1, |c| c.0);
                let below = (st.dropped && cursor + 1 < oldest).then_some(oldest);
                let frames: Vec<Value> = st
                    .chunks
                    .iter()
                    .filter(|c| c.0 > cursor)
                    .map(|(seq, stream, data)| {
                        json!({"type": "data", "seq": seq, "stream": stream, "data_base64": B64.encode(data)})
                    })
                    .collect();
                let done = st.output_done.then(|| {
                    let mut e = json!({"type": "exit", "exit_code": st.exit_code});
                    if let Some(s) = &st.signal {
                        e["signal"] = json!(s);
                    }
                    e
                });
                (frames, done, below)
            };
            if let Some(oldest) = below {
                let _ = tx
                    .send(frame(
                        sse,
                        &json!({"type": "error", "error": format!("output after seq {cursor} is no longer retained"), "oldest_available_seq": oldest}),
                    ))
                    .await;
                return;
            }
            for f in frames {
                cursor = f["seq"].as_u64().unwrap_or(cursor);
                if tx.send(frame(sse, &f)).await.is_err() {
                    return;
                }
            }
            if let Some(exit) = done
                && !stall_mid
            {
                let _ = tx.send(frame(sse, &exit)).await;
                return;
            }
            tokio::select! {
                () = tx.closed() => return,
                () = app2.shutdown.cancelled() => return,
                r = changes.changed() => if r.is_err() { return },
                _ = hb.tick(), if !stall_mid => {
                    if tx.send(exec::heartbeat(sse, &json!({"type": "heartbeat"}))).await.is_err() {
                        return;
                    }
                },
            }
        }
    });
    Ok(stream_response(sse, rx))
}

async fn input(app: &Arc<App>, req: &mut Req) -> ApiResult {
    let p = find(app, req, true)?;
    let body = req.json().await?;
    let data = opt_str(&body, "data_base64")?
        .ok_or_else(|| ApiError::bad_request("data_base64", "is required"))?;
    let bytes = B64
        .decode(data.as_bytes())
        .map_err(|_| ApiError::bad_request("data_base64", "is not valid base64"))?;
    let mut stdin = p.stdin.lock().await;
    let Some(w) = stdin.as_mut() else {
        return Err(ApiError::conflict("stdin is closed"));
    };
    if w.write_all(&bytes).await.is_err() || w.flush().await.is_err() {
        *stdin = None;
        return Err(ApiError::conflict("the process no longer reads stdin"));
    }
    drop(stdin);
    let seq = {
        let mut st = p.lock();
        st.input_seq += 1;
        st.input_seq
    };
    ok(json!({"input_seq": seq}))
}

async fn wait_until(p: &ManagedProc, tree: bool, budget: Duration) {
    let mut changes = p.changed.subscribe();
    let deadline = tokio::time::Instant::now() + budget;
    loop {
        {
            let st = p.lock();
            if (tree && st.tree_exited && st.output_done) || (!tree && st.leader_exited) {
                return;
            }
        }
        tokio::select! {
            () = tokio::time::sleep_until(deadline) => return,
            r = changes.changed() => if r.is_err() { return },
        }
    }
}

async fn wait(app: &Arc<App>, req: &mut Req) -> ApiResult {
    let p = find(app, req, false)?;
    let tree = match req.q("scope") {
        None | Some("" | "leader") => false,
        Some("tree") => true,
        Some(other) => {
            return Err(ApiError::bad_request(
                "scope",
                format!("must be leader or tree, not {other:?}"),
            ));
        }
    };
    let ms: u64 = match req.q("timeout_ms") {
        None | Some("") => 0,
        Some(v) => v
            .parse()
            .map_err(|_| ApiError::bad_request("timeout_ms", "must be a non-negative integer"))?,
    };
    wait_until(&p, tree, Duration::from_millis(ms.min(300_000))).await;
    ok(p.to_json())
}

async fn delete(app: &Arc<App>, req: &mut Req) -> ApiResult {
    let p = find(app, req, false)?;
    let grace: u64 = match req.q("grace_ms") {
        None | Some("") => 0,
        Some(v) => v
            .parse()
            .map_err(|_| ApiError::bad_request("grace_ms", "must be a non-negative integer"))?,
    };
    {
        let mut st = p.lock();
        if !st.tree_exited {
            st.state = "terminating";
        }
    }
    p.bump();
    p.signal_group(Signal::SIGCONT);
    p.signal_group(Signal::SIGTERM);
    wait_until(&p, true, Duration::from_millis(grace.min(60_000))).await;
    p.signal_group(Signal::SIGKILL);
    wait_until(&p, true, Duration::from_secs(5)).await;
    let view = p.to_json();
    let _ = with_sandbox_mut(app, req.sid(), |sb| {
        sb.processes.remove(req.sub());
        Ok(())
    });
    ok(view)
}
