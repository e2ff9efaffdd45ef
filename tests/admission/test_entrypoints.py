"""The Knative function (driven the way func-python drives it: ASGI lifespan and
http scopes through ``func_python.http.ASGIApplication``) and the Lambda handler
(Function URL payload 2.0 events), both against the simulated cluster."""

from __future__ import annotations

import asyncio
import base64
import copy
import importlib.util
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from func_python.http import ASGIApplication
from spotguard.gateway import kube
from spotguard.gateway import resources as r
from spotguard_sim import testing

from tests.admission import cluster
from tests.admission.test_e2e import SCENARIO, deployment

FUNCTION_DIR = Path(__file__).parents[2] / "functions" / "admission"
PAYLOADS = Path(__file__).parent / "payloads"


def load_module(name: str, path: Path, package_dir: Path | None = None) -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        name, path, submodule_search_locations=[str(package_dir)] if package_dir else None
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def sim_env() -> Iterator[tuple[Any, dict[str, Any]]]:
    """A simulated cluster with a Deployment ``web`` (2 replicas) and its ReplicaSet."""
    with testing.running_cluster(SCENARIO) as sim:
        k = kube.Kube(sim.api_client())
        k.create(r.DEPLOYMENTS, deployment("web", 2), "shop")
        deadline = time.monotonic() + 20
        while not k.list(r.REPLICASETS, "shop"):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        yield sim, k.list(r.REPLICASETS, "shop")[0]


@pytest.fixture
def cluster_env(sim_env: tuple[Any, dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> tuple[Any, dict[str, Any]]:
    sim, rs = sim_env
    monkeypatch.setenv("KUBECONFIG", sim.kubeconfig)
    monkeypatch.setenv("SPOTGUARD_NAMESPACE", "spotguard")
    return sim, rs


def review_for(rs: dict[str, Any]) -> dict[str, Any]:
    pod = cluster.pod_for(rs)
    pod["metadata"]["labels"] = dict(rs["spec"]["selector"]["matchLabels"])
    return cluster.review(pod, "shop")


# -- Knative -------------------------------------------------------------------------------


class AsgiDriver:
    """Speaks ASGI to func-python's application object, as hypercorn does."""

    def __init__(self, app: ASGIApplication) -> None:
        self.app = app
        self.loop = asyncio.new_event_loop()
        self.lifespan_in: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.lifespan_out: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.lifespan = self.loop.create_task(
            self.app({"type": "lifespan", "asgi": {"version": "3.0"}}, self.lifespan_in.get, self.lifespan_out.put)
        )

    def _run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def startup(self) -> None:
        self._run(self.lifespan_in.put({"type": "lifespan.startup"}))
        assert self._run(self.lifespan_out.get()) == {"type": "lifespan.startup.complete"}

    def shutdown(self) -> None:
        self._run(self.lifespan_in.put({"type": "lifespan.shutdown"}))
        assert self._run(self.lifespan_out.get()) == {"type": "lifespan.shutdown.complete"}
        self._run(self.lifespan)
        self.loop.close()

    def request(
        self, method: str, path: str, body: bytes = b"", chunk: int = 65536
    ) -> tuple[int, dict[str, str], bytes]:
        pieces = [body[i : i + chunk] for i in range(0, len(body), chunk)] or [b""]
        messages = [{"type": "http.request", "body": p, "more_body": i < len(pieces) - 1} for i, p in enumerate(pieces)]
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return messages.pop(0) if messages else {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"timeout=3s",
            "headers": [(b"content-type", b"application/json"), (b"host", b"spotguard-admission.spotguard.svc")],
        }
        self._run(self.app(scope, receive, send))
        start = next(m for m in sent if m["type"] == "http.response.start")
        payload = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
        headers = {k.decode(): v.decode() for k, v in start.get("headers", [])}
        return start["status"], headers, payload


@pytest.fixture
def knative(cluster_env: tuple[Any, dict[str, Any]]) -> Iterator[AsgiDriver]:
    package = load_module(
        "spotguard_admission_function", FUNCTION_DIR / "function" / "__init__.py", FUNCTION_DIR / "function"
    )
    driver = AsgiDriver(ASGIApplication(package.new()))
    driver.startup()
    yield driver
    driver.shutdown()


def test_knative_function_answers_a_review_with_a_placement(
    knative: AsgiDriver, cluster_env: tuple[Any, dict[str, Any]]
) -> None:
    _, rs = cluster_env
    review = review_for(rs)
    status, headers, body = knative.request("POST", "/mutate", json.dumps(review).encode(), chunk=500)
    assert status == 200 and headers["content-type"] == "application/json"
    answer = json.loads(body)
    assert answer["response"]["uid"] == review["request"]["uid"]
    ops = cluster.patch_of(answer)
    assert any(op["path"] == "/metadata/labels/spotguard.io~1placement" for op in ops)


def test_knative_health_endpoints_and_bad_input(knative: AsgiDriver) -> None:
    assert knative.request("GET", "/health/liveness")[0] == 200
    assert knative.request("GET", "/health/readiness") == (200, {"content-type": "text/plain"}, b"OK")
    status, _, body = knative.request("POST", "/mutate", b"{nope")
    assert status == 400 and json.loads(body)["reason"] == "NotJSON"
    status, _, body = knative.request("POST", "/", b" " * (3 * 1024 * 1024 + 1))
    assert status == 413
    status, _, _ = knative.request("GET", "/metrics")
    assert status == 200


# -- Lambda --------------------------------------------------------------------------------


@pytest.fixture
def lambda_module(cluster_env: tuple[Any, dict[str, Any]]) -> ModuleType:
    return load_module("spotguard_admission_lambda", FUNCTION_DIR / "lambda_function.py")


def function_url_event(
    body: bytes, *, base64_encoded: bool = False, method: str = "POST", path: str = "/mutate"
) -> dict[str, Any]:
    event = json.loads((PAYLOADS / "lambda-function-url-event.json").read_text())
    event["body"] = base64.b64encode(body).decode() if base64_encoded else body.decode()
    event["isBase64Encoded"] = base64_encoded
    event["rawPath"] = path
    event["requestContext"]["http"].update(method=method, path=path)
    return event


@pytest.mark.parametrize("base64_encoded", [False, True])
def test_lambda_handler_answers_a_function_url_event(
    lambda_module: ModuleType, cluster_env: tuple[Any, dict[str, Any]], base64_encoded: bool
) -> None:
    _, rs = cluster_env
    review = review_for(rs)
    result = lambda_module.lambda_handler(
        function_url_event(json.dumps(review).encode(), base64_encoded=base64_encoded), None
    )
    assert result["statusCode"] == 200
    assert result["headers"]["Content-Type"] == "application/json"
    answer = json.loads(result["body"])
    assert answer["kind"] == "AdmissionReview" and answer["response"]["uid"] == review["request"]["uid"]
    assert any(op["path"] == "/metadata/labels/spotguard.io~1placement" for op in cluster.patch_of(answer))


def test_lambda_handler_bad_input_is_a_4xx(lambda_module: ModuleType) -> None:
    bad = function_url_event(b"", base64_encoded=True)
    bad["body"] = "***not base64***"
    assert lambda_module.lambda_handler(bad, None)["statusCode"] == 400
    assert lambda_module.lambda_handler(function_url_event(b"[1, 2"), None)["statusCode"] == 400
    wrong = copy.deepcopy(json.loads((PAYLOADS / "deployment-pod.json").read_text()))
    wrong["apiVersion"] = "admission.k8s.io/v1beta1"
    result = lambda_module.lambda_handler(function_url_event(json.dumps(wrong).encode()), None)
    assert result["statusCode"] == 400 and json.loads(result["body"])["reason"] == "WrongType"
    health = lambda_module.lambda_handler(function_url_event(b"", method="GET", path="/healthz"), None)
    assert health["statusCode"] == 200


def test_the_knative_project_keeps_one_instance_warm_and_uses_the_python_runtime() -> None:
    import yaml

    func = yaml.safe_load((FUNCTION_DIR / "func.yaml").read_text())
    assert func["runtime"] == "python"
    assert func["deploy"]["options"]["scale"]["min"] >= 1  # a webhook must not cold-start
    assert func["deploy"]["healthEndpoints"] == {"liveness": "/health/liveness", "readiness": "/health/readiness"}
    # only the API server calls it: never exposed outside the cluster
    assert {"key": "networking.knative.dev/visibility", "value": "cluster-local"} in func["deploy"]["labels"]
    pyproject = (FUNCTION_DIR / "pyproject.toml").read_text()
    assert "func-python==0.8.1" in pyproject
