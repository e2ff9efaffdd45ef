"""kubernetes-client/python's own e2e files, unmodified, against `spotguard sim serve`.

The files (``kubernetes/e2e_test/`` of https://github.com/kubernetes-client/python)
are not in the ``kubernetes`` wheel nor in any sdist on PyPI (36.0.3, 29.0.0 and
12.0.1 checked), and CI reaches no GitHub, so this is a check run by hand, not a test
CI collects (a skipped test would pass for nothing):

    python -m tests.sim.upstream_client_e2e CHECKOUT

runs them as their maintainers do (``pytest kubernetes/e2e_test`` from the checkout's
root), reaching the simulated cluster through the kubeconfig they read
(``base.get_e2e_configuration`` loads ``$KUBECONFIG``); it exits non-zero when any
fails. In CI, ``tests/sim/test_upstream_dynamic_client_e2e.py`` runs the upstream e2e
files the wheel does ship, and ``tests/sim/test_client_e2e.py`` is the port of these.

Deselected, each with its reason (no container runs in a simulated cluster):
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.sim import served

FILES = ("test_client.py", "test_apps.py", "test_batch.py", "test_watch.py", "test_informer.py")
DESELECTED = {
    "test_client.py::TestClient::test_pod_apis": "execs into the pod (websocket exec)",
    "test_client.py::TestClient::test_exit_code": "execs commands and reads their exit codes",
    "test_client.py::TestClient::test_portforward_raw": "port-forwards to a server in the pod",
    "test_client.py::TestClient::test_portforward_http": "port-forwards to nginx in the pod",
}
__doc__ = (__doc__ or "") + "".join(f"\n- ``{k}``: {v}" for k, v in DESELECTED.items()) + "\n"


def check(checkout: str, tmp_path: Path) -> None:
    """Run the upstream files from ``checkout`` against a fresh simulated cluster (raises on failure)."""
    suite = Path(checkout) / "kubernetes" / "e2e_test"
    assert (suite / "base.py").is_file(), f"{suite} is not kubernetes-client/python's e2e_test"
    with served.serving(tmp_path) as kubeconfig:
        args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                "--rootdir", str(checkout), *(f"kubernetes/e2e_test/{f}" for f in FILES)]
        for test_id in DESELECTED:  # node ids relative to the checkout's root
            args += ["--deselect", f"kubernetes/e2e_test/{test_id}"]
        env = {**os.environ, "KUBECONFIG": str(kubeconfig), "PYTHONPATH": str(checkout)}
        result = subprocess.run(args, cwd=checkout, env=env, capture_output=True, text=True,
                                timeout=600, check=False)
        assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
        assert " passed" in result.stdout and " failed" not in result.stdout
        left_out = re.search(r"(\d+) deselected", result.stdout)
        assert left_out is None or int(left_out.group(1)) <= len(DESELECTED)  # nothing else


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.sim.upstream_client_e2e CHECKOUT (of kubernetes-client/python)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        check(argv[0], Path(tmp))
    print("the upstream e2e files passed against spotguard sim serve")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
