"""Whose cluster an EC2 instance that started ``running`` will join, from its tags.

An EC2 state-change rule sees every instance of the account and region: most
of them are not this cluster's (other clusters, plain EC2). Their Node never
comes, so waiting for it (:class:`spotguard.nodeadded.service.Service`) is a
minute lost per event. The instance's tags say where it goes:

===================================  ==========================================
``kubernetes.io/cluster/<name>``     every EKS-provisioned node (managed node
                                     groups, Karpenter, eksctl, the cloud
                                     provider's convention)
``eks:cluster-name``                 EKS managed node groups
``eks:eks-cluster-name``             Karpenter (v1) and EKS Auto Mode
``aws:eks:cluster-name``             EKS (Fargate and managed resources)
===================================  ==========================================

An instance that names clusters but not this one, or that EC2 does not know
(another account or region), is :attr:`Owner.OTHER`: answered at once. One
that names this cluster is :attr:`Owner.OURS`; one without any of these tags,
or a lookup that failed, is :attr:`Owner.UNKNOWN`: waited for, as before.
The cluster's name is ``$SPOTGUARD_CLUSTER_NAME`` or ``$SPOTGUARD_EKS_CLUSTER``;
without one nothing is asked.
"""

from __future__ import annotations

import enum
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

log = logging.getLogger("spotguard.nodeadded")

CLUSTER_TAG_PREFIX = "kubernetes.io/cluster/"
CLUSTER_NAME_TAGS = ("eks:cluster-name", "eks:eks-cluster-name", "aws:eks:cluster-name")


class Owner(enum.StrEnum):
    OURS = "ours"
    OTHER = "other"
    UNKNOWN = "unknown"


Check = Callable[[str], tuple[Owner, str]]  # instance id -> (owner, why)


def clusters_named(tags: Mapping[str, str]) -> set[str]:
    """The clusters an instance's tags name."""
    out = {key[len(CLUSTER_TAG_PREFIX) :] for key in tags if key.startswith(CLUSTER_TAG_PREFIX)}
    out |= {tags[key] for key in CLUSTER_NAME_TAGS if tags.get(key)}
    return {name for name in out if name}


def owner_of(tags: Mapping[str, str] | None, cluster: str) -> tuple[Owner, str]:
    """Whose the instance is, from its tags (None: EC2 does not know the instance)."""
    if tags is None:
        return Owner.OTHER, "EC2 does not know the instance here (another account or region)"
    named = clusters_named(tags)
    if cluster in named:
        return Owner.OURS, f"tagged for cluster {cluster}"
    if named:
        return Owner.OTHER, "tagged for cluster " + ", ".join(sorted(named)) + f", not {cluster}"
    return Owner.UNKNOWN, "no cluster tag"


def tags_of(ec2: Any, instance_id: str) -> dict[str, str] | None:
    """The instance's tags (None when EC2 does not know it). Raises what boto3 raises."""
    # A filter (not InstanceIds=): an id of another account or region is absent, not an error.
    pages = ec2.get_paginator("describe_instances").paginate(Filters=[{"Name": "instance-id", "Values": [instance_id]}])
    for page in pages:
        for reservation in page.get("Reservations", []):
            for instance in reservation.get("Instances", []):
                if instance.get("InstanceId") == instance_id:
                    return _tags(instance.get("Tags") or [])
    return None


def _tags(items: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    return {str(t.get("Key")): str(t.get("Value") or "") for t in items if t.get("Key")}


def checker(ec2: Any, cluster: str) -> Check:
    def check(instance_id: str) -> tuple[Owner, str]:
        try:
            return owner_of(tags_of(ec2, instance_id), cluster)
        except Exception as exc:  # botocore's ClientError (no ec2:DescribeInstances), a timeout, ...
            log.info("could not read the instance's tags: waiting for its node", extra={"error": str(exc)})
            return Owner.UNKNOWN, f"DescribeInstances failed: {type(exc).__name__}"

    return check


def from_environment(env: Mapping[str, str] | None = None) -> Check | None:
    """The check for this process's cluster (None without a cluster name: nothing is asked)."""
    env = os.environ if env is None else env
    cluster = (env.get("SPOTGUARD_CLUSTER_NAME") or env.get("SPOTGUARD_EKS_CLUSTER") or "").strip()
    if not cluster:
        return None
    import boto3
    import botocore.config

    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None
    # Short timeouts and few retries: this only saves a wait, it must never cost one.
    cfg = botocore.config.Config(connect_timeout=3, read_timeout=5, retries={"max_attempts": 2})
    return checker(boto3.client("ec2", region_name=region, config=cfg), cluster)
