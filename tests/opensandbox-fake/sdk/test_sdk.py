"""The OpenSandbox fake checked against the official ``opensandbox`` 1.1.1 Python SDK.

Each test starts the ``opensandbox-fake`` binary on a free loopback port and drives it with the
SDK's synchronous client, configured only through the environment variables the SDK reads
(``OPEN_SANDBOX_DOMAIN``, ``OPEN_SANDBOX_API_KEY``). The binary is found through
``OPENSANDBOX_FAKE_BIN`` or the workspace's ``target/debug``; see README.md beside this file.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import pytest

opensandbox = pytest.importorskip(
    "opensandbox", reason="the opensandbox SDK is not installed (see README.md)"
)

from opensandbox import SandboxManagerSync, SandboxSync  # noqa: E402
from opensandbox.config.connection_sync import ConnectionConfigSync  # noqa: E402
from opensandbox.exceptions import SandboxApiException, SandboxException  # noqa: E402
from opensandbox.models.execd import RunCommandOpts  # noqa: E402
from opensandbox.models.sandboxes import (  # noqa: E402
    NetworkPolicy,
    NetworkRule,
    SandboxFilter,
)

API_KEY = "sdk-test-key"
REPO = Path(__file__).resolve().parents[3]
IMAGE = "python:3.12-slim"
ENTRYPOINT = ["tail", "-f", "/dev/null"]
RESOURCES = {"cpu": "500m", "memory": "512Mi"}


def _binary() -> Path:
    """The fake's binary: ``OPENSANDBOX_FAKE_BIN`` or the workspace's debug build."""
    explicit = os.environ.get("OPENSANDBOX_FAKE_BIN")
    path = Path(explicit) if explicit else REPO / "target" / "debug" / "opensandbox-fake"
    if not path.is_file():
        pytest.skip(
            f"{path} does not exist: run `cargo build -p opensandbox-fake` or set "
            "OPENSANDBOX_FAKE_BIN"
        )
    return path


class Fake:
    """A running ``opensandbox-fake`` child process and a raw HTTP client for it."""

    def __init__(self, *args: str) -> None:
        """Starts the binary with ``args`` and reads its ``listening on`` line."""
        self.proc = subprocess.Popen(
            [str(_binary()), "--port", "0", "--api-key", API_KEY, "--ping-ms", "500", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert self.proc.stdout is not None
        first = self.proc.stdout.readline().strip()
        assert first.startswith("listening on http://127.0.0.1:"), first
        self.url = first.removeprefix("listening on ")
        self.domain = self.url.removeprefix("http://")

    def stats(self) -> dict:
        """``GET /_fake/stats``."""
        return httpx.get(f"{self.url}/_fake/stats").json()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def fake_args() -> list[str]:
    """Extra command-line flags of the fake (tests override this fixture)."""
    return []


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, fake_args: list[str]) -> Iterator[Fake]:
    """A fake server, with the SDK's environment pointing at it."""
    f = Fake(*fake_args)
    monkeypatch.setenv("OPEN_SANDBOX_DOMAIN", f.domain)
    monkeypatch.setenv("OPEN_SANDBOX_API_KEY", API_KEY)
    monkeypatch.setenv("OPENSANDBOX_DISABLE_METRICS", "1")
    try:
        yield f
    finally:
        f.stop()


def _create(**kwargs) -> SandboxSync:
    """Creates a sandbox with the SDK's defaults plus ``kwargs``."""
    args = dict(
        entrypoint=ENTRYPOINT,
        resource=RESOURCES,
        timeout=timedelta(minutes=10),
        ready_timeout=timedelta(seconds=20),
    )
    args.update(kwargs)
    return SandboxSync.create(IMAGE, **args)


def _stdout(execution) -> str:
    """The SDK's own joining of the stdout frames."""
    return "\n".join(m.text for m in execution.logs.stdout)


def test_create_waits_ready_and_runs_a_command(fake: Fake) -> None:
    """Create (the SDK polls the endpoints and execd's /ping), then a command's output and
    exit code as the SDK normalises the bare-JSON frames; the guest knows its own id."""
    sb = _create(env={"GREETING": "hello"}, metadata={"created-by": "sdk-test"})
    try:
        info = sb.get_info()
        assert info.status.state == "Running"
        assert info.metadata == {"created-by": "sdk-test"}
        assert info.image is not None and info.image.image == IMAGE
        ex = sb.commands.run('echo "$GREETING"; echo "$OPENSANDBOX_ID"; echo oops >&2')
        assert ex.exit_code == 0, ex
        assert ex.error is None
        assert [m.text for m in ex.logs.stdout] == ["hello", sb.id]
        assert [m.text for m in ex.logs.stderr] == ["oops"]
        assert ex.text == f"hello\n{sb.id}"
        assert ex.id, "the init frame carries the command id"
        assert ex.complete is not None
        status = sb.commands.get_command_status(ex.id)
        assert status.running is False and status.exit_code == 0
    finally:
        sb.kill()
        sb.close()
    assert fake.stats()["live"] == 0


def test_failing_command_exit_code_and_options(fake: Fake) -> None:
    """A non-zero exit arrives as an ``error`` frame the SDK turns into ``exit_code``;
    ``working_directory``, ``envs`` and ``timeout`` are honoured."""
    sb = _create()
    try:
        ex = sb.commands.run("echo before; exit 7")
        assert ex.exit_code == 7
        assert ex.error is not None and ex.error.name == "CommandExecError"
        assert ex.error.value == "7"
        assert _stdout(ex) == "before"
        ex = sb.commands.run(
            'pwd; echo "$ONE"',
            opts=RunCommandOpts(working_directory="/tmp", envs={"ONE": "1"}),
        )
        assert ex.exit_code == 0
        assert ex.logs.stdout[0].text.endswith("/tmp")
        assert ex.logs.stdout[1].text == "1"
        started = time.monotonic()
        ex = sb.commands.run("sleep 30", opts=RunCommandOpts(timeout=timedelta(seconds=1)))
        assert time.monotonic() - started < 15
        assert ex.exit_code == -1, "a command killed by its timeout reports -1"
        ex = sb.commands.run(["printf", "%s|", "a b", "$HOME"])
        assert ex.exit_code == 0
        assert _stdout(ex) == "a b|$HOME|"
    finally:
        sb.kill()
        sb.close()


def test_upload_download_and_ranged_read(fake: Fake) -> None:
    """``write_file`` (chunked multipart), ``read_file``/``read_bytes`` with a Range, file info,
    listing and deletion; a command sees the uploaded file."""
    sb = _create()
    try:
        payload = bytes(range(256)) * 40
        sb.files.write_file("/workspace/data/blob.bin", payload)
        sb.files.write_file("/workspace/hello.py", "print('hi from a file')", mode=644)
        assert sb.files.read_bytes("/workspace/data/blob.bin") == payload
        assert sb.files.read_bytes("/workspace/data/blob.bin", range_header="bytes=10-19") == payload[10:20]
        assert sb.files.read_file("/workspace/hello.py") == "print('hi from a file')"
        info = sb.files.get_file_info(["/workspace/hello.py"])["/workspace/hello.py"]
        assert info.size == len("print('hi from a file')")
        assert info.mode == 644
        ex = sb.commands.run("python3 /workspace/hello.py")
        assert ex.exit_code == 0 and _stdout(ex) == "hi from a file"
        sb.files.delete_files(["/workspace/hello.py"])
        with pytest.raises(SandboxException):
            sb.files.read_file("/workspace/hello.py")
    finally:
        sb.kill()
        sb.close()


def test_get_list_by_metadata_renew_and_delete(fake: Fake) -> None:
    """The manager lists by metadata (AND) and state; renew moves the expiry (shorter is
    accepted); kill deletes and a later get is an API error."""
    a = _create(metadata={"created-by": "sdk-test", "run": "one"})
    b = _create(metadata={"created-by": "sdk-test", "run": "two"})
    manager = SandboxManagerSync.create()
    try:
        found = manager.list_sandbox_infos(
            SandboxFilter(metadata={"created-by": "sdk-test", "run": "two"}, states=["Running"])
        )
        assert [i.id for i in found.sandbox_infos] == [b.id]
        both = manager.list_sandbox_infos(SandboxFilter(metadata={"created-by": "sdk-test"}))
        assert {i.id for i in both.sandbox_infos} == {a.id, b.id}
        assert both.pagination.total_items == 2
        none = manager.list_sandbox_infos(SandboxFilter(metadata={"created-by": "nobody"}))
        assert none.sandbox_infos == []
        before = a.get_info().expires_at
        renewed = a.renew(timedelta(minutes=2))
        assert renewed.expires_at < before, "a shorter expiry is accepted"
        assert abs(a.get_info().expires_at - renewed.expires_at) < timedelta(seconds=1)
        a.kill()
        with pytest.raises(SandboxApiException) as err:
            manager.get_sandbox_info(a.id)
        assert err.value.status_code == 404
    finally:
        for sb in (a, b):
            try:
                sb.kill()
            except SandboxException:
                pass
            sb.close()
        manager.close()
    assert fake.stats()["live"] == 0


def test_pause_and_resume(fake: Fake) -> None:
    """Pause (state Paused; a second pause is refused), then ``SandboxSync.resume`` gives a
    usable sandbox whose files survived."""
    sb = _create()
    try:
        sb.files.write_file("/workspace/keep.txt", "kept")
        sb.pause()
        assert sb.get_info().status.state == "Paused"
        with pytest.raises(SandboxApiException) as err:
            sb.pause()
        assert err.value.status_code == 409
        resumed = SandboxSync.resume(sb.id)
        try:
            assert resumed.get_info().status.state == "Running"
            ex = resumed.commands.run("cat /workspace/keep.txt")
            assert ex.exit_code == 0 and _stdout(ex) == "kept"
        finally:
            resumed.close()
    finally:
        sb.kill()
        sb.close()


def test_egress_policy_read_back(fake: Fake) -> None:
    """``get_egress_policy()`` reads the sidecar's policy through the 18080 endpoint; patching
    and deleting rules read back too."""
    policy = NetworkPolicy(
        default_action="deny",
        egress=[NetworkRule(action="allow", target="pypi.org")],
    )
    sb = _create(network_policy=policy)
    try:
        got = sb.get_egress_policy()
        assert got.default_action == "deny"
        assert [(r.action, r.target) for r in got.egress] == [("allow", "pypi.org")]
        sb.patch_egress_rules([NetworkRule(action="allow", target="*.python.org")])
        got = sb.get_egress_policy()
        assert [r.target for r in got.egress] == ["pypi.org", "*.python.org"]
        sb.delete_egress_rules(["pypi.org"])
        assert [r.target for r in sb.get_egress_policy().egress] == ["*.python.org"]
        raw = httpx.get(
            f"{fake.url}/v1/sandboxes/{sb.id}/networkpolicy",
            headers={"OPEN-SANDBOX-API-KEY": API_KEY},
        ).json()
        assert raw["enforcementMode"] == "dns+nft"
    finally:
        sb.kill()
        sb.close()


def test_through_the_server_proxy(fake: Fake) -> None:
    """``use_server_proxy=True``: the SDK talks to execd through
    ``/v1/sandboxes/{id}/proxy/44772`` and uploads with a Content-Length."""
    config = ConnectionConfigSync(use_server_proxy=True)
    sb = _create(connection_config=config)
    try:
        assert "/v1/sandboxes/" in sb.get_endpoint(44772).endpoint
        sb.files.write_file("/workspace/p.txt", "via proxy")
        ex = sb.commands.run("cat /workspace/p.txt; exit 2")
        assert ex.exit_code == 2 and _stdout(ex) == "via proxy"
        assert fake.stats()["requests"].get("proxy", 0) > 0
    finally:
        sb.kill()
        sb.close()


def test_snapshot_and_restore(fake: Fake) -> None:
    """A snapshot becomes Ready and a sandbox created from it has the files."""
    sb = _create()
    manager = SandboxManagerSync.create()
    try:
        sb.files.write_file("/workspace/state.txt", "snap")
        snap = sb.create_snapshot(name="first")
        deadline = time.monotonic() + 10
        while manager.get_snapshot(snap.id).status.state != "Ready":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        restored = SandboxSync.create(
            snapshot_id=snap.id,
            resource=RESOURCES,
            timeout=timedelta(minutes=5),
            ready_timeout=timedelta(seconds=20),
        )
        try:
            assert restored.get_info().snapshot_id == snap.id
            assert restored.files.read_file("/workspace/state.txt") == "snap"
        finally:
            restored.kill()
            restored.close()
        manager.delete_snapshot(snap.id)
    finally:
        sb.kill()
        sb.close()
        manager.close()


def test_wrong_key_is_refused(fake: Fake, monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK surfaces the 401 of a wrong key and creates nothing."""
    monkeypatch.setenv("OPEN_SANDBOX_API_KEY", "wrong")
    with pytest.raises(SandboxApiException) as err:
        _create()
    assert err.value.status_code == 401
    assert fake.stats()["created"] == 0


@pytest.mark.parametrize("fake_args", [["--expiry-failed-ms", "1500"]])
def test_ttl_expiry_after_a_short_renew(fake: Fake, fake_args: list[str]) -> None:
    """The server deletes a sandbox when its (renewed) expiry passes; in between (Docker) the
    SDK reads it as ``Failed`` with the container's exit, as from the real 1.1.1 server."""
    sb = _create()
    manager = SandboxManagerSync.create()
    try:
        expiry = datetime.now(timezone.utc) + timedelta(seconds=1)
        sb._sandbox_service.renew_sandbox_expiration(sb.id, expiry)  # noqa: SLF001
        deadline = time.monotonic() + 10
        seen: list[tuple[str, str | None, str | None]] = []
        while fake.stats()["live"] != 0:
            assert time.monotonic() < deadline, "the sandbox outlived its expiry"
            try:
                status = manager.get_sandbox_info(sb.id).status
            except SandboxApiException as gone:
                assert gone.status_code == 404
                break
            state = (status.state, status.reason, status.message)
            if status.state != "Running" and state not in seen:
                seen.append(state)
            time.sleep(0.1)
        assert seen == [
            ("Failed", "CONTAINER_EXITED_ERROR", "Sandbox container exited with code 137.")
        ]
        deadline = time.monotonic() + 5
        while fake.stats()["live"] != 0:
            assert time.monotonic() < deadline, "the Failed sandbox was not removed"
            time.sleep(0.1)
        assert fake.stats()["expired"] == 1
    finally:
        manager.close()
        sb.close()


@pytest.mark.parametrize(
    "fake_args",
    [
        pytest.param(["--execd-ready-ms", "1500"], id="execd-late"),
        pytest.param(["--runtime", "kubernetes", "--pending-ms", "1000"], id="kubernetes-pending"),
    ],
)
def test_create_waits_for_execd(fake: Fake, fake_args: list[str]) -> None:
    """``Running`` before execd answers (502 through the proxy), or Kubernetes' ``Pending``:
    the SDK's readiness loop waits until ``/ping`` answers, and the first command works."""
    started = time.monotonic()
    sb = _create()
    try:
        assert time.monotonic() - started >= 0.9, "create returned before execd was up"
        assert sb.get_info().status.state == "Running"
        ex = sb.commands.run("echo up")
        assert ex.exit_code == 0 and _stdout(ex) == "up"
        assert fake.stats()["requests"].get("execd_ping", 0) >= 1
    finally:
        sb.kill()
        sb.close()
