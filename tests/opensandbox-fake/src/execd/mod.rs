//! The execd double: the API `OpenSandbox`'s in-sandbox daemon serves on port 44772 (ping,
//! streamed commands, files, directories), over one guest.
//!
//! A guest is either a directory of the fake server (its `/workspace`, `/tmp`, `/root`, `/home`
//! live under it and guest paths are rewritten there) or, for the stand-alone
//! `opensandbox-fake execd`, the real file system of the machine it runs on (nothing rewritten).

pub(crate) mod command;
mod files;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use axum::body::Body;
use axum::http::{HeaderMap, Method, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::json;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::config::{Config, OutputFraming, SecureRuntime};
use crate::http::{ApiError, json_response};
use crate::util::{map_guest_text, normalize_guest_path};
use command::{Record, StreamFault};

/// Host environment variables passed through to guest commands of the fake server.
const PASS_THROUGH: &[&str] = &[
    "LANG",
    "LC_ALL",
    "USER",
    "LOGNAME",
    "PYENV_ROOT",
    "PYENV_VERSION",
];

/// Sends `sig` to a process group (errors ignored: it may be gone).
pub(crate) fn signal_group(pgid: i32, sig: Signal) {
    if pgid > 1 {
        let _ = killpg(Pid::from_raw(pgid), sig);
    }
}

/// What every guest of one server shares: the configuration, the guest `PATH` prefix and the
/// directory holding the secure-runtime shims.
#[derive(Debug)]
pub(crate) struct Host {
    pub config: Mutex<Config>,
    pub guest_path: Vec<PathBuf>,
    /// Where the `uname`/`dmesg` shims of the current secure runtime are written.
    pub shim_root: Option<PathBuf>,
}

impl Host {
    /// The current configuration.
    pub(crate) fn config(&self) -> MutexGuard<'_, Config> {
        self.config
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Writes the shims of the configured secure runtime and returns their directory (`None`
    /// for runc, whose guests see the host's kernel).
    pub(crate) fn shim_dir(&self) -> Option<PathBuf> {
        let root = self.shim_root.as_ref()?;
        let (runtime, kernel) = {
            let c = self.config();
            (c.secure_runtime, c.guest_kernel.clone())
        };
        let (name, release, banner) = match runtime {
            SecureRuntime::None => return None,
            SecureRuntime::Gvisor => ("gvisor", "4.4.0".to_owned(), Some("Starting gVisor...")),
            SecureRuntime::Kata | SecureRuntime::Firecracker => ("kata", kernel, None),
        };
        let safe: String = release
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let dir = root.join(format!("{name}-{safe}"));
        if dir.join("uname").is_file() {
            return Some(dir);
        }
        std::fs::create_dir_all(&dir).ok()?;
        let real_uname = ["/usr/bin/uname", "/bin/uname"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .unwrap_or("uname");
        let quoted = release.replace('\'', "");
        let uname = format!(
            "#!/bin/sh\n# opensandbox-fake: the kernel a {name} guest reports.\n\
             case \"$1\" in\n\
             -r|--kernel-release) echo '{quoted}' ;;\n\
             -a|--all) echo \"Linux $(hostname) {quoted} #1 SMP x86_64 GNU/Linux\" ;;\n\
             *) exec {real_uname} \"$@\" ;;\n\
             esac\n"
        );
        write_script(&dir.join("uname"), &uname).ok()?;
        if let Some(banner) = banner {
            let dmesg = format!(
                "#!/bin/sh\necho '[    0.000000] {banner}'\necho '[    0.500000] Ready!'\n"
            );
            write_script(&dir.join("dmesg"), &dmesg).ok()?;
        }
        Some(dir)
    }
}

fn write_script(path: &Path, body: &str) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, body)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))?;
    std::fs::rename(tmp, path)
}

/// One sandbox's execd: where its files live, how its commands run, and its paused state.
#[derive(Debug)]
pub(crate) struct Guest {
    /// The sandbox id (`OPENSANDBOX_ID` in its commands).
    pub id: String,
    /// The host directory standing for the guest's `/` (or `/` itself when not mapped).
    pub root: PathBuf,
    /// Whether guest paths are rewritten under `root` (false for the stand-alone execd).
    mapped: bool,
    /// The sandbox's environment (from the create request).
    env: BTreeMap<String, String>,
    host: Arc<Host>,
    frozen: watch::Sender<bool>,
    /// Cancelled when the sandbox is destroyed: every command ends.
    pub gone: CancellationToken,
    groups: Mutex<HashSet<i32>>,
    commands: Mutex<HashMap<String, Arc<Record>>>,
    /// execd answers only from this instant on (`None`: at once).
    ready_at: Mutex<Option<Instant>>,
}

impl Guest {
    /// A guest of the fake server rooted at `root` (created with its usual directories).
    pub(crate) fn new_mapped(
        id: String,
        root: PathBuf,
        env: BTreeMap<String, String>,
        host: Arc<Host>,
    ) -> std::io::Result<Self> {
        for d in ["workspace", "tmp", "root", "home"] {
            std::fs::create_dir_all(root.join(d))?;
        }
        Ok(Self::build(id, root, true, env, host))
    }

    /// The stand-alone execd's guest: the machine's own file system, commands inheriting the
    /// daemon's environment.
    pub(crate) fn new_unmapped(host: Arc<Host>) -> Self {
        Self::build(
            String::new(),
            PathBuf::from("/"),
            false,
            BTreeMap::new(),
            host,
        )
    }

    fn build(
        id: String,
        root: PathBuf,
        mapped: bool,
        env: BTreeMap<String, String>,
        host: Arc<Host>,
    ) -> Self {
        let (frozen, _) = watch::channel(false);
        Self {
            id,
            root,
            mapped,
            env,
            host,
            frozen,
            gone: CancellationToken::new(),
            groups: Mutex::new(HashSet::new()),
            commands: Mutex::new(HashMap::new()),
            ready_at: Mutex::new(None),
        }
    }

    /// execd does not answer until `at`.
    pub(crate) fn not_ready_until(&self, at: Option<Instant>) {
        *lock(&self.ready_at) = at;
    }

    /// Whether execd answers now.
    pub(crate) fn is_ready(&self) -> bool {
        lock(&self.ready_at).is_none_or(|t| Instant::now() >= t)
    }

    /// Freezes the guest (`docker pause`): its processes get SIGSTOP and its streams go silent.
    pub(crate) fn freeze(&self) {
        for g in lock(&self.groups).iter() {
            signal_group(*g, Signal::SIGSTOP);
        }
        self.frozen.send_replace(true);
    }

    /// Thaws a frozen guest.
    pub(crate) fn thaw(&self) {
        for g in lock(&self.groups).iter() {
            signal_group(*g, Signal::SIGCONT);
        }
        self.frozen.send_replace(false);
    }

    /// Kills every process of the guest (a Kubernetes pause loses memory; a delete).
    pub(crate) fn kill_all(&self) {
        for g in lock(&self.groups).iter() {
            signal_group(*g, Signal::SIGCONT);
            signal_group(*g, Signal::SIGKILL);
        }
    }

    /// Destroys the guest: every command ends and every process is killed.
    pub(crate) fn destroy(&self) {
        self.gone.cancel();
        self.kill_all();
        self.frozen.send_replace(false);
    }

    /// Whether the guest is frozen.
    pub(crate) fn is_frozen(&self) -> bool {
        *self.frozen.borrow()
    }

    /// Resolves once the guest is frozen.
    pub(crate) async fn wait_frozen(&self) {
        let mut rx = self.frozen.subscribe();
        let _ = rx.wait_for(|f| *f).await;
    }

    /// Resolves once the guest is not frozen.
    pub(crate) async fn wait_thawed(&self) {
        let mut rx = self.frozen.subscribe();
        let _ = rx.wait_for(|f| !*f).await;
    }

    pub(crate) fn remember_group(&self, pgid: i32) {
        if pgid > 1 {
            lock(&self.groups).insert(pgid);
            if self.is_frozen() {
                signal_group(pgid, Signal::SIGSTOP);
            }
        }
    }

    /// Forgets a command's process group once it is empty; a group that still has members
    /// (children left running in the background) stays tracked, so destroying the guest kills
    /// them too.
    pub(crate) fn forget_group(&self, pgid: i32) {
        if pgid > 1 && killpg(Pid::from_raw(pgid), None).is_err() {
            lock(&self.groups).remove(&pgid);
        }
    }

    pub(crate) fn remember_command(&self, rec: Arc<Record>) {
        lock(&self.commands).insert(rec.id.clone(), rec);
    }

    fn command(&self, id: &str) -> Option<Arc<Record>> {
        lock(&self.commands).get(id).cloned()
    }

    pub(crate) fn ping_interval(&self) -> std::time::Duration {
        self.host.config().ping()
    }

    pub(crate) fn framing(&self) -> OutputFraming {
        self.host.config().output_framing
    }

    /// Rewrites guest paths in command text (nothing for the stand-alone execd).
    pub(crate) fn map_text(&self, text: &str) -> String {
        if self.mapped {
            map_guest_text(text, &self.root)
        } else {
            text.to_owned()
        }
    }

    /// A `cwd` as a host path.
    pub(crate) fn host_path_text(&self, cwd: &str) -> PathBuf {
        PathBuf::from(self.map_text(cwd))
    }

    /// The directory commands start in without a `cwd`.
    pub(crate) fn default_cwd(&self) -> PathBuf {
        if self.mapped {
            self.root.join("workspace")
        } else {
            std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"))
        }
    }

    /// An `argv[0]` as the program to start: a path (relative to `cwd`) or the first match on
    /// the command's `PATH`; unchanged when nothing matches (the start then fails).
    pub(crate) fn resolve_program(
        &self,
        name: &str,
        env: &[(OsString, OsString)],
        cwd: &Path,
    ) -> PathBuf {
        if name.contains('/') {
            let mapped = PathBuf::from(self.map_text(name));
            return if mapped.is_absolute() {
                mapped
            } else {
                cwd.join(mapped)
            };
        }
        let path = env
            .iter()
            .rev()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| v.clone())
            .unwrap_or_default();
        std::env::split_paths(&path)
            .filter(|d| d.is_absolute())
            .map(|d| d.join(name))
            .find(|p| p.is_file())
            .unwrap_or_else(|| PathBuf::from(name))
    }

    /// The environment of a command: for a guest of the fake server, a clean environment with
    /// the guest `PATH`, `HOME`, `TMPDIR`, `OPENSANDBOX_ID` and the sandbox's `env`; for the
    /// stand-alone execd, the daemon's own. The request's `envs` come last.
    pub(crate) fn command_env(
        &self,
        extra: &BTreeMap<String, String>,
    ) -> Vec<(OsString, OsString)> {
        let mut out: Vec<(OsString, OsString)> = Vec::new();
        if self.mapped {
            for k in PASS_THROUGH {
                if let Some(v) = std::env::var_os(k) {
                    out.push(((*k).into(), v));
                }
            }
            if std::env::var_os("LANG").is_none() {
                out.push(("LANG".into(), "C.UTF-8".into()));
            }
            if std::env::var_os("PYENV_ROOT").is_none()
                && let Some(home) = std::env::var_os("HOME")
            {
                let root = Path::new(&home).join(".pyenv");
                if root.is_dir() {
                    out.push(("PYENV_ROOT".into(), root.into_os_string()));
                }
            }
            let mut dirs: Vec<PathBuf> = Vec::new();
            dirs.extend(self.host.shim_dir());
            dirs.extend(self.host.guest_path.iter().cloned());
            if let Some(p) = std::env::var_os("PATH") {
                dirs.extend(std::env::split_paths(&p));
            }
            out.push((
                "PATH".into(),
                std::env::join_paths(dirs).unwrap_or_default(),
            ));
            out.push(("HOME".into(), self.root.join("root").into_os_string()));
            out.push(("TMPDIR".into(), self.root.join("tmp").into_os_string()));
            out.push((
                "HOSTNAME".into(),
                self.id.chars().take(12).collect::<String>().into(),
            ));
            for (k, v) in &self.env {
                out.push((k.into(), self.map_text(v).into()));
            }
            out.push(("OPENSANDBOX_ID".into(), self.id.clone().into()));
        } else {
            out.extend(std::env::vars_os());
        }
        for (k, v) in extra {
            out.push((k.into(), self.map_text(v).into()));
        }
        out
    }

    /// A guest path of the files API as a host path. Relative paths are taken from `/`; a path
    /// that climbs above `/` is refused.
    pub(crate) fn host_file(&self, path: &str) -> Result<PathBuf, String> {
        let abs = if path.starts_with('/') {
            path.to_owned()
        } else {
            format!("/{path}")
        };
        let norm = normalize_guest_path(&abs)
            .ok_or_else(|| format!("path {path:?} climbs above the root"))?;
        if !self.mapped {
            return Ok(norm);
        }
        let rel = norm.strip_prefix("/").unwrap_or(&norm);
        Ok(self.root.join(rel))
    }

    /// A host path under the guest as the guest sees it.
    pub(crate) fn guest_file(&self, host: &Path) -> String {
        if !self.mapped {
            return host.to_string_lossy().into_owned();
        }
        match host.strip_prefix(&self.root) {
            Ok(rel) => format!("/{}", rel.to_string_lossy()),
            Err(_) => host.to_string_lossy().into_owned(),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The route name (for statistics and faults) of an execd request.
pub(crate) fn route_name(method: &Method, path: &str) -> &'static str {
    let p = path.trim_end_matches('/');
    match (method.as_str(), p) {
        ("GET", "/ping") => "execd_ping",
        ("POST", "/command") => "command",
        ("DELETE", "/command") => "command_interrupt",
        ("GET", p) if p.starts_with("/command/status/") => "command_status",
        ("GET", p) if p.starts_with("/command/") && p.ends_with("/logs") => "command_logs",
        ("POST", "/files/upload") => "files_upload",
        ("GET", "/files/download") => "files_download",
        ("GET", "/files/info") => "files_info",
        ("DELETE", "/files") => "files_delete",
        ("POST", "/directories") => "directories_create",
        ("GET", "/directories/list") => "directories_list",
        ("DELETE", "/directories") => "directories_delete",
        _ => "execd_other",
    }
}

/// execd's error body.
fn err(status: u16, code: &str, message: impl Into<String>) -> Response {
    ApiError::new(status, code, message).into_response()
}

/// Serves one execd request for `guest`.
pub(crate) async fn handle(
    guest: Arc<Guest>,
    method: &Method,
    path: &str,
    query: &[(String, String)],
    headers: &HeaderMap,
    body: Body,
    fault: StreamFault,
) -> Response {
    let p = path.trim_end_matches('/');
    match (method.as_str(), p) {
        ("GET", "/ping") => Response::builder()
            .status(200)
            .body(Body::empty())
            .unwrap_or_default(),
        ("POST", "/command") => run_command(guest, body, fault).await,
        ("DELETE", "/command") => interrupt(&guest, query),
        ("GET", p) if p.starts_with("/command/status/") => {
            let id = crate::util::percent_decode(&p["/command/status/".len()..], false);
            match guest.command(&id) {
                Some(rec) => json_response(200, &rec.to_json()),
                None => err(
                    404,
                    "INVALID_REQUEST_BODY",
                    format!("command {id} not found"),
                ),
            }
        }
        ("GET", p) if p.starts_with("/command/") && p.ends_with("/logs") => {
            let id =
                crate::util::percent_decode(&p["/command/".len()..p.len() - "/logs".len()], false);
            command_logs(&guest, &id, query)
        }
        ("POST", "/files/upload") => files::upload(&guest, headers, body).await,
        ("GET", "/files/download") => files::download(&guest, query, headers).await,
        ("GET", "/files/info") => files::info(&guest, query),
        ("DELETE", "/files") => files::remove_files(&guest, query),
        ("POST", "/directories") => files::make_dirs(&guest, body).await,
        ("GET", "/directories/list") => files::list_dir(&guest, query),
        ("DELETE", "/directories") => files::remove_dirs(&guest, query),
        _ => Response::builder()
            .status(404)
            .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
            .body(Body::from("404 page not found"))
            .unwrap_or_default(),
    }
}

async fn run_command(guest: Arc<Guest>, body: Body, fault: StreamFault) -> Response {
    let Ok(bytes) = axum::body::to_bytes(body, 4 * 1024 * 1024).await else {
        return err(400, "INVALID_REQUEST_BODY", "error reading request body");
    };
    let req = match command::parse_request(&bytes) {
        Ok(r) => r,
        Err(msg) => return err(400, "INVALID_REQUEST_BODY", msg),
    };
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    if req.background {
        tokio::spawn(command::run_background(guest, req, tx));
    } else {
        tokio::spawn(command::run_foreground(guest, req, tx, fault));
    }
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, std::io::Error>(b), rx))
    });
    Response::builder()
        .status(200)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .header("X-Accel-Buffering", "no")
        .body(Body::from_stream(stream))
        .unwrap_or_default()
}

fn interrupt(guest: &Guest, query: &[(String, String)]) -> Response {
    let Some(id) = crate::http::q(query, "id").filter(|s| !s.is_empty()) else {
        return err(400, "MISSING_QUERY", "missing query parameter 'id'");
    };
    let Some(rec) = guest.command(id) else {
        return err(
            500,
            "RUNTIME_ERROR",
            "error interrupting code context. no such session",
        );
    };
    let pgid = rec.pgid;
    if pgid > 1 && lock(&rec.state).running {
        // SIGTERM, then SIGKILL if the group is still there after 3 s.
        signal_group(pgid, Signal::SIGCONT);
        signal_group(pgid, Signal::SIGTERM);
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_secs(3)).await;
            signal_group(pgid, Signal::SIGKILL);
        });
    }
    json_response(200, &serde_json::Value::Null)
}

fn command_logs(guest: &Guest, id: &str, query: &[(String, String)]) -> Response {
    let Some(rec) = guest.command(id) else {
        return err(
            404,
            "INVALID_REQUEST_BODY",
            format!("command {id} not found"),
        );
    };
    let cursor = crate::http::q(query, "cursor")
        .and_then(|c| c.parse::<usize>().ok())
        .unwrap_or(0);
    let log = lock(&rec.log);
    let start = cursor.min(log.len());
    let text = String::from_utf8_lossy(&log[start..]).into_owned();
    Response::builder()
        .status(200)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .header("EXECD-COMMANDS-TAIL-CURSOR", log.len().to_string())
        .body(Body::from(text))
        .unwrap_or_default()
}

/// Answers `json!(null)` with 200, as execd's `RespondSuccess(nil)` does.
pub(crate) fn success_null() -> Response {
    json_response(200, &json!(null))
}
