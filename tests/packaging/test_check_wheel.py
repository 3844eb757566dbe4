"""scripts/check_wheel.py and scripts/native_binary.py, on real binaries of every platform.

The fixtures are tiny extension modules linked by zig for each target the release builds
(ELF for musl, Mach-O for macOS, PE for Windows), so the same parsing and the same allowlists
that check a release wheel are exercised here, in CI, in seconds.
"""

from __future__ import annotations

import re
import zipfile
from collections.abc import Iterator
from pathlib import Path

import check_wheel
import native_binary
import pytest
from conftest import ROOT, Build

# (zig target, wheel platform tag, module file name)
PLATFORMS = [
    ("x86_64-linux-musl", "musllinux_1_2_x86_64", "_native.abi3.so"),
    ("aarch64-linux-musl", "musllinux_1_2_aarch64", "_native.abi3.so"),
    ("aarch64-macos.11.0", "macosx_11_0_arm64", "_native.abi3.so"),
    ("x86_64-macos.10.12", "macosx_10_12_x86_64", "_native.abi3.so"),
    ("x86_64-windows-gnu", "win_amd64", "_native.pyd"),
]
IDS = [tag for _, tag, _ in PLATFORMS]
LIBRARY_CHECK = re.compile(r"loads only \w+'s allowed libraries")


@pytest.fixture(autouse=True)
def fresh_failures() -> Iterator[None]:
    check_wheel.failures.clear()
    yield
    check_wheel.failures.clear()


def failed(pattern: re.Pattern[str] | str) -> bool:
    return any(re.search(pattern, f) for f in check_wheel.failures)


@pytest.mark.parametrize(("target", "tag", "name"), PLATFORMS, ids=IDS)
def test_a_module_of_each_platform_passes(build: Build, target: str, tag: str, name: str) -> None:
    (binary,) = native_binary.read(build(target, name))
    assert binary.exports >= {"PyInit__native"}
    assert "PyModuleDef_Init" in binary.all_imports()
    check_wheel.check_binary(binary, check_wheel.platform_of(tag))
    assert check_wheel.failures == []


@pytest.mark.parametrize(("target", "tag", "name"), PLATFORMS, ids=IDS)
def test_a_library_outside_the_allowlist_fails(build: Build, target: str, tag: str, name: str) -> None:
    (binary,) = native_binary.read(build(target, f"evil-{name}", needs=("evil",)))
    assert any("evil" in lib for lib in binary.libraries), binary.libraries
    check_wheel.check_binary(binary, check_wheel.platform_of(tag))
    assert failed(LIBRARY_CHECK), check_wheel.failures


def test_the_wrong_architecture_or_format_fails(build: Build) -> None:
    (arm,) = native_binary.read(build("aarch64-linux-musl", "_native.abi3.so"))
    check_wheel.check_binary(arm, check_wheel.platform_of("musllinux_1_2_x86_64"))
    assert check_wheel.failures == ["architecture is x86_64"]
    check_wheel.failures.clear()
    check_wheel.check_binary(arm, check_wheel.platform_of("macosx_11_0_arm64"))
    assert "binary format is Mach-O" in check_wheel.failures


def test_a_mingw_runtime_dll_or_a_versioned_python_dll_fails(build: Build) -> None:
    platform = check_wheel.platform_of("win_amd64")
    for dll in ("libgcc_s_seh-1.dll", "libwinpthread-1.dll", "python311.dll", "vcruntime140.dll"):
        assert not check_wheel.allowed(platform, dll), dll
    for dll in ("KERNEL32.dll", "api-ms-win-crt-runtime-l1-1-0.dll", "python3.dll", "bcrypt.dll"):
        assert check_wheel.allowed(platform, dll), dll


def test_a_module_built_for_a_newer_macos_than_its_tag_fails(build: Build) -> None:
    (binary,) = native_binary.read(build("aarch64-macos.13.0", "_native.abi3.so"))
    assert binary.min_os == (13, 0, 0)
    check_wheel.check_binary(binary, check_wheel.platform_of("macosx_11_0_arm64"))
    assert failed(r"minimum macOS <= 11\.0")


def test_a_macos_symbol_looked_up_from_no_loaded_framework_fails() -> None:
    platform = check_wheel.platform_of("macosx_11_0_arm64")
    binary = native_binary.NativeBinary(
        "Mach-O", "aarch64", "shared library",
        libraries=["/usr/lib/libSystem.B.dylib", f"{check_wheel._FRAMEWORKS}/Security.framework/Versions/A/Security"],
        exports={"PyInit__native"},
        imports={"": {"PyModuleDef_Init", "SecTrustEvaluateWithError", "CFRelease"}},
        min_os=(11, 0, 0),
    )
    check_wheel.check_binary(binary, platform)
    # CFRelease is CoreFoundation's, which this module does not load.
    assert failed("looked up at load time"), check_wheel.failures
    binary.libraries.append(f"{check_wheel._FRAMEWORKS}/CoreFoundation.framework/Versions/A/CoreFoundation")
    check_wheel.failures.clear()
    check_wheel.check_binary(binary, platform)
    assert check_wheel.failures == []


def test_a_glibc_floor_above_the_tag_fails() -> None:
    binary = native_binary.NativeBinary(
        "ELF", "x86_64", "shared library", libraries=["libc.so.6"], exports={"PyInit__native"},
        symbol_versions={"libc.so.6": {"GLIBC_2.2.5", "GLIBC_2.34"}},
    )
    check_wheel.check_binary(binary, check_wheel.platform_of("manylinux2014_x86_64"))
    assert check_wheel.failures == ["newest GLIBC symbol version <= 2.17"]


def test_a_module_without_the_init_symbol_fails(build: Build) -> None:
    module = build("x86_64-windows-gnu", "_native.pyd")
    (binary,) = native_binary.read(module.parent / "python3.dll")  # the stub: no PyInit__native
    check_wheel.check_binary(binary, check_wheel.platform_of("win_amd64"))
    assert "exports PyInit__native" in check_wheel.failures


def test_not_a_binary_is_reported_not_crashed(tmp_path: Path) -> None:
    junk = tmp_path / "_native.abi3.so"
    junk.write_bytes(b"#!/bin/sh\necho hi\n")
    with pytest.raises(native_binary.FormatError):
        native_binary.read(junk)
    junk.write_bytes(b"\x7fELF\x02\x01" + b"\0" * 10)  # truncated
    with pytest.raises(native_binary.FormatError):
        native_binary.read(junk)


def _full_listing() -> list[str]:
    tags = [
        "manylinux_2_17_x86_64.manylinux2014_x86_64",
        "manylinux_2_17_aarch64.manylinux2014_aarch64",
        "musllinux_1_2_x86_64",
        "musllinux_1_2_aarch64",
        "macosx_10_12_x86_64",
        "macosx_11_0_arm64",
        "win_amd64",
    ]
    return [f"langflow_sandbox_createos-0.3.0-cp310-abi3-{t}.whl" for t in tags] + ["langflow_sandbox_createos-0.3.0.tar.gz"]


def test_a_full_build_listing_has_the_whole_matrix() -> None:
    check_wheel.check_complete(_full_listing())
    assert check_wheel.failures == []


@pytest.mark.parametrize("missing", range(8))
def test_a_full_build_missing_any_artifact_fails(missing: int) -> None:
    listing = _full_listing()
    gone = listing.pop(missing)
    check_wheel.check_complete(listing)
    assert len(check_wheel.failures) == 1, (gone, check_wheel.failures)


def test_a_wheel_outside_the_matrix_or_twice_fails() -> None:
    check_wheel.check_complete([*_full_listing(), "langflow_sandbox_createos-0.3.0-cp310-abi3-win32.whl"])
    assert check_wheel.failures == ["no wheel outside the matrix"]
    check_wheel.failures.clear()
    check_wheel.check_complete([*_full_listing(), "langflow_sandbox_createos-0.3.1-cp310-abi3-win_amd64.whl"])
    assert check_wheel.failures == ["one wheel for Windows x64"]


def test_every_matrix_tag_is_a_platform_the_checks_know() -> None:
    for name in _full_listing()[:-1]:
        *_, tags = check_wheel.wheel_tags(Path(name))
        assert check_wheel.platform_of(tags[-1]).tag == tags[-1]
    with pytest.raises(ValueError, match="not one this project ships"):
        check_wheel.platform_of("linux_x86_64")


def test_the_release_matrix_is_the_same_in_the_script_the_workflow_and_the_checks() -> None:
    script = (ROOT / "scripts" / "build-wheels").read_text()
    script_targets = re.findall(r'^  "([\w-]+) [\w-]+"$', script, re.MULTILINE)
    workflow = (ROOT / ".github" / "workflows" / "release.yml").read_text()
    workflow_targets = re.findall(r"target: ([\w-]+)", workflow)
    assert len(script_targets) == len(check_wheel.MATRIX) == 7, script_targets
    # The workflow builds Windows with MSVC on a Windows runner; everything else is the same.
    assert sorted(t.replace("-pc-windows-gnu", "-pc-windows-msvc") for t in script_targets) == sorted(workflow_targets)


def test_a_whole_wheel_is_checked_from_its_file(build: Build, tmp_path: Path) -> None:
    """check_native reads the module out of the wheel by the platform's file name."""
    module = build("x86_64-windows-gnu", "_native.pyd")
    wheel = tmp_path / "langflow_sandbox_createos-0.3.0-cp310-abi3-win_amd64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.write(module, "langflow_sandbox_createos/_native.pyd")
    check_wheel.check_native(wheel, check_wheel.platform_of("win_amd64"))
    assert check_wheel.failures == []
    wrong = tmp_path / "langflow_sandbox_createos-0.3.0-cp310-abi3-macosx_11_0_arm64.whl"
    with zipfile.ZipFile(wrong, "w") as zf:
        zf.write(module, "langflow_sandbox_createos/_native.pyd")
    check_wheel.check_native(wrong, check_wheel.platform_of("macosx_11_0_arm64"))
    assert failed("one native module, _native.abi3.so")
