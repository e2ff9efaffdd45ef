"""Kubernetes resource quantities ("100m", "1Gi", "2") as integers.

CPU in millicores, everything else in base units (bytes for memory), rounded up
as the API server does for requests.
https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/quantity/
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable, Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

_SUFFIX = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?\d+)?)([a-zA-Z]*)$")

Resources = dict[str, int]


def parse(value: Any, *, milli: bool = False) -> int:
    """Parse a quantity; ``milli`` gives thousandths (for CPU). Raises ValueError."""
    parsed = _parse_text(str(value).strip(), milli)
    if parsed is None:
        raise ValueError(f"invalid quantity {value!r}")
    return parsed


@functools.lru_cache(maxsize=4096)
def _parse_text(text: str, milli: bool) -> int | None:
    """:func:`parse` of a quantity's text (None: not a quantity), remembered: the same few
    quantities are parsed again and again (every pod's requests, every node's allocatable)."""
    m = _QUANTITY.match(text)
    if not m or m.group(2) not in _SUFFIX:
        return None
    try:
        number = Decimal(m.group(1)) * _SUFFIX[m.group(2)]
    except InvalidOperation:
        return None
    if milli:
        number *= 1000
    return math.ceil(number)


def parse_resources(raw: Mapping[str, Any] | None) -> Resources:
    """A resource list (``{"cpu": "100m", "memory": "1Gi"}``); unparseable entries are dropped."""
    out: Resources = {}
    for name, value in (raw or {}).items():
        try:
            out[name] = parse(value, milli=(name == "cpu"))
        except ValueError:
            continue
    return out


def add(total: Resources, more: Mapping[str, int]) -> Resources:
    out = dict(total)
    for k, v in more.items():
        out[k] = out.get(k, 0) + v
    return out


def container_requests(container: Mapping[str, Any]) -> Resources:
    """A container's requests; a resource with a limit but no request requests its limit.

    (The API server defaults a missing request to the limit.)
    """
    resources = container.get("resources") or {}
    out = parse_resources(resources.get("limits"))
    out.update(parse_resources(resources.get("requests")))
    return out


def pod_requests(spec: Mapping[str, Any]) -> Resources:
    """Effective requests of a pod spec: max(sum of containers, each init container) + overhead.

    Sidecars (init containers with ``restartPolicy: Always``) add up with the
    containers and with the init containers that start after them. Pod-level
    ``spec.resources.requests`` take precedence where given.
    https://kubernetes.io/docs/concepts/workloads/pods/init-containers/#resource-sharing-within-containers
    https://kubernetes.io/docs/tasks/configure-pod-container/assign-pod-level-resources/
    """
    total: Resources = {}
    for c in spec.get("containers") or []:
        total = add(total, container_requests(c))
    init_max: Resources = {}
    sidecars: Resources = {}
    for c in spec.get("initContainers") or []:
        req = container_requests(c)
        if c.get("restartPolicy") == "Always":
            sidecars = add(sidecars, req)
            continue
        for k, v in add(sidecars, req).items():
            init_max[k] = max(init_max.get(k, 0), v)
    total = add(total, sidecars)
    for k, v in init_max.items():
        total[k] = max(total.get(k, 0), v)
    total.update(parse_resources((spec.get("resources") or {}).get("requests")))
    return add(total, parse_resources(spec.get("overhead")))


def fits(
    requests: Mapping[str, int], free: Mapping[str, int], names: Iterable[str] | None = None
) -> bool:
    keys = names if names is not None else requests.keys()
    return all(requests.get(k, 0) <= free.get(k, 0) for k in keys if requests.get(k, 0) > 0)
