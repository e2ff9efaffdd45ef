"""Hypothesis strategies: pods (as the API server would accept them), workloads, nodes, clusters.

Pods come with and without user affinity, tolerations, topology spread,
init containers (and sidecars), labels whose keys carry ``/`` (and ``~``,
which JSON Pointer must escape), and with metadata.labels, metadata.annotations
and spec.affinity missing altogether.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import strategies as st
from spotguard.policy import config, floors
from spotguard.policy.capacity import Capacity
from spotguard.policy.state import WorkloadState
from spotguard.policy.tolerations import Toleration
from spotguard.policy.views import NodeView, PodView
from spotguard.policy.workloads import Kind, Workload

Json = dict[str, Any]

REQ = "requiredDuringSchedulingIgnoredDuringExecution"
PREF = "preferredDuringSchedulingIgnoredDuringExecution"
ZONE = "topology.kubernetes.io/zone"
HOST = "kubernetes.io/hostname"

_alnum = "abcdefghijklmnopqrstuvwxyz0123456789"
names = st.text(alphabet=_alnum, min_size=1, max_size=8)
dns_labels = st.builds(lambda a, b: a + b, st.sampled_from("abcdefghij"), st.text(_alnum, max_size=6))
label_values = st.one_of(
    st.just(""),
    st.builds(
        lambda a, mid, b: a + mid + b,
        st.sampled_from("abcXYZ019"),
        st.text(alphabet=_alnum + "-_.", max_size=10),
        st.sampled_from("abcXYZ019"),
    ),
)
# Keys: plain names, prefixed names ("team.example.com/owner"), and keys with "~"
# (not valid for the API server, but the patch must escape whatever it meets).
label_keys = st.one_of(
    names,
    st.builds(lambda p, n: f"{p}.example.com/{n}", dns_labels, names),
    st.builds(lambda a, b: f"{a}~{b}", names, names),
    st.builds(lambda a, b: f"x.io/{a}~1{b}", names, names),
)
user_labels = st.dictionaries(label_keys, label_values, max_size=4)

# Keys a user's own node affinity may use (never a capacity scheme key: those pods are skipped).
affinity_keys = st.sampled_from([ZONE, HOST, "disk", "example.com/gpu", "node.example.com/gen"])


@st.composite
def requirements(draw: st.DrawFn) -> Json:
    key = draw(affinity_keys)
    op = draw(st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]))
    out: Json = {"key": key, "operator": op}
    if op in ("In", "NotIn"):
        out["values"] = draw(st.lists(st.sampled_from(["a", "b", "c", "1", "7"]), min_size=1, max_size=3, unique=True))
    elif op in ("Gt", "Lt"):
        out["values"] = [str(draw(st.integers(0, 9)))]
    return out


@st.composite
def node_selector_terms(draw: st.DrawFn) -> Json:
    term: Json = {}
    kind = draw(st.sampled_from(["expr", "expr", "fields", "both"]))
    if kind in ("expr", "both"):
        term["matchExpressions"] = draw(st.lists(requirements(), min_size=1, max_size=3))
    if kind in ("fields", "both"):
        values = draw(st.lists(st.sampled_from(["n0", "n1", "n2"]), min_size=1, max_size=2, unique=True))
        op = draw(st.sampled_from(["In", "NotIn"]))
        term["matchFields"] = [{"key": "metadata.name", "operator": op, "values": values}]
    return term


@st.composite
def affinities(draw: st.DrawFn) -> Json | None:
    affinity: Json = {}
    node_affinity: Json = {}
    if draw(st.booleans()):
        node_affinity[REQ] = {"nodeSelectorTerms": draw(st.lists(node_selector_terms(), min_size=1, max_size=3))}
    if draw(st.booleans()):
        node_affinity[PREF] = draw(
            st.lists(
                st.builds(
                    lambda w, e: {"weight": w, "preference": {"matchExpressions": e}},
                    st.integers(1, 100),
                    st.lists(requirements(), min_size=1, max_size=2),
                ),
                min_size=1,
                max_size=2,
            )
        )
    if node_affinity or draw(st.booleans()):
        affinity["nodeAffinity"] = node_affinity
    if draw(st.booleans()):
        affinity["podAntiAffinity"] = {
            PREF: [
                {
                    "weight": 50,
                    "podAffinityTerm": {"topologyKey": HOST, "labelSelector": {"matchLabels": {"app": "web"}}},
                }
            ]
        }
    if not affinity and draw(st.booleans()):
        return None  # spec.affinity absent
    return affinity


@st.composite
def tolerations_json(draw: st.DrawFn) -> Json:
    op = draw(st.sampled_from(["Equal", "Exists"]))
    out: Json = {"operator": op}
    if op == "Equal" or draw(st.booleans()):
        out["key"] = draw(st.sampled_from(["dedicated", "capacity", "example.com/team", "spot"]))
    if op == "Equal":
        out["value"] = draw(st.sampled_from(["", "web", "spot", "true"]))
    effect = draw(st.sampled_from(["", "NoSchedule", "NoExecute", "PreferNoSchedule"]))
    if effect:
        out["effect"] = effect
    if effect == "NoExecute" and draw(st.booleans()):
        out["tolerationSeconds"] = draw(st.integers(0, 600))
    return out


cpu = st.sampled_from(["50m", "100m", "250m", "500m", "1", "1500m", "2"])
memory = st.sampled_from(["64Mi", "128Mi", "512Mi", "1Gi", "2Gi"])


@st.composite
def resources(draw: st.DrawFn) -> Json | None:
    if draw(st.integers(0, 4)) == 0:
        return None
    requests: Json = {}
    if draw(st.booleans()) or True:
        requests["cpu"] = draw(cpu)
    if draw(st.booleans()):
        requests["memory"] = draw(memory)
    return {"requests": requests}


@st.composite
def containers(draw: st.DrawFn, prefix: str, min_size: int, max_size: int, init: bool = False) -> list[Json]:
    n = draw(st.integers(min_size, max_size))
    out = []
    for i in range(n):
        c: Json = {"name": f"{prefix}{i}", "image": "registry.example.com/app:1.0"}
        res = draw(resources())
        if res is not None:
            c["resources"] = res
        if init and draw(st.booleans()):
            c["restartPolicy"] = "Always"  # a sidecar
        out.append(c)
    return out


@st.composite
def spread_constraints(draw: st.DrawFn) -> list[Json]:
    keys = draw(st.lists(st.sampled_from([HOST, ZONE, "example.com/rack"]), max_size=2, unique=True))
    return [
        {
            "maxSkew": draw(st.integers(1, 3)),
            "topologyKey": k,
            "whenUnsatisfiable": draw(st.sampled_from(["DoNotSchedule", "ScheduleAnyway"])),
            "labelSelector": {"matchLabels": {"app": "web"}},
        }
        for k in keys
    ]


@st.composite
def pods_json(draw: st.DrawFn, owner_kind: str | None = None) -> Json:
    """A managed pod (ReplicaSet or StatefulSet) as admission sees it at CREATE."""
    kind = owner_kind or draw(st.sampled_from(["ReplicaSet", "StatefulSet"]))
    meta: Json = {"namespace": draw(st.sampled_from(["shop", "default", "team-a"]))}
    if kind == "StatefulSet":
        meta["name"] = f"db-{draw(st.integers(0, 9))}"
    elif draw(st.booleans()):
        meta["generateName"] = "web-7d9f-"  # name empty at admission
    else:
        meta["name"] = f"web-7d9f-{draw(names)}"
    labels = draw(user_labels)
    if draw(st.integers(0, 3)) == 0:
        pass  # metadata.labels absent
    else:
        if kind == "ReplicaSet" and draw(st.booleans()):
            labels["pod-template-hash"] = "7d9f"
        meta["labels"] = labels
    if draw(st.booleans()):
        meta["annotations"] = draw(st.dictionaries(label_keys, st.text(max_size=8), max_size=2))
    meta["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": kind, "name": "web-7d9f", "uid": "uid-owner", "controller": True}
    ]
    spec: Json = {"containers": draw(containers("app", 1, 3))}
    init = draw(containers("init", 0, 2, init=True))
    if init:
        spec["initContainers"] = init
    affinity = draw(affinities())
    if affinity is not None:
        spec["affinity"] = affinity
    if draw(st.booleans()):
        spec["tolerations"] = draw(st.lists(tolerations_json(), max_size=3))
    if draw(st.booleans()):
        spec["topologySpreadConstraints"] = draw(spread_constraints())
    if draw(st.booleans()):
        spec["nodeSelector"] = draw(
            st.dictionaries(st.sampled_from(["disk", ZONE]), st.sampled_from(["a", "ssd"]), max_size=2)
        )
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


@st.composite
def configs(draw: st.DrawFn) -> config.Config:
    spot_tolerations = draw(
        st.sampled_from(
            [
                (),
                (Toleration("capacity", "Equal", "spot", "NoSchedule"),),
                (Toleration("spot", "Exists"), Toleration("dedicated", "Equal", "web", "NoSchedule")),
            ]
        )
    )
    return dataclasses.replace(
        config.Config(),
        spot_tolerations=spot_tolerations,
        unknown_capacity=draw(st.sampled_from([Capacity.ON_DEMAND, Capacity.SPOT])),
        spread_topology_keys=draw(st.sampled_from([(HOST, ZONE), (ZONE,), ()])),
        on_demand_deletion_cost=draw(st.sampled_from([0, 1000])),
        spot_preference_weight=draw(st.integers(1, 100)),
    )


floor_annotations = st.one_of(
    st.none(),
    st.integers(0, 15).map(str),
    st.integers(0, 100).map(lambda p: f"{p}%"),
    st.sampled_from(["bad", "-1", "150%", ""]),
)


small_floors = st.sampled_from([None, None, "0", "1", "2", "50%"])


@st.composite
def workloads(
    draw: st.DrawFn,
    name: str = "web",
    max_replicas: int = 12,
    annotation: st.SearchStrategy[str | None] = floor_annotations,
) -> Workload:
    kind = draw(st.sampled_from(list(Kind)))
    annotations: dict[str, str] = {}
    floor = draw(annotation)
    if floor is not None:
        annotations["spotguard.io/min-on-demand"] = floor
    return Workload(
        kind=kind,
        namespace="shop",
        name=name,
        replicas=draw(st.integers(0, max_replicas)),
        annotations=annotations,
    )


# ---- clusters for the rebalance plan ---------------------------------------------------------

CAPACITY_LABELS: dict[str, dict[str, str]] = {
    "spot": {"node.kubernetes.io/capacity": "spot"},
    "karpenter-spot": {"karpenter.sh/capacity-type": "spot"},
    "on-demand": {"node.kubernetes.io/capacity": "on-demand"},
    "eks-on-demand": {"eks.amazonaws.com/capacityType": "ON_DEMAND"},
    "unknown": {},
}


@st.composite
def nodes(draw: st.DrawFn, name: str) -> NodeView:
    labels = dict(draw(st.sampled_from(list(CAPACITY_LABELS.values()))))
    labels[ZONE] = draw(st.sampled_from(["a", "b"]))
    labels[HOST] = name
    taints = []
    if draw(st.integers(0, 5)) == 0:
        taints.append({"key": "spotguard.io/interruption", "value": "evt", "effect": "NoSchedule"})
    if draw(st.integers(0, 4)) == 0:
        taints.append(
            {"key": "capacity", "value": "spot", "effect": draw(st.sampled_from(["NoSchedule", "PreferNoSchedule"]))}
        )
    raw: Json = {
        "metadata": {"name": name, "labels": labels},
        "spec": {"taints": taints, "unschedulable": draw(st.integers(0, 6)) == 0},
        "status": {
            "allocatable": {
                "cpu": draw(st.sampled_from(["1", "2", "4"])),
                "memory": draw(st.sampled_from(["2Gi", "8Gi"])),
                "pods": str(draw(st.integers(1, 8))),
            },
            "conditions": [{"type": "Ready", "status": "False" if draw(st.integers(0, 6)) == 0 else "True"}],
        },
    }
    return NodeView.from_json(raw)


@st.composite
def clusters(draw: st.DrawFn, cfg: config.Config) -> tuple[list[NodeView], list[PodView], list[WorkloadState]]:
    node_list = [draw(nodes(f"n{i}")) for i in range(draw(st.integers(1, 6)))]
    if draw(st.booleans()):  # a roomy, usable spot node, so that moves happen often
        roomy = {"cpu": "16", "memory": "64Gi", "pods": str(draw(st.integers(1, 30)))}
        labels = {"node.kubernetes.io/capacity": "spot", ZONE: "a", HOST: "roomy"}
        node_list.append(
            NodeView.from_json({"metadata": {"name": "roomy", "labels": labels}, "status": {"allocatable": roomy}})
        )
    node_names = [n.name for n in node_list]
    states: list[WorkloadState] = []
    all_pods: list[PodView] = []
    for w in range(draw(st.integers(1, 4))):
        wl = draw(workloads(name=f"w{w}", max_replicas=6, annotation=small_floors))
        if draw(st.integers(0, 5)) == 0:
            wl = dataclasses.replace(wl, annotations={**wl.annotations, "spotguard.io/surge": "{}"})
        if draw(st.integers(0, 8)) == 0:
            wl = dataclasses.replace(wl, annotations={**wl.annotations, "spotguard.io/enabled": "false"})
        pods: list[PodView] = []
        steady = draw(st.integers(0, 3)) > 0  # most workloads: every pod scheduled and Ready
        for i in range(draw(st.integers(0, 7))):
            spec: Json = {
                "containers": [{"name": "app", "resources": {"requests": {"cpu": draw(cpu), "memory": draw(memory)}}}]
            }
            if not steady and draw(st.integers(0, 3)) == 0:
                spec["nodeName"] = ""  # pending
            else:
                spec["nodeName"] = draw(st.sampled_from(node_names))
            if draw(st.integers(0, 3)) == 0:
                spec["tolerations"] = [draw(tolerations_json())]
            if draw(st.integers(0, 5)) == 0:
                spec["affinity"] = {
                    "nodeAffinity": {
                        REQ: {"nodeSelectorTerms": draw(st.lists(node_selector_terms(), min_size=1, max_size=2))}
                    }
                }
            name = f"w{w}-{i}" if wl.kind is Kind.STATEFULSET else f"w{w}-x{i}"
            raw: Json = {
                "metadata": {
                    "name": name,
                    "namespace": "shop",
                    "uid": f"uid-w{w}-{i}",
                    "labels": {"app": f"w{w}", "spotguard.io/placement": draw(st.sampled_from(["on-demand", "spot"]))},
                    "ownerReferences": [
                        {
                            "kind": "ReplicaSet" if wl.kind is Kind.DEPLOYMENT else "StatefulSet",
                            "name": f"w{w}",
                            "controller": True,
                        }
                    ],
                },
                "spec": spec,
                "status": {
                    "phase": draw(st.sampled_from(["Running"] * 7 + ["Succeeded"])) if spec["nodeName"] else "Pending",
                    "conditions": [
                        {"type": "Ready", "status": "True" if steady or draw(st.integers(0, 3)) else "False"}
                    ],
                },
            }
            pods.append(PodView.from_json(raw))
        all_pods += pods
        states.append(WorkloadState(wl, floors.floor_for(wl, cfg), tuple(pods)))
    for i in range(draw(st.integers(0, 4))):  # pods of other things (DaemonSets, bare pods)
        all_pods.append(
            PodView.from_json(
                {
                    "metadata": {"name": f"other-{i}", "namespace": "kube-system"},
                    "spec": {
                        "nodeName": draw(st.sampled_from(node_names)),
                        "containers": [{"name": "c", "resources": {"requests": {"cpu": draw(cpu)}}}],
                    },
                    "status": {"phase": "Running"},
                }
            )
        )
    return node_list, all_pods, states


@st.composite
def tight_clusters(draw: st.DrawFn, cfg: config.Config) -> tuple[list[NodeView], list[PodView], list[WorkloadState]]:
    """Steady workloads mostly on on-demand, and little room on spot: many moves compete for it."""
    od = [f"od{i}" for i in range(draw(st.integers(1, 3)))]
    spot = [f"spot{i}" for i in range(draw(st.integers(1, 4)))]
    node_list = [
        NodeView.from_json(
            {
                "metadata": {"name": n, "labels": {"karpenter.sh/capacity-type": "on-demand"}},
                "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110"}},
            }
        )
        for n in od
    ] + [
        NodeView.from_json(
            {
                "metadata": {"name": n, "labels": {"node.kubernetes.io/capacity": "spot"}},
                "status": {
                    "allocatable": {
                        "cpu": draw(st.sampled_from(["500m", "1", "2"])),
                        "memory": draw(st.sampled_from(["1Gi", "4Gi"])),
                        "pods": str(draw(st.integers(1, 4))),
                    }
                },
            }
        )
        for n in spot
    ]
    states: list[WorkloadState] = []
    all_pods: list[PodView] = []
    for w in range(draw(st.integers(1, 4))):
        n = draw(st.integers(1, 6))
        wl = draw(workloads(name=f"w{w}", max_replicas=6, annotation=small_floors))
        wl = dataclasses.replace(wl, replicas=n)
        pods = []
        for i in range(n):
            node = draw(st.sampled_from(od)) if draw(st.integers(0, 3)) else draw(st.sampled_from(spot))
            requests = {"cpu": draw(st.sampled_from(["100m", "250m", "400m"])), "memory": draw(memory)}
            raw: Json = {
                "metadata": {"name": f"w{w}-{i}", "uid": f"uid-w{w}-{i}", "namespace": "shop"},
                "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"requests": requests}}]},
                "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
            }
            pods.append(PodView.from_json(raw))
        all_pods += pods
        states.append(WorkloadState(wl, floors.floor_for(wl, cfg), tuple(pods)))
    return node_list, all_pods, states
