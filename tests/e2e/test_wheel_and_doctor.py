"""What `pip install` delivers (metadata, stubs, abi3 tag) and the operator's doctor command."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import distribution, entry_points
from pathlib import Path

import pytest

from conftest import Fake, backend_env, make_template, run_doctor, venv_bin

DIST = "langflow-sandbox-createos"


def test_wheel_ships_stubs_marker_and_entry_point() -> None:
    dist = distribution(DIST)
    files = {str(f) for f in dist.files or ()}
    assert "langflow_sandbox_createos/py.typed" in files
    assert "langflow_sandbox_createos/_native.pyi" in files
    assert any(f.startswith("langflow_sandbox_createos/_native") and f.endswith(".so") for f in files)
    # One wheel for every CPython >= 3.10: the stable ABI tag, not a per-version one.
    wheel = dist.read_text("WHEEL") or ""
    tags = [line.split(":", 1)[1].strip() for line in wheel.splitlines() if line.startswith("Tag:")]
    assert tags and all(tag.startswith("cp310-abi3-") for tag in tags), tags
    assert any(req.replace(" ", "").startswith("lfx>=1.12") for req in dist.requires or ()), dist.requires
    (ep,) = [ep for ep in entry_points(group="lfx.sandbox_backends") if ep.name == "createos"]
    assert ep.value == "langflow_sandbox_createos.backend:create_backend"
    # The operator commands as a console script, the same main as `python -m`.
    (script,) = [ep for ep in entry_points(group="console_scripts") if ep.name == DIST]
    assert script.value == "langflow_sandbox_createos.__main__:main"


COMMANDS = ("doctor", "reap", "template", "gateway")


def test_no_command_or_help_lists_the_commands() -> None:
    """A first `python -m langflow_sandbox_createos` (or the console script) says what there is."""
    bare = subprocess.run([sys.executable, "-m", "langflow_sandbox_createos"], capture_output=True, text=True, timeout=60, check=False)
    assert bare.returncode == 2, (bare.stdout, bare.stderr)
    assert bare.stderr.startswith("usage: python -m langflow_sandbox_createos"), bare.stderr
    assert all(f"    {command} " in bare.stderr for command in COMMANDS), bare.stderr
    script = venv_bin(DIST)
    helped = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=60, check=False)
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith(f"usage: {DIST}"), helped.stdout
    assert all(f"    {command} " in helped.stdout for command in COMMANDS), helped.stdout
    doctor = subprocess.run([script, "doctor", "--help"], capture_output=True, text=True, timeout=60, check=False)
    assert doctor.returncode == 0 and "--surface" in doctor.stdout and "--json" in doctor.stdout, doctor.stdout
    wrong = subprocess.run([script, "doctor", "--surface", "nope"], capture_output=True, text=True, timeout=60, check=False)
    assert wrong.returncode == 2 and "backend, component, executor" in wrong.stderr, wrong.stderr


def test_doctor_shows_what_a_run_would_get_and_creates_nothing(clean_fake: Fake) -> None:
    proc = run_doctor(backend_env(clean_fake))
    assert proc.returncode == 0, (proc.stdout, proc.stderr[-2000:])
    out = proc.stdout
    # lfx defaults: 192 MiB floor raised to 4096 MiB, deny-all egress.
    assert "s-2vcpu-4gb" in out, out
    assert "240.0.0.0/4" in out, out
    assert "LANGFLOW_SANDBOX_BACKEND_PLUGINS" in out, out
    stats = clean_fake.stats()
    assert stats["created"] == 0, stats
    assert stats["requests"].get("whoami", 0) >= 1, stats


def test_doctor_lists_refusals_and_fails(clean_fake: Fake) -> None:
    env = backend_env(clean_fake, LANGFLOW_SANDBOX_ALLOW_NETWORK="true", LANGFLOW_SANDBOX_ALLOWED_DOMAINS="pypi.org")
    proc = run_doctor(env)
    assert proc.returncode == 1, (proc.stdout, proc.stderr[-2000:])
    assert "LANGFLOW_SANDBOX_ALLOWED_DOMAINS" in proc.stdout, proc.stdout
    # Selected but not trusted: lfx itself refuses to start, and doctor says which switch.
    untrusted = run_doctor(backend_env(clean_fake, LANGFLOW_SANDBOX_BACKEND_PLUGINS=None))
    assert untrusted.returncode == 1, (untrusted.stdout, untrusted.stderr[-2000:])
    assert "LANGFLOW_SANDBOX_BACKEND_PLUGINS does not list createos" in untrusted.stdout, untrusted.stdout
    assert clean_fake.stats()["created"] == 0


def test_doctor_fails_on_a_rejected_key(clean_fake: Fake) -> None:
    proc = run_doctor(backend_env(clean_fake, CREATEOS_SANDBOX_API_KEY="wrong-key-123"))
    assert proc.returncode == 1, (proc.stdout, proc.stderr[-2000:])
    assert "CREATEOS_SANDBOX_API_KEY" in proc.stdout, proc.stdout
    assert "wrong-key-123" not in proc.stdout + proc.stderr


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".")[:3])


def test_upgrades_the_python_plugin_020_in_place() -> None:
    """`pip install -U` replaces 0.2.0: a newer version, its three entry points, its names."""
    import json
    from importlib.resources import files

    import langflow_sandbox_createos
    from langflow_sandbox_createos.backend import create_backend

    dist = distribution(DIST)
    assert _release(dist.version) > (0, 2, 0), dist.version
    assert langflow_sandbox_createos.__version__ == dist.version
    # The component bundle's manifest says the same version as the wheel.
    manifest = json.loads((files("langflow_sandbox_createos") / "extension.json").read_text())
    assert manifest["id"] == DIST and manifest["version"] == dist.version, manifest
    groups = {
        "lfx.sandbox_backends": ("createos", "langflow_sandbox_createos.backend:create_backend"),
        "lfx.executors": ("createos", "langflow_sandbox_createos.executor:CreateOSExecutor"),
        "langflow.extensions": (DIST, "langflow_sandbox_createos"),
    }
    for group, (name, value) in groups.items():
        (ep,) = [ep for ep in entry_points(group=group) if ep.name == name]
        assert ep.value == value, (group, ep.value)
    # 0.2.0 named the factory at the package root; a config that spelled it so still resolves.
    assert langflow_sandbox_createos.create_backend is create_backend


def _section(out: str, title: str) -> list[str]:
    """The finding lines of one doctor section."""
    lines = out.splitlines()
    start = lines.index(title) + 1
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("  [")), len(lines))
    return lines[start:end]


def test_doctor_reports_every_surface_and_what_the_executor_covers(clean_fake: Fake) -> None:
    template = make_template(clean_fake, "lf-t-doctor")
    env = backend_env(
        clean_fake,
        LANGFLOW_EXECUTOR_KIND="createos",
        CREATEOS_EXECUTOR_ROOTFS="lf-t-doctor",
        CREATEOS_EXECUTOR_WARM_POOL="2",
        CREATEOS_EXECUTOR_TIMEOUT_SECONDS="90",
    )
    proc = run_doctor(env, args=("--surface", "backend,component,executor"))
    assert proc.returncode == 0, (proc.stdout, proc.stderr[-2000:])
    out = proc.stdout
    component = "\n".join(_section(out, "CreateOS Sandbox component"))
    assert "deny-all" in component and "Guest Reuse off" in component, component
    executor = _section(out, "Whole-flow executor: settings")
    rootfs = [line for line in executor if "rootfs: CREATEOS_EXECUTOR_ROOTFS=lf-t-doctor" in line]
    assert rootfs and rootfs[0].startswith("  [ok     ]") and template in rootfs[0], executor
    assert any(line.startswith("  [ok     ] shape: s-4vcpu-8gb") for line in executor), executor
    assert any("timeout: 90 s" in line for line in executor), executor
    assert any("egress: " in line for line in executor), executor
    assert any("warm pool: 2 guest(s)" in line for line in executor), executor
    paths = _section(out, "Whole-flow executor: which Langflow paths reach it")
    # Read from the installed lfx: Graph.arun, lfx run/serve and Loop go through its executor seam.
    assert sum(line.startswith("  [ok     ]") and "reaches the executor" in line for line in paths) == 3, paths
    # This venv has lfx but no Langflow server: the Playground's path cannot be read, and doctor
    # says so rather than guessing; the backend is selected, so the Python Interpreter is covered.
    (playground,) = [line for line in paths if "Playground" in line]
    assert "cannot tell" in playground and "langflow is not installed" in playground, playground
    assert any("still runs in a guest" in line for line in paths), paths
    # Without the backend, doctor suggests it for those paths, and checks only the executor.
    bare = run_doctor(env | {"LANGFLOW_SANDBOX_BACKEND": "none"})
    assert bare.returncode == 0, bare.stdout
    assert "Checked: executor (LANGFLOW_EXECUTOR_KIND=createos)\n" in bare.stdout, bare.stdout
    assert "backend (LANGFLOW_SANDBOX_BACKEND=none selects another backend" in bare.stdout, bare.stdout
    bare_paths = _section(bare.stdout, "Whole-flow executor: which Langflow paths reach it")
    suggestion = [line for line in bare_paths if "LANGFLOW_SANDBOX_BACKEND=createos" in line]
    assert suggestion and suggestion[0].startswith("  [warn   ]"), bare.stdout
    assert clean_fake.stats()["created"] == 0


def test_doctor_reports_the_caps_wait_and_retry_every_surface_shares(clean_fake: Fake) -> None:
    unset = _section(run_doctor(backend_env(clean_fake)).stdout, "Every surface: admission and control-plane retry")
    assert any("no cap (CREATEOS_MAX_LIVE_GUESTS unset)" in line for line in unset), unset
    assert any("retried for 30 s per call" in line for line in unset), unset
    shared_settings = {
        "CREATEOS_MAX_LIVE_GUESTS": "16",
        "CREATEOS_MAX_LIVE_GUESTS_PER_FLOW": "2",
        "CREATEOS_ADMISSION_WAIT_SECONDS": "5",
        "CREATEOS_CONTROL_PLANE_RETRY_SECONDS": "90",
    }
    env = backend_env(clean_fake) | shared_settings
    proc = run_doctor(env)
    assert proc.returncode == 0, (proc.stdout, proc.stderr[-2000:])
    shared = _section(proc.stdout, "Every surface: admission and control-plane retry")
    assert any("at most 16 (CREATEOS_MAX_LIVE_GUESTS=16)" in line for line in shared), shared
    assert any("at most 2 (CREATEOS_MAX_LIVE_GUESTS_PER_FLOW=2)" in line for line in shared), shared
    assert any("waits in line up to 5 s" in line for line in shared), shared
    assert any("retried for 90 s per call" in line for line in shared), shared
    # A bad cap refuses every surface's runs: doctor fails and names it.
    bad = run_doctor(env | {"CREATEOS_MAX_LIVE_GUESTS_PER_FLOW": "0"})
    assert bad.returncode == 1, bad.stdout
    refused = [line for line in _section(bad.stdout, "Every surface: admission and control-plane retry") if line.startswith("  [refused]")]
    assert len(refused) == 1 and "CREATEOS_MAX_LIVE_GUESTS_PER_FLOW" in refused[0], bad.stdout
    assert clean_fake.stats()["created"] == 0


def test_a_bad_executor_setting_fails_doctor_only_where_the_executor_is_selected(clean_fake: Fake) -> None:
    bad = {"CREATEOS_EXECUTOR_TIMEOUT_SECONDS": "0", "CREATEOS_EXECUTOR_INSTALL_LFX": "true"}
    selected = run_doctor(backend_env(clean_fake, LANGFLOW_EXECUTOR_KIND="createos", **bad))
    assert selected.returncode == 1, selected.stdout
    refusals = [line for line in selected.stdout.splitlines() if line.startswith("  [refused]")]
    assert len(refusals) == 1 and "CREATEOS_EXECUTOR_TIMEOUT_SECONDS" in refusals[0], selected.stdout
    assert selected.stdout.endswith("backend: ready; executor: refused\n"), selected.stdout
    other = run_doctor(backend_env(clean_fake, **bad))
    assert other.returncode == 0, other.stdout
    assert "executor (LANGFLOW_EXECUTOR_KIND is unset: lfx runs flows in-process)" in other.stdout, other.stdout
    assert "CREATEOS_EXECUTOR_TIMEOUT_SECONDS" not in other.stdout, other.stdout


def test_the_playground_statement_follows_the_installed_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The answer is read from the code, not a version table: a build driver that hands the run
    to lfx's coordinator reads as covered, one that builds vertices itself as not."""
    from langflow_sandbox_createos import reach

    def playground(body: str | bytes) -> reach.Route:
        root = tmp_path / f"v{len(list(tmp_path.iterdir()))}"
        (root / "langflow" / "api").mkdir(parents=True)
        (root / "langflow" / "__init__.py").write_text("")
        build = root / "langflow" / "api" / "build.py"
        if isinstance(body, bytes):
            build.write_bytes(body)
        else:
            build.write_text(body)
        monkeypatch.syspath_prepend(str(root))
        (route,) = [r for r in reach.routes() if r.name == reach.PLAYGROUND]
        return route

    in_process = "async def _generate_flow_events(graph):\n    await graph.build_vertex('a')\n"
    assert playground(in_process).reaches is False
    through = (
        "async def _generate_flow_events(graph):\n"
        "    from lfx.execution import aget_default_coordinator\n"
        "    return await (await aget_default_coordinator()).run_to_completion(graph, inputs=[])\n"
    )
    assert playground(through).reaches is True
    assert playground("def other():\n    pass\n").reaches is None
    # A file that cannot be read as source is not known either, never covered, and no crash.
    unreadable = playground(b"async def _generate_flow_events(graph):\n    '\xff'\n")
    assert unreadable.reaches is None and "could not be" in unreadable.evidence, unreadable


def test_the_paths_report_follows_the_executor_s_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``LANGFLOW_EXECUTOR_KIND=opensandbox`` the executor is this package's too: no "no
    flow run reaches it", and the uncovered path's advice names the OpenSandbox backend."""
    from langflow_sandbox_createos import reach

    found = [
        reach.Route(name="Graph.arun", reaches=True, evidence="x.py:a"),
        reach.Route(name=reach.PLAYGROUND, reaches=False, evidence="y.py:b"),
    ]
    for name in ("LANGFLOW_SANDBOX_BACKEND", "LANGFLOW_SANDBOX_BACKEND_PLUGINS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LANGFLOW_EXECUTOR_KIND", "opensandbox")
    text = "\n".join(t for _, t in reach.findings(found))
    assert "no flow run reaches" not in text, text
    assert "LANGFLOW_EXECUTOR_KIND=opensandbox does not sandbox it" in text, text
    assert "LANGFLOW_SANDBOX_BACKEND=opensandbox" in text, text
    assert reach.first_run_message(found)[1].startswith("opensandbox executor:")
    monkeypatch.setenv("LANGFLOW_SANDBOX_BACKEND_PLUGINS", "opensandbox")
    monkeypatch.setenv("LANGFLOW_SANDBOX_BACKEND", "opensandbox")
    assert "(the sandbox backend is selected)" in "\n".join(t for _, t in reach.findings(found))
    monkeypatch.setenv("LANGFLOW_EXECUTOR_KIND", "in-process")
    text = "\n".join(t for _, t in reach.findings(found))
    assert "no flow run reaches this executor; set LANGFLOW_EXECUTOR_KIND=createos" in text, text


# The flows of the demo and the README's surfaces: one per surface.
PLAIN_RUN_FLOWS = ("pyrepl_flow.json", "component_flow.json", "shout_flow.json")


def test_plain_lfx_run_passes_lfx_s_dependency_preflight() -> None:
    """`lfx run` without --no-check-dependencies: lfx's preflight finds nothing missing for any
    surface's flow once the wheel is installed (the Python Interpreter's code imports
    langchain-experimental, which the wheel depends on for that reason)."""
    import json

    from lfx.utils.flow_requirements import find_missing_dependencies

    assert any(req.replace(" ", "").startswith("langchain-experimental") for req in distribution(DIST).requires or ())
    for name in PLAIN_RUN_FLOWS:
        flow = json.loads((Path(__file__).parent / "flows" / name).read_text())
        assert find_missing_dependencies({"data": flow["data"]}) == [], name
