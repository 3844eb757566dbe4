"""PEP 517 build backend of the sdist: maturin's, after checking that Rust is there.

pip builds the sdist only where no wheel matches the machine. Without a Rust toolchain,
maturin's own backend would either fail with a long traceback or fetch a toolchain of its own
(several hundred MB, unasked). This one stops first, with one line saying what is needed.
Every hook is maturin's otherwise.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import maturin

# The workspace's rust-version (Cargo.toml); tests/packaging checks that the two agree.
MSRV = (1, 88)
_MSRV = ".".join(map(str, MSRV))
_NEEDED = (
    f"langflow-sandbox-createos: no wheel matches this platform, and building it from source "
    f"needs a Rust toolchain {_MSRV} or newer (rustc and cargo on PATH, e.g. from https://rustup.rs)"
)


def rust_problem() -> str | None:
    """Why this machine cannot build the extension, or None when it can."""
    found = {}
    for tool in ("cargo", "rustc"):
        exe = shutil.which(tool)
        if exe is None:
            return f"{_NEEDED}: {tool} was not found."
        try:
            out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60).stdout
        except (OSError, subprocess.SubprocessError) as exc:
            return f"{_NEEDED}: `{tool} --version` failed ({exc})."
        m = re.match(rf"{tool} (\d+)\.(\d+)", out)
        if not m:
            return f"{_NEEDED}: `{tool} --version` printed {out.strip()[:80]!r}."
        found[tool] = (int(m[1]), int(m[2]))
        if found[tool] < MSRV:
            return f"{_NEEDED}: {tool} is {m[1]}.{m[2]}."
    return None


def _require_rust() -> None:
    problem = rust_problem()
    if problem:
        # SystemExit with a message: the build frontend shows this one line, no traceback.
        print(problem, file=sys.stderr)
        raise SystemExit(1)


def _checked(hook: Callable[..., Any]) -> Callable[..., Any]:
    """maturin's `hook`, run only once Rust is known to be there."""

    @functools.wraps(hook)
    def run(*args: Any, **kwargs: Any) -> Any:
        _require_rust()
        return hook(*args, **kwargs)

    return run


# Every PEP 517 hook (and the optional ones pip uses) is maturin's, behind the check.
get_requires_for_build_wheel = _checked(maturin.get_requires_for_build_wheel)
get_requires_for_build_editable = _checked(maturin.get_requires_for_build_wheel)
get_requires_for_build_sdist = _checked(maturin.get_requires_for_build_sdist)
prepare_metadata_for_build_wheel = _checked(maturin.prepare_metadata_for_build_wheel)
prepare_metadata_for_build_editable = _checked(maturin.prepare_metadata_for_build_wheel)
build_wheel = _checked(maturin.build_wheel)
build_editable = _checked(maturin.build_editable)
build_sdist = _checked(maturin.build_sdist)
