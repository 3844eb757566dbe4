"""`doctor` as an operator runs it, one surface or one bad setting at a time, against the fake.

Each case runs `python -m langflow_sandbox_createos doctor --json` as a subprocess in the
environment an operator would set; the JSON carries the report exactly as plain `doctor` prints
it (`report`), and a few cases also run without `--json` to hold that to its word. The cases run
a few at a time (doctor mostly waits for lfx's import and for bounded network checks), and each
is one parametrized test.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pytest

from conftest import E2E, FAKE_KEY, Fake, backend_env, free_port, make_template
from conftest import OS_KEY, OsFake

#: lfx's switches and the egress opt-in of the backend (conftest's backend_env sets them all).
BACKEND = ("LANGFLOW_SANDBOX_BACKEND_PLUGINS", "LANGFLOW_SANDBOX_BACKEND")
ACCEPT = "LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS"
#: A template the way `template build` names its own (`lf-t-`), and one it did not build.
OURS = "lf-t-doctor-matrix"
FOREIGN = "someone-elses-image"
#: Placeholders a case's environment may hold, replaced when the matrix starts.
UNREACHABLE = "{unreachable}"
OSFAKE = "{osfake}"
STORE = "{store}"


@dataclass(frozen=True)
class Case:
    """One doctor run: which surfaces the environment enables, what is set on top."""

    name: str
    env: dict[str, str | None]
    exit_code: int
    checked: tuple[str, ...]
    #: Settings that must be named by a problem (a `[refused]` line and a JSON finding).
    named: tuple[str, ...] = ()
    #: Text the report must contain / must not contain.
    shows: tuple[str, ...] = ()
    hides: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    #: Also run without `--json`: stdout must be the JSON's `report`.
    plain: bool = False


def backend_only(**extra: str | None) -> dict[str, str | None]:
    return {"LANGFLOW_EXECUTOR_KIND": None, **extra}


def executor_only(**extra: str | None) -> dict[str, str | None]:
    base: dict[str, str | None] = {name: None for name in BACKEND}
    base.update({ACCEPT: None, "LANGFLOW_EXECUTOR_KIND": "createos", "CREATEOS_EXECUTOR_ROOTFS": OURS})
    base.update(extra)
    return base


def nothing_enabled(**extra: str | None) -> dict[str, str | None]:
    base: dict[str, str | None] = {name: None for name in BACKEND}
    base.update(extra)
    return base


def opensandbox_only(**extra: str | None) -> dict[str, str | None]:
    """The OpenSandbox backend as its operator sets it up, pointed at the OpenSandbox fake: no
    CreateOS setting at all."""
    base: dict[str, str | None] = {
        "LANGFLOW_EXECUTOR_KIND": None,
        "CREATEOS_SANDBOX_API_KEY": None,
        "CREATEOS_SANDBOX_BASE_URL": None,
        ACCEPT: None,
        "LANGFLOW_SANDBOX_BACKEND_PLUGINS": "opensandbox",
        "LANGFLOW_SANDBOX_BACKEND": "opensandbox",
        "OPEN_SANDBOX_DOMAIN": OSFAKE,
        "OPEN_SANDBOX_API_KEY": OS_KEY,
        "OPEN_SANDBOX_SERVER_UNREACHABLE": "true",
        "OPEN_SANDBOX_ATTEST_ISOLATION": "hardware-virtualized",
        "OPEN_SANDBOX_RUNTIME_CLASS": "kata-qemu",
    }
    base.update(extra)
    return base


def opensandbox_executor_only(**extra: str | None) -> dict[str, str | None]:
    """The executor on the OpenSandbox fake, as its operator sets it up: no CreateOS setting, no
    backend switch."""
    base = opensandbox_only(LANGFLOW_SANDBOX_BACKEND_PLUGINS=None, LANGFLOW_SANDBOX_BACKEND=None)
    base.update({"LANGFLOW_EXECUTOR_KIND": "opensandbox"})
    base.update(extra)
    return base


CASES = [
    # Each surface alone, as its operator sets it up: no problem.
    Case("backend alone", backend_only(), 0, ("backend",), shows=("s-2vcpu-4gb", "240.0.0.0/4"), plain=True),
    Case("executor alone", executor_only(), 0, ("executor",), shows=(f"template {OURS}",)),
    Case(
        "executor alone, lfx installed per run",
        executor_only(CREATEOS_EXECUTOR_ROOTFS=None, CREATEOS_EXECUTOR_INSTALL_LFX="true"),
        0,
        ("executor",),
    ),
    Case(
        "executor alone, a template doctor cannot see into",
        executor_only(CREATEOS_EXECUTOR_ROOTFS=FOREIGN),
        0,
        ("executor",),
        shows=("cannot tell",),
    ),
    Case("component alone (nothing else enabled)", nothing_enabled(), 0, ("component",)),
    Case(
        "component asked for",
        executor_only(**{ACCEPT: "true"}),
        0,
        ("component",),
        args=("--surface", "component"),
        shows=("s-2vcpu-4gb",),
    ),
    # One bad setting each: exit 1 and the setting named.
    Case(
        "executor on the catalog default image (no lfx)",
        executor_only(CREATEOS_EXECUTOR_ROOTFS=None),
        1,
        ("executor",),
        named=("CREATEOS_EXECUTOR_ROOTFS",),
        shows=("devbox:1",),
    ),
    Case(
        "executor template that does not exist",
        executor_only(CREATEOS_EXECUTOR_ROOTFS="tpl_missing"),
        1,
        ("executor",),
        named=("CREATEOS_EXECUTOR_ROOTFS",),
    ),
    Case(
        "executor shape not in the catalog",
        executor_only(CREATEOS_EXECUTOR_SHAPE="s-nope"),
        1,
        ("executor",),
        named=("CREATEOS_EXECUTOR_SHAPE",),
        shows=("s-4vcpu-8gb",),
    ),
    Case(
        "executor timeout 0 hides nothing else",
        executor_only(CREATEOS_EXECUTOR_TIMEOUT_SECONDS="0", CREATEOS_EXECUTOR_WARM_POOL="2"),
        1,
        ("executor",),
        named=("CREATEOS_EXECUTOR_TIMEOUT_SECONDS",),
        shows=("warm pool: 2 guest(s)", f"template {OURS}", "shape: s-4vcpu-8gb"),
        plain=True,
    ),
    Case(
        "backend trusted but not selected",
        backend_only(LANGFLOW_SANDBOX_BACKEND=None),
        1,
        ("backend",),
        named=("LANGFLOW_SANDBOX_BACKEND",),
    ),
    Case(
        "bad shared cap",
        backend_only(CREATEOS_MAX_LIVE_GUESTS="-1"),
        1,
        ("backend",),
        named=("CREATEOS_MAX_LIVE_GUESTS",),
    ),
    Case(
        "plain http to another machine",
        backend_only(CREATEOS_SANDBOX_BASE_URL="http://cp.example.test"),
        1,
        ("backend",),
        named=("CREATEOS_SANDBOX_BASE_URL",),
        shows=("https",),
        hides=("ClientBuilder", "allow_insecure_http"),
    ),
    Case(
        "lfx timeout not a number",
        backend_only(LANGFLOW_SANDBOX_TIMEOUT_SECONDS="abc"),
        1,
        ("backend",),
        named=("LANGFLOW_SANDBOX_TIMEOUT_SECONDS",),
        shows=("valid integer",),
        hides=("see the log above",),
    ),
    Case(
        "lfx memory negative",
        backend_only(LANGFLOW_SANDBOX_MEMORY_MB="-5"),
        1,
        ("backend",),
        named=("LANGFLOW_SANDBOX_MEMORY_MB",),
        shows=("greater than or equal to 128",),
    ),
    Case(
        "lfx network switch not a boolean",
        backend_only(LANGFLOW_SANDBOX_ALLOW_NETWORK="maybe"),
        1,
        ("backend",),
        named=("LANGFLOW_SANDBOX_ALLOW_NETWORK",),
        shows=("valid boolean",),
    ),
    Case(
        # A run would retry for 120 s: doctor's own check must not wait that long.
        "control plane unreachable",
        backend_only(CREATEOS_SANDBOX_BASE_URL=UNREACHABLE, CREATEOS_CONTROL_PLANE_RETRY_SECONDS="120"),
        1,
        ("backend",),
        named=("CREATEOS_SANDBOX_BASE_URL",),
        shows=(UNREACHABLE,),
    ),
    # The OpenSandbox backend: its own surface, no CreateOS setting needed.
    Case(
        "opensandbox alone",
        opensandbox_only(),
        0,
        ("opensandbox",),
        # Attested without OPEN_SANDBOX_HOST_KERNEL: a warning, not a problem.
        shows=(
            "accepted OPEN_SANDBOX_API_KEY",
            "hardware-virtualized",
            "kata-qemu",
            "not known without creating a sandbox",
            "OPEN_SANDBOX_HOST_KERNEL is unset",
        ),
        hides=("CREATEOS_SANDBOX_API_KEY", OS_KEY),
        plain=True,
    ),
    Case(
        "opensandbox server unreachable",
        opensandbox_only(OPEN_SANDBOX_DOMAIN=UNREACHABLE),
        1,
        ("opensandbox",),
        named=("OPEN_SANDBOX_DOMAIN",),
        shows=(UNREACHABLE,),
    ),
    Case("opensandbox key refused", opensandbox_only(OPEN_SANDBOX_API_KEY="not-the-servers-key"), 1, ("opensandbox",), named=("OPEN_SANDBOX_API_KEY",), hides=("not-the-servers-key",)),
    Case("opensandbox key unset", opensandbox_only(OPEN_SANDBOX_API_KEY=None), 1, ("opensandbox",), named=("OPEN_SANDBOX_API_KEY",)),
    Case(
        "opensandbox bad values, each named",
        opensandbox_only(OPEN_SANDBOX_IDLE_SECONDS="soon", OPEN_SANDBOX_CREATED_BY="-bad-", OPEN_SANDBOX_CPU="abc"),
        1,
        ("opensandbox",),
        named=("OPEN_SANDBOX_IDLE_SECONDS", "OPEN_SANDBOX_CREATED_BY", "OPEN_SANDBOX_CPU"),
    ),
    Case(
        "opensandbox host kernel named: no warning",
        opensandbox_only(OPEN_SANDBOX_HOST_KERNEL="6.1.0-18-amd64"),
        0,
        ("opensandbox",),
        hides=("OPEN_SANDBOX_HOST_KERNEL is unset",),
    ),
    Case(
        "opensandbox isolation not attested: lfx refuses container",
        opensandbox_only(OPEN_SANDBOX_ATTEST_ISOLATION=None),
        1,
        ("opensandbox",),
        named=("OPEN_SANDBOX_ATTEST_ISOLATION",),
        shows=("container",),
    ),
    Case(
        "opensandbox not trusted by lfx",
        opensandbox_only(LANGFLOW_SANDBOX_BACKEND_PLUGINS="createos"),
        1,
        ("opensandbox",),
        named=("LANGFLOW_SANDBOX_BACKEND_PLUGINS",),
    ),
    # The executor on OpenSandbox: its own surface, judged by the executor's own plan.
    Case(
        "opensandbox executor alone",
        opensandbox_executor_only(),
        0,
        ("opensandbox-executor",),
        shows=("accepted OPEN_SANDBOX_API_KEY", "a flow run would go ahead", "hardware-virtualized", "8192Mi"),
        hides=("CREATEOS_SANDBOX_API_KEY", OS_KEY),
        plain=True,
    ),
    Case(
        "opensandbox executor, server unreachable",
        opensandbox_executor_only(OPEN_SANDBOX_DOMAIN=UNREACHABLE),
        1,
        ("opensandbox-executor",),
        named=("OPEN_SANDBOX_DOMAIN",),
        shows=(UNREACHABLE,),
    ),
    Case(
        "opensandbox backend, open egress to a loopback server without the operator's word",
        opensandbox_only(OPEN_SANDBOX_SERVER_UNREACHABLE=None, LANGFLOW_SANDBOX_ALLOW_NETWORK="true"),
        1,
        ("opensandbox",),
        named=("OPEN_SANDBOX_SERVER_UNREACHABLE",),
        shows=("every run is refused", "LANGFLOW_SANDBOX_ALLOW_NETWORK=true"),
    ),
    Case(
        "opensandbox executor, open egress to a loopback server without the operator's word",
        opensandbox_executor_only(OPEN_SANDBOX_SERVER_UNREACHABLE=None),
        1,
        ("opensandbox-executor",),
        named=("OPEN_SANDBOX_SERVER_UNREACHABLE",),
        shows=("every flow run is refused", "CREATEOS_EXECUTOR_EGRESS=none"),
    ),
    Case(
        "opensandbox executor, isolation neither attested nor accepted",
        opensandbox_executor_only(OPEN_SANDBOX_ATTEST_ISOLATION=None, OPEN_SANDBOX_RUNTIME_CLASS=None),
        1,
        ("opensandbox-executor",),
        shows=("OPEN_SANDBOX_ATTEST_ISOLATION", "OPEN_SANDBOX_ALLOW_CONTAINER_ISOLATION"),
    ),
    Case(
        "opensandbox executor, container isolation accepted",
        opensandbox_executor_only(
            OPEN_SANDBOX_ATTEST_ISOLATION=None, OPEN_SANDBOX_RUNTIME_CLASS=None, OPEN_SANDBOX_ALLOW_CONTAINER_ISOLATION="true"
        ),
        0,
        ("opensandbox-executor",),
        shows=("container, accepted by OPEN_SANDBOX_ALLOW_CONTAINER_ISOLATION",),
    ),
    Case(
        "opensandbox executor, a domain allowlist needs no gateway",
        opensandbox_executor_only(CREATEOS_EXECUTOR_ALLOWED_DOMAINS="pypi.org,*.pythonhosted.org"),
        0,
        ("opensandbox-executor",),
        shows=("a flow run would go ahead",),
    ),
    Case(
        "opensandbox executor, an address in the allowlist",
        opensandbox_executor_only(CREATEOS_EXECUTOR_ALLOWED_DOMAINS="pypi.org,10.0.0.0/8"),
        1,
        ("opensandbox-executor",),
        shows=("CREATEOS_EXECUTOR_ALLOWED_DOMAINS", "10.0.0.0/8"),
    ),
    Case(
        "opensandbox executor, a bad executor timeout",
        opensandbox_executor_only(CREATEOS_EXECUTOR_TIMEOUT_SECONDS="0"),
        1,
        ("opensandbox-executor",),
        shows=("CREATEOS_EXECUTOR_TIMEOUT_SECONDS",),
    ),
    Case(
        "admission store does not answer",
        nothing_enabled(CREATEOS_ADMISSION_STORE=STORE, CREATEOS_MAX_LIVE_GUESTS="4"),
        1,
        ("component",),
        named=("CREATEOS_ADMISSION_STORE",),
    ),
]


@dataclass
class Ran:
    """What one case's doctor runs printed."""

    data: subprocess.CompletedProcess[str]
    plain: subprocess.CompletedProcess[str] | None
    seconds: float
    replace: Callable[[str], str] = field(default=lambda s: s)


def _doctor(env: dict[str, str], args: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "langflow_sandbox_createos", "doctor", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=90,
        cwd=E2E,
        check=False,
    )


@pytest.fixture(scope="module")
def matrix(fake: Fake, osfake_server: OsFake) -> dict[str, Ran]:
    """Every case's runs, all started at once; the fakes' guest counts checked afterwards."""
    fake.reset()
    osfake_server.reset()
    make_template(fake, OURS)
    make_template(fake, FOREIGN)
    values = {
        UNREACHABLE: f"http://127.0.0.1:{free_port()}",
        STORE: f"redis://127.0.0.1:{free_port()}/0",
        OSFAKE: osfake_server.url,
    }

    def replace(text: str) -> str:
        for placeholder, value in values.items():
            text = text.replace(placeholder, value)
        return text

    def run(case: Case) -> Ran:
        env = backend_env(fake, **{k: None if v is None else replace(v) for k, v in case.env.items()})
        started = time.monotonic()
        data = _doctor(env, (*case.args, "--json"))
        seconds = time.monotonic() - started
        plain = _doctor(env, case.args) if case.plain else None
        return Ran(data, plain, seconds, replace)

    # A few cases at a time: each run is a Python process that imports lfx (memory, CPU).
    with ThreadPoolExecutor(max_workers=max(2, min(len(CASES), os.cpu_count() or 2))) as pool:
        results = dict(zip([c.name for c in CASES], pool.map(run, CASES)))
    # Doctor never creates a guest, whatever it finds.
    assert fake.stats()["created"] == 0
    assert osfake_server.stats()["created"] == 0
    return results


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_doctor_matrix(case: Case, matrix: dict[str, Ran]) -> None:
    ran = matrix[case.name]
    err = ran.data.stderr
    assert ran.data.returncode == case.exit_code, f"stdout:\n{ran.data.stdout[-4000:]}\nstderr:\n{err[-2000:]}"
    # The report as JSON, for deployment scripts: stable keys, the same exit code.
    data: dict[str, Any] = json.loads(ran.data.stdout)
    assert set(data) >= {"checked", "skipped", "findings", "problems", "surfaces", "verdict", "exit_code", "report"}
    assert data["exit_code"] == case.exit_code
    out = data["report"]
    context = f"report:\n{out}\nstderr:\n{err[-2000:]}"
    lines = out.splitlines()
    # One verdict, last, counting every problem; no line twice.
    assert lines[-1].startswith("Result: ") and data["verdict"] == lines[-1], context
    assert sum(line.startswith("Result: ") for line in lines) == 1, context
    repeated = [line for line, n in Counter(lines).items() if n > 1]
    assert not repeated, (repeated, context)
    problems = [line for line in lines if line.startswith("  [refused]")]
    assert data["problems"] == len(problems), context
    if case.exit_code == 0:
        assert not problems and lines[-1].startswith("Result: no problems"), context
    else:
        word = "problem" if len(problems) == 1 else "problems"
        assert lines[-1].startswith(f"Result: {len(problems)} {word} ("), context
    state = "ready" if case.exit_code == 0 else "refused"
    assert data["surfaces"] == {surface: state for surface in case.checked}, context
    assert [c["surface"] for c in data["checked"]] == list(case.checked), context
    assert all(s["reason"] for s in data["checked"] + data["skipped"]), data
    assert lines[1] == f"Checked: {case.checked[0]} ({data['checked'][0]['reason']})", context
    # Each bad setting is named by a problem, in the report and in the findings.
    refused = [f for f in data["findings"] if f["level"] == "refused"]
    assert all(set(f) == {"area", "section", "level", "setting", "message"} for f in data["findings"])
    for setting in case.named:
        assert any(setting in line for line in problems), (setting, context)
        assert any(f["setting"] == setting or setting in f["message"] for f in refused), (setting, refused)
    for text in case.shows:
        assert ran.replace(text) in out, (text, context)
    for text in case.hides:
        assert text not in out + err, (text, context)
    # Progress goes to stderr, never into the report; the key goes nowhere.
    assert "doctor: " in err and not any(line.startswith("doctor: ") for line in lines), context
    assert FAKE_KEY not in ran.data.stdout + err
    assert OS_KEY not in ran.data.stdout + err
    # Bounded waits: an unreachable control plane or store fails within seconds, not after a
    # run's retry window (120 s in the unreachable case).
    assert ran.seconds < 60, ran.seconds
    if ran.plain is not None:
        # Plain `doctor` prints that report (the same but for measured times), with the same
        # exit code.
        assert ran.plain.returncode == case.exit_code, ran.plain.stderr[-2000:]
        assert _untimed(ran.plain.stdout) == _untimed(out + "\n"), (ran.plain.stdout, out)


def _untimed(report: str) -> str:
    """``report`` with its measured durations (``answered in 6 ms``) blanked."""
    return re.sub(r"\d+(\.\d+)? ms\b", "N ms", report)
