"""What `pip install` delivers (metadata, stubs, abi3 tag) and the operator's doctor command."""

from __future__ import annotations

from importlib.metadata import distribution, entry_points

from conftest import Fake, backend_env, run_doctor

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
