"""The docs check (scripts/check_docs.py): nothing an operator can set goes undocumented.

It proves two things. The repository passes: every setting the sources read appears in the docs
set, every relative link and anchor in it resolves, and the README is short and has its
Contents. And the check can fail: a tree with a dead link, a dead anchor and an undocumented
variable is refused, with each of them named.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import check_docs
import pytest
from conftest import ROOT

SCRIPT = ROOT / "scripts" / "check_docs.py"


def run_check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def write(root: Path, path: str, text: str) -> None:
    file = root / path
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(text)


def test_the_repository_passes() -> None:
    run = run_check()
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("docs ok:"), run.stdout
    assert len(run.stdout.strip().splitlines()) == 1, run.stdout


def test_a_dead_link_and_an_undocumented_variable_fail_by_name(tmp_path: Path) -> None:
    write(
        tmp_path,
        "README.md",
        "# demo\n\n## Contents\n\n- [Setup](docs/setup.md#installing)\n- [Gone](docs/missing.md)\n\n"
        "Set `CREATEOS_DOCUMENTED_SETTING`.\n",
    )
    write(tmp_path, "docs/setup.md", "# Setup\n\n## Install\n\nSee the [README](../README.md#contents).\n")
    write(
        tmp_path,
        "crates/demo/src/lib.rs",
        'const A: &str = "CREATEOS_DOCUMENTED_SETTING";\nconst B: &str = "CREATEOS_UNDOCUMENTED_SETTING";\n',
    )
    run = run_check("--root", str(tmp_path))
    assert run.returncode == 1, run.stdout + run.stderr
    assert "CREATEOS_UNDOCUMENTED_SETTING" in run.stderr, run.stderr
    assert "CREATEOS_DOCUMENTED_SETTING " not in run.stderr, run.stderr
    assert "docs/missing.md does not exist" in run.stderr, run.stderr
    assert "#installing" in run.stderr, run.stderr  # the heading is "Install"
    assert "#contents" not in run.stderr, run.stderr  # that one resolves


def test_a_long_readme_without_contents_fails(tmp_path: Path) -> None:
    write(tmp_path, "README.md", "# demo\n" + "line\n" * check_docs.README_MAX_LINES)
    run = run_check("--root", str(tmp_path))
    assert run.returncode == 1, run.stdout + run.stderr
    assert f"more than {check_docs.README_MAX_LINES}" in run.stderr, run.stderr
    assert "no '## Contents' section" in run.stderr, run.stderr


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("What one user's run can see of another's", "what-one-users-run-can-see-of-anothers"),
        ("Linking: zig", "linking-zig"),
        ("The `lfx run` flows", "the-lfx-run-flows"),
        ("Egress gateway (domain allowlists)", "egress-gateway-domain-allowlists"),
        ("CI_WHEEL_TARGETS and [links](x.md)", "ci_wheel_targets-and-links"),
    ],
)
def test_anchors_follow_githubs_rules(heading: str, anchor: str) -> None:
    assert check_docs.github_slug(heading) == anchor


def test_a_repeated_heading_gets_a_number() -> None:
    assert check_docs.anchors("## Warm pool\n\ntext\n\n## Warm pool\n") == {"warm-pool", "warm-pool-1"}
