"""Server processes and HTTP plumbing behind ``mlm serve``, knowing nothing of Prefect or MLflow.

In: commands to run, hosts and ports, URLs. Out: children started in their own session (process group),
stopped group-wise (SIGTERM, then SIGKILL after a grace period, so nothing a server forked survives it);
bind tests for ports; small stdlib HTTP GET/POST helpers that answer status 0 when nothing listens.
Stdlib only, so ``mlm --help`` stays instant.
"""
from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
GRACE_S = 10.0                       # SIGTERM -> SIGKILL
LOOPBACK = {"127.0.0.1", "localhost", "::1"}   # hosts only this machine reaches


class ServeError(Exception):
    """A problem found before or while starting; ``code`` is the exit status."""

    def __init__(self, msg: str, code: int = 1):
        super().__init__(msg)
        self.code = code


# ------------------------------------------------------------------------------------- plumbing
def client_host(host: str) -> str:
    """Where a local client reaches a server bound to ``host``."""
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)


def server_url(host: str, port: int) -> str:
    h = client_host(host)
    return f"http://[{h}]:{port}" if ":" in h else f"http://{h}:{port}"


def port_free(host: str, port: int) -> bool:
    """Bind test, with SO_REUSEADDR like uvicorn: only a live listener (or a foreign owner) fails it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """An ephemeral port that is free right now (for tests)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 2.0, auth: str | None = None) -> tuple[int, str]:
    """(status, body) of a GET; status 0 when nothing answers."""
    req = urllib.request.Request(url, headers=auth_header(auth))
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 (http only)
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except (urllib.error.URLError, OSError, ValueError):
        return 0, ""


def http_post_json(url: str, body: dict, timeout: float = 5.0, auth: str | None = None) -> tuple[int, object]:
    headers = {"Content-Type": "application/json", **auth_header(auth)}
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, None
    except (urllib.error.URLError, OSError, ValueError):
        return 0, None


def auth_header(auth: str | None) -> dict:
    if not auth:
        return {}
    return {"Authorization": "Basic " + base64.b64encode(auth.encode()).decode()}


# ------------------------------------------------------------------------------------- children
@dataclass
class Child:
    name: str
    cmd: list[str]
    env: dict
    log: Path
    cwd: Path = REPO_ROOT
    proc: subprocess.Popen | None = field(default=None, repr=False)

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as fh:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(self.cmd, env=self.env, cwd=self.cwd, stdout=fh, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self, n: int = 25) -> str:
        try:
            return "\n".join(self.log.read_text(encoding="utf-8", errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def stop_children(children: list[Child], grace: float = GRACE_S) -> None:
    """SIGTERM every child's whole process group, then SIGKILL what is left after ``grace`` seconds."""
    started = [c for c in children if c.proc is not None]
    for c in started:
        try:
            os.killpg(c.proc.pid, signal.SIGTERM)  # pgid == pid: start_new_session=True
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    for c in started:
        while time.monotonic() < deadline:
            c.proc.poll()  # reap the leader so a zombie does not keep its group "alive"
            if not group_exists(c.proc.pid):
                break
            time.sleep(0.1)
    for c in started:
        c.proc.poll()
        if group_exists(c.proc.pid):
            try:
                os.killpg(c.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            c.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def wait_until(what: str, check, children: list[Child], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for c in children:
            if not c.alive():
                raise ServeError(f"{c.name} exited (code {c.proc.returncode}) before {what}; "
                                 f"last lines of {c.log}:\n{c.tail()}")
        if check():
            return
        time.sleep(0.5)
    tails = "\n".join(f"--- {c.log}:\n{c.tail(10)}" for c in children)
    raise ServeError(f"timed out after {timeout:.0f}s waiting for {what}\n{tails}")
