"""`spotguard sim serve` in a subprocess, as a user starts it, for the suites that reach it
only through a kubeconfig (upstream's own e2e files)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@contextmanager
def serving(tmp: Path) -> Iterator[Path]:
    """`spotguard sim serve --kubeconfig` (the small scenario) in a subprocess; yields the
    kubeconfig it wrote; stops it with SIGINT (killed after 10 s)."""
    kubeconfig = tmp / "kubeconfig"
    serve = subprocess.Popen(
        [sys.executable, "-m", "spotguard.cli", "sim", "serve", "--kubeconfig", str(kubeconfig),
         "--scenario", str(REPO / "infra" / "scenarios" / "small.yaml")],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not kubeconfig.exists():
            assert serve.poll() is None, serve.stderr.read().decode() if serve.stderr else "died"
            assert time.monotonic() < deadline, "spotguard sim serve did not write its kubeconfig"
            time.sleep(0.1)
        yield kubeconfig
    finally:
        serve.send_signal(signal.SIGINT)
        try:
            serve.wait(10)
        except subprocess.TimeoutExpired:
            serve.kill()
            serve.wait()
