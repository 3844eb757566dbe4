"""scripts/check_platform_gates.py: the per-commit guard of the macOS and Windows wheels.

Each test gives the check a small crate (or a whole synthetic `cargo metadata` graph) and
asserts what it reports. The two breaks it exists for are here as they were on main at
2fdee64: `std::os::unix` without a cfg in egress-credential (Windows), and a framework in the
macOS graph that scripts/build-wheels did not stub (SystemConfiguration).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import check_platform_gates as gates
import pytest
from conftest import ROOT

WINDOWS = ["x86_64-pc-windows-gnu", "x86_64-pc-windows-msvc"]
UNIX = [t for t in gates.TARGETS if t not in WINDOWS]


def scan(tmp_path: Path, files: dict[str, str], features: set[str] | None = frozenset()) -> list[tuple[str, int, list[str]]]:
    """Writes a crate's src/ and returns (file, line, targets) for each finding."""
    for name, text in files.items():
        path = tmp_path / "src" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    found = []
    for source, module_gates in gates.module_files(tmp_path / "src" / "lib.rs"):
        for f in gates.find_ungated(source, module_gates, None if features is None else set(features)):
            found.append((f.path.relative_to(tmp_path / "src").as_posix(), f.line, f.targets))
    return sorted(found)


# The code that broke the Windows wheel (egress-credential's token.rs at 2fdee64).
TOKEN_RS_AT_2FDEE64 = """
impl Secret {
    /// The secret from [`SECRET_ENV`] (its bytes as written, e.g. 64 hex characters).
    pub fn from_env() -> Result<Self, TokenError> {
        match std::env::var_os(SECRET_ENV) {
            None => Err(TokenError::SecretMissing),
            Some(value) if value.is_empty() => Err(TokenError::SecretMissing),
            Some(value) => Self::new(std::os::unix::ffi::OsStringExt::into_vec(value)),
        }
    }
}
"""


def test_the_ungated_unix_call_that_broke_the_windows_wheel_is_reported(tmp_path: Path) -> None:
    assert scan(tmp_path, {"lib.rs": TOKEN_RS_AT_2FDEE64}) == [("lib.rs", 8, WINDOWS)]


# What broke the Windows wheel at 3bdd668 (sandbox-core's postgres_store.rs): a variant that
# exists only on Unix, named in code every target compiles.
SOCKET_AT_3BDD668 = """
enum Socket {
    Tcp(TcpStream),
    #[cfg(unix)]
    Unix(tokio::net::UnixStream),
}

fn handshake(socket: Socket) -> bool {
    let local = matches!(socket, Socket::Unix(_));
    #[cfg(unix)]
    let watch = matches!(socket, Socket::Unix(_));
    match socket {
        Socket::Tcp(_) => local,
        #[cfg(unix)]
        Socket::Unix(_) => true,
    }
}
"""


def test_a_variant_declared_under_a_cfg_is_reported_where_named_without_it(tmp_path: Path) -> None:
    assert scan(tmp_path, {"lib.rs": SOCKET_AT_3BDD668}) == [("lib.rs", 9, WINDOWS)]
    fixed = SOCKET_AT_3BDD668.replace("    let local = matches!", "    #[cfg(unix)]\n    let local = matches!")
    assert scan(tmp_path / "fixed", {"lib.rs": fixed}) == []


def test_the_same_call_under_a_cfg_on_its_statement_item_or_block_passes(tmp_path: Path) -> None:
    text = """
#[cfg(unix)]
use std::os::unix::net::UnixStream;

#[cfg(not(windows))]
fn raw(value: std::ffi::OsString) -> Result<Vec<u8>, (), > {
    Ok(std::os::unix::ffi::OsStringExt::into_vec(value))
}

fn either(value: std::ffi::OsString) -> Vec<u8> {
    #[cfg(target_os = "linux")]
    let fd = std::os::fd::BorrowedFd::borrow_raw;
    #[cfg(unix)]
    {
        return std::os::unix::ffi::OsStringExt::into_vec(value);
    }
    #[cfg(windows)]
    return value.to_string_lossy().into_owned().into_bytes();
}

#[cfg(all(unix, feature = "fast"))]
impl Fast {
    fn go(&self) -> Result<(), std::io::Error> { let f = self.file.as_raw_fd(); Ok(()) }
}
"""
    assert scan(tmp_path, {"lib.rs": text}) == []


def test_a_runtime_cfg_macro_does_not_gate_compilation(tmp_path: Path) -> None:
    text = """
fn bytes(value: std::ffi::OsString) -> Vec<u8> {
    if cfg!(unix) {
        std::os::unix::ffi::OsStringExt::into_vec(value)
    } else {
        value.into_string().unwrap().into_bytes()
    }
}
"""
    assert scan(tmp_path, {"lib.rs": text}) == [("lib.rs", 4, WINDOWS)]


def test_windows_apis_need_a_windows_gate(tmp_path: Path) -> None:
    text = """
fn handle(f: &std::fs::File) -> isize {
    use std::os::windows::io::AsRawHandle as _;
    f.as_raw_handle() as isize
}
#[cfg(windows)]
fn ok() { let _ = tokio::signal::windows::ctrl_break(); }
"""
    assert scan(tmp_path, {"lib.rs": text}) == [("lib.rs", 3, UNIX), ("lib.rs", 4, UNIX)]


def test_crates_and_methods_of_one_platform_are_seen_not_only_std_os(tmp_path: Path) -> None:
    text = """
fn f(s: &std::net::TcpStream) {
    let _ = libc::getpid();
    let _ = nix::unistd::getpid();
    let _ = tokio::signal::unix::signal(SignalKind::terminate());
    let _ = tokio::net::UnixListener::bind("/tmp/x");
    let _ = s.as_raw_fd();
    let _ = signal_hook::consts::SIGHUP;
    let _ = signal_hook::consts::SIGTERM;
}
"""
    lines = [line for _, line, _ in scan(tmp_path, {"lib.rs": text})]
    # SIGTERM exists on Windows (signal-hook emulates it); SIGHUP does not.
    assert lines == [3, 4, 5, 6, 7, 8]


def test_comments_strings_and_test_code_are_not_the_wheels(tmp_path: Path) -> None:
    text = '''
//! Uses std::os::unix only under a cfg.
/// `std::os::unix::ffi::OsStrExt` in a doc comment.
const HELP: &str = "std::os::unix is named in a message";
const RAW: &str = r#"and in a raw "string" with std::os::fd"#;
const BRACE: char = '{';
/* nested /* std::os::unix */ still a comment std::os::unix */
fn lifetime<'a>(x: &'a str) -> &'a str { x }

#[cfg(test)]
mod tests {
    use std::os::unix::ffi::OsStringExt as _;
}
'''
    assert scan(tmp_path, {"lib.rs": text}) == []


def test_fields_and_arms_are_gated_one_by_one(tmp_path: Path) -> None:
    text = """
struct Pipe {
    #[cfg(unix)]
    read: std::os::fd::OwnedFd,
    write: std::os::fd::OwnedFd,
}
fn f(kind: Kind) {
    match kind {
        #[cfg(unix)]
        Kind::Fd(fd) => drop(std::os::fd::OwnedFd::from(fd)),
        Kind::Other(fd) => drop(std::os::fd::OwnedFd::from(fd)),
    }
}
"""
    assert [line for _, line, _ in scan(tmp_path, {"lib.rs": text})] == [5, 11]


def test_module_declarations_and_inner_attributes_gate_whole_files(tmp_path: Path) -> None:
    files = {
        "lib.rs": "#[cfg(unix)]\nmod unix_only;\nmod inner_gated;\nmod plain;\n#[cfg(windows)]\n#[path = \"win/impl.rs\"]\nmod win;\n",
        "unix_only.rs": "pub use std::os::unix::net::UnixStream;\n",
        "inner_gated.rs": "#![cfg(unix)]\n//! Unix only.\npub use std::os::fd::OwnedFd;\n",
        "plain.rs": "mod nested;\n",
        "plain/nested.rs": "pub use std::os::unix::net::UnixStream;\n",
        "win/impl.rs": "pub use std::os::windows::io::RawHandle;\n",
        "unreached.rs": "pub use std::os::unix::net::UnixStream;\n",
    }
    assert scan(tmp_path, files) == [("plain/nested.rs", 1, WINDOWS)]


def test_a_feature_gate_counts_only_where_the_features_are_known(tmp_path: Path) -> None:
    text = '#[cfg(any(unix, feature = "posix-shim"))]\nuse std::os::unix::net::UnixStream;\n'
    assert scan(tmp_path, {"lib.rs": text}, features=set()) == []
    (tmp_path / "src" / "lib.rs").unlink()
    assert scan(tmp_path, {"lib.rs": text}, features={"posix-shim"}) == [("lib.rs", 2, WINDOWS)]
    (tmp_path / "src" / "lib.rs").unlink()
    assert scan(tmp_path, {"lib.rs": text}, features=None) == [("lib.rs", 2, WINDOWS)]


@pytest.mark.parametrize(
    ("cfg", "target", "expected"),
    [
        ("unix", "x86_64-apple-darwin", True),
        ("unix", "x86_64-pc-windows-gnu", False),
        ('all(target_os = "linux", target_env = "musl")', "aarch64-unknown-linux-musl", True),
        ('all(target_os = "linux", target_env = "musl")', "aarch64-unknown-linux-gnu", False),
        ('any(target_vendor = "apple", windows)', "x86_64-pc-windows-msvc", True),
        ("not(any(unix, windows))", "x86_64-unknown-linux-gnu", False),
        ("debug_assertions", "x86_64-unknown-linux-gnu", None),
        ("not(debug_assertions)", "x86_64-unknown-linux-gnu", None),
        ("all(windows, debug_assertions)", "x86_64-unknown-linux-gnu", False),
        ("any(unix, debug_assertions)", "x86_64-unknown-linux-gnu", True),
        ("test", "x86_64-unknown-linux-gnu", False),
    ],
)
def test_cfg_predicates_are_evaluated_per_target(cfg: str, target: str, expected: bool | None) -> None:
    assert gates.evaluate(gates.parse_cfg(cfg), gates.TARGETS[target], None) is expected


def test_a_cfg_it_cannot_read_is_an_error_not_a_pass() -> None:
    with pytest.raises(gates.CfgSyntaxError):
        gates.parse_cfg("all(unix,")
    with pytest.raises(gates.CfgSyntaxError):
        gates.parse_cfg('target_os = linux')


# --- frameworks, on a synthetic dependency graph -----------------------------------------------


def crate(tmp_path: Path, name: str, lib: str, build: str | None = None) -> dict:
    root = tmp_path / name
    (root / "src").mkdir(parents=True)
    (root / "src" / "lib.rs").write_text(lib)
    targets = [{"kind": ["lib"], "src_path": str(root / "src" / "lib.rs")}]
    if build is not None:
        (root / "build.rs").write_text(build)
        targets.append({"kind": ["custom-build"], "src_path": str(root / "build.rs")})
    return {"id": f"{name} 0.1.0", "name": name, "targets": targets}


def graph(packages: list[dict], deps: dict[str, list[tuple[str, str | None, str | None]]], features: dict[str, list[str]] | None = None) -> gates.Graph:
    """deps: name -> [(dependency, kind, target)]."""
    nodes = [
        {
            "id": p["id"],
            "deps": [{"pkg": f"{d} 0.1.0", "dep_kinds": [{"kind": k, "target": t}]} for d, k, t in deps.get(p["name"], [])],
            "features": (features or {}).get(p["name"], []),
        }
        for p in packages
    ]
    return gates.Graph.load({"packages": packages, "resolve": {"nodes": nodes}, "workspace_members": [packages[0]["id"]]})


def frameworks_graph(tmp_path: Path) -> gates.Graph:
    link = '#[link(name = "{}", kind = "framework")]\nunsafe extern "C" {{}}\n'
    packages = [
        crate(tmp_path, "py-bindings", "pub fn f() {}\n"),
        crate(tmp_path, "security-sys", link.format("Security")),
        # A framework behind a feature nobody enables, and one for another Apple OS.
        crate(
            tmp_path,
            "mixed",
            '#[cfg(feature = "bless")]\nmod bless {\n' + link.format("ServiceManagement") + "}\n"
            '#[cfg(target_os = "ios")]\n' + link.format("UIKit") + link.format("SystemConfiguration"),
        ),
        crate(tmp_path, "win-only", link.format("NotOnMacos")),
        crate(tmp_path, "proc", link.format("HostOnly")),
        crate(tmp_path, "scripted", "", build='fn main() { println!("cargo:rustc-link-lib=framework=CoreFoundation"); }\n'),
    ]
    deps = {
        "py-bindings": [
            ("security-sys", None, 'cfg(target_vendor = "apple")'),
            ("mixed", None, None),
            ("win-only", None, "cfg(windows)"),
            ("proc", "build", None),
            ("scripted", None, "aarch64-apple-darwin"),
        ],
    }
    return graph(packages, deps)


def test_the_frameworks_the_macos_graph_links_are_found_by_cfg_feature_and_target(tmp_path: Path) -> None:
    problems, summary = gates.check_frameworks(
        frameworks_graph(tmp_path),
        stubbed={"Security", "SystemConfiguration", "CoreFoundation"},
        allowed={"Security", "SystemConfiguration", "CoreFoundation"},
        prefixed={"Security", "SystemConfiguration", "CoreFoundation"},
    )
    assert problems == []
    assert "CoreFoundation (scripted); Security (security-sys); SystemConfiguration (mixed)" in summary


def test_a_framework_without_a_stub_fails_naming_it_and_who_links_it(tmp_path: Path) -> None:
    # As at 2fdee64: SystemConfiguration linked (whoami, through tokio-postgres), not stubbed.
    problems, _ = gates.check_frameworks(
        frameworks_graph(tmp_path),
        stubbed={"Security", "CoreFoundation"},
        allowed={"Security", "CoreFoundation"},
        prefixed={"Security", "CoreFoundation", "SystemConfiguration"},
    )
    assert len(problems) == 2
    assert "needs the SystemConfiguration framework (mixed)" in problems[0]
    assert "MACOS_FRAMEWORKS" in problems[0]
    assert "ALLOWED_LIBRARIES" in problems[1]


def test_the_real_stub_list_and_wheel_allowlist_are_read() -> None:
    import check_wheel

    stubbed = gates.stubbed_frameworks((ROOT / "scripts" / "build-wheels").read_text())
    assert {"CoreFoundation", "Security", "SystemConfiguration"} <= stubbed
    assert gates.allowed_frameworks(check_wheel.ALLOWED_LIBRARIES["macos"]) == stubbed
    assert gates.allowed_frameworks(check_wheel.FRAMEWORK_PREFIXES) == stubbed
    with pytest.raises(SystemExit, match="MACOS_FRAMEWORKS"):
        gates.stubbed_frameworks("for entry in CoreFoundation:150:1971; do")


def test_the_command_fails_on_an_ungated_use_in_a_crate_of_the_wheel(tmp_path: Path) -> None:
    packages = [
        crate(tmp_path, "py-bindings", "pub fn f() {}\n"),
        crate(tmp_path, "egress-credential", TOKEN_RS_AT_2FDEE64),
        crate(tmp_path, "only-in-tests", TOKEN_RS_AT_2FDEE64),
    ]
    g = {
        "packages": packages,
        "resolve": {
            "nodes": [
                {"id": "py-bindings 0.1.0", "deps": [
                    {"pkg": "egress-credential 0.1.0", "dep_kinds": [{"kind": None, "target": None}]},
                    {"pkg": "only-in-tests 0.1.0", "dep_kinds": [{"kind": "dev", "target": None}]},
                ], "features": []},
                {"id": "egress-credential 0.1.0", "deps": [], "features": []},
                {"id": "only-in-tests 0.1.0", "deps": [], "features": []},
            ]
        },
        "workspace_members": [p["id"] for p in packages],
    }
    meta = tmp_path / "metadata.json"
    meta.write_text(json.dumps(g))
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "check_platform_gates.py"), "--metadata", str(meta)],
        capture_output=True, text=True, cwd=tmp_path, check=False,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    fails = [line for line in run.stdout.splitlines() if line.startswith("FAIL")]
    assert len(fails) == 1, run.stdout
    assert "egress-credential/src/lib.rs:8: std::os::unix" in fails[0]
    assert "x86_64-pc-windows-gnu" in fails[0]
    assert "ok   macOS frameworks linked: none" in run.stdout
