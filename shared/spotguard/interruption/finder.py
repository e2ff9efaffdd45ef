"""Which node runs an EC2 instance: ``spec.providerID``, then the instance's private DNS name.

Matching by providerID is done by the pure plan
(:func:`spotguard.policy.interruption.match_nodes`); this module asks EC2
(``DescribeInstances``, one call for all unmatched instances) for the private
DNS names of the rest, and matches them to node names or the
``kubernetes.io/hostname`` label.

Another cluster's notices arrive too (EventBridge rules match the whole account
and region). As aws-node-termination-handler does, two answers keep them out of
the dead-letter queue:

- a managed tag (``SPOTGUARD_MANAGED_TAG``, e.g. NTH's
  ``aws-node-termination-handler/managed``): the lookup asks only for
  instances carrying that tag key, so an untagged instance no node names by
  providerID is another cluster's and is acknowledged;
- a refused lookup (no ``ec2:DescribeInstances``: ``UnauthorizedOperation``,
  ``AccessDenied``) is no transient failure: it raises :class:`LookupDenied`,
  and the notices no node names by providerID are acknowledged as another
  cluster's instead of retried into the dead-letter queue. Only a failure that
  may pass (a timeout, throttling, a 5xx) raises :class:`LookupFailed`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from spotguard.policy.views import NodeView

log = logging.getLogger("spotguard.interruption")

HOSTNAME_LABEL = "kubernetes.io/hostname"


# Error codes that say the caller may not ask, not that asking failed this time.
DENIED_CODES = frozenset(
    {"UnauthorizedOperation", "AccessDenied", "AccessDeniedException", "AuthFailure", "OptInRequired"}
)


class LookupFailed(Exception):
    """EC2 could not be asked (a transient failure: the notices are retried)."""


class LookupDenied(Exception):
    """EC2 refuses to be asked (no permission): asking again will not help."""


def error_code(exc: BaseException) -> str:
    """The AWS error code of a botocore ClientError (``""`` for anything else)."""
    response = getattr(exc, "response", None)
    if isinstance(response, Mapping):
        error = response.get("Error")
        if isinstance(error, Mapping):
            return str(error.get("Code") or "")
    return ""


def private_dns_names(ec2: Any, instance_ids: Sequence[str], managed_tag: str = "") -> dict[str, str]:
    """instance id -> PrivateDnsName, for the instances EC2 knows (unknown ids are left out),
    and only those tagged ``managed_tag`` (a tag key) where it is set."""
    out: dict[str, str] = {}
    if not instance_ids:
        return out
    filters = [{"Name": "instance-id", "Values": list(instance_ids)}]
    if managed_tag:
        filters.append({"Name": "tag-key", "Values": [managed_tag]})
    try:
        # A filter (not InstanceIds=) so that an id of another account or region
        # is simply absent instead of failing the whole call.
        paginator = ec2.get_paginator("describe_instances")
        pages = paginator.paginate(Filters=filters)
        for page in pages:
            for reservation in page.get("Reservations", []):
                for instance in reservation.get("Instances", []):
                    dns = instance.get("PrivateDnsName") or ""
                    if dns:
                        out[instance["InstanceId"]] = dns
    except Exception as exc:  # botocore's ClientError, EndpointConnectionError, ...
        if error_code(exc) in DENIED_CODES:
            raise LookupDenied(f"ec2 DescribeInstances was refused: {exc}") from exc
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
