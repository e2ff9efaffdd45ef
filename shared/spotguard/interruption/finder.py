"""Which node runs an EC2 instance: ``spec.providerID``, then the instance's private DNS name.

Matching by providerID is done by the pure plan
(:func:`spotguard.policy.interruption.match_nodes`); this module asks EC2
(``DescribeInstances``, one call for all unmatched instances) for the private
DNS names of the rest, and matches them to node names or the
``kubernetes.io/hostname`` label.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from spotguard.policy.views import NodeView

log = logging.getLogger("spotguard.interruption")

HOSTNAME_LABEL = "kubernetes.io/hostname"


class LookupFailed(Exception):
    """EC2 could not be asked (a transient failure: the notices are retried)."""


def private_dns_names(ec2: Any, instance_ids: Sequence[str]) -> dict[str, str]:
    """instance id -> PrivateDnsName, for the instances EC2 knows (unknown ids are left out)."""
    out: dict[str, str] = {}
    if not instance_ids:
        return out
    try:
        # A filter (not InstanceIds=) so that an id of another account or region
        # is simply absent instead of failing the whole call.
        paginator = ec2.get_paginator("describe_instances")
        pages = paginator.paginate(Filters=[{"Name": "instance-id", "Values": list(instance_ids)}])
        for page in pages:
            for reservation in page.get("Reservations", []):
                for instance in reservation.get("Instances", []):
                    dns = instance.get("PrivateDnsName") or ""
                    if dns:
                        out[instance["InstanceId"]] = dns
    except Exception as exc:  # botocore's ClientError, EndpointConnectionError, ...
        raise LookupFailed(f"ec2 DescribeInstances failed: {exc}") from exc
    return out


def by_dns(dns_names: Mapping[str, str], nodes: Iterable[NodeView]) -> dict[str, str]:
    """instance id -> node name, where a node's name or hostname label is the DNS name."""
    index: dict[str, str] = {}
    for node in nodes:
        for key in (node.name, node.labels.get(HOSTNAME_LABEL, "")):
            if key:
                index.setdefault(key.lower(), node.name)
                index.setdefault(key.lower().split(".", 1)[0], node.name)
    out: dict[str, str] = {}
    for instance_id, raw in dns_names.items():
        dns = raw.lower()
        name = index.get(dns) or index.get(dns.split(".", 1)[0])
        if name:
            out[instance_id] = name
    return out
