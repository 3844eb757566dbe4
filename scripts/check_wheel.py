"""Check one built wheel of langflow-sandbox-createos before it may be released.

    python scripts/check_wheel.py WHEEL [WHEEL...]

For each wheel:

- the native module's ELF machine is the architecture the tag names, and its libc is the one
  the tag names (glibc's ``libc.so.6`` for manylinux; musl's ``libc.so`` or Alpine's
  ``libc.musl-*.so.1``, and no ``GLIBC_`` symbol versions, for musllinux);
- the libc floor: the newest ``GLIBC_x.y`` symbol version the module needs (read with
  ``readelf``) is not newer than the tag claims, and for manylinux ``auditwheel show`` agrees
  that the wheel is consistent with its tag;
- the metadata: ``Requires-Python: >=3.10``, the ``Typing :: Typed`` classifier, the licence,
  project URLs, and a Markdown long description (the PyPI README, which names all three
  surfaces);
- the typing files (``py.typed``, ``_native.pyi``) are in the wheel;
- ``twine check --strict`` passes (run once for all wheels, by the caller or here).

Exits 1 when any check fails and prints one line per check.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from email.parser import Parser
from pathlib import Path

PACKAGE = "langflow_sandbox_createos"
# ELF `Machine:` as readelf prints it, per wheel-tag architecture.
MACHINES = {"x86_64": "Advanced Micro Devices X86-64", "aarch64": "AArch64"}
# What the long description must mention: each surface and how to enable it.
DESCRIPTION_MUST_NAME = [
    "LANGFLOW_SANDBOX_BACKEND_PLUGINS=createos",
    "LANGFLOW_SANDBOX_BACKEND=createos",
    "langflow.extensions",
    "LANGFLOW_EXECUTOR_KIND=createos",
    "CREATEOS_SANDBOX_API_KEY",
]

failures: list[str] = []


def check(ok: bool, what: str, detail: str = "") -> None:
    print(f"  {'ok  ' if ok else 'FAIL'} {what}{': ' + detail if detail else ''}")
    if not ok:
        failures.append(what)


def readelf(*args: str) -> str:
    return subprocess.run(["readelf", *args], check=True, capture_output=True, text=True).stdout


def platform_of(wheel: Path) -> tuple[str, str, tuple[int, int]]:
    """(libc, arch, floor) from the wheel's platform tag, e.g. ('glibc', 'x86_64', (2, 17))."""
    tags = wheel.stem.split("-")[-1]
    for tag in tags.split("."):
        m = re.fullmatch(r"(manylinux|musllinux)_(\d+)_(\d+)_(\w+)", tag)
        if m:
            libc = "glibc" if m[1] == "manylinux" else "musl"
            return libc, m[4], (int(m[2]), int(m[3]))
        if tag.startswith("manylinux2014_"):
            return "glibc", tag.removeprefix("manylinux2014_"), (2, 17)
    raise SystemExit(f"{wheel.name}: no manylinux/musllinux platform tag")


def check_native(wheel: Path, libc: str, arch: str, floor: tuple[int, int]) -> None:
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if n.startswith(f"{PACKAGE}/_native") and n.endswith(".so")]
        check(len(names) == 1, "one native module", ", ".join(names) or "none")
        if len(names) != 1:
            return
        so = Path(zf.extract(names[0], tmp))
        header = readelf("-h", str(so))
        machine = re.search(r"Machine:\s+(.+)", header)
        got = machine[1].strip() if machine else "?"
        check(got == MACHINES.get(arch), f"ELF machine is {arch}", got)
        dynamic = readelf("-d", str(so))
        needed = re.findall(r"\(NEEDED\).*\[(.+?)\]", dynamic)
        # musl's own soname is `libc.so`; Alpine's loader also answers to `libc.musl-<arch>.so.1`.
        musl = [n for n in needed if n == "libc.so" or n.startswith("libc.musl-")]
        if libc == "musl":
            # Not exercised on the build machine (no musl wheel can be built there): written to
            # the musl ABI, to be confirmed on the first release machine that builds one.
            check(bool(musl), "links musl libc", ", ".join(needed))
            check(not any(n.startswith("libc.so") for n in needed), "no glibc dependency", ", ".join(needed))
        else:
            check("libc.so.6" in needed and not musl, "links glibc (libc.so.6)", ", ".join(needed))
        check(not any("libpython" in n for n in needed), "no libpython dependency", ", ".join(needed))
        versions = readelf("-V", str(so))
        glibc = sorted({tuple(map(int, v.split("."))) for v in re.findall(r"GLIBC_(\d+\.\d+(?:\.\d+)?)", versions)})
        newest = max(glibc, default=(0, 0))[:2]
        shown = ".".join(map(str, newest)) if glibc else "none"
        if libc == "glibc":
            check(newest <= floor, f"newest GLIBC symbol version <= {floor[0]}.{floor[1]}", shown)
        else:
            check(not glibc, "no GLIBC symbol versions", shown)


def check_auditwheel(wheel: Path, libc: str, arch: str, floor: tuple[int, int]) -> None:
    auditwheel = shutil.which("auditwheel") or str(Path(sys.executable).with_name("auditwheel"))
    run = subprocess.run([auditwheel, "show", str(wheel)], capture_output=True, text=True)
    text = " ".join(run.stdout.split())
    family = "manylinux" if libc == "glibc" else "musllinux"
    want = f"{family}_{floor[0]}_{floor[1]}_{arch}"
    m = re.search(r'consistent with the following platform tag: "([^"]+)"', text)
    got = m[1] if m else (run.stderr.strip().splitlines() or ["no verdict"])[-1]
    check(run.returncode == 0 and got == want, f"auditwheel show: consistent with {want}", got)


def check_metadata(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        meta_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        meta = Parser().parsestr(zf.read(meta_name).decode())
        check(f"{PACKAGE}/py.typed" in names, "py.typed in the wheel")
        check(f"{PACKAGE}/_native.pyi" in names, "_native.pyi in the wheel")
        check(any(n.endswith(".dist-info/licenses/LICENSE") or n.endswith("LICENSE") for n in names), "licence file in the wheel")
    check(meta.get("Requires-Python") == ">=3.10", "Requires-Python >=3.10", str(meta.get("Requires-Python")))
    classifiers = meta.get_all("Classifier") or []
    check("Typing :: Typed" in classifiers, "classifier Typing :: Typed")
    licence = meta.get("License-Expression") or meta.get("License")
    check(licence == "MIT", "licence MIT", str(licence))
    urls = meta.get_all("Project-URL") or []
    check(len(urls) >= 2, "project URLs", "; ".join(urls))
    check(meta.get("Description-Content-Type", "").startswith("text/markdown"), "long description is Markdown")
    body = meta.get_payload() or ""
    missing = [s for s in DESCRIPTION_MUST_NAME if s not in body]
    check(not missing, "long description names every surface and the key", "missing " + ", ".join(missing) if missing else f"{len(body)} chars")


def main(argv: list[str]) -> int:
    twine = True
    wheels = []
    for arg in argv:
        if arg == "--no-twine":
            twine = False
        else:
            wheels.append(Path(arg))
    if not wheels:
        print(__doc__)
        return 2
    for wheel in wheels:
        libc, arch, floor = platform_of(wheel)
        print(f"{wheel.name} ({libc} >= {floor[0]}.{floor[1]}, {arch}, {wheel.stat().st_size / 1e6:.2f} MB)")
        check_native(wheel, libc, arch, floor)
        check_auditwheel(wheel, libc, arch, floor)
        check_metadata(wheel)
    if twine:
        exe = shutil.which("twine") or str(Path(sys.executable).with_name("twine"))
        env = {**os.environ, "NO_COLOR": "1", "TERM": "dumb"}
        run = subprocess.run([exe, "check", "--strict", *map(str, wheels)], capture_output=True, text=True, env=env)
        check(run.returncode == 0, "twine check --strict", " ".join((run.stdout + run.stderr).split())[-300:])
    if failures:
        print(f"wheel checks: {len(failures)} failed")
        return 1
    print(f"wheel checks: all passed for {len(wheels)} wheel(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
