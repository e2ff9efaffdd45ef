"""A ``running`` EC2 state change for an instance of another cluster is answered at once.

The events are EventBridge's exact shape (tests/events), the instances are
moto's (server mode), tagged as EKS managed node groups and Karpenter tag them;
the cluster is the simulated one. The wait for a node is observed through the
Service's sleep: a foreign instance must not sleep once (and no pass runs: the
planted orphan Lease stays), our own instance is waited for.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from spotguard.gateway import kube
from spotguard.nodeadded import instances, reconciler, service, triggers
from spotguard.policy import config
from spotguard_sim import objects, testing

from tests.interruption.transport_support import REGION, Moto, moto_server, sample
from tests.nodeadded.test_transports import FUNCTION_DIR, Orphans, load

CLUSTER = "prod"
__all__ = ["moto_server"]  # the fixture


@pytest.fixture
def sim(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Any]:
    with testing.running_cluster([objects.namespace("spotguard"), objects.node("od-0", "on-demand")]) as running:
        monkeypatch.setenv("KUBECONFIG", str(running.kubeconfig))
        monkeypatch.setenv("HOME", str(tmp_path))
        yield running


def launch(ec2: Any, tags: dict[str, str]) -> str:
    images = ec2.describe_images()["Images"] or []
    ami = images[0]["ImageId"] if images else "ami-12c6146b"
    spec: dict[str, Any] = {"ImageId": ami, "MinCount": 1, "MaxCount": 1, "InstanceType": "m5.large"}
    if tags:
        spec["TagSpecifications"] = [
            {"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}
        ]
    return str(ec2.run_instances(**spec)["Instances"][0]["InstanceId"])


MANAGED_NODE_GROUP = {"kubernetes.io/cluster/{c}": "owned", "eks:cluster-name": "{c}", "eks:nodegroup-name": "spot"}
KARPENTER = {"kubernetes.io/cluster/{c}": "owned", "eks:eks-cluster-name": "{c}", "karpenter.sh/nodepool": "spot"}


def tagged(tags: dict[str, str], cluster: str) -> dict[str, str]:
    return {k.format(c=cluster): v.format(c=cluster) for k, v in tags.items()}


def running_event(instance_id: str) -> dict[str, Any]:
    event = copy.deepcopy(sample("ec2-instance-state-change-notification.running.json"))
    event["region"] = REGION
    event["detail"]["instance-id"] = instance_id
    event["resources"] = [f"arn:aws:ec2:{REGION}:{event['account']}:instance/{instance_id}"]
    return event


class Sleeps:
    def __init__(self) -> None:
        self.calls: list[float] = []

    def __call__(self, seconds: float) -> None:
        import time

        self.calls.append(seconds)
        time.sleep(min(seconds, 0.05))


def svc_for(sim: Any, ec2: Any, sleeps: Sleeps, join_wait: float) -> service.Service:
    return service.Service(
        lambda: reconciler.Reconciler(kube.Kube(sim.api_client()), config.Config()),
        join_wait=join_wait,
        poll=0.05,
        sleep=sleeps,
        owner=instances.checker(ec2, CLUSTER),
    )


@pytest.mark.parametrize("shape", [MANAGED_NODE_GROUP, KARPENTER], ids=["managed-node-group", "karpenter"])
def test_an_instance_of_another_cluster_is_answered_without_a_wait(
    sim: Any, moto_server: Moto, shape: dict[str, str]
) -> None:
    ec2 = moto_server.client("ec2")
    other = launch(ec2, tagged(shape, "staging"))
    orphans = Orphans(kube.Kube(sim.api_client()))
    lease = orphans.plant()
    sleeps = Sleeps()
    svc = svc_for(sim, ec2, sleeps, join_wait=600)  # a wait would be ten minutes
    answer = svc.handle(triggers.from_eventbridge(running_event(other), "event"))
    assert answer.result == "foreign" and "staging" in answer.reason, answer
    assert sleeps.calls == []
    assert orphans.exists(lease)  # no pass either


def test_an_instance_ec2_does_not_know_is_another_clusters(sim: Any, moto_server: Moto) -> None:
    ec2 = moto_server.client("ec2")
    sleeps = Sleeps()
    answer = svc_for(sim, ec2, sleeps, join_wait=600).handle(
        triggers.from_eventbridge(running_event("i-0fffffffffffffff0"), "event")
    )
    assert answer.result == "foreign" and sleeps.calls == []


@pytest.mark.parametrize("tags", [tagged(KARPENTER, CLUSTER), {}], ids=["ours", "untagged"])
def test_our_instance_or_an_untagged_one_is_waited_for(sim: Any, moto_server: Moto, tags: dict[str, str]) -> None:
    ec2 = moto_server.client("ec2")
    mine = launch(ec2, tags)
    orphans = Orphans(kube.Kube(sim.api_client()))
    lease = orphans.plant()
    sleeps = Sleeps()
    answer = svc_for(sim, ec2, sleeps, join_wait=0.3).handle(triggers.from_eventbridge(running_event(mine), "event"))
    assert answer.result == "reconciled" and answer.joined is False
    assert sleeps.calls  # it waited for the node (which never joined here), then passed
    assert not orphans.exists(lease)


def test_ec2_unreachable_means_waiting_as_before() -> None:
    import boto3
    import botocore.config

    cfg = botocore.config.Config(connect_timeout=0.5, read_timeout=0.5, retries={"max_attempts": 1})
    ec2 = boto3.client(
        "ec2",
        region_name=REGION,
        endpoint_url="http://127.0.0.1:9",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=cfg,
    )
    owner, why = instances.checker(ec2, CLUSTER)("i-0123456789abcdef0")
    assert owner is instances.Owner.UNKNOWN and "DescribeInstances failed" in why


def test_the_lambda_answers_another_clusters_instance_at_once(
    sim: Any, moto_server: Moto, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The packaged Lambda handler, configured as deployed (the cluster's name and region from
    the environment), an EventBridge event in AWS's shape."""
    for name, value in {
        "AWS_ENDPOINT_URL": moto_server.url,
        "AWS_REGION": REGION,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "SPOTGUARD_CLUSTER_NAME": CLUSTER,
        "SPOTGUARD_NODE_JOIN_WAIT_SECONDS": "600",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    other = launch(moto_server.client("ec2"), tagged(MANAGED_NODE_GROUP, "staging"))
    orphans = Orphans(kube.Kube(sim.api_client()))
    lease = orphans.plant()
    module = load(FUNCTION_DIR / "lambda_function.py", "node_added_lambda_foreign")
    answer = module.lambda_handler(running_event(other), None)
    assert answer["result"] == "foreign" and answer["joined"] is False, answer
    assert answer["trigger"]["instance_id"] == other
    assert orphans.exists(lease)


def test_owner_of_reads_the_tags() -> None:
    assert instances.owner_of(tagged(MANAGED_NODE_GROUP, CLUSTER), CLUSTER)[0] is instances.Owner.OURS
    assert instances.owner_of(tagged(KARPENTER, "staging"), CLUSTER)[0] is instances.Owner.OTHER
    assert instances.owner_of({"Name": "bastion"}, CLUSTER)[0] is instances.Owner.UNKNOWN
    assert instances.owner_of(None, CLUSTER)[0] is instances.Owner.OTHER
    # An instance shared by two clusters' tags is ours when one of them is.
    both = {"kubernetes.io/cluster/staging": "shared", f"kubernetes.io/cluster/{CLUSTER}": "shared"}
    assert instances.owner_of(both, CLUSTER)[0] is instances.Owner.OURS
    assert instances.from_environment({}) is None


@pytest.mark.parametrize(("value", "wait"), [(None, 3.0), ("0.5", 1.5), ("bad", 3.0)])
def test_a_moves_wait_for_the_admission_cache_follows_its_setting(
    value: str | None, wait: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """node-added's "+k" waits for as long as the admission webhook keeps a workload
    ($SPOTGUARD_WORKLOAD_CACHE_SECONDS, the same setting) and a read in flight."""
    from spotguard_sim import testing

    if value is not None:
        monkeypatch.setenv("SPOTGUARD_WORKLOAD_CACHE_SECONDS", value)
    with testing.running_cluster([], controllers=False) as sim:
        monkeypatch.setenv("KUBECONFIG", sim.kubeconfig)
        rec = reconciler.Reconciler.from_environment()
    assert rec.admission_cache_seconds == pytest.approx(wait)
