"""Scenarios for the interruption end-to-end tests and benchmark: a mixed cluster of
on-demand and spot nodes, Deployments and StatefulSets, as plain API objects."""

from __future__ import annotations

from spotguard_sim import objects

CAPACITY = objects.CAPACITY
Obj = objects.Obj
instance_id = objects.instance_id
namespace = objects.namespace


def node(name: str, capacity: str, *, cpu: str = "16", pods: str = "110", zone: str = "us-east-1a") -> Obj:
    provider = objects.provider_id(zone, instance_id(name))
    return objects.node(name, capacity, zone=zone, cpu=cpu, pods=pods, provider=provider)


def deployment(name: str, replicas: int, ns: str = "shop", **annotations: str) -> Obj:
    return objects.deployment(name, replicas, namespace=ns, annotations=annotations)


def statefulset(name: str, replicas: int, ns: str = "shop") -> Obj:
    return objects.statefulset(name, replicas, namespace=ns, policy="Parallel")


def pdb(
    name: str, app: str, ns: str = "shop", *, min_available: int | None = None, max_unavailable: int | None = None
) -> Obj:
    return objects.pdb(name, app, namespace=ns, min_available=min_available, max_unavailable=max_unavailable)


def hpa(name: str, target: str, min_replicas: int, max_replicas: int, ns: str = "shop") -> Obj:
    """An autoscaler under a steady load that needs ``min_replicas`` (a surge lowers each pod's
    utilization, so once its minimum is back the autoscaler scales down, as a real one does)."""
    obj = objects.hpa(name, target, min_replicas, max_replicas, namespace=ns, cpu_utilization=80)
    obj["metadata"].setdefault("annotations", {})["sim.spotguard.io/load-replicas"] = str(min_replicas)
    return obj


def mixed_nodes(on_demand: int = 3, spot: int = 6) -> list[Obj]:
    """The end-to-end cluster's namespace and nodes."""
    objs: list[Obj] = [namespace("shop"), namespace("spotguard")]
    objs += [node(f"od-{i}", "on-demand") for i in range(on_demand)]
    objs += [node(f"spot-{i}", "spot", cpu="8") for i in range(spot)]
    return objs


def mixed_workloads() -> list[Obj]:
    """A mix of workloads: many replicas and one, a user budget, an autoscaler, StatefulSets."""
    return [
        deployment("web", 6),
        pdb("web", "web", max_unavailable=1),  # the user's own budget: no second one
        deployment("api", 3),
        hpa("api", "api", 3, 6),
        deployment("cart", 4, **{"spotguard.io/min-on-demand": "50%"}),
        deployment("single", 1),
        deployment("lonely", 1),
        deployment("solo", 1, **{"spotguard.io/min-on-demand": "0"}),  # a single replica on spot
        deployment("worker", 8),
        statefulset("db", 3),
        statefulset("queue", 5),
    ]
