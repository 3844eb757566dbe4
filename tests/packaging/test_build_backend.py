"""The sdist's build backend (crates/py-bindings/pep517/lfsc_build.py): no Rust, one clear line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import lfsc_build
import pytest
from conftest import ROOT

BACKEND_DIR = ROOT / "crates" / "py-bindings" / "pep517"


def fake_tools(folder: Path, version: str) -> Path:
    """`cargo` and `rustc` that report `version`, alone on a PATH."""
    folder.mkdir(parents=True, exist_ok=True)
    for tool in ("cargo", "rustc"):
        exe = folder / tool
        exe.write_text(f"#!/bin/sh\necho '{tool} {version} (fake 2026-01-01)'\n")
        exe.chmod(0o755)
    return folder


def test_the_msrv_is_the_workspace_rust_version() -> None:
    declared = re.search(r'^rust-version = "(\d+)\.(\d+)"', (ROOT / "Cargo.toml").read_text(), re.MULTILINE)
    assert declared, "no rust-version in Cargo.toml"
    assert lfsc_build.MSRV == (int(declared[1]), int(declared[2]))


def test_no_cargo_names_what_is_needed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    problem = lfsc_build.rust_problem()
    assert problem is not None
    assert "Rust toolchain 1.88 or newer" in problem and "cargo was not found" in problem
    assert "\n" not in problem


def test_an_old_rust_is_refused_a_new_one_accepted(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(fake_tools(tmp_path / "old", "1.80.1")))
    problem = lfsc_build.rust_problem()
    assert problem is not None and "cargo is 1.80" in problem
    monkeypatch.setenv("PATH", str(fake_tools(tmp_path / "new", "1.88.0")))
    assert lfsc_build.rust_problem() is None


def test_a_frontend_sees_one_line_and_no_traceback(tmp_path: Path) -> None:
    """What pip runs (a hook in a subprocess), on a machine without Rust: exit 1, one line."""
    hook = "import lfsc_build, sys; lfsc_build.prepare_metadata_for_build_wheel(sys.argv[1])"
    env = {**os.environ, "PATH": str(tmp_path), "PYTHONPATH": str(BACKEND_DIR)}
    run = subprocess.run([sys.executable, "-c", hook, str(tmp_path)], capture_output=True, text=True, env=env)
    assert run.returncode == 1, run
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert "needs a Rust toolchain 1.88 or newer" in lines[0]
    assert "Traceback" not in run.stderr + run.stdout


def test_the_sdist_uses_this_backend() -> None:
    pyproject = (ROOT / "crates" / "py-bindings" / "pyproject.toml").read_text()
    assert 'build-backend = "lfsc_build"' in pyproject
    assert 'backend-path = ["pep517"]' in pyproject
    assert '{ path = "pep517/lfsc_build.py", format = "sdist" }' in pyproject
