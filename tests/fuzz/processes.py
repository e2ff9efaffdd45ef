"""The shipped servers as separate processes: ``spotguard serve admission`` (gunicorn, HTTPS),
``spotguard serve spot-interruption`` and ``spotguard serve node-added`` (hypercorn), exactly
as a user starts them."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import requests
from spotguard import certs


@dataclass(frozen=True)
class Served:
    url: str
    verify: str | bool  # the CA file for HTTPS
    process: subprocess.Popen[bytes]
    log: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tls_files(directory: Path) -> certs.Paths:
    return certs.make(directory, ["localhost"], ips=["127.0.0.1"])


@contextlib.contextmanager
def serving(
    command: list[str], url: str, verify: str | bool, log: Path, health: str, *, extra_env: dict[str, str] | None = None
) -> Iterator[Served]:
    env = {**os.environ, "SPOTGUARD_LOG_LEVEL": "INFO", "PYTHONUNBUFFERED": "1"}
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE", "SPOTGUARD_EKS_CLUSTER", "KUBECONFIG"):
        env.pop(name, None)
    env.update(extra_env or {})
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "spotguard.cli", *command], stdout=out, stderr=subprocess.STDOUT, env=env
        )
    served = Served(url, verify, process, log)
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"{command[:2]} exited: {served.log_text()[-2000:]}")
            try:
                if requests.get(url + health, verify=verify, timeout=2).ok:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{command[:2]} did not start: {served.log_text()[-2000:]}")
            time.sleep(0.1)
        yield served
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def admission(workdir: Path, kubeconfig: str | None) -> Iterator[Served]:
    """``kubeconfig`` None: no cluster (every pod is allowed unchanged)."""
    tls = tls_files(workdir / "tls")
    port = free_port()
    command = [
        "serve", "admission", "--host", "127.0.0.1", "--port", str(port),
        "--tls-cert", str(tls.cert), "--tls-key", str(tls.key), "--workers", "1", "--threads", "4",
    ]  # fmt: skip
    if kubeconfig is not None:
        command += ["--kubeconfig", kubeconfig]
    with serving(command, f"https://127.0.0.1:{port}", str(tls.ca_cert), workdir / "admission.log", "/healthz") as s:
        yield s


@contextlib.contextmanager
def cloudevents_function(
    name: str, workdir: Path, kubeconfig: str, reconcile_interval: float = 0, env: dict[str, str] | None = None
) -> Iterator[Served]:
    """``spotguard serve <name>`` for a CloudEvents function (spot-interruption, node-added).

    ``env``: settings of the deployed function (``SPOTGUARD_DRAIN=true``). A pass runs for
    each CloudEvent POSTed to / (and every ``reconcile_interval`` seconds, when > 0).
    """
    port = free_port()
    command = [
        "serve", name, "--host", "127.0.0.1", "--port", str(port),
        "--kubeconfig", kubeconfig, "--reconcile-interval", str(reconcile_interval),
    ]  # fmt: skip
    log = workdir / f"{name}.log"
    with serving(command, f"http://127.0.0.1:{port}", False, log, "/healthz", extra_env=env) as s:
        yield s


def spot_interruption(
    workdir: Path, kubeconfig: str, reconcile_interval: float = 0, env: dict[str, str] | None = None
) -> contextlib.AbstractContextManager[Served]:
    return cloudevents_function("spot-interruption", workdir, kubeconfig, reconcile_interval, env)


def node_added(
    workdir: Path, kubeconfig: str, reconcile_interval: float = 0, env: dict[str, str] | None = None
) -> contextlib.AbstractContextManager[Served]:
    return cloudevents_function("node-added", workdir, kubeconfig, reconcile_interval, env)
