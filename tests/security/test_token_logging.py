"""The EKS bearer token a Lambda signs is never logged, not even at DEBUG.

GIVEN the admission and spot-interruption Lambda handlers configured for EKS
(``SPOTGUARD_EKS_CLUSTER``: a token from a presigned STS GetCallerIdentity URL),
pointed at the simulated cluster, with ``SPOTGUARD_LOG_LEVEL=DEBUG``; WHEN each
handles a real event (so requests carry the token); THEN neither the token nor
its signature (from which, with the rest of botocore's DEBUG lines, the
presigned URL and so the token can be rebuilt) appears in any log record or on
stderr.
"""

from __future__ import annotations

import base64
import copy
import json
import logging
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from spotguard.gateway import eks, kube
from spotguard.gateway import resources as r
from spotguard_sim import objects, testing

from tests.fuzz import entrypoints, inputs

ROOT = Path(__file__).resolve().parents[2]


class Everything(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.texts: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.texts.append(f"{record.name} {record.getMessage()} {record.__dict__!r}")


@pytest.fixture
def debug_logs() -> Iterator[Everything]:
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    quiet = {name: logging.getLogger(name).level for name in ("botocore", "botocore.auth", "urllib3", "kubernetes")}
    handler = Everything()
    root.addHandler(handler)
    try:
        yield handler
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        for name, value in quiet.items():
            logging.getLogger(name).setLevel(value)


def signature(token: str) -> str:
    body = token.removeprefix("Bearer ").removeprefix(eks.TOKEN_PREFIX)
    url = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode()
    return parse_qs(urlsplit(url).query)["X-Amz-Signature"][0]


def review_of_a_live_pod(k: kube.Kube) -> dict[str, Any]:
    pods = [p for p in k.list(r.PODS, "shop") if p["metadata"].get("ownerReferences")]
    assert pods
    pod = copy.deepcopy(pods[0])
    pod["metadata"] = {
        "generateName": pod["metadata"]["generateName"],
        "namespace": "shop",
        "labels": pod["metadata"]["labels"],
        "ownerReferences": pod["metadata"]["ownerReferences"],
    }
    pod["spec"].pop("nodeName", None)
    pod.pop("status", None)
    review = json.loads((inputs.REVIEWS / "deployment-pod.json").read_text())
    review["request"].update(uid=str(uuid.uuid4()), namespace="shop", object=pod, name="")
    return review


def test_the_eks_token_is_never_logged(
    debug_logs: Everything, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    template = objects.pod_template("web", containers=[objects.container("web", cpu="100m")])
    scenario = [
        objects.namespace("shop"),
        objects.namespace("spotguard"),  # where the admission Leases live
        objects.node("od-a", "on-demand", provider=objects.provider_id("us-east-1a", "i-0aaaaaaaaaaaaaaa1")),
        objects.node("spot-a", "spot", provider=objects.provider_id("us-east-1a", "i-1234567890abcdef0")),
        objects.deployment("web", 2, namespace="shop", template=template),
    ]
    with testing.running_cluster(scenario) as sim:
        k = kube.Kube(sim.api_client())
        # The EKS access entry of the Lambdas' principal: a group bound to cluster-admin.
        sim.map_aws_access_key(
            "AKIAIOSFODNN7EXAMPLE", "arn:aws:sts::123456789012:assumed-role/spotguard/test", ("spotguard:test",)
        )
        sim.store.create(
            "clusterrolebindings",
            {
                "metadata": {"name": "spotguard-test"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "spotguard:test"}],
            },
        )
        deadline = time.monotonic() + 30
        while not [p for p in k.list(r.PODS, "shop") if p["metadata"].get("ownerReferences")]:
            assert time.monotonic() < deadline, "the sim made no pod"
            time.sleep(0.1)
        assert sim.ca_pem is not None
        for name in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_SESSION_TOKEN"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HOME", str(tmp_path))
        monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "aws-config"))
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "aws-credentials"))
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAIOSFODNN7EXAMPLE")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
        monkeypatch.setenv("AWS_REGION", "us-east-1")
        monkeypatch.setenv("SPOTGUARD_EKS_CLUSTER", "prod")
        monkeypatch.setenv("SPOTGUARD_EKS_ENDPOINT", sim.url)
        monkeypatch.setenv("SPOTGUARD_EKS_CA", base64.b64encode(sim.ca_pem).decode())
        monkeypatch.setenv("SPOTGUARD_LOG_LEVEL", "DEBUG")

        admission = entrypoints.load(ROOT / "functions" / "admission" / "lambda_function.py")
        event = inputs.function_url_event()
        event["body"], event["isBase64Encoded"] = json.dumps(review_of_a_live_pod(k)), False
        answer = admission.lambda_handler(event, None)
        response = json.loads(answer["body"])["response"]
        assert "spotguard.io/placement" in response["auditAnnotations"], response  # decided with the API

        interruption = entrypoints.load(ROOT / "functions" / "spot-interruption" / "lambda_function.py")
        notice = json.loads((inputs.EVENTS / "ec2-spot-instance-interruption-warning.json").read_text())
        notice["time"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        assert interruption.lambda_handler(notice, None)["result"] == "done"

        # admission wraps its client in a per-review deadline (DeadlineKube.base is the client)
        clients = [getattr(admission._state["ctx"].kube, "base", admission._state["ctx"].kube)]
        clients.append(interruption._state["handler"].handler.kube)
        tokens = [c.api_client.configuration.api_key["BearerToken"] for c in clients]
    assert logging.getLogger().level == logging.DEBUG  # the handlers did log at DEBUG
    assert any("botocore" in text for text in debug_logs.texts)  # botocore was heard from
    out, err = capfd.readouterr()
    logged = "\n".join([*debug_logs.texts, out, err])
    for token in tokens:
        assert token.startswith("Bearer " + eks.TOKEN_PREFIX)
        assert token.removeprefix("Bearer ") not in logged
        assert token.removeprefix("Bearer ")[:60] not in logged
        assert signature(token) not in logged, "the token's signature was logged"
