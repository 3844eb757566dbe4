"""Check built wheels of langflow-sandbox-createos before they may be released.

    python scripts/check_wheel.py WHEEL [WHEEL...]            # every check on each wheel
    python scripts/check_wheel.py --complete DIST_DIR          # also: the full matrix is there
    python scripts/check_wheel.py --no-twine --no-auditwheel --no-abi3audit WHEEL...

For each wheel, from the files alone (the build machine cannot run most of them):

- the native module (``_native.abi3.so``, or ``_native.pyd`` on Windows) is the binary format
  and architecture its platform tag names (ELF, Mach-O or PE; x86_64 or aarch64), is a shared
  library, and exports the module init symbol ``PyInit__native``;
- every library it loads is on the allowlist of that platform (``ALLOWED_LIBRARIES``): the libc
  the tag names, and the operating system's own libraries; never a libpython or a compiler
  runtime that the platform does not ship;
- what it takes from Python is the stable ABI of CPython 3.10 (``abi3audit``), taken from
  ``python3.dll`` on Windows and looked up in the interpreter on Linux and macOS;
- the platform's floor: the newest ``GLIBC_x.y`` it needs is not newer than its manylinux tag
  (and ``auditwheel show`` agrees), a musllinux module needs no glibc symbol version, a macOS module
  declares a minimum macOS no newer than its tag;
- the tags (``cp310-abi3-<platform>``) and the metadata: ``Requires-Python``, ``Requires-Dist:
  lfx>=1.12``, ``Typing :: Typed``, the licence, project URLs, the PyPI description;
- the typing files are in the wheel, and ``twine check --strict`` passes.

``--complete`` also fails when a platform of the release matrix (``MATRIX``) has no wheel, has
more than one, or the sdist is missing. Exits 1 when any check fails; one line per check.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import native_binary  # noqa: E402  (the sibling module, found through the line above)

PACKAGE = "langflow_sandbox_createos"
DIST = "langflow-sandbox-createos"
INIT_SYMBOL = "PyInit__native"
# The init function under the module's dotted name: a Windows module linked by zig exports it
# too (see windows_gnu_flags in scripts/build-wheels). Python never looks it up.
DOTTED_INIT_SYMBOL = f"PyInit_{PACKAGE}._native"

# The release matrix: one wheel per entry, matched on its platform tag. scripts/build-wheels
# builds all of them, and so does .github/workflows/release.yml.
MATRIX = {
    "manylinux2014 x86_64": r"manylinux(2014|_2_17)_x86_64",
    "manylinux2014 aarch64": r"manylinux(2014|_2_17)_aarch64",
    "musllinux_1_2 x86_64": r"musllinux_1_2_x86_64",
    "musllinux_1_2 aarch64": r"musllinux_1_2_aarch64",
    "macOS x86_64": r"macosx_\d+_\d+_x86_64",
    "macOS arm64": r"macosx_\d+_\d+_arm64",
    "Windows x64": r"win_amd64",
}

# Libraries a module may load, per platform. Anything else is a library a user's machine may
# not have (a compiler runtime, a libpython), or a decision to be taken here first.
_LINUX_GLIBC = {"libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2", "librt.so.1", "libgcc_s.so.1"}
_FRAMEWORKS = "/System/Library/Frameworks"
ALLOWED_LIBRARIES: dict[str, set[str]] = {
    # glibc's libraries and the GCC runtime every glibc system has (the manylinux policy's core).
    "glibc": _LINUX_GLIBC | {"ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1"},
    # musl is one library: `libc.so` (its own soname), which Alpine's loader also answers to
    # as `libc.musl-<arch>.so.1`. No libgcc_s: Alpine installs it only on request.
    "musl": {"libc.so", "libc.musl-x86_64.so.1", "libc.musl-aarch64.so.1"},
    # libSystem (libc, libm, pthreads, dyld), libiconv (which Rust's std links on Apple targets)
    # with its libcharset, the two frameworks the platform certificate verifier uses, and
    # SystemConfiguration (whoami, under tokio-postgres; part of every macOS since 10.0).
    "macos": {
        "/usr/lib/libSystem.B.dylib",
        "/usr/lib/libiconv.2.dylib",
        "/usr/lib/libcharset.1.dylib",
        f"{_FRAMEWORKS}/CoreFoundation.framework/Versions/A/CoreFoundation",
        f"{_FRAMEWORKS}/Security.framework/Versions/A/Security",
        f"{_FRAMEWORKS}/SystemConfiguration.framework/Versions/A/SystemConfiguration",
    },
    # Windows' own DLLs (kernel, sockets, crypto, certificate store, the C runtime of every
    # Windows 10+) and the stable-ABI Python DLL. Not python3X.dll, not MinGW's
    # libgcc_s_seh-1.dll / libwinpthread-1.dll / libstdc++-6.dll, not vcruntime140.dll
    # (Python ships it, but a module built without MSVC has no business loading it).
    "windows": {
        "python3.dll",
        "kernel32.dll",
        "ntdll.dll",
        "advapi32.dll",
        "bcrypt.dll",
        "bcryptprimitives.dll",  # ProcessPrng: Rust's std takes its randomness from it
        "crypt32.dll",
        "ncrypt.dll",
        "secur32.dll",
        "userenv.dll",
        "ws2_32.dll",
        "iphlpapi.dll",
        "ole32.dll",
        "oleaut32.dll",
        "shell32.dll",
        "user32.dll",
        "msvcrt.dll",
        "ucrtbase.dll",
        "api-ms-win-core-synch-l1-2-0.dll",
    },
}
# Windows' API sets of the Universal C runtime (api-ms-win-crt-*-l1-1-0.dll) are part of the OS.
_WINDOWS_API_SET = re.compile(r"api-ms-win-crt-[a-z]+-l1-1-0\.dll")

# macOS frameworks whose symbols a module may look up at load time rather than bind to the
# framework (what the local cross build does, having no macOS SDK to bind against): a symbol
# looked up that way must carry the prefix of a framework the module loads.
FRAMEWORK_PREFIXES = {
    f"{_FRAMEWORKS}/CoreFoundation.framework/Versions/A/CoreFoundation": ("CF", "kCF", "__CF"),
    f"{_FRAMEWORKS}/Security.framework/Versions/A/Security": (
        "Sec", "kSec", "SSL", "kSSL", "CMS", "kCMS", "Authorization", "kAuthorization",
    ),
    f"{_FRAMEWORKS}/SystemConfiguration.framework/Versions/A/SystemConfiguration": ("SC", "kSC"),
}

# What the long description must mention: each surface and how to enable it.
DESCRIPTION_MUST_NAME = [
    "LANGFLOW_SANDBOX_BACKEND_PLUGINS=createos",
    "LANGFLOW_SANDBOX_BACKEND=createos",
    "langflow.extensions",
    "LANGFLOW_EXECUTOR_KIND=createos",
    "CREATEOS_SANDBOX_API_KEY",
]

failures: list[str] = []


def check(ok: bool, what: str, detail: str = "") -> bool:
    print(f"  {'ok  ' if ok else 'FAIL'} {what}{': ' + detail if detail else ''}")
    if not ok:
        failures.append(what)
    return ok


def _shown(names: set[str] | list[str], limit: int = 8) -> str:
    names = sorted(names)
    more = f" (+{len(names) - limit} more)" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more if names else "none"


@dataclass(frozen=True)
class Platform:
    """What a wheel's platform tag promises."""

    system: str
    """``glibc``, ``musl``, ``macos`` or ``windows`` (the allowlist that applies)."""
    arch: str
    """``x86_64`` or ``aarch64``."""
    floor: tuple[int, ...]
    """The oldest libc (Linux) or macOS it claims to run on; () for Windows."""
    tag: str

    @property
    def binary_format(self) -> str:
        return {"macos": "Mach-O", "windows": "PE"}.get(self.system, "ELF")

    @property
    def module_name(self) -> str:
        return "_native.pyd" if self.system == "windows" else "_native.abi3.so"


def platform_of(tag: str) -> Platform:
    """The promise of one platform tag, e.g. ``manylinux2014_x86_64`` or ``win_amd64``."""
    if m := re.fullmatch(r"manylinux_(\d+)_(\d+)_(x86_64|aarch64)", tag):
        return Platform("glibc", m[3], (int(m[1]), int(m[2])), tag)
    if m := re.fullmatch(r"manylinux2014_(x86_64|aarch64)", tag):
        return Platform("glibc", m[1], (2, 17), tag)
    if m := re.fullmatch(r"musllinux_(\d+)_(\d+)_(x86_64|aarch64)", tag):
        return Platform("musl", m[3], (int(m[1]), int(m[2])), tag)
    if m := re.fullmatch(r"macosx_(\d+)_(\d+)_(x86_64|arm64)", tag):
        return Platform("macos", "aarch64" if m[3] == "arm64" else "x86_64", (int(m[1]), int(m[2])), tag)
    if tag == "win_amd64":
        return Platform("windows", "x86_64", (), tag)
    if tag == "win_arm64":
        return Platform("windows", "aarch64", (), tag)
    raise ValueError(f"platform tag {tag!r} is not one this project ships")


def wheel_tags(wheel: Path) -> tuple[str, str, list[str]]:
    """(python tag, abi tag, platform tags) from a wheel's file name."""
    parts = wheel.name.removesuffix(".whl").split("-")
    return parts[-3], parts[-2], parts[-1].split(".")


def allowed(platform: Platform, library: str) -> bool:
    name = library.lower() if platform.system == "windows" else library
    if platform.system == "windows" and _WINDOWS_API_SET.fullmatch(name):
        return True
    return name in ALLOWED_LIBRARIES[platform.system]


def check_binary(binary: native_binary.NativeBinary, platform: Platform) -> None:
    """The checks one native module must pass for its platform (no tools, the file alone)."""
    check(binary.format == platform.binary_format, f"binary format is {platform.binary_format}", binary.format)
    check(binary.arch == platform.arch, f"architecture is {platform.arch}", binary.arch)
    check(binary.kind == "shared library", "is a loadable shared library", binary.kind)
    check(INIT_SYMBOL in binary.exports, f"exports {INIT_SYMBOL}", f"{len(binary.exports)} exported symbols")
    clashing = {s for s in binary.exports if s not in (INIT_SYMBOL, DOTTED_INIT_SYMBOL) and re.match(r"_?Py", s)}
    check(not clashing, "exports no other Python-namespace symbol", _shown(clashing))
    outside = [lib for lib in binary.libraries if not allowed(platform, lib)]
    check(not outside, f"loads only {platform.system}'s allowed libraries", _shown(outside) if outside else _shown(binary.libraries))
    check(
        not any(re.search(r"python3\d+\.dll|libpython", lib, re.IGNORECASE) for lib in binary.libraries),
        "loads no version-specific libpython / python3X.dll",
    )
    if platform.system == "glibc":
        glibc = {
            tuple(int(p) for p in v.removeprefix("GLIBC_").split("."))
            for versions in binary.symbol_versions.values()
            for v in versions
            if re.fullmatch(r"GLIBC_\d+\.\d+(\.\d+)?", v)
        }
        newest = max(glibc, default=())
        check(newest[:2] <= platform.floor, f"newest GLIBC symbol version <= {'.'.join(map(str, platform.floor))}", ".".join(map(str, newest)) or "none")
    elif platform.system == "musl":
        versions = {v for vs in binary.symbol_versions.values() for v in vs}
        check(not versions, "needs no glibc symbol version", _shown(versions))
    elif platform.system == "macos":
        shown = ".".join(map(str, binary.min_os)) if binary.min_os else "none"
        check(binary.min_os is not None and binary.min_os[:2] <= platform.floor, f"minimum macOS <= {platform.floor[0]}.{platform.floor[1]}", shown)
        # Looked up at load time (not bound to a library): Python's own symbols, and symbols of
        # a loaded framework when the module was linked without the SDK.
        looked_up = binary.imports.get("", set()) - binary.weak
        loaded = [lib for lib in binary.libraries if lib in FRAMEWORK_PREFIXES]
        stray = {
            s for s in looked_up
            if not s.startswith(("Py", "_Py"))
            and not any(s.startswith(FRAMEWORK_PREFIXES[lib]) for lib in loaded)
        }
        check(not stray, "symbols looked up at load time are Python's or a loaded framework's", _shown(stray))
    elif platform.system == "windows":
        from_python = binary.imports.get("python3.dll", set())
        check(bool(from_python), "takes Python's symbols from python3.dll", f"{len(from_python)} symbols")


def check_native(wheel: Path, platform: Platform) -> None:
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if re.fullmatch(rf"{PACKAGE}/_native[^/]*\.(so|pyd|dylib|dll)", n)]
        check(names == [f"{PACKAGE}/{platform.module_name}"], f"one native module, {platform.module_name}", _shown(names))
        if len(names) != 1:
            return
        try:
            binaries = native_binary.read(Path(zf.extract(names[0], tmp)))
        except native_binary.FormatError as exc:
            check(False, "native module is readable", str(exc))
            return
        check(len(binaries) == 1, "one architecture in the module", str(len(binaries)))
        check_binary(binaries[0], platform)


def _tool(name: str) -> str:
    return shutil.which(name) or str(Path(sys.executable).with_name(name))


def check_auditwheel(wheel: Path, platform: Platform) -> None:
    run = subprocess.run([_tool("auditwheel"), "show", str(wheel)], capture_output=True, text=True)
    text = " ".join(run.stdout.split())
    family = "manylinux" if platform.system == "glibc" else "musllinux"
    want = f"{family}_{platform.floor[0]}_{platform.floor[1]}_{platform.arch}"
    m = re.search(r'consistent with the following platform tag: "([^"]+)"', text)
    got = m[1] if m else (run.stderr.strip().splitlines() or ["no verdict"])[-1]
    check(run.returncode == 0 and got == want, f"auditwheel show: consistent with {want}", got)


def check_abi3audit(wheel: Path) -> None:
    """abi3audit reads the module's Python imports (ELF, Mach-O or PE) against CPython's
    stable-ABI tables for the version the tag claims (cp310)."""
    run = subprocess.run([_tool("abi3audit"), "--strict", "--report", str(wheel)], capture_output=True, text=True)
    try:
        report = json.loads(run.stdout)
        results = [r for spec in report["specs"].values() for r in spec["wheel"]]
        problems = [f"{r['name']}: {len(r['result']['non_abi3_symbols'])} non-abi3, computed {r['result']['computed']}" for r in results if not r["result"]["is_abi3"] or r["result"]["non_abi3_symbols"] or not r["result"]["is_abi3_baseline_compatible"]]
        detail = "; ".join(problems) if problems else f"{len(results)} module(s), abi3 for {results[0]['result']['baseline'] if results else '?'}"
        check(run.returncode == 0 and bool(results) and not problems, "abi3audit: only the stable ABI of its cp tag", detail)
    except (ValueError, KeyError, IndexError, TypeError):
        check(False, "abi3audit: only the stable ABI of its cp tag", (run.stdout + run.stderr).strip()[-300:])


def check_metadata(wheel: Path, platform: Platform) -> None:
    py_tag, abi_tag, _ = wheel_tags(wheel)
    check((py_tag, abi_tag) == ("cp310", "abi3"), "tag cp310-abi3 (one wheel for every CPython >= 3.10)", f"{py_tag}-{abi_tag}")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        meta_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        meta = Parser().parsestr(zf.read(meta_name).decode())
        wheel_file = Parser().parsestr(zf.read(meta_name.replace("METADATA", "WHEEL")).decode())
        check(f"{PACKAGE}/py.typed" in names, "py.typed in the wheel")
        check(f"{PACKAGE}/_native.pyi" in names, "_native.pyi in the wheel")
        check(any(n.endswith(".dist-info/licenses/LICENSE") or n.endswith("LICENSE") for n in names), "licence file in the wheel")
    declared = wheel_file.get_all("Tag") or []
    check(declared == [f"cp310-abi3-{platform.tag}"] or f"cp310-abi3-{platform.tag}" in declared, "WHEEL declares the file name's tag", _shown(declared))
    check(wheel_file.get("Root-Is-Purelib", "").strip() == "false", "WHEEL: Root-Is-Purelib false")
    check(meta.get("Name") == DIST, f"name {DIST}", str(meta.get("Name")))
    check(meta.get("Requires-Python") == ">=3.10", "Requires-Python >=3.10", str(meta.get("Requires-Python")))
    requires = [r.replace(" ", "") for r in meta.get_all("Requires-Dist") or []]
    check(any(r.startswith("lfx>=1.12") for r in requires), "Requires-Dist lfx>=1.12", _shown(requires))
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


def check_complete(listing: list[str]) -> None:
    """The release matrix: exactly one wheel per platform, and one sdist."""
    wheels = [n for n in listing if n.startswith(f"{PACKAGE}-") and n.endswith(".whl")]
    print(f"release matrix ({len(wheels)} wheels)")
    for name, pattern in MATRIX.items():
        found = [w for w in wheels if any(re.fullmatch(pattern, t) for t in wheel_tags(Path(w))[2])]
        check(len(found) == 1, f"one wheel for {name}", _shown(found) if found else "MISSING")
    unknown = [w for w in wheels if not any(re.fullmatch(p, t) for p in MATRIX.values() for t in wheel_tags(Path(w))[2])]
    check(not unknown, "no wheel outside the matrix", _shown(unknown))
    sdists = [n for n in listing if n.startswith(f"{PACKAGE}-") and n.endswith(".tar.gz")]
    check(len(sdists) == 1, "one sdist", _shown(sdists) if sdists else "MISSING")


def main(argv: list[str]) -> int:
    twine = auditwheel = abi3audit = True
    complete: Path | None = None
    wheels: list[Path] = []
    args = iter(argv)
    for arg in args:
        if arg == "--no-twine":
            twine = False
        elif arg == "--no-auditwheel":
            auditwheel = False
        elif arg == "--no-abi3audit":
            abi3audit = False
        elif arg == "--complete":
            complete = Path(next(args))
            wheels.extend(sorted(complete.glob(f"{PACKAGE}-*.whl")))
        else:
            wheels.append(Path(arg))
    if not wheels and complete is None:
        print(__doc__)
        return 2
    for wheel in wheels:
        *_, platform_tags = wheel_tags(wheel)
        try:
            platform = platform_of(platform_tags[-1])
        except ValueError as exc:
            print(wheel.name)
            check(False, "platform tag", str(exc))
            continue
        floor = ".".join(map(str, platform.floor)) or "any"
        print(f"{wheel.name} ({platform.system} >= {floor}, {platform.arch}, {wheel.stat().st_size / 1e6:.2f} MB)")
        check_native(wheel, platform)
        # auditwheel judges musllinux wheels by the host's musl: on a glibc host it cannot.
        if auditwheel and platform.system == "glibc":
            check_auditwheel(wheel, platform)
        if abi3audit:
            check_abi3audit(wheel)
        check_metadata(wheel, platform)
    if twine and wheels:
        env = {**os.environ, "NO_COLOR": "1", "TERM": "dumb"}
        run = subprocess.run([_tool("twine"), "check", "--strict", *map(str, wheels)], capture_output=True, text=True, env=env)
        check(run.returncode == 0, "twine check --strict", " ".join((run.stdout + run.stderr).split())[-300:])
    if complete is not None:
        check_complete(sorted(p.name for p in complete.iterdir()))
    if failures:
        print(f"wheel checks: {len(failures)} failed")
        return 1
    print(f"wheel checks: all passed for {len(wheels)} wheel(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
