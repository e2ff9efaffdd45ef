"""`spotguard package lambda`: one zip per function, each run in a clean Python.

GIVEN the zips built for this machine's Python and architecture, WHEN one is
unpacked into a task directory and its handler is called by a Python with
nothing installed (a venv without even pip) with a real event shape, THEN it
answers as the deployed Lambda would, against the simulated cluster.
"""

from __future__ import annotations

import importlib.metadata
import json
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from spotguard import packaging as packaging_mod
from spotguard.gateway import kube
from spotguard.gateway import resources as r
from spotguard_sim import testing

from tests.admission import cluster as admission_cluster
from tests.admission.test_e2e import SCENARIO, deployment
from tests.infra import venvs
from tests.interruption import transport_support
from tests.nodeadded import test_transports as node_added_transports

# Fresh virtual environments install from the package index: minutes on a busy machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

FUNCTIONS = venvs.ROOT / "functions"
LAMBDA_FUNCTIONS = sorted(d.name for d in FUNCTIONS.iterdir() if (d / "lambda_function.py").is_file())
NEVER_IN_A_ZIP = ("flask", "gunicorn", "hypercorn", "aiohttp", "boto3", "botocore", "cryptography", "moto")
DRIVER = """
import json, sys
task, event_file, result_file = sys.argv[1:4]
sys.path.insert(0, task)  # as the Lambda runtime puts /var/task first
import lambda_function
event = json.load(open(event_file))
result = lambda_function.lambda_handler(event, None)
json.dump(result, open(result_file, "w"))
for name in list(sys.modules):
    module = sys.modules[name]
    origin = getattr(module, "__file__", None) or ""
    if origin and not origin.startswith(task) and "site-packages" in origin:
        raise SystemExit(f"imported from outside the zip: {name} ({origin})")
"""


@pytest.fixture(scope="module")
def packaged(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("lambda-zips")
    printed = venvs.run(
        [
            str(venvs.BIN / "spotguard"),
            "package",
            "lambda",
            "--out",
            str(out),
            "--python-version",
            venvs.PYTHON_VERSION,
            "--arch",
            venvs.LAMBDA_ARCH,
        ],
        env=venvs.clean_env(),
    )
    return out, printed


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clean Python of the Lambda's version: no packages at all, not even pip."""
    return venvs.new_venv(tmp_path_factory.mktemp("runtime") / "venv", with_pip=False)


def invoke(runtime: Path, zip_path: Path, event: Any, tmp: Path, **env: str) -> tuple[Any, str]:
    """Unpack the zip as /var/task and call lambda_handler(event, None) in the clean Python."""
    task = tmp / "task"
    with zipfile.ZipFile(zip_path) as archive:
        archive.extractall(task)
    (tmp / "event.json").write_text(json.dumps(event))
    (tmp / "driver.py").write_text(DRIVER)
    stdout = venvs.run(
        [str(runtime), "-I", str(tmp / "driver.py"), str(task), str(tmp / "event.json"), str(tmp / "result.json")],
        env=venvs.clean_env(HOME=str(tmp), **env),
        timeout=120,
    )
    return json.loads((tmp / "result.json").read_text()), stdout


def emf_lines(stdout: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in stdout.splitlines() if line.startswith("{") and '"_aws"' in line]
    return lines


def test_one_zip_per_function_with_its_size_printed(packaged: tuple[Path, str]) -> None:
    out, printed = packaged
    assert LAMBDA_FUNCTIONS and {"admission", "spot-interruption", "node-added"} <= set(LAMBDA_FUNCTIONS)
    assert sorted(p.stem for p in out.glob("*.zip")) == LAMBDA_FUNCTIONS
    for name in LAMBDA_FUNCTIONS:
        zip_path = out / f"{name}.zip"
        [line] = [line for line in printed.splitlines() if str(zip_path) in line]
        assert "MiB zipped" in line and "MiB unpacked" in line
        with zipfile.ZipFile(zip_path) as archive:
            names = archive.namelist()
            total = sum(i.file_size for i in archive.infolist())
        assert "lambda_function.py" in names
        assert (FUNCTIONS / name / "lambda_function.py").read_bytes() == zipfile.ZipFile(zip_path).read(
            "lambda_function.py"
        )
        tops = {n.split("/")[0] for n in names}
        assert not {t for t in tops if t.split("-")[0].lower() in NEVER_IN_A_ZIP}, tops
        never = ("spotguard_sim/", "spotguard/ops/", "kubernetes/aio/")
        assert not [n for n in names if n.startswith(never) or n.endswith(".pyc")]
        assert "spotguard/demo.py" not in names and "spotguard/cli.py" not in names
        assert total < 60 * 2**20, f"{name}: {total} bytes unpacked"


def test_the_zips_are_reproducible(packaged: tuple[Path, str], tmp_path: Path) -> None:
    out, _ = packaged
    again = packaging_mod._zip(
        "x", tmp_path / "x.zip", [("lambda_function.py", FUNCTIONS / "admission" / "lambda_function.py")]
    )
    first = packaging_mod._zip(
        "y", tmp_path / "y.zip", [("lambda_function.py", FUNCTIONS / "admission" / "lambda_function.py")]
    )
    assert again.path.read_bytes() == first.path.read_bytes()
    assert all(info.date_time == packaging_mod.ZIP_TIME for info in zipfile.ZipFile(out / "admission.zip").infolist())


def test_the_lambda_dependency_set_is_closed() -> None:
    # Every requirement of a packaged distribution is packaged, provided by the runtime, or unused.
    allowed = {n.lower() for n in packaging_mod.LAMBDA_DISTRIBUTIONS + packaging_mod.LAMBDA_PROVIDED}
    allowed |= set(packaging_mod.LAMBDA_UNUSED)
    missing = []
    for name in packaging_mod.LAMBDA_DISTRIBUTIONS:
        for text in importlib.metadata.requires(name) or []:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            if req.name.lower().replace("_", "-") not in allowed:
                missing.append(f"{name} needs {req}")
    assert missing == []


@pytest.fixture(scope="module")
def admission_cluster_env() -> Iterator[tuple[Any, dict[str, Any]]]:
    with testing.running_cluster(SCENARIO) as sim:
        k = kube.Kube(sim.api_client())
        k.create(r.DEPLOYMENTS, deployment("web", 2), "shop")
        rs = transport_support.wait_for(lambda: k.list(r.REPLICASETS, "shop"), timeout=30)
        yield sim, rs[0]


def test_admission_zip_answers_a_function_url_event(
    packaged: tuple[Path, str], runtime: Path, admission_cluster_env: tuple[Any, dict[str, Any]], tmp_path: Path
) -> None:
    sim, rs = admission_cluster_env
    pod = admission_cluster.pod_for(rs)
    pod["metadata"]["labels"] = dict(rs["spec"]["selector"]["matchLabels"])
    review = admission_cluster.review(pod, "shop")
    event = json.loads((venvs.ROOT / "tests" / "admission" / "payloads" / "lambda-function-url-event.json").read_text())
    event["body"] = json.dumps(review)
    event["isBase64Encoded"] = False
    result, stdout = invoke(
        runtime,
        packaged[0] / "admission.zip",
        event,
        tmp_path,
        KUBECONFIG=sim.kubeconfig,
        SPOTGUARD_NAMESPACE="spotguard",
    )
    assert result["statusCode"] == 200
    answer = json.loads(result["body"])
    assert answer["response"]["uid"] == review["request"]["uid"]
    ops = admission_cluster.patch_of(answer)
    assert any(op["path"] == "/metadata/labels/spotguard.io~1placement" for op in ops)
    [metrics] = emf_lines(stdout)
    assert metrics["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "spotguard"
    assert metrics["service"] == "admission"
    assert (metrics["Reviews"], metrics["Patched"]) == ([1.0], [1.0])  # EMF values are lists


def test_spot_interruption_zip_handles_an_sqs_batch(packaged: tuple[Path, str], runtime: Path, tmp_path: Path) -> None:
    event = transport_support.sample("sqs-batch.json")
    with testing.running_cluster(transport_support.scenario()) as sim:
        api = kube.connect(sim.kubeconfig)
        transport_support.wait_for(lambda: len(transport_support.pods_on(api, "spot-a")) == 2, timeout=30)
        result, stdout = invoke(
            runtime,
            packaged[0] / "spot-interruption.zip",
            event,
            tmp_path,
            KUBECONFIG=sim.kubeconfig,
            SPOTGUARD_NAMESPACE="spotguard",
        )
        assert result == {"batchItemFailures": []}
        node = api.get(r.NODES, "spot-a")
        assert transport_support.interruption_taint(node)
        # the surge is web's copy (the default): its two pods on spot-a, spec.replicas untouched
        transport_support.assert_copy_surge(api, "web", 2, 2)
    [metrics] = emf_lines(stdout)
    assert metrics["service"] == "spot-interruption"
    assert (metrics["Messages"], metrics["BatchItemFailures"]) == ([float(len(event["Records"]))], [0.0])


def test_a_zip_reports_an_unreachable_cluster_as_retries(
    packaged: tuple[Path, str], runtime: Path, tmp_path: Path
) -> None:
    # GIVEN no cluster behind the kubeconfig, WHEN a notice arrives, THEN it is retried, not lost
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n"
    )
    event = transport_support.sample("sqs-batch.json")
    result, stdout = invoke(runtime, packaged[0] / "spot-interruption.zip", event, tmp_path, KUBECONFIG=str(kubeconfig))
    assert result["batchItemFailures"], result
    [metrics] = emf_lines(stdout)
    assert metrics["BatchItemFailures"] == [float(len(result["batchItemFailures"]))]


def test_node_added_zip_runs_a_pass_for_an_instance_running_and_a_schedule(
    packaged: tuple[Path, str], runtime: Path, tmp_path: Path
) -> None:
    # A pass deletes the reservation Lease of a ReplicaSet that does not exist: the visible effect.
    with testing.running_cluster(node_added_transports.cluster()) as sim:
        orphans = node_added_transports.Orphans(kube.Kube(sim.api_client()))
        for name in ("ec2-instance-state-change-notification.running.json", "eventbridge-scheduled-event.json"):
            lease = orphans.plant()
            (tmp_path / name).mkdir()
            result, _ = invoke(
                runtime,
                packaged[0] / "node-added.zip",
                transport_support.sample(name),
                tmp_path / name,
                KUBECONFIG=sim.kubeconfig,
                SPOTGUARD_NAMESPACE="spotguard",
                SPOTGUARD_NODE_JOIN_WAIT_SECONDS="1",
            )
            assert result["result"] == "reconciled", (name, result)
            assert not orphans.exists(lease), name
            if "running" in name:
                assert result["joined"] is True
                assert result["trigger"]["instance_id"] == node_added_transports.SAMPLE_INSTANCE
