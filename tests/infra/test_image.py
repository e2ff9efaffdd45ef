"""The container image, tested without a container engine.

The Dockerfile's only install step is scripts/install-image. These tests run
that same script into a fresh virtual environment and then use the result as
the image would be used: `spotguard serve admission` (HTTPS, plain-HTTP
metrics summed over its workers) and `spotguard serve spot-interruption`,
against the simulated cluster, without writing into the installation.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from spotguard.gateway import kube
from spotguard.gateway import resources as r
from spotguard_sim import testing

from tests.admission import cluster as admission_cluster
from tests.admission.test_e2e import SCENARIO, deployment
from tests.infra import venvs
from tests.interruption import transport_support

# Fresh virtual environments install from the package index: minutes on a busy machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

DOCKERFILE = venvs.ROOT / "Dockerfile"
DEV_ONLY = ("pytest", "moto", "ruff", "mypy", "hypothesis", "cfn-lint", "func-python", "aws-lambda-powertools")


def pinned() -> dict[str, str]:
    pins = {}
    for line in (venvs.ROOT / "requirements.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            pins[name.strip().lower().replace("_", "-")] = version.strip()
    return pins


def test_the_dockerfile_installs_with_the_script_and_runs_as_non_root() -> None:
    text = DOCKERFILE.read_text()
    stages = re.findall(r"^FROM\s+(\S+)", text, re.M)
    assert len(stages) >= 2, "multi-stage"
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)", text, re.M)
    assert base and "slim" in base.group(1)
    build, final = text.split("\nFROM ")[-2:]
    runs = re.findall(r"^RUN\s+(.+)$", build, re.M)
    assert runs == ["scripts/install-image /opt/spotguard"], "every install step lives in scripts/install-image"
    assert "COPY --from=build /opt/spotguard /opt/spotguard" in final
    # no installer in the runtime layer: the base image's pip (and ensurepip) go
    [drop] = re.findall(r"^RUN\s+(.+)$", final, re.M)
    assert "pip uninstall" in drop and "ensurepip" in drop
    assert re.search(r"^USER 65532:65532$", final, re.M), "numeric non-root user, as the manifests' runAsUser"
    assert 'ENTRYPOINT ["spotguard"]' in final
    assert "PYTHONDONTWRITEBYTECODE=1" in final
    # Everything the script reads is in the build context.
    ignore = (venvs.ROOT / ".dockerignore").read_text().splitlines()
    needed_files = ("requirements-image.txt", "requirements-image-build.txt", "pyproject.toml", "README.md")
    for needed in (*needed_files, "scripts/install-image", "shared/"):
        assert f"!{needed}" in ignore
        assert needed.rstrip("/") in text


def hashed(path: Path) -> dict[str, tuple[str, list[str]]]:
    """name -> (version, sha256 hashes) of a requirements file in pip's hash-checking form."""
    out: dict[str, tuple[str, list[str]]] = {}
    text = path.read_text().replace("\\\n", " ")
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        spec, *options = line.split()
        name, version = spec.split("==")
        hashes = [o.removeprefix("--hash=sha256:") for o in options]
        assert all(o.startswith("--hash=sha256:") for o in options) and hashes, line
        assert all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes), line
        out[name.lower().replace("_", "-")] = (version, hashes)
    return out


def test_the_image_installs_hashed_pins_with_require_hashes() -> None:
    runtime = hashed(venvs.ROOT / "requirements-image.txt")
    build = hashed(venvs.ROOT / "requirements-image-build.txt")
    assert set(build) == {"setuptools"} and "setuptools" not in runtime
    # the same versions requirements.txt pins (scripts/lock-image writes them from it)
    pins = pinned()
    assert {n: v for n, (v, _) in runtime.items() if pins.get(n) != v} == {}
    assert {"kubernetes", "flask", "gunicorn", "hypercorn", "cloudevents", "boto3", "orjson"} <= set(runtime)
    assert not set(DEV_ONLY) & set(runtime)
    script = (venvs.ROOT / "scripts" / "install-image").read_text()
    installs = [line for line in script.splitlines() if '"${pip_install[@]}"' in line]
    assert len(installs) == 3
    for line, follows in zip(installs[:2], ("requirements-image-build.txt", "requirements-image.txt"), strict=True):
        assert "--require-hashes" in line and "--no-deps" in line and "--only-binary=:all:" in line
        assert follows in script.split(line, 1)[1].splitlines()[1]
    assert "--no-index" in installs[2] and "spotguard-*.whl" in installs[2]  # our own wheel, built just before
    code = "\n".join(line for line in script.splitlines() if not line.lstrip().startswith("#"))
    assert "--constraint" not in code and "requirements.txt" not in code


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """scripts/install-image into a fresh virtual environment (the image's /opt/spotguard)."""
    venv = tmp_path_factory.mktemp("image") / "opt-spotguard"
    venvs.run(
        ["bash", str(venvs.ROOT / "scripts" / "install-image"), str(venv)],
        env=venvs.clean_env(PYTHON=venvs.base_python()),
        timeout=900,
    )
    return venv


def files_of(venv: Path) -> set[str]:
    return {str(p.relative_to(venv)) for p in venv.rglob("*")}


LIST = (
    "import importlib.metadata as m, json; "
    "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))"
)


def test_the_image_holds_spotguard_and_exactly_the_pinned_runtime_dependencies(image: Path) -> None:
    listed = json.loads(venvs.run([str(image / "bin" / "python"), "-c", LIST]))
    installed = {name.lower().replace("_", "-"): version for name, version in listed.items()}
    assert installed.pop("spotguard") == "0.1.0"
    # exactly the hashed pins, and no installer left behind
    assert installed == {name: version for name, (version, _) in hashed(venvs.ROOT / "requirements-image.txt").items()}
    assert "pip" not in installed and not (image / "bin" / "pip").exists()
    assert not list((image / "lib").glob("python3*/site-packages/pip"))
    assert not set(DEV_ONLY) & set(installed)
    assert {"gunicorn", "hypercorn", "flask", "kubernetes", "cloudevents", "orjson"} <= set(installed)
    # Installed as a package, not a link to the checkout.
    [location] = list((image / "lib").glob("python3*/site-packages/spotguard/__init__.py"))
    assert location.is_file()
    out = venvs.run([str(image / "bin" / "spotguard"), "serve", "--help"])
    assert "admission" in out and "spot-interruption" in out
    # the simulated cluster and the operator's commands are not in the in-cluster image
    site = location.parent
    assert not (site.parent / "spotguard_sim").exists()
    assert not (site / "ops").exists() and not (site / "demo.py").exists()
    commands = venvs.run([str(image / "bin" / "spotguard"), "--help"])
    assert "certs" in commands and "reconcile" in commands
    assert not re.search(r"^\s+(sim|demo|simulate|replay|snapshot)\s", commands, re.M)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def sim_with_web() -> Iterator[tuple[Any, dict[str, Any]]]:
    with testing.running_cluster(SCENARIO) as sim:
        k = kube.Kube(sim.api_client())
        k.create(r.DEPLOYMENTS, deployment("web", 2), "shop")
        rs = transport_support.wait_for(lambda: k.list(r.REPLICASETS, "shop"), timeout=30)
        yield sim, rs[0]


class Served:
    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        self.handle = log.open("w")
        self.process = subprocess.Popen(args, env=env, stdout=self.handle, stderr=subprocess.STDOUT)

    def wait_until(self, url: str, **kw: Any) -> requests.Response:
        def ready() -> requests.Response | None:
            assert self.process.poll() is None, f"the server exited:\n{self.log.read_text()[-3000:]}"
            try:
                response = requests.get(url, timeout=5, **kw)
            except requests.ConnectionError:
                return None
            return response if response.status_code == 200 else None

        answer: requests.Response = transport_support.wait_for(ready, timeout=120, interval=0.2)
        return answer

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=60)
        finally:
            self.handle.close()


def admitted(text: str) -> float:
    return sum(float(v) for v in re.findall(r"^spotguard_admission_requests_total\{[^}]*\} (\S+)$", text, re.M))


def test_the_image_serves_the_webhook_over_https_with_metrics_over_http(
    image: Path, sim_with_web: tuple[Any, dict[str, Any]], tmp_path: Path
) -> None:
    sim, rs = sim_with_web
    spotguard = str(image / "bin" / "spotguard")
    certs = tmp_path / "certs"
    venvs.run([spotguard, "certs", "--out", str(certs), "--dns-name", "localhost", "--ip", "127.0.0.1"])
    before = files_of(image)
    port, metrics_port = free_port(), free_port()
    served = Served(
        [
            spotguard,
            "serve",
            "admission",
            "--host",
            "127.0.0.1",
            f"--port={port}",
            f"--metrics-port={metrics_port}",
            "--tls-cert",
            str(certs / "tls.crt"),
            "--tls-key",
            str(certs / "tls.key"),
            "--kubeconfig",
            sim.kubeconfig,
            "--workers",
            "2",
        ],
        venvs.clean_env(TMPDIR=str(tmp_path), HOME=str(tmp_path), SPOTGUARD_NAMESPACE="spotguard"),
        tmp_path / "admission.log",
    )
    try:
        ca = str(certs / "ca.crt")
        served.wait_until(f"https://127.0.0.1:{port}/readyz", verify=ca)
        reviews = 6
        for _ in range(reviews):
            pod = admission_cluster.pod_for(rs)
            pod["metadata"]["labels"] = dict(rs["spec"]["selector"]["matchLabels"])
            review = admission_cluster.review(pod, "shop")
            answer = requests.post(f"https://127.0.0.1:{port}/mutate", json=review, verify=ca, timeout=10)
            assert answer.status_code == 200
            assert admission_cluster.patch_of(answer.json())
        # The plain-HTTP port counts every review, whichever worker answered it.
        transport_support.wait_for(
            lambda: admitted(requests.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text) == reviews,
            timeout=60,
        )
    finally:
        served.stop()
    assert files_of(image) == before, "the server wrote into its installation (read-only root filesystem)"


def test_the_image_serves_spot_interruption_cloudevents(image: Path, tmp_path: Path) -> None:
    ping = transport_support.sample("cloudevent-ping.binary.json")
    with testing.running_cluster(transport_support.scenario()) as sim:
        before = files_of(image)
        port = free_port()
        served = Served(
            [
                str(image / "bin" / "spotguard"),
                "serve",
                "spot-interruption",
                "--host",
                "127.0.0.1",
                f"--port={port}",
                "--kubeconfig",
                sim.kubeconfig,
                "--reconcile-interval",
                "0",
            ],
            venvs.clean_env(TMPDIR=str(tmp_path), HOME=str(tmp_path), SPOTGUARD_NAMESPACE="spotguard"),
            tmp_path / "spot-interruption.log",
        )
        try:
            served.wait_until(f"http://127.0.0.1:{port}/healthz")
            answer = requests.post(f"http://127.0.0.1:{port}/", headers=ping["headers"], data=ping["body"], timeout=30)
            assert answer.status_code == 200, answer.text
            metrics = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
            assert metrics.status_code == 200 and "spotguard_" in metrics.text
        finally:
            served.stop()
    assert files_of(image) == before


def test_the_image_serves_the_webhook_in_plain_http_behind_knative(
    image: Path, sim_with_web: tuple[Any, dict[str, Any]], tmp_path: Path
) -> None:
    # As infra/knative runs it: Knative's cluster-local gateway terminates TLS.
    sim, rs = sim_with_web
    port = free_port()
    served = Served(
        [
            str(image / "bin" / "spotguard"),
            "serve",
            "admission",
            "--plain-http",
            "--host",
            "127.0.0.1",
            f"--port={port}",
            "--kubeconfig",
            sim.kubeconfig,
            "--workers",
            "1",
        ],
        venvs.clean_env(TMPDIR=str(tmp_path), HOME=str(tmp_path), SPOTGUARD_NAMESPACE="spotguard"),
        tmp_path / "admission-plain.log",
    )
    try:
        served.wait_until(f"http://127.0.0.1:{port}/readyz")
        pod = admission_cluster.pod_for(rs)
        pod["metadata"]["labels"] = dict(rs["spec"]["selector"]["matchLabels"])
        answer = requests.post(
            f"http://127.0.0.1:{port}/mutate", json=admission_cluster.review(pod, "shop"), timeout=10
        )
        assert answer.status_code == 200
        assert admission_cluster.patch_of(answer.json())
    finally:
        served.stop()
    refused = subprocess.run(
        [str(image / "bin" / "spotguard"), "serve", "admission", f"--port={port}"],
        capture_output=True,
        text=True,
        env=venvs.clean_env(),
        check=False,
        timeout=60,
    )
    assert refused.returncode == 2 and "--tls-cert and --tls-key are required" in refused.stderr
