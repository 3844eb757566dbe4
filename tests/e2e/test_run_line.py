"""Each run says, at `lfx run -v`, which surface ran it, in which guest, and where the time went.

One INFO line per run, the same for every surface (sandbox-core's ``timings::run_line``):
``createos <surface> run in guest <name> (id <id>): create_ms=… run_ms=… destroy_ms=…``. It goes
through the log bridge to the ``langflow_sandbox_createos`` logger, which ``lfx run`` does not
print; the package then prints it on stderr when ``lfx run`` was given ``-v``, and only then.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from conftest import E2E, Fake, backend_env, venv_bin

LINE = re.compile(
    r"createos (?P<surface>backend|component|executor) run in guest (?P<guest>lf-\S+) \(id (?P<id>\S+)\): "
    r"create_ms=(?P<create>\d+) run_ms=(?P<run>\d+) destroy_ms=(?P<destroy>\d+|background)$"
)

SURFACES = {
    # The Python Interpreter flow through the sandbox backend.
    "backend": ("pyrepl_flow.json", "print(5)", {}),
    # The CreateOS Sandbox node, with the backend off.
    "component": ("component_text_flow.json", "print(6)", {"LANGFLOW_SANDBOX_BACKEND": None, "LANGFLOW_SANDBOX_BACKEND_PLUGINS": None}),
    # The whole flow in one guest (the fake's guest python3 is this venv's, which has lfx).
    "executor": (
        "shout_flow.json",
        "hi",
        {"LANGFLOW_SANDBOX_BACKEND": None, "LANGFLOW_SANDBOX_BACKEND_PLUGINS": None, "LANGFLOW_EXECUTOR_KIND": "createos"},
    ),
}


def lines(fake: Fake, surface: str, *verbosity: str) -> list[str]:
    flow, message, overrides = SURFACES[surface]
    proc = subprocess.run(
        [venv_bin("lfx"), "run", *verbosity, str(E2E / "flows" / flow), message],
        capture_output=True,
        text=True,
        env=backend_env(fake, **overrides),
        timeout=240,
        cwd=E2E,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [line for line in proc.stderr.splitlines() if " run in guest " in line]


@pytest.mark.parametrize("surface", list(SURFACES))
def test_each_run_logs_its_surface_guest_and_timings_at_v(clean_fake: Fake, surface: str) -> None:
    (line,) = lines(clean_fake, surface, "-v")
    assert line.startswith("[info    ] langflow_sandbox_createos: "), line
    found = LINE.search(line)
    assert found is not None, line
    assert found["surface"] == surface
    # One guest for the run, the one the line names (a fresh one per surface here).
    assert clean_fake.wait_settled()["created"] == 1
    # Quiet without -v: lfx run's output stays what it was.
    assert lines(clean_fake, surface) == []
