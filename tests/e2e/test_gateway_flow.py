"""Issue 22's proof through a real lfx flow: a domain allowlist that holds.

The Python Interpreter flow (``flows/pyrepl_flow.json``, lfx 1.13's component with the createos
backend) runs through ``lfx run`` on the enforcing test network of the gateway crate
(``crates/egress-gateway/examples/egress-testnet.rs``): every guest of the fake control plane
lives in a network namespace whose firewall allows only its egress rules, the gateway (the
wheel's ``python -m langflow_sandbox_createos gateway``) runs in a namespace of its own, and a
test "internet" serves a package index holding ``tinypkg`` as ``https://pkg.test/simple/``.

With ``LANGFLOW_SANDBOX_ALLOWED_DOMAINS=pkg.test`` the flow's code ``pip install``s ``tinypkg``
through the gateway and prints its value; with another name listed the install is refused by
the gateway and the flow reports the failure. In both runs a direct connection to the index's
address, ignoring the proxy settings, is dropped by the guest's firewall. Each run leaves no
guest live, and the network leaves no namespace behind.

Needs root, ``ip`` and ``nft`` (network namespaces) and pip in this environment (the guests run
its ``python3``); otherwise the tests are skipped with the reason. ``EGRESS_TESTNET_BIN`` points
at the network's binary; by default ``target/debug/examples/egress-testnet`` (build it with
``cargo build -p egress-gateway --example egress-testnet``).
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from conftest import Fake, backend_env, built_binary, lfx_run

# What the flow's code does: the direct connection first (it must be dropped whatever the list
# says), then pip through the proxy the guest's environment names, then the import. One retry:
# with none, pip does not print the proxy's answer (the refusal's reason) before giving up.
CODE = """
import os, socket, subprocess, sys, tempfile
d = tempfile.mkdtemp()
ca = os.path.join(d, "ca.pem")
with open(ca, "w") as f:
    f.write(CA_PEM)
try:
    socket.create_connection((DIRECT, 443), timeout=3).close()
    direct = "connected"
except OSError as e:
    direct = type(e).__name__
target = os.path.join(d, "site")
r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check",
    "--no-cache-dir", "--retries", "1", "--timeout", "10", "--index-url", INDEX, "--cert", ca,
    "--target", target, "tinypkg"], capture_output=True, text=True)
if r.returncode != 0:
    sys.exit("direct connection: " + direct + "; pip install tinypkg failed: " + (r.stdout + r.stderr)[-1500:])
sys.path.insert(0, target)
import tinypkg
print("direct connection:", direct + "; tinypkg", tinypkg.VALUE)
"""


def _testnet_binary() -> Path:
    """The network's executable, or a failure that says how to build it."""
    return built_binary(
        "EGRESS_TESTNET_BIN", "debug/examples/egress-testnet", "cargo build -p egress-gateway --example egress-testnet"
    )


def _skip_reason() -> str | None:
    """Why this machine cannot run the network, checked before anything is started."""
    if os.geteuid() != 0:
        return "network namespaces need root (run as root, e.g. in the CI container)"
    for tool, package in (("ip", "iproute2"), ("nft", "nftables")):
        if shutil.which(tool, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") is None:
            return f"the `{tool}` command is missing (install Debian's `{package}`)"
    pip = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True, check=False, timeout=60)
    if pip.returncode != 0:
        return f"pip is not installed in {sys.prefix}, whose python3 the guests run"
    return None


@dataclass
class Network:
    """A running ``egress-testnet``: its settings and everything it printed after them."""

    proc: subprocess.Popen[str]
    info: dict[str, Any]
    output: list[str] = field(default_factory=list)

    @property
    def fake(self) -> Fake:
        """The enforcing fake control plane, for its counters."""
        return Fake(proc=self.proc, url=self.info["fake_url"], key=self.info["api_key"])

    def records(self, since: int = 0) -> list[dict[str, str]]:
        """The gateway's connection records (``key=value`` words) from output line ``since`` on."""
        out: list[dict[str, str]] = []
        for line in self.output[since:]:
            if "egress_gateway::connection" in line:
                words = (w.split("=", 1) for w in line.split() if "=" in w)
                out.append({k: v.strip('"') for k, v in words})
        return out

    def wait_record(self, since: int, **fields: str) -> dict[str, str]:
        """The first record after ``since`` holding ``fields``; fails after 15 s without one."""
        deadline = time.monotonic() + 15
        while True:
            for record in self.records(since):
                if all(record.get(k) == v for k, v in fields.items()):
                    return record
            if time.monotonic() > deadline:
                pytest.fail(f"no gateway record with {fields} in {self.records(since)}")
            time.sleep(0.1)


def _leftover_namespaces(pid: int) -> list[str]:
    """Namespaces the network of process ``pid`` made (its own and its guests') still present."""
    names = os.listdir("/run/netns") if os.path.isdir("/run/netns") else []
    return [n for n in names if n.startswith((f"egw-test-{pid}-", f"createos-fake-{pid}-"))]


@pytest.fixture(scope="module")
def testnet() -> Iterator[Network]:
    """The network for this module; torn down by closing its stdin, and checked to be gone."""
    reason = _skip_reason()
    if reason is not None:
        pytest.skip(reason)
    cmd = [
        str(_testnet_binary()),
        "--guest-path",
        str(Path(sys.executable).parent),
        "--",
        sys.executable,
        "-m",
        "langflow_sandbox_createos",
        "gateway",
    ]
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith(("CREATEOS_", "LANGFLOW_"))},
    )
    assert proc.stdout is not None
    seen: list[str] = []
    info: dict[str, Any] | None = None
    try:
        deadline = time.monotonic() + 120
        with selectors.DefaultSelector() as selector:
            selector.register(proc.stdout, selectors.EVENT_READ)
            while info is None and time.monotonic() < deadline:
                if not selector.select(timeout=max(0.0, deadline - time.monotonic())):
                    break
                line = proc.stdout.readline()
                if not line:
                    break
                if line.startswith("unsupported: "):
                    pytest.skip(line.removeprefix("unsupported: ").strip())
                if line.startswith("ready "):
                    info = json.loads(line.removeprefix("ready "))
                else:
                    seen.append(line)
        if info is None:
            pytest.fail(f"egress-testnet did not get ready: {''.join(seen)[-3000:]}")
        net = Network(proc=proc, info=info, output=seen)

        def pump() -> None:  # keep the pipe drained; the gateway's records arrive here
            assert proc.stdout is not None
            for line in proc.stdout:
                net.output.append(line)

        threading.Thread(target=pump, name="testnet-output", daemon=True).start()
        yield net
    finally:
        # Closing stdin is what a dying test does too: the network takes itself down.
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    assert proc.returncode == 0, "".join(seen)[-3000:]
    assert _leftover_namespaces(proc.pid) == []


def _env(net: Network, domains: str) -> dict[str, str]:
    fake = net.fake
    return backend_env(
        fake,
        CREATEOS_GATEWAY_URL=net.info["gateway_url"],
        CREATEOS_GATEWAY_SECRET=net.info["gateway_secret"],
        LANGFLOW_SANDBOX_ALLOW_NETWORK="true",
        LANGFLOW_SANDBOX_ALLOWED_DOMAINS=domains,
        LANGFLOW_SANDBOX_TIMEOUT_SECONDS="120",
    )


def _code(net: Network) -> str:
    info = net.info
    return (
        CODE.replace("CA_PEM", repr(info["ca_pem"]))
        .replace("DIRECT", repr(info["names"]["pkg.test"]))
        .replace("INDEX", repr(info["index_url"]))
    )


def test_allowed_domain_installs_from_the_index_through_the_gateway(testnet: Network) -> None:
    since = len(testnet.output)
    run = lfx_run(_env(testnet, "pkg.test"), _code(testnet))
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.json["success"] is True
    # What the user sees: the package installed and imported; the direct route dropped (a
    # timeout, not a refusal: the firewall's policy is drop).
    assert run.result == {"result": "direct connection: TimeoutError; tinypkg 42"}, run.result
    testnet.wait_record(since, host="pkg.test", verdict="allowed")
    assert all(r.get("verdict") != "refused" for r in testnet.records(since)), testnet.records(since)
    assert testnet.fake.wait_settled()["live"] == 0


def test_unlisted_domain_fails_closed(testnet: Network) -> None:
    since = len(testnet.output)
    run = lfx_run(_env(testnet, "api.test"), _code(testnet))
    assert run.returncode == 0, run.stderr[-3000:]
    # The flow reports the program's failure (a user-code error, not a crash of the flow):
    # pip could not reach the index, and nothing was installed.
    error = run.result.get("error", "")
    assert "pip install tinypkg failed" in error, run.result
    assert "direct connection: TimeoutError" in error, run.result
    assert "403" in error, run.result
    assert "host not in this run's allowlist" in error, run.result
    assert "tinypkg 42" not in json.dumps(run.result)
    # The gateway refused the name for this run's credential; nothing was let through.
    testnet.wait_record(since, host="pkg.test", verdict="refused", reason="host_not_allowed")
    assert all(r.get("verdict") != "allowed" for r in testnet.records(since)), testnet.records(since)
    assert testnet.fake.wait_settled()["live"] == 0
