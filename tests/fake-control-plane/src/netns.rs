//! Linux network namespaces for the enforcing mode (`--enforce-egress`), also usable by other
//! crates' tests that need a small private network (a "gateway" and an "internet" namespace).
//!
//! Everything goes through iproute2's `ip` (namespaces, links, addresses, routes) and, for
//! firewalls, nftables' `nft`, run inside a namespace with `ip netns exec`. A socket that must
//! live in a namespace is bound by a short-lived thread that entered it (`setns`): the socket
//! stays in that namespace whichever thread uses it afterwards. All of it needs root.

use std::io::{self, Write as _};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

/// Where `ip netns` keeps its named namespaces.
const NETNS_DIR: &str = "/run/netns";

/// The commands the enforcing mode needs, found on `PATH` or in the sbin directories.
#[derive(Debug, Clone)]
pub struct Tools {
    /// iproute2's `ip`.
    pub ip: PathBuf,
    /// nftables' `nft`.
    pub nft: PathBuf,
}

fn find(program: &str) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    dirs.extend(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from));
    dirs.into_iter()
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// The tools, or why network namespaces cannot be used here (not root; `ip` or `nft`
/// missing), as a message that says what to install or how to run.
pub fn support() -> Result<Tools, String> {
    if !nix::unistd::geteuid().is_root() {
        return Err(
            "network namespaces need root (run as root, e.g. in the CI container)".to_owned(),
        );
    }
    let ip = find("ip").ok_or("the `ip` command is missing (install Debian's `iproute2`)")?;
    let nft = find("nft").ok_or("the `nft` command is missing (install Debian's `nftables`)")?;
    Ok(Tools { ip, nft })
}

fn tools() -> io::Result<Tools> {
    support().map_err(io::Error::other)
}

/// Runs `program args`, feeding `stdin` if given; an error carries the command's stderr.
fn run(program: &Path, args: &[&str], stdin: Option<&str>) -> io::Result<Output> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "`{} {}` failed: {}",
            program.display(),
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(out)
}

/// Runs `ip args` in the namespace `netns` (`None`: the caller's own).
pub fn ip(netns: Option<&str>, args: &[&str]) -> io::Result<()> {
    let tools = tools()?;
    let mut all = Vec::with_capacity(args.len() + 2);
    if let Some(ns) = netns {
        all.extend(["-n", ns]);
    }
    all.extend_from_slice(args);
    run(&tools.ip, &all, None).map(drop)
}

/// Deletes namespaces named `{prefix}-{pid}-...` whose process `pid` is gone: what a killed
/// test or fake left behind.
pub fn remove_stale(prefix: &str) {
    let Ok(entries) = std::fs::read_dir(NETNS_DIR) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(prefix)
            .and_then(|rest| rest.strip_prefix('-'))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = ip(None, &["netns", "del", &name]);
        }
    }
}

/// A named network namespace, deleted (with the links inside it) when dropped.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

static SEQ: AtomicU32 = AtomicU32::new(0);

impl Netns {
    /// Creates `{prefix}-{pid}-{n}` with its loopback up.
    pub fn create(prefix: &str) -> io::Result<Netns> {
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let name = format!("{prefix}-{}-{n}", std::process::id());
        ip(None, &["netns", "add", &name])?;
        let ns = Netns { name };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// The namespace's name (for `ip netns exec NAME`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs `ip args` inside this namespace.
    pub fn ip(&self, args: &[&str]) -> io::Result<()> {
        ip(Some(&self.name), args)
    }

    /// A command that runs `program` inside this namespace (through `ip netns exec`); set its
    /// arguments, environment and stdio as usual.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> io::Result<Command> {
        let tools = tools()?;
        let mut cmd = Command::new(tools.ip);
        cmd.args(["netns", "exec", &self.name]).arg(program);
        Ok(cmd)
    }

    /// Loads an nftables ruleset (the text of `nft -f`) inside this namespace.
    pub fn nft(&self, ruleset: &str) -> io::Result<()> {
        let tools = tools()?;
        let nft = tools.nft.to_string_lossy().into_owned();
        run(
            &tools.ip,
            &["netns", "exec", &self.name, &nft, "-f", "-"],
            Some(ruleset),
        )
        .map(drop)
    }

    /// Runs `f` on a thread that has entered this namespace: sockets it creates live here.
    pub fn enter<T: Send>(&self, f: impl FnOnce() -> io::Result<T> + Send) -> io::Result<T> {
        let path = Path::new(NETNS_DIR).join(&self.name);
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    let file = std::fs::File::open(&path)?;
                    nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                        .map_err(io::Error::from)?;
                    f()
                })
                .join()
                .map_err(|_| io::Error::other("the namespace thread panicked"))?
        })
    }

    /// A TCP listener bound to `addr` inside this namespace (non-blocking, ready for tokio).
    pub fn bind_tcp(&self, addr: SocketAddr) -> io::Result<std::net::TcpListener> {
        self.enter(|| {
            let listener = std::net::TcpListener::bind(addr)?;
            listener.set_nonblocking(true)?;
            Ok(listener)
        })
    }

    /// Turns IPv4 forwarding on inside this namespace (a router between its links).
    pub fn enable_forwarding(&self) -> io::Result<()> {
        self.enter(|| std::fs::write("/proc/sys/net/ipv4/ip_forward", "1"))
    }

    /// Connects this namespace to `peer` with a veth pair: `local_if` here with `local_cidr`,
    /// `peer_if` there with `peer_cidr` (e.g. `10.214.0.0/31` and `10.214.0.1/31`), both up.
    pub fn link(
        &self,
        local_if: &str,
        local_cidr: &str,
        peer: &Netns,
        peer_if: &str,
        peer_cidr: &str,
    ) -> io::Result<()> {
        veth(
            Some(&self.name),
            local_if,
            local_cidr,
            peer,
            peer_if,
            peer_cidr,
        )
    }
}

/// A veth pair between the namespace named `uplink` (`None`: the caller's) and `guest`, with
/// addresses, both ends up.
pub(crate) fn veth(
    uplink: Option<&str>,
    up_if: &str,
    up_cidr: &str,
    guest: &Netns,
    guest_if: &str,
    guest_cidr: &str,
) -> io::Result<()> {
    let up_ns = uplink;
    let mut add = vec!["link", "add", up_if];
    if let Some(ns) = up_ns {
        add.extend(["netns", ns]);
    }
    add.extend([
        "type",
        "veth",
        "peer",
        "name",
        guest_if,
        "netns",
        guest.name(),
    ]);
    ip(None, &add)?;
    ip(up_ns, &["addr", "add", up_cidr, "dev", up_if])?;
    ip(up_ns, &["link", "set", up_if, "up"])?;
    guest.ip(&["addr", "add", guest_cidr, "dev", guest_if])?;
    guest.ip(&["link", "set", guest_if, "up"])
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(None, &["netns", "del", &self.name]);
    }
}
