"""The public exceptions: where they live, what they extend, and what each call raises.

Callers catch lfx's ``SandboxUnavailableError`` / ``SandboxExecutionError``; the package's own
classes in ``langflow_sandbox_createos.exceptions`` must be instances of those when they come
out of lfx's real entry point (``run_code_in_sandbox``), so lfx and Langflow keep failing
closed on a refusal.
"""

from __future__ import annotations

import json

import pytest

from conftest import Fake, backend_env, run_python

PUBLIC = "langflow_sandbox_createos.exceptions"
NAMES = ("SandboxError", "SandboxRefusedError", "SandboxFailedError")
#: The 0.2.0 names, kept as the same class objects.
ALIASES = {
    "CreateOSError": "SandboxError",
    "CreateOSUnavailableError": "SandboxRefusedError",
    "CreateOSExecutionError": "SandboxFailedError",
}


def test_classes_live_in_the_public_module_and_extend_lfx_errors() -> None:
    from lfx.utils.sandbox.base import SandboxExecutionError, SandboxUnavailableError

    from langflow_sandbox_createos import exceptions

    assert sorted(exceptions.__all__) == sorted([*NAMES, *ALIASES])
    for name in NAMES:
        cls = getattr(exceptions, name)
        assert cls.__module__ == PUBLIC, (name, cls.__module__)
        assert cls.__name__ == name
        assert issubclass(cls, SandboxExecutionError), name
    assert issubclass(exceptions.SandboxRefusedError, SandboxUnavailableError)
    assert issubclass(exceptions.SandboxRefusedError, exceptions.SandboxError)
    assert issubclass(exceptions.SandboxFailedError, exceptions.SandboxError)
    # An infrastructure failure must not read as "configured but unusable".
    assert not issubclass(exceptions.SandboxFailedError, SandboxUnavailableError)


def test_the_0_2_0_names_are_the_same_classes() -> None:
    import langflow_sandbox_createos as pkg
    from langflow_sandbox_createos import exceptions

    for old, new in ALIASES.items():
        assert getattr(exceptions, old) is getattr(exceptions, new), old
        assert getattr(pkg, old) is getattr(pkg, new), old
    # 0.2.0 code that catches the old names catches what is raised now.
    try:
        raise exceptions.SandboxRefusedError("refused")
    except exceptions.CreateOSUnavailableError as exc:
        assert type(exc).__name__ == "SandboxRefusedError"


def test_the_extension_no_longer_defines_exception_classes() -> None:
    from langflow_sandbox_createos import _native

    for old in ("CreateOSError", "Unavailable", "ExecutionFailed"):
        assert not hasattr(_native, old), old


LAZY_SCRIPT = """
import sys
import langflow_sandbox_createos as pkg
# Of lfx, only the module of its env-fallback deny-list (env_fallback extends it on import).
lfx_loaded = sorted(m for m in sys.modules if m == "lfx" or m.startswith("lfx."))
assert lfx_loaded == ["lfx", "lfx.utils", "lfx.utils.env_var_security"], lfx_loaded
assert "langflow_sandbox_createos.exceptions" not in sys.modules
assert "langflow_sandbox_createos._native" not in sys.modules
cls = pkg.SandboxRefusedError
from langflow_sandbox_createos.exceptions import CreateOSUnavailableError, SandboxRefusedError
assert cls is SandboxRefusedError is CreateOSUnavailableError is pkg.CreateOSUnavailableError
assert "langflow_sandbox_createos._native" not in sys.modules, "the exceptions loaded the extension"
assert set(pkg.__all__) >= {"CreateOSError", "CreateOSUnavailableError", "CreateOSExecutionError",
                            "SandboxError", "SandboxRefusedError", "SandboxFailedError"}
print("ok")
"""


def test_package_root_resolves_the_exceptions_lazily(clean_fake: Fake) -> None:
    proc = run_python(LAZY_SCRIPT, backend_env(clean_fake))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "ok"


# Through lfx's own dispatcher, exactly as the Python Interpreter component calls it: lfx
# resolves the backend from LANGFLOW_SANDBOX_BACKEND through its trust-gated entry points,
# checks the policy, then runs. What comes out is reported as one JSON line.
ENTRY_POINT_SCRIPT = """
import json
from lfx.utils.sandbox import run_code_in_sandbox
from lfx.utils.sandbox.base import SandboxExecutionError, SandboxUnavailableError
try:
    run_code_in_sandbox("print(1)")
except BaseException as exc:
    cls = type(exc)
    print(json.dumps({
        "module": cls.__module__,
        "name": cls.__name__,
        "unavailable": isinstance(exc, SandboxUnavailableError),
        "execution": isinstance(exc, SandboxExecutionError),
        "message": str(exc),
        "cause": repr(exc.__cause__),
    }))
else:
    print(json.dumps({"name": None}))
"""


def _through_lfx(env: dict[str, str]) -> dict[str, object]:
    proc = run_python(ENTRY_POINT_SCRIPT, env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_refusal_through_lfx_is_a_public_unavailable_error(clean_fake: Fake) -> None:
    raised = _through_lfx(backend_env(clean_fake, CREATEOS_SANDBOX_API_KEY=None))
    assert raised["module"] == PUBLIC, raised
    assert raised["name"] == "SandboxRefusedError", raised
    assert raised["unavailable"] is True and raised["execution"] is True, raised
    assert "CREATEOS_SANDBOX_API_KEY" in str(raised["message"]), raised
    assert clean_fake.stats()["created"] == 0


def test_an_infrastructure_failure_through_lfx_is_a_public_execution_error(clean_fake: Fake) -> None:
    clean_fake.set_faults("create=503")
    # The create fails for good: give up after 3 s of retries instead of the default 30.
    env = backend_env(clean_fake, CREATEOS_CONTROL_PLANE_RETRY_SECONDS="3")
    raised = _through_lfx(env)
    assert raised["module"] == PUBLIC, raised
    assert raised["name"] == "SandboxFailedError", raised
    assert raised["execution"] is True and raised["unavailable"] is False, raised
    assert env["CREATEOS_SANDBOX_API_KEY"] not in str(raised["message"])
    # Raised by the extension itself, not re-wrapped: no stray chained native exception.
    assert raised["cause"] == "None", raised


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        pytest.param({"CREATEOS_SANDBOX_API_KEY": None}, "SandboxRefusedError", id="no-key"),
        pytest.param({"CREATEOS_SANDBOX_API_KEY": "wrong-key-7"}, "SandboxRefusedError", id="rejected-key"),
        # Refused before any request is made (and loopback anyway).
        pytest.param({"CREATEOS_SANDBOX_BASE_URL": "ftp://127.0.0.1:1/"}, "SandboxRefusedError", id="bad-endpoint"),
    ],
)
def test_reap_raises_the_public_classes(clean_fake: Fake, overrides: dict[str, str | None], expected: str) -> None:
    script = (
        "from langflow_sandbox_createos import _native\n"
        "try:\n    _native.reap(True)\n"
        "except BaseException as exc:\n    print(type(exc).__module__, type(exc).__name__)\n"
    )
    proc = run_python(script, backend_env(clean_fake, **overrides))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == [PUBLIC, expected]
    assert "wrong-key-7" not in proc.stdout + proc.stderr


def test_reap_raises_an_execution_error_when_the_listing_keeps_failing(clean_fake: Fake) -> None:
    clean_fake.set_faults("list=503")
    script = (
        "from langflow_sandbox_createos import _native\n"
        "try:\n    _native.reap(True)\n"
        "except BaseException as exc:\n    print(type(exc).__module__, type(exc).__name__)\n"
    )
    # The listing fails for good: give up after 3 s of retries instead of the default 30.
    proc = run_python(script, backend_env(clean_fake, CREATEOS_CONTROL_PLANE_RETRY_SECONDS="3"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == [PUBLIC, "SandboxFailedError"]


def test_doctor_reports_an_unreadable_setting_instead_of_raising(clean_fake: Fake) -> None:
    # lfx's settings are a dataclass; one whose value the backend cannot honour (a negative
    # timeout) is a problem line in the report, and the trust gate is still checked.
    script = (
        "from lfx.utils.sandbox.base import _SandboxSettings\n"
        "from langflow_sandbox_createos import _native\n"
        "code, report, _ = _native.doctor(_SandboxSettings(timeout_seconds=-5), [], ['backend'], [], [])\n"
        "print(code)\nprint(report)\n"
        "try:\n    _native.doctor(None, [], ['nope'], [], [])\n"
        "except ValueError as exc:\n    print('ValueError:', exc)\n"
    )
    proc = run_python(script, backend_env(clean_fake))
    assert proc.returncode == 0, proc.stderr[-3000:]
    first, report = proc.stdout.split("\n", 1)
    assert first == "1", proc.stdout
    assert "[refused] LANGFLOW_SANDBOX_TIMEOUT_SECONDS" in report, report
    assert "lfx trusts the plugin" in report, report
    # An unknown surface is the caller's mistake, said as such.
    assert 'ValueError: unknown surface "nope"' in report, report
    assert clean_fake.stats()["created"] == 0


def test_without_the_exceptions_module_the_message_still_arrives(clean_fake: Fake) -> None:
    # lfx missing or broken: the public classes cannot be imported, and the refusal must still
    # come out, with its message, as a RuntimeError whose cause says why.
    script = (
        "import sys\n"
        "sys.modules['langflow_sandbox_createos.exceptions'] = None  # any import of it fails\n"
        "from langflow_sandbox_createos import _native\n"
        "try:\n    _native.reap(True)\n"
        "except BaseException as exc:\n"
        "    print(type(exc).__name__, type(exc.__cause__).__name__)\n    print(exc)\n"
    )
    proc = run_python(script, backend_env(clean_fake, CREATEOS_SANDBOX_API_KEY=None))
    assert proc.returncode == 0, proc.stderr[-3000:]
    kinds, message = proc.stdout.split("\n", 1)
    assert kinds.split() == ["RuntimeError", "ModuleNotFoundError"], proc.stdout
    assert "CREATEOS_SANDBOX_API_KEY" in message, proc.stdout
