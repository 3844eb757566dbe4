"""Fixtures for the packaging checks: tiny real binaries of each platform, linked by zig."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "crates" / "py-bindings" / "pep517"))

# A module's init function, as the real extension has it: exported, and taking one symbol
# from Python. `EXTRA` adds what a variant needs.
MODULE_C = """
extern void *PyModuleDef_Init(void *);
EXTRA
static char def[64];
__attribute__((visibility("default"))) void *PyInit__native(void) { return CALL; }
"""
# A Windows DLL without the C runtime needs its own entry point.
DLL_ENTRY = "int DllMainCRTStartup(void *h, unsigned r, void *p) { return 1; }\n"


def _zig() -> list[str]:
    if importlib.util.find_spec("ziglang") is None:
        pytest.skip("zig (the `ziglang` package, a scripts/build-wheels tool) is not installed in this venv")
    return [sys.executable, "-m", "ziglang", "cc"]


Build = Callable[..., Path]


@pytest.fixture(scope="session")
def build(tmp_path_factory: pytest.TempPathFactory) -> Build:
    """Links a tiny extension module for a zig target: `build("x86_64-linux-musl", "mod.so")`.

    `needs`: names of other tiny libraries (built first, in the same folder) the module calls
    one function of each, so that the module loads them. No C runtime is linked, so nothing
    of zig's libc is compiled (fast on a cold cache)."""
    root = tmp_path_factory.mktemp("binaries")
    zig = _zig()

    def link(target: str, out: str, sources: list[Path], flags: list[str]) -> Path:
        folder = root / target
        folder.mkdir(exist_ok=True)
        path = folder / out
        cmd = [*zig, "-target", target, "-shared", "-nostdlib", "-o", str(path), *map(str, sources), *flags]
        run = subprocess.run(cmd, capture_output=True, text=True, cwd=folder)
        assert run.returncode == 0, (cmd, run.stderr)
        return path

    def source(folder: Path, name: str, text: str) -> Path:
        folder.mkdir(exist_ok=True)
        path = folder / name
        path.write_text(text)
        return path

    def build_module(target: str, out: str, needs: tuple[str, ...] = ()) -> Path:
        folder = root / target
        windows = "windows" in target
        entry = [source(folder, "entry.c", DLL_ENTRY)] if windows else []
        flags: list[str] = []
        calls = "PyModuleDef_Init(def)"
        extra = ""
        libs = ["python3"] if windows else []  # Windows resolves Python's symbols at link time
        for lib in (*libs, *needs):
            body = (
                '__attribute__((visibility("default"))) void *PyModuleDef_Init(void *d) { return d; }\n'
                if lib == "python3"
                else f'__attribute__((visibility("default"))) int {lib}_fn(void) {{ return 1; }}\n'
            )
            src = source(folder, f"{lib}.c", body)
            if windows:
                link(target, f"{lib}.dll", [src, *entry], [f"-Wl,--out-implib,lib{lib}.a"])
                flags.append(f"-l{lib}")
            elif "macos" in target:
                link(target, f"lib{lib}.dylib", [src], [f"-Wl,-install_name,/opt/{lib}/lib{lib}.dylib"])
                flags.append(f"-l{lib}")
            else:
                link(target, f"lib{lib}.so", [src], [f"-Wl,-soname,lib{lib}.so.1"])
                flags.append(f"-l{lib}")
            if lib != "python3":
                extra += f"extern int {lib}_fn(void);\n"
                calls = f"({lib}_fn() ? {calls} : 0)"
        text = MODULE_C.replace("EXTRA", extra).replace("CALL", calls)
        flags = ["-L.", *flags]
        if "macos" in target:
            flags += ["-undefined", "dynamic_lookup"]
        elif not windows:
            flags += ["-Wl,--allow-shlib-undefined"]
        return link(target, out, [source(folder, f"{out}.c", text), *entry], flags)

    return build_module
