"""Hands a flow job to the preloaded runner of a warm guest (embedded in langflow-executor).

Run by the executor as ``python3 -S lfx_handoff.py job NAME JOB_PATH`` under ``timeout(1)``,
it connects to the runner listening on the abstract Unix socket NAME (``lfx_runner.py --serve``),
passes it this process's standard output and error (SCM_RIGHTS), so the runner's frames travel
on this exec's stream exactly as a cold runner's would, and exits with the status the runner
reports. ``python3 -S lfx_handoff.py ping NAME SECONDS`` waits up to SECONDS for the runner to
be ready and prints what it answers.

Only the standard library is imported (and no ``site``), so this costs a few milliseconds.
"""

from __future__ import annotations

import socket
import sys
import time

# Exit statuses the host reads (langflow-executor's runner module mirrors them).
EXIT_NO_RUNNER = 86  # nothing listens: the job was not handed over, nothing ran
EXIT_RUNNER_LOST = 87  # the runner ended without reporting a status


def _connect(name: str, wait: float) -> socket.socket | None:
    deadline = time.monotonic() + wait
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect("\0" + name)
            return sock
        except OSError:
            sock.close()
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)


def _read_line(sock: socket.socket) -> str:
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(256)
        if not chunk:
            break
        data += chunk
    return data.decode("utf-8", "replace").strip()


def main() -> int:
    mode, name, arg = sys.argv[1], sys.argv[2], sys.argv[3]
    sock = _connect(name, float(arg) if mode == "ping" else 0.0)
    if sock is None:
        print(f"no preloaded lfx runner listens on {name!r}; the flow was not handed over", file=sys.stderr)
        return EXIT_NO_RUNNER
    with sock:
        if mode == "ping":
            sock.sendall(b"PING")
            print(_read_line(sock) or "LOST")
            return 0
        sys.stdout.flush()
        sys.stderr.flush()
        socket.send_fds(sock, [b"JOB " + arg.encode("utf-8")], [1, 2])
        reply = _read_line(sock)
    if reply.startswith("EXIT "):
        try:
            return int(reply[5:])
        except ValueError:
            pass
    print("the preloaded lfx runner ended without reporting a status", file=sys.stderr)
    return EXIT_RUNNER_LOST


if __name__ == "__main__":
    sys.exit(main())
