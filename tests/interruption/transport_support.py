"""Shared pieces of the transport tests: sample events, moto in server mode, a small cluster.

Fixtures defined here are imported by the test modules that use them.
"""

from __future__ import annotations

import hashlib
import importlib.util
import itertools
import json
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from spotguard.policy.notices import Notice
from spotguard_sim import objects

ROOT = Path(__file__).resolve().parents[2]
EVENTS = ROOT / "tests" / "events"
GOLDEN = Path(__file__).resolve().parent / "golden"
FUNCTION_DIR = ROOT / "functions" / "spot-interruption"

REGION = "us-east-2"
CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}

# The EC2 event pattern of the spot-interruption rule (as infra/aws deploys it).
EC2_PATTERN = {
    "source": ["aws.ec2"],
    "detail-type": [
        "EC2 Spot Instance Interruption Warning",
        "EC2 Instance Rebalance Recommendation",
        "EC2 Instance State-change Notification",
    ],
}

# The instance in the AWS documentation's samples, and a second one.
SPOT_INSTANCE = "i-1234567890abcdef0"
NTH_INSTANCE = "i-0b662ef9931388ba0"
ON_DEMAND_INSTANCE = "i-0aaaaaaaaaaaaaaa1"


def sample(name: str) -> Any:
    """A file of tests/events, parsed."""
    return json.loads((EVENTS / name).read_text())


# -- a handler that records what it was given -------------------------------------------------


@dataclass
class RecordingHandler:
    """Answers each notice with the outcome its instance id maps to (default ``done``).

    Stands in for the interruption handler where a test is about a transport, not
    about what the handler does to a cluster.
    """

    outcomes: Mapping[str, str] = field(default_factory=dict)
    raises: Exception | None = None
    calls: list[list[Notice]] = field(default_factory=list)
    reconciles: int = 0
    reconcile_raises: Exception | None = None
    delay: float = 0.0

    def handle(self, notices: Sequence[Notice]) -> list[str]:
        self.calls.append(list(notices))
        if self.delay:
            time.sleep(self.delay)
        if self.raises is not None:
            raise self.raises
        return [self.outcomes.get(n.instance_id, "done") for n in notices]

    def reconcile(self) -> None:
        self.reconciles += 1
        if self.reconcile_raises is not None:
            raise self.reconcile_raises


# -- the Lambda SQS batch shape ----------------------------------------------------------------


def lambda_batch(messages: Sequence[Mapping[str, Any]], queue_arn: str, region: str = REGION) -> dict[str, Any]:
    """The event the Lambda SQS event source mapping sends for messages from ReceiveMessage.

    Field for field as Lambda documents it: camelCase record keys, the system
    attributes as strings, message attributes with lower-case keys.
    """
    records = []
    for m in messages:
        attributes = dict(m.get("Attributes") or {})
        message_attributes = {
            name: {
                "stringValue": value.get("StringValue"),
                "stringListValues": [],
                "binaryListValues": [],
                "dataType": value["DataType"],
            }
            for name, value in (m.get("MessageAttributes") or {}).items()
        }
        records.append(
            {
                "messageId": m["MessageId"],
                "receiptHandle": m["ReceiptHandle"],
                "body": m["Body"],
                "attributes": attributes,
                "messageAttributes": message_attributes,
                "md5OfBody": m["MD5OfBody"],
                "eventSource": "aws:sqs",
                "eventSourceARN": queue_arn,
                "awsRegion": region,
            }
        )
    return {"Records": records}


def record(body: str, message_id: str, receive_count: str = "1") -> dict[str, Any]:
    """One Lambda SQS record with ``body``."""
    return {
        "messageId": message_id,
        "receiptHandle": f"AQEB{message_id}",
        "body": body,
        "attributes": {
            "ApproximateReceiveCount": receive_count,
            "SentTimestamp": "1636666194183",
            "SenderId": "AIDAIENQZJOLO23YVJ4VO",
            "ApproximateFirstReceiveTimestamp": "1636666194185",
        },
        "messageAttributes": {},
        "md5OfBody": hashlib.md5(body.encode()).hexdigest(),
        "eventSource": "aws:sqs",
        "eventSourceARN": f"arn:aws:sqs:{REGION}:123456789012:spotguard-interruptions",
        "awsRegion": REGION,
    }


# -- moto in server mode -----------------------------------------------------------------------


@dataclass
class Moto:
    url: str

    def client(self, service: str, region: str = REGION) -> Any:
        import boto3

        return boto3.client(service, endpoint_url=self.url, region_name=region, **CREDENTIALS)


@pytest.fixture(scope="session")
def moto_server() -> Iterator[Moto]:
    import os

    from moto.server import ThreadedMotoServer

    # The EC2 backend loads every public AMI when it starts (seconds); no test needs them.
    os.environ.setdefault("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield Moto(f"http://{host}:{port}")
    finally:
        server.stop()


_names = itertools.count()


def unique(prefix: str) -> str:
    return f"{prefix}-{next(_names)}-{int(time.time() * 1000) % 100000}"


@pytest.fixture
def aws_env(moto_server: Moto, monkeypatch: pytest.MonkeyPatch) -> Moto:
    """The environment a deployed function reads, pointed at moto (boto3 honours AWS_ENDPOINT_URL)."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server.url)
    monkeypatch.setenv("AWS_REGION", REGION)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return moto_server


# -- a small simulated cluster -----------------------------------------------------------------


def node(name: str, capacity: str, instance: str, zone: str = "us-east-2a") -> dict[str, Any]:
    return objects.node(name, capacity, zone=zone, cpu="8", memory="32Gi", provider=objects.provider_id(zone, instance))


def deployment(name: str, replicas: int, node_name: str, namespace: str = "shop") -> dict[str, Any]:
    # Pinned to one node so the test knows where the pods run.
    containers = [objects.container(name, "nginx", cpu="100m")]
    template = objects.pod_template(name, containers=containers, nodeSelector={"kubernetes.io/hostname": node_name})
    return objects.deployment(name, replicas, namespace=namespace, template=template)


def scenario() -> list[dict[str, Any]]:
    """Two spot nodes (the AWS samples' instances), one on-demand node; two replicas of web on spot-a."""
    return [
        objects.namespace("shop"),
        node("spot-a", "spot", SPOT_INSTANCE, "us-east-2a"),
        node("spot-b", "spot", NTH_INSTANCE, "us-east-2b"),
        node("od-a", "on-demand", ON_DEMAND_INSTANCE, "us-east-2a"),
        deployment("web", 2, "spot-a"),
    ]


def wait_for(predicate: Any, timeout: float = 10.0, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {predicate}")
        time.sleep(interval)


def pods_on(api: Any, node_name: str, namespace: str = "shop") -> list[str]:
    from spotguard.gateway import resources

    return [
        p["metadata"]["name"]
        for p in api.list(resources.PODS, namespace=namespace)
        if p["spec"].get("nodeName") == node_name and not p["metadata"].get("deletionTimestamp")
    ]


def interruption_taint(node_obj: Mapping[str, Any]) -> str | None:
    for taint in node_obj.get("spec", {}).get("taints") or []:
        if taint.get("key") == "spotguard.io/interruption" and taint.get("effect") == "NoSchedule":
            return str(taint.get("value", ""))
    return None


# -- the function project's modules ------------------------------------------------------------


def load_module(path: Path, name: str) -> ModuleType:
    """Import a file of functions/spot-interruption under a unique name.

    Both function projects have a ``function`` package and a ``lambda_function``
    module, so they are loaded by path, never through ``sys.path``.
    """
    package = path.is_dir()
    location = path / "__init__.py" if package else path
    spec = importlib.util.spec_from_file_location(
        name, location, submodule_search_locations=[str(path)] if package else None
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def knative_function() -> ModuleType:
    return load_module(FUNCTION_DIR / "function", f"spot_interruption_function_{next(_names)}")


def lambda_function() -> ModuleType:
    return load_module(FUNCTION_DIR / "lambda_function.py", f"spot_interruption_lambda_{next(_names)}")


# -- the surge copy (the default surge: a spotguard-owned ReplicaSet) ---------------------------


def surge_copy(api: Any, name: str, namespace: str = "shop") -> dict[str, Any] | None:
    """``name``'s surge copy (``spotguard-surge-<name>``), or None."""
    from spotguard.gateway import resources
    from spotguard.gateway.errors import NotFound
    from spotguard.policy.workloads import surge_copy_name

    try:
        return dict(api.get(resources.REPLICASETS, surge_copy_name(name), namespace))
    except NotFound:
        return None


def assert_copy_surge(api: Any, name: str, replicas: int, surge: int, namespace: str = "shop") -> dict[str, Any]:
    """``name`` surged by its copy: ``surge`` replicas pinned to on-demand, carrying the surge's
    record (marked ``copy``); the Deployment untouched (its spec.replicas at ``replicas``, no
    record of spotguard's on it). Returns the record."""
    from spotguard.gateway import resources
    from spotguard.policy import config, patches, surgecopy

    deployment = api.get(resources.DEPLOYMENTS, name, namespace)
    assert deployment["spec"]["replicas"] == replicas, deployment["spec"]
    assert "spotguard.io/surge" not in (deployment["metadata"].get("annotations") or {})
    rs = surge_copy(api, name, namespace)
    assert rs is not None, f"no surge copy of {name}"
    record = json.loads(rs["metadata"]["annotations"][surgecopy.RECORD])
    assert record.get("copy") is True, record
    assert rs["spec"]["replicas"] == surge, rs["spec"]
    terms = rs["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][patches.REQUIRED]["nodeSelectorTerms"]
    wanted = patches.on_demand_expressions(config.Config())
    assert terms and all(e in t.get("matchExpressions", []) for t in terms for e in wanted), terms
    return dict(record)
