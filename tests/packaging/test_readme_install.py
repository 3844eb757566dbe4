"""The README's install commands are ones CI runs or checks (scripts/readme_install.py).

The wheel line is run by ``scripts/test`` itself, in a fresh virtual environment, after it built
the same wheel. What is checked here, without a build: the build line's options are ones
``scripts/build-wheels`` accepts, for the target ``scripts/test`` builds; the source line names
the package's folder; ``scripts/test`` runs the README's wheel line; and the reader refuses a
block it does not understand.
"""

from __future__ import annotations

import fnmatch
import subprocess
import tomllib

import pytest
import readme_install
from conftest import ROOT

README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_build_line_is_one_build_wheels_accepts_for_the_ci_target() -> None:
    build = readme_install.commands(README)["build"].split()
    # --help ends the option parsing with status 0; an unknown option exits 2 before it.
    parsed = subprocess.run(["bash", str(ROOT / build[0]), *build[1:], "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert parsed.returncode == 0, parsed.stderr
    target = build[build.index("--only") + 1]
    script = (ROOT / "scripts" / "test").read_text(encoding="utf-8")
    assert f"CI_WHEEL_TARGETS:-{target}" in script, "scripts/test builds another target than the README's"
    assert "scripts/build-wheels --dev" in script


def test_the_wheel_line_installs_what_ci_builds_and_ci_runs_it() -> None:
    wheel = readme_install.commands(README)["wheel"]
    # What maturin names the manylinux2014 wheel: both of its platform tags, 2014's first.
    built = "dist/langflow_sandbox_createos-0.3.0-cp310-abi3-manylinux2014_x86_64.manylinux_2_17_x86_64.whl"
    pattern = wheel.split()[-1]
    assert fnmatch.fnmatchcase(built, pattern), (pattern, built)
    script = (ROOT / "scripts" / "test").read_text(encoding="utf-8")
    assert "scripts/readme_install.py wheel" in script


def test_the_source_line_names_the_package() -> None:
    folder = readme_install.commands(README)["source"].split()[2]
    pyproject = tomllib.loads((ROOT / folder / "pyproject.toml").read_text(encoding="utf-8"))
    assert pyproject["project"]["name"] == "langflow-sandbox-createos"
    # The source build's backend first checks for Rust (tests/packaging/test_build_backend.py).
    assert pyproject["build-system"]["build-backend"] == "lfsc_build"


@pytest.mark.parametrize(
    ("block", "why"),
    [
        ("## Install\n\n```bash\npip install langflow-sandbox-createos\n```\n", "does not know"),
        ("## Install\n\n```bash\nscripts/build-wheels\npip install ./crates/py-bindings\n```\n", "lacks the wheel"),
        ("## Other\n", "no '## Install'"),
    ],
)
def test_a_block_it_does_not_understand_is_refused(block: str, why: str) -> None:
    with pytest.raises(SystemExit, match=why):
        readme_install.commands(block)
