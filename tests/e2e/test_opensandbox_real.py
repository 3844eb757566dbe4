"""Every surface against a real ``opensandbox-server`` 1.1.1, as docs/opensandbox.md says to run
it (opt-in: skipped, saying why, unless ``OPENSANDBOX_REAL=1`` and the server's settings are in
the environment).

    scripts/opensandbox-server setup && scripts/opensandbox-server start   # root, Docker
    eval "$(scripts/opensandbox-server env)"
    OPENSANDBOX_REAL=1 python -m pytest -q tests/e2e/test_opensandbox_real.py

The server is what ``scripts/opensandbox-server`` stands up: Docker in bridge mode with
``publish_host = "127.0.0.1"``, runc containers, this project's execd double, no egress sidecar,
an image with python3 and lfx. So what runs is what such a server can run: unrestricted egress
(a deny-all is refused, naming the server's ``[egress]`` setting), container isolation accepted
with ``OPEN_SANDBOX_ALLOW_CONTAINER_ISOLATION=true`` (component, executor) and, for lfx's
backend seam, which accepts nothing but ``hardware-virtualized``, a false attestation
(``OPEN_SANDBOX_ATTEST_ISOLATION=hardware-virtualized`` without ``OPEN_SANDBOX_HOST_KERNEL``:
doctor warns about exactly that). The TLS case puts nginx in front of the server with the
docs' recipe (a private CA, ``OPEN_SANDBOX_CA_FILE``) on this machine's own non-loopback
address, and is skipped without ``nginx`` and ``openssl``.

Guest Reuse (``lfx serve``, the component's kept sandbox, then ``reap``) and the executor's
warm pool run too. Every test checks that the server holds no sandbox afterwards (its own listing, and Docker's
containers when ``DOCKER_HOST`` reaches the server's daemon).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import E2E, LfxRun, lfx_run, run_bounded, run_doctor, signal_lfx_run, venv_bin, with_overrides

SHOUT = E2E / "flows" / "shout_flow.json"
#: What ``scripts/opensandbox-server env`` sets for the plugin. ``OPEN_SANDBOX_SERVER_UNREACHABLE``
#: is true of that server (it and every published execd port listen on loopback only); the TLS
#: case's nginx listens on this machine's own address, which sandboxes can route to, so there the
#: word is this test machine's, not a setup to copy.
_SERVER_VARS = (
    "OPEN_SANDBOX_DOMAIN",
    "OPEN_SANDBOX_API_KEY",
    "OPEN_SANDBOX_API_KEY_FILE",
    "OPEN_SANDBOX_IMAGE",
    "OPEN_SANDBOX_SERVER_UNREACHABLE",
)


def _why_skipped() -> str | None:
    if os.environ.get("OPENSANDBOX_REAL") != "1":
        return "OPENSANDBOX_REAL=1 is not set (a real opensandbox-server is needed: scripts/opensandbox-server)"
    missing = [n for n in ("OPEN_SANDBOX_DOMAIN", "OPEN_SANDBOX_IMAGE") if not os.environ.get(n)]
    if not (os.environ.get("OPEN_SANDBOX_API_KEY") or os.environ.get("OPEN_SANDBOX_API_KEY_FILE")):
        missing.append("OPEN_SANDBOX_API_KEY_FILE")
    if missing:
        return f"{', '.join(missing)} not set: eval \"$(scripts/opensandbox-server env)\" first"
    return None


pytestmark = pytest.mark.skipif(_why_skipped() is not None, reason=_why_skipped() or "")


def _key() -> str:
    if os.environ.get("OPEN_SANDBOX_API_KEY"):
        return os.environ["OPEN_SANDBOX_API_KEY"]
    return Path(os.environ["OPEN_SANDBOX_API_KEY_FILE"]).read_text().strip()


def _base_url() -> str:
    domain = os.environ["OPEN_SANDBOX_DOMAIN"]
    return domain if domain.startswith(("http://", "https://")) else f"http://{domain}"


def server_sandboxes() -> list[dict[str, Any]]:
    """Every sandbox the server lists (any state, any creator)."""
    request = urllib.request.Request(
        f"{_base_url()}/v1/sandboxes?pageSize=100", headers={"OPEN-SANDBOX-API-KEY": _key()}
    )
    with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - the operator's server
        return json.loads(response.read())["items"]


def containers() -> list[str]:
    """The OpenSandbox containers in the server's Docker, when ``docker`` reaches it."""
    if not shutil.which("docker") or not os.environ.get("DOCKER_HOST"):
        return []
    out = subprocess.run(
        ["docker", "ps", "-aq", "--filter", "label=opensandbox.io/id"], capture_output=True, text=True, timeout=30, check=False
    )
    return out.stdout.split()


def wait_nothing_left(timeout: float = 15.0) -> float:
    """Seconds until the server lists no sandbox and Docker holds no container of it."""
    start = time.monotonic()
    while server_sandboxes() or containers():
        if time.monotonic() - start > timeout:
            pytest.fail(f"left after {timeout} s: {server_sandboxes()} {containers()}")
        time.sleep(0.2)
    return time.monotonic() - start


@pytest.fixture(autouse=True)
def nothing_before_or_after() -> Iterator[None]:
    assert not server_sandboxes(), "the server already holds sandboxes: stop what else uses it"
    yield
    wait_nothing_left()


def real_env(**overrides: str | None) -> dict[str, str]:
    """The operator's environment: the server's settings as ``scripts/opensandbox-server env``
    printed them, nothing else of this package's or lfx's, plus ``overrides``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CREATEOS_", "LANGFLOW_", "OPEN_SANDBOX_"))}
    env.update({k: os.environ[k] for k in _SERVER_VARS if os.environ.get(k)})
    env["PYTHONUNBUFFERED"] = "1"
    return with_overrides(env, overrides)


#: lfx's backend seam on this runc server: selected, trusted, unrestricted egress, and the false
#: attestation lfx needs to run anything (see the module's docstring).
BACKEND = {
    "LANGFLOW_SANDBOX_BACKEND_PLUGINS": "opensandbox",
    "LANGFLOW_SANDBOX_BACKEND": "opensandbox",
    "LANGFLOW_SANDBOX_ALLOW_NETWORK": "true",
    "OPEN_SANDBOX_ATTEST_ISOLATION": "hardware-virtualized",
}
#: The component and the executor: container isolation accepted knowingly.
CONTAINER = {"OPEN_SANDBOX_ALLOW_CONTAINER_ISOLATION": "true"}


def backend_env(**overrides: str | None) -> dict[str, str]:
    return real_env(**{**BACKEND, **overrides})


def executor_env(**overrides: str | None) -> dict[str, str]:
    return real_env(**{"LANGFLOW_EXECUTOR_KIND": "opensandbox", **CONTAINER, **overrides})


def component_flow(tmp_path: Path, *, session_mode: str = "", flow_id: str = "") -> Path:
    """A flow whose CreateOS Sandbox node has Provider = OpenSandbox and Allow Network on (this
    server has no egress sidecar for the default deny-all); Guest Reuse ``session_mode`` and
    the flow's id when given."""
    from test_opensandbox_component import BUILD

    out = tmp_path / f"component-opensandbox-{session_mode or 'off'}.json"
    args = [str(out), "OpenSandbox", *([session_mode, flow_id] if session_mode else [])]
    subprocess.run([sys.executable, "-c", BUILD, *args], check=True, timeout=120, cwd=E2E)
    data = json.loads(out.read_text())
    for node in data["data"]["nodes"]:
        if node["id"] == "createos_sandbox":
            node["data"]["node"]["template"]["allow_network"]["value"] = True
    out.write_text(json.dumps(data))
    return out


def lfx(env: dict[str, str], flow: Path, message: str) -> LfxRun:
    proc = run_bounded([venv_bin("lfx"), "run", str(flow), message], env, timeout=240)
    return LfxRun(proc.returncode, proc.stdout, proc.stderr)


def component_results(run: LfxRun) -> dict[str, Any]:
    assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-3000:])
    assert run.json["success"], run.json
    return run.result


# ---- doctor, per surface ---------------------------------------------------------------------


def test_doctor_is_green_for_the_backend_and_the_executor() -> None:
    backend = run_doctor(backend_env(), args=("--surface", "opensandbox"))
    assert backend.returncode == 0, backend.stdout[-3000:]
    assert "answered and accepted OPEN_SANDBOX_API_KEY" in backend.stdout, backend.stdout[-3000:]
    # The false attestation is what doctor warns about.
    assert "OPEN_SANDBOX_HOST_KERNEL is unset" in backend.stdout, backend.stdout[-3000:]
    executor = run_doctor(executor_env(), args=("--surface", "opensandbox-executor"))
    assert executor.returncode == 0, executor.stdout[-3000:]
    assert "opensandbox-executor: ready" in executor.stdout, executor.stdout[-3000:]
    # Without the attestation the backend is refused, naming the setting.
    refused = run_doctor(backend_env(OPEN_SANDBOX_ATTEST_ISOLATION=None), args=("--surface", "opensandbox"))
    assert refused.returncode == 1 and "OPEN_SANDBOX_ATTEST_ISOLATION" in refused.stdout, refused.stdout[-3000:]


# ---- each surface runs a flow ----------------------------------------------------------------


def test_the_backend_runs_the_python_interpreter_flow() -> None:
    run = lfx_run(backend_env(), "import os\nprint(math.factorial(5) + 6*7, os.environ['OPENSANDBOX_ID'] != '')")
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.result == {"result": "162 True"}, run.stdout[-2000:]


def test_the_backends_default_deny_all_is_refused_for_want_of_a_sidecar() -> None:
    run = lfx_run(backend_env(LANGFLOW_SANDBOX_ALLOW_NETWORK=None), "print(1)")
    assert run.returncode != 0
    message = run.json["exception_message"]
    assert "[egress] image" in message and 'dns+nft' in message, message


def test_the_component_runs_its_node_on_the_server(tmp_path: Path) -> None:
    results = component_results(lfx(real_env(**CONTAINER), component_flow(tmp_path), "import math\nprint(math.factorial(5) + 6*7)"))
    assert (results["result"], results["exit_code"], results["provider"]) == ("162", 0, "opensandbox"), results


def test_the_executor_runs_the_whole_flow_in_a_sandbox() -> None:
    run = lfx(executor_env(), SHOUT, "from the real server")
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.json["result"] == "FROM THE REAL SERVER!", run.stdout[-2000:]


def test_an_image_the_server_cannot_pull_is_refused_naming_the_setting() -> None:
    run = lfx(executor_env(OPEN_SANDBOX_IMAGE="registry.invalid/lf/python:missing"), SHOUT, "x")
    out = run.stdout + run.stderr
    assert "FROM" not in run.stdout
    assert "cannot pull the image" in out and "OPEN_SANDBOX_IMAGE" in out, out[-3000:]
    assert '"exception_type": "SandboxRefusedError"' in out, out[-3000:]


# ---- stopping ----------------------------------------------------------------------------------


def test_ctrl_c_of_lfx_run_leaves_no_container_within_15_s() -> None:
    def started() -> bool:
        return len(server_sandboxes()) == 1

    env = backend_env(LANGFLOW_SANDBOX_TIMEOUT_SECONDS="120")
    run = signal_lfx_run(env, "import time\ntime.sleep(90)", signal.SIGINT, started, settle=2.0)
    assert run.returncode != 0
    assert run.took < 15, run.took
    assert run.took + wait_nothing_left(timeout=15) < 15


def test_sigterm_of_lfx_run_deletes_the_sandbox() -> None:
    env = backend_env(LANGFLOW_SANDBOX_TIMEOUT_SECONDS="120")
    run = signal_lfx_run(env, "import time\ntime.sleep(90)", signal.SIGTERM, lambda: len(server_sandboxes()) == 1, settle=2.0)
    assert run.returncode == -signal.SIGTERM, (run.returncode, run.stderr[-2000:])
    assert run.took + wait_nothing_left(timeout=15) < 15


# ---- a server on another host: the docs' TLS recipe ------------------------------------------


def _own_address() -> str:
    """This machine's first non-loopback IPv4 address (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))
            address = s.getsockname()[0]
        except OSError:
            address = "127.0.0.1"
    return address


@pytest.fixture(scope="module")
def tls_front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """nginx in front of the server, configured as docs/opensandbox.md's recipe, its certificate
    for this machine's own address signed by a private CA: the ``https://`` domain and the CA."""
    if not (shutil.which("nginx") and shutil.which("openssl")):
        pytest.skip("nginx and openssl are needed for the TLS recipe (apt-get install nginx-light openssl)")
    if not os.environ["OPEN_SANDBOX_DOMAIN"].removeprefix("http://").startswith(("127.", "localhost")):
        pytest.skip("OPEN_SANDBOX_DOMAIN is not the loopback server scripts/opensandbox-server runs")
    d = tmp_path_factory.mktemp("tls")
    address = _own_address()
    with socket.socket() as s:
        s.bind((address, 0))
        port = s.getsockname()[1]

    def sh(*argv: str) -> None:
        subprocess.run(argv, check=True, cwd=d, capture_output=True, timeout=120)

    sh("openssl", "req", "-x509", "-newkey", "rsa:3072", "-nodes", "-days", "3650", "-subj", "/CN=OpenSandbox private CA",
       "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
       "-keyout", "ca.key", "-out", "ca.pem")  # fmt: skip
    (d / "server.ext").write_text(
        f"subjectAltName=IP:{address}\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n"
    )
    sh("openssl", "req", "-newkey", "rsa:3072", "-nodes", "-subj", f"/CN={address}", "-keyout", "server.key", "-out", "server.csr")
    sh("openssl", "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-days", "825",
       "-extfile", "server.ext", "-out", "server.pem")  # fmt: skip
    upstream = os.environ["OPEN_SANDBOX_DOMAIN"].removeprefix("http://")
    (d / "nginx.conf").write_text(
        f"""worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log;
events {{ worker_connections 256; }}
http {{
    access_log {d}/access.log;
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    server {{
        listen {address}:{port} ssl;
        ssl_certificate     {d}/server.pem;
        ssl_certificate_key {d}/server.key;
        client_max_body_size 0;
        location / {{
            proxy_pass http://{upstream};
            proxy_http_version 1.1;
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 3600s;
            proxy_send_timeout 3600s;
            proxy_set_header Host $host;
        }}
    }}
}}
"""
    )
    sh("nginx", "-c", str(d / "nginx.conf"))
    try:
        yield f"https://{address}:{port}", d / "ca.pem"
    finally:
        pid = int((d / "nginx.pid").read_text())
        os.kill(pid, signal.SIGTERM)


def test_every_surface_through_the_tls_recipe(tls_front: tuple[str, Path], tmp_path: Path) -> None:
    domain, ca = tls_front
    over = {"OPEN_SANDBOX_DOMAIN": domain, "OPEN_SANDBOX_CA_FILE": str(ca)}
    doctor = run_doctor(backend_env(**over), args=("--surface", "opensandbox"))
    assert doctor.returncode == 0 and f"{domain}/v1 answered" in doctor.stdout, doctor.stdout[-3000:]
    run = lfx_run(backend_env(**over), "print(6*7)")
    assert run.returncode == 0 and run.result == {"result": "42"}, run.stderr[-3000:]
    results = component_results(lfx(real_env(**CONTAINER, **over), component_flow(tmp_path), "print('over tls')"))
    assert results["result"] == "over tls", results
    shout = lfx(executor_env(**over), SHOUT, "through tls")
    assert shout.returncode == 0 and shout.json["result"] == "THROUGH TLS!", shout.stderr[-3000:]
    # Without the CA file the first call is refused at once, naming it.
    refused = lfx(executor_env(OPEN_SANDBOX_DOMAIN=domain), SHOUT, "no ca")
    assert "OPEN_SANDBOX_CA_FILE" in refused.stdout + refused.stderr, refused.stdout[-3000:]



# ---- Guest Reuse and the warm pool -------------------------------------------------------------


def test_guest_reuse_keeps_one_sandbox_with_its_files_and_reap_deletes_it(tmp_path: Path) -> None:
    from test_component import COUNTER, FLOW_ID, reap, served

    flow = component_flow(tmp_path, session_mode="flow", flow_id=FLOW_ID)
    env = real_env(**CONTAINER)
    with served(env, tmp_path, flow) as server:
        seen = [server.results(COUNTER, session_id=f"caller-{n}") for n in range(3)]
    assert [r["result"] for r in seen] == ["RUN_COUNT 1", "RUN_COUNT 2", "RUN_COUNT 3"], seen
    assert len({r["sandbox_id"] for r in seen}) == 1
    assert [r["reused_guest"] for r in seen] == [False, True, True]
    assert [s["id"] for s in server_sandboxes()] == [seen[0]["sandbox_id"]]
    gone = reap(env, "--provider", "opensandbox", "--older-than", "0s")
    assert gone.returncode == 0 and f"deleted reused guest {seen[0]['sandbox_name']}" in gone.stdout, gone.stdout


def test_a_warm_pool_serves_the_next_flow_and_leaves_nothing() -> None:
    from test_executor import POOLED_ARUN

    from conftest import script_result

    script = POOLED_ARUN.replace("sys.argv[1]", repr(str(SHOUT))).replace(
        "_native.NativeExecutor()", '_native.NativeExecutor("opensandbox")'
    )
    result, _ = script_result(script, [], executor_env(CREATEOS_EXECUTOR_WARM_POOL="1"), timeout=300)
    assert result["texts"] == [["FIRST!"], ["SECOND!"]], result
    assert (result["pool"]["hits"], result["pool"]["misses"]) == (1, 1), result
