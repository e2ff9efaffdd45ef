"""Each Knative function folder builds on its own, as `func build` sees it.

GIVEN `spotguard package knative` staged the spotguard wheel into a copy of
functions/, WHEN one function's folder is copied alone and installed with pip
into a fresh virtual environment, THEN func-python serves it (as the function
image's entry point does) and it answers a real request against the
simulated cluster.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from spotguard.gateway import kube
from spotguard.gateway import resources as r
from spotguard_sim import testing

from tests.admission import cluster as admission_cluster
from tests.admission.test_e2e import SCENARIO, deployment
from tests.infra import venvs
from tests.infra.test_image import Served, free_port
from tests.interruption import transport_support
from tests.nodeadded import test_transports as node_added_transports

# Fresh virtual environments install from the package index: minutes on a busy machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

FUNCTIONS = sorted(d.name for d in (venvs.ROOT / "functions").iterdir() if (d / "func.yaml").is_file())
# What func-python's entry point does for each invoke mode of func.yaml.
SERVE = {
    "http": "from func_python.http import serve",
    "cloudevent": "from func_python.cloudevent import serve",
}


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """function name -> the python of a fresh venv holding only that folder (and what it requires)."""
    work = tmp_path_factory.mktemp("functions")
    staged = work / "functions"
    shutil.copytree(venvs.ROOT / "functions", staged, ignore=shutil.ignore_patterns("vendor", "__pycache__"))
    printed = venvs.run(
        [str(venvs.BIN / "spotguard"), "package", "knative", "--functions-dir", str(staged), "--out", str(staged)]
    )
    assert len(printed.splitlines()) == len(FUNCTIONS)

    def build(name: str) -> Path:
        alone = work / "alone" / name
        shutil.copytree(staged / name, alone)  # nothing of the repository around it
        python = venvs.new_venv(work / "venvs" / name)
        venvs.run([str(python), "-m", "pip", "install", "--quiet", str(alone)], timeout=900)
        return python

    with ThreadPoolExecutor(max_workers=len(FUNCTIONS)) as pool:
        return dict(zip(FUNCTIONS, pool.map(build, FUNCTIONS), strict=True))


def test_every_function_folder_depends_on_the_staged_wheel_only() -> None:
    import tomllib

    from spotguard import __version__

    for name in FUNCTIONS:
        project = tomllib.loads((venvs.ROOT / "functions" / name / "pyproject.toml").read_text())
        [spotguard] = [d for d in project["project"]["dependencies"] if d.startswith("spotguard")]
        assert spotguard == f"spotguard @ {{root:uri}}/vendor/spotguard-{__version__}-py3-none-any.whl", name
        assert project["tool"]["hatch"]["metadata"]["allow-direct-references"] is True


def test_the_folders_install_spotguard_from_their_vendored_wheel(installed: dict[str, Path]) -> None:
    for name, python in installed.items():
        shown = venvs.run([str(python), "-m", "pip", "show", "-f", "spotguard"])
        assert "Editable project location" not in shown, name
        location = next(line.split(": ", 1)[1] for line in shown.splitlines() if line.startswith("Location: "))
        assert Path(location).is_relative_to(python.parent.parent), name
        direct = json.loads(
            venvs.run(
                [
                    str(python),
                    "-c",
                    "import importlib.metadata as m; print(m.distribution('spotguard').read_text('direct_url.json'))",
                ]
            )
        )
        assert direct["url"].endswith("/vendor/spotguard-0.1.0-py3-none-any.whl"), name


def serve(python: Path, name: str, tmp: Path, **env: str) -> tuple[Served, int]:
    invoke = yaml.safe_load((venvs.ROOT / "functions" / name / "func.yaml").read_text())["invoke"]
    port = free_port()
    code = f"{SERVE[invoke]}\nfrom function import new\nserve(new)\n"
    served = Served(
        [str(python), "-c", code],
        venvs.clean_env(LISTEN_ADDRESS=f"127.0.0.1:{port}", HOME=str(tmp), TMPDIR=str(tmp), **env),
        tmp / f"{name}.log",
    )
    return served, port


@pytest.fixture(scope="module")
def sim_with_web() -> Iterator[tuple[Any, dict[str, Any]]]:
    with testing.running_cluster(SCENARIO) as sim:
        k = kube.Kube(sim.api_client())
        k.create(r.DEPLOYMENTS, deployment("web", 2), "shop")
        rs = transport_support.wait_for(lambda: k.list(r.REPLICASETS, "shop"), timeout=30)
        yield sim, rs[0]


def test_the_admission_folder_served_by_func_python_answers_a_review(
    installed: dict[str, Path], sim_with_web: tuple[Any, dict[str, Any]], tmp_path: Path
) -> None:
    sim, rs = sim_with_web
    served, port = serve(installed["admission"], "admission", tmp_path, KUBECONFIG=sim.kubeconfig)
    try:
        served.wait_until(f"http://127.0.0.1:{port}/health/readiness")
        pod = admission_cluster.pod_for(rs)
        pod["metadata"]["labels"] = dict(rs["spec"]["selector"]["matchLabels"])
        review = admission_cluster.review(pod, "shop")
        answer = requests.post(f"http://127.0.0.1:{port}/mutate", json=review, timeout=30)
        assert answer.status_code == 200
        assert answer.json()["response"]["uid"] == review["request"]["uid"]
        assert admission_cluster.patch_of(answer.json())
    finally:
        served.stop()


def test_the_spot_interruption_folder_served_by_func_python_handles_a_notice(
    installed: dict[str, Path], tmp_path: Path
) -> None:
    event = transport_support.sample("cloudevent-aws-sqs.binary.json")
    with testing.running_cluster(transport_support.scenario()) as sim:
        api = kube.connect(sim.kubeconfig)
        transport_support.wait_for(lambda: len(transport_support.pods_on(api, "spot-a")) == 2, timeout=30)
        served, port = serve(installed["spot-interruption"], "spot-interruption", tmp_path, KUBECONFIG=sim.kubeconfig)
        try:
            served.wait_until(f"http://127.0.0.1:{port}/health/readiness")
            answer = requests.post(
                f"http://127.0.0.1:{port}/", headers=event["headers"], data=event["body"], timeout=60
            )
            assert answer.status_code == 200, answer.text
            assert transport_support.interruption_taint(api.get(r.NODES, "spot-a"))
        finally:
            served.stop()


def test_the_node_added_folder_served_by_func_python_runs_a_pass(installed: dict[str, Path], tmp_path: Path) -> None:
    # A pass deletes the reservation Lease of a ReplicaSet that does not exist: the visible effect.
    with testing.running_cluster(node_added_transports.cluster()) as sim:
        orphans = node_added_transports.Orphans(kube.Kube(sim.api_client()))
        served, port = serve(
            installed["node-added"],
            "node-added",
            tmp_path,
            KUBECONFIG=sim.kubeconfig,
            SPOTGUARD_NAMESPACE="spotguard",
            SPOTGUARD_NODE_JOIN_WAIT_SECONDS="1",
        )
        try:
            served.wait_until(f"http://127.0.0.1:{port}/health/readiness")
            for name in ("cloudevent-ping.binary.json", "cloudevent-apiserversource-node.binary.json"):
                lease = orphans.plant()
                event = transport_support.sample(name)
                answer = requests.post(
                    f"http://127.0.0.1:{port}/", headers=event["headers"], data=event["body"], timeout=60
                )
                assert answer.status_code == 200, (name, answer.text)
                data = node_added_transports.answer_data(dict(answer.headers), answer.content)
                assert data["result"] == "reconciled", (name, data)
                assert not orphans.exists(lease), name
        finally:
            served.stop()
