"""Start the real admission server (``spotguard serve admission``) in a subprocess, over HTTPS."""

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
class Server:
    url: str
    ca: str
    process: subprocess.Popen[bytes]
    log: Path


def make_certs(directory: Path) -> certs.Paths:
    return certs.make(directory, ["localhost"], ips=["127.0.0.1"])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def running(
    tls: certs.Paths,
    workdir: Path,
    *,
    kubeconfig: str | None = None,
    workers: int | None = 1,
    threads: int | None = 8,
    env: dict[str, str] | None = None,
) -> Iterator[Server]:
    with running_many(1, tls, workdir, kubeconfig=kubeconfig, workers=workers, threads=threads, env=env) as many:
        yield many[0]


@contextlib.contextmanager
def running_many(
    count: int,
    tls: certs.Paths,
    workdir: Path,
    *,
    kubeconfig: str | None = None,
    workers: int | None = 1,
    threads: int | None = 8,
    env: dict[str, str] | None = None,
) -> Iterator[list[Server]]:
    """``count`` separate server processes, started at once."""
    started: list[Server] = []
    try:
        for _ in range(count):
            started.append(_start(tls, workdir, kubeconfig=kubeconfig, workers=workers, threads=threads, env=env))
        for server in started:
            _wait(server)
        yield started
    finally:
        for server in started:
            server.process.send_signal(signal.SIGINT)  # gunicorn: quick shutdown
        for server in started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                server.process.wait(10)
            # The whole group (its own session): a master killed or gone alone left its
            # workers running, orphaned, after some runs.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.process.pid, signal.SIGKILL)
            server.process.wait()


def _start(
    tls: certs.Paths,
    workdir: Path,
    *,
    kubeconfig: str | None,
    workers: int | None,
    threads: int | None,
    env: dict[str, str] | None,
) -> Server:
    port = free_port()
    args = [sys.executable, "-m", "spotguard.cli", "--log-level", "WARNING", "serve", "admission"]
    args += ["--host", "127.0.0.1", "--port", str(port), "--tls-cert", str(tls.cert), "--tls-key", str(tls.key)]
    if workers is not None:  # None: the server's own default sizing
        args += ["--workers", str(workers)]
    if threads is not None:
        args += ["--threads", str(threads)]
    if kubeconfig:
        args += ["--kubeconfig", kubeconfig]
    environment = {k: v for k, v in os.environ.items() if k != "KUBECONFIG" and not k.startswith("SPOTGUARD_")}
    environment["HOME"] = str(workdir)  # no ~/.kube/config of the machine
    environment.update(env or {})
    log = workdir / f"server-{port}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            args, stdout=out, stderr=subprocess.STDOUT, env=environment, start_new_session=True
        )
    return Server(f"https://127.0.0.1:{port}", str(tls.ca_cert), process, log)


def _wait(server: Server, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if server.process.poll() is not None:
            raise RuntimeError(f"server exited: {server.log.read_text()[-2000:]}")
        try:
            if requests.get(server.url + "/healthz", verify=server.ca, timeout=1).ok:
                return
        except requests.RequestException:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"server did not start: {server.log.read_text()[-2000:]}")
        time.sleep(0.1)
