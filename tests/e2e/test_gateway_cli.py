"""``python -m langflow_sandbox_createos gateway``: the egress gateway as the wheel ships it.

What a guest reaches through the gateway is proven in the gateway crate's network-namespace
tests and, through a real flow, in ``test_gateway_flow.py`` (both need root); these check the command itself, with no root: its options, the secret
(required, never printed), refusals of requests without a valid credential, the per-connection
log record, and a clean stop on SIGTERM and Ctrl-C.
"""

from __future__ import annotations

import os
import selectors
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from conftest import E2E

SECRET = "e2e-gateway-secret-0123456789abcdefABCDEF"


def _env(secret: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CREATEOS_")}
    if secret is not None:
        env["CREATEOS_GATEWAY_SECRET"] = secret
    return env


def _run(args: list[str], secret: str | None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "langflow_sandbox_createos", "gateway", *args],
        capture_output=True,
        text=True,
        env=_env(secret),
        timeout=60,
        cwd=E2E,
        check=False,
    )


@contextmanager
def _gateway() -> Iterator[tuple[subprocess.Popen[str], tuple[str, int]]]:
    """A running gateway on a loopback port; killed if the test leaves it running."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "langflow_sandbox_createos", "gateway", "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(SECRET),
        cwd=E2E,
        # A shell starts background jobs with SIGINT ignored, and a child inherits that, so
        # Ctrl-C would never reach it: the gateway starts as a terminal would start it.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            assert sel.select(timeout=60), "the gateway printed nothing"
        first = proc.stdout.readline().strip()
        assert first.startswith("listening on 127.0.0.1:"), first
        host, port = first.removeprefix("listening on ").rsplit(":", 1)
        yield proc, (host, int(port))
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def _exchange(addr: tuple[str, int], head: str) -> str:
    with socket.create_connection(addr, timeout=30) as sock:
        sock.sendall(head.encode())
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    return data.decode(errors="replace")


def test_help_lists_the_options_under_the_command_name() -> None:
    proc = _run(["--help"], None)
    assert proc.returncode == 0, proc.stderr
    assert "Usage: python -m langflow_sandbox_createos gateway" in proc.stdout, proc.stdout
    for option in ("--listen", "--max-connections-per-credential", "--max-bytes-per-credential", "--idle-timeout"):
        assert option in proc.stdout, proc.stdout
    bad = _run(["--listen", "not-an-address"], SECRET)
    assert bad.returncode == 2, bad.stderr
    assert "--listen" in bad.stderr, bad.stderr


def test_refuses_to_start_without_a_usable_secret() -> None:
    missing = _run(["--listen", "127.0.0.1:0"], None)
    assert missing.returncode == 2, (missing.stdout, missing.stderr)
    assert "CREATEOS_GATEWAY_SECRET is not set" in missing.stderr, missing.stderr
    assert "listening on" not in missing.stdout
    short = "only-twenty-bytes-xx"
    weak = _run(["--listen", "127.0.0.1:0"], short)
    assert weak.returncode == 2, (weak.stdout, weak.stderr)
    assert "at least 32" in weak.stderr, weak.stderr
    assert short not in weak.stdout + weak.stderr


def test_refuses_requests_without_a_valid_credential_and_stops_on_sigterm() -> None:
    with _gateway() as (proc, addr):
        answer = _exchange(addr, "CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\n\r\n")
        assert answer.startswith("HTTP/1.1 407 "), answer
        assert "x-egress-gateway-reason: no_credentials" in answer, answer
        assert 'proxy-authenticate: Basic realm="createos-egress-gateway"' in answer, answer
        forged = "Proxy-Authorization: Basic cnVuOm5vdC1hLXRva2Vu\r\n"  # run:not-a-token
        answer = _exchange(addr, f"CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\n{forged}\r\n")
        assert "x-egress-gateway-reason: bad_credentials" in answer, answer
        answer = _exchange(addr, "GET / HTTP/1.1\r\nHost: pypi.org\r\n\r\n")
        assert answer.startswith("HTTP/1.1 407 "), answer
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
    # One record per connection, with the verdict and reason; the secret is never printed.
    records = [line for line in err.splitlines() if "egress_gateway::connection" in line]
    assert len(records) == 3, err
    assert all("verdict=refused" in r for r in records), records
    assert any("host=pypi.org" in r and "reason=no_credentials" in r for r in records), records
    assert any("host=pypi.org" in r and "reason=bad_credentials" in r for r in records), records
    assert SECRET not in err
    assert "egress gateway stopped" in err, err


def test_ctrl_c_stops_it_cleanly() -> None:
    with _gateway() as (proc, _addr):
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert "Traceback" not in err, err
