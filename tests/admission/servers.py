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
    workers: int = 1,
    threads: int = 8,
    env: dict[str, str] | None = None,
) -> Iterator[Server]:
    port = free_port()
    args = [sys.executable, "-m", "spotguard.cli", "--log-level", "WARNING", "serve", "admission"]
    args += ["--host", "127.0.0.1", "--port", str(port), "--tls-cert", str(tls.cert), "--tls-key", str(tls.key)]
    args += ["--workers", str(workers), "--threads", str(threads)]
    if kubeconfig:
        args += ["--kubeconfig", kubeconfig]
    environment = {k: v for k, v in os.environ.items() if k != "KUBECONFIG" and not k.startswith("SPOTGUARD_")}
    environment["HOME"] = str(workdir)  # no ~/.kube/config of the machine
    environment.update(env or {})
    log = workdir / f"server-{port}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=environment)
    url = f"https://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"server exited: {log.read_text()[-2000:]}")
            try:
                if requests.get(url + "/healthz", verify=str(tls.ca_cert), timeout=1).ok:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"server did not start: {log.read_text()[-2000:]}")
            time.sleep(0.1)
        yield Server(url, str(tls.ca_cert), process, log)
    finally:
        process.send_signal(signal.SIGINT)  # gunicorn: quick shutdown
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
