"""The simulated cluster's timings and limits, with upstream defaults (sources in docs/sim.md).

A scenario may set them with a ``kind: Settings`` document (``apiVersion:
sim.spotguard.io/v1``); every field is optional and every time is in simulated
seconds (the time scale applies):

    apiVersion: sim.spotguard.io/v1
    kind: Settings
    metadata: {name: timings}
    nodeLoss:
      instanceAction: terminate          # terminate | stop | hibernate
      shuttingDownSeconds: 120           # EC2 shutting-down -> terminated
      nodeMonitorGracePeriodSeconds: 50
      nodeMonitorPeriodSeconds: 5
      cloudNodeMonitorPeriodSeconds: 5
      podGCPeriodSeconds: 20
      podGCQuarantineSeconds: 40
      nodeEvictionRate: 0.1
      secondaryNodeEvictionRate: 0.01
      largeClusterSizeThreshold: 50
      unhealthyZoneThreshold: 0.55
    controllerManager:
      kubeAPIQPS: 20
      kubeAPIBurst: 30
      burstReplicas: 500
    karpenter:
      kubeClientQPS: 200                 # --kube-client-qps: one client for all of Karpenter's controllers
      kubeClientBurst: 300               # --kube-client-burst
    clusterAutoscaler:
      kubeClientQPS: 5                   # --kube-client-qps: the autoscaler's one client
      kubeClientBurst: 10                # --kube-client-burst (its other flags: capacity.clusterAutoscaler)
    apiServer:
      etcdCompactionIntervalSeconds: 300  # 0: never compact
    capacity: {...}                       # node provisioners and prices: spotguard_sim.capacity
    kubelet:
      terminationSeconds: 5              # at most this long from a pod's deletion to its removal
                                         # (default: its grace period, 30 s unless it says otherwise)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from typing import Any

from spotguard.logs import UserError

from spotguard_sim import capacity as capacity_mod

API_VERSION = "sim.spotguard.io/v1"
KIND = "Settings"
INSTANCE_ACTIONS = ("terminate", "stop", "hibernate")

# EC2 shutting-down -> terminated: AWS documents no normal duration, only that "longer than a few
# minutes" is a delay (TroubleshootingInstancesShuttingDown); a modelling choice (docs/sim.md)
SHUTTING_DOWN_SECONDS = 120.0
# kube-controller-manager --node-monitor-grace-period (50s since v1.32, kubernetes#126287)
NODE_MONITOR_GRACE_PERIOD = 50.0
# kube-controller-manager --node-monitor-period
NODE_MONITOR_PERIOD = 5.0
# cloud-controller-manager --node-monitor-period (CloudNodeLifecycleController.MonitorNodes)
CLOUD_NODE_MONITOR_PERIOD = 5.0
# pkg/controller/podgc/gc_controller.go gcCheckPeriod and quarantineTime
POD_GC_PERIOD = 20.0
POD_GC_QUARANTINE = 40.0
# kube-controller-manager --node-eviction-rate, --secondary-node-eviction-rate,
# --large-cluster-size-threshold, --unhealthy-zone-threshold
NODE_EVICTION_RATE = 0.1
SECONDARY_NODE_EVICTION_RATE = 0.01
LARGE_CLUSTER_SIZE_THRESHOLD = 50
UNHEALTHY_ZONE_THRESHOLD = 0.55
# kube-controller-manager --kube-api-qps / --kube-api-burst (each controller's own client)
KUBE_API_QPS = 20.0
KUBE_API_BURST = 30
# Karpenter --kube-client-qps / --kube-client-burst (kubernetes-sigs/karpenter
# pkg/operator/options/options.go: KUBE_CLIENT_QPS 200, KUBE_CLIENT_BURST 300): the rest config
# of the controller-runtime manager whose one client every Karpenter controller uses
KARPENTER_KUBE_CLIENT_QPS = 200.0
KARPENTER_KUBE_CLIENT_BURST = 300
# cluster-autoscaler --kube-client-qps / --kube-client-burst (cluster-autoscaler/FAQ.md,
# "What are the parameters to CA?"): its one clientset (kube_util.CreateKubeClient)
CLUSTER_AUTOSCALER_KUBE_CLIENT_QPS = 5.0
CLUSTER_AUTOSCALER_KUBE_CLIENT_BURST = 10
# pkg/controller/replicaset/replica_set.go BurstReplicas
BURST_REPLICAS = 500
# kube-apiserver --etcd-compaction-interval (storagebackend.DefaultCompactInterval)
ETCD_COMPACTION_INTERVAL = 300.0


@dataclasses.dataclass(frozen=True)
class NodeLoss:
    """What happens after a node's instance goes away, and when."""

    instance_action: str = "terminate"
    shutting_down_seconds: float = SHUTTING_DOWN_SECONDS
    node_monitor_grace_period: float = NODE_MONITOR_GRACE_PERIOD
    node_monitor_period: float = NODE_MONITOR_PERIOD
    cloud_node_monitor_period: float = CLOUD_NODE_MONITOR_PERIOD
    pod_gc_period: float = POD_GC_PERIOD
    pod_gc_quarantine: float = POD_GC_QUARANTINE
    node_eviction_rate: float = NODE_EVICTION_RATE
    secondary_node_eviction_rate: float = SECONDARY_NODE_EVICTION_RATE
    large_cluster_size_threshold: int = LARGE_CLUSTER_SIZE_THRESHOLD
    unhealthy_zone_threshold: float = UNHEALTHY_ZONE_THRESHOLD


@dataclasses.dataclass(frozen=True)
class ControllerManager:
    """kube-controller-manager's client limits and replica bursts."""

    kube_api_qps: float = KUBE_API_QPS
    kube_api_burst: int = KUBE_API_BURST
    burst_replicas: int = BURST_REPLICAS


@dataclasses.dataclass(frozen=True)
class KarpenterClient:
    """Karpenter's client limit: one token bucket shared by all its controllers (qps 0: no limit)."""

    kube_client_qps: float = KARPENTER_KUBE_CLIENT_QPS
    kube_client_burst: int = KARPENTER_KUBE_CLIENT_BURST


@dataclasses.dataclass(frozen=True)
class ClusterAutoscalerClient:
    """The Cluster Autoscaler's client limit: one token bucket for all its requests (qps 0: no
    limit). Its other flags and its node groups are ``capacity.cluster_autoscaler``."""

    kube_client_qps: float = CLUSTER_AUTOSCALER_KUBE_CLIENT_QPS
    kube_client_burst: int = CLUSTER_AUTOSCALER_KUBE_CLIENT_BURST


@dataclasses.dataclass(frozen=True)
class ApiServer:
    """kube-apiserver's storage: how long old resourceVersions stay readable."""

    etcd_compaction_interval: float = ETCD_COMPACTION_INTERVAL


@dataclasses.dataclass(frozen=True)
class Kubelet:
    """How long a deleted pod keeps its node's room: at most ``termination_seconds`` from its
    deletion (default: no cap, its whole grace period: ``terminationGracePeriodSeconds``, 30 s
    unless the pod says otherwise, or the eviction's or deletion's own). The test harness
    (:func:`spotguard_sim.testing.running_cluster`) caps it at 1 s unless told otherwise, so
    contract tests do not wait for it; the demo, ``simulate`` and the benchmarks take it from
    here."""

    termination_seconds: float = math.inf


@dataclasses.dataclass(frozen=True)
class Settings:
    node_loss: NodeLoss = dataclasses.field(default_factory=NodeLoss)
    controller_manager: ControllerManager = dataclasses.field(default_factory=ControllerManager)
    karpenter: KarpenterClient = dataclasses.field(default_factory=KarpenterClient)
    cluster_autoscaler: ClusterAutoscalerClient = dataclasses.field(default_factory=ClusterAutoscalerClient)
    api_server: ApiServer = dataclasses.field(default_factory=ApiServer)
    capacity: capacity_mod.Capacity = dataclasses.field(default_factory=capacity_mod.Capacity)
    kubelet: Kubelet = dataclasses.field(default_factory=Kubelet)


_NODE_LOSS_FIELDS = {
    "instanceAction": "instance_action",
    "shuttingDownSeconds": "shutting_down_seconds",
    "nodeMonitorGracePeriodSeconds": "node_monitor_grace_period",
    "nodeMonitorPeriodSeconds": "node_monitor_period",
    "cloudNodeMonitorPeriodSeconds": "cloud_node_monitor_period",
    "podGCPeriodSeconds": "pod_gc_period",
    "podGCQuarantineSeconds": "pod_gc_quarantine",
    "nodeEvictionRate": "node_eviction_rate",
    "secondaryNodeEvictionRate": "secondary_node_eviction_rate",
    "largeClusterSizeThreshold": "large_cluster_size_threshold",
    "unhealthyZoneThreshold": "unhealthy_zone_threshold",
}
_CONTROLLER_MANAGER_FIELDS = {
    "kubeAPIQPS": "kube_api_qps",
    "kubeAPIBurst": "kube_api_burst",
    "burstReplicas": "burst_replicas",
}
_CLIENT_FIELDS = {"kubeClientQPS": "kube_client_qps", "kubeClientBurst": "kube_client_burst"}
_API_SERVER_FIELDS = {"etcdCompactionIntervalSeconds": "etcd_compaction_interval"}
_KUBELET_FIELDS = {"terminationSeconds": "termination_seconds"}


def is_settings(doc: Mapping[str, Any]) -> bool:
    return doc.get("apiVersion") == API_VERSION and doc.get("kind") == KIND


def _section(doc: Mapping[str, Any], key: str, fields: Mapping[str, str], cls: Any, where: str) -> Any:
    raw = doc.get(key) or {}
    if not isinstance(raw, Mapping):
        raise UserError(f"{where}: {key} must be a mapping")
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise UserError(f"{where}: unknown {key} field(s) {', '.join(unknown)}; known: {', '.join(fields)}")
    values: dict[str, Any] = {}
    for name, attr in fields.items():
        if name not in raw:
            continue
        value = raw[name]
        default = getattr(cls(), attr)
        if isinstance(default, str):
            if value not in INSTANCE_ACTIONS:
                raise UserError(f"{where}: {key}.{name} must be one of {', '.join(INSTANCE_ACTIONS)}, got {value!r}")
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise UserError(f"{where}: {key}.{name} must be a non-negative number, got {value!r}")
        elif isinstance(default, int):
            if int(value) != value:
                raise UserError(f"{where}: {key}.{name} must be an integer, got {value!r}")
            value = int(value)
        else:
            value = float(value)
        values[attr] = value
    return cls(**values)


def from_doc(doc: Mapping[str, Any], where: str = "scenario") -> Settings:
    unknown = sorted(set(doc) - {"apiVersion", "kind", "metadata", "nodeLoss", "controllerManager",
                                 "karpenter", "clusterAutoscaler", "apiServer", "capacity", "kubelet"})
    if unknown:
        raise UserError(f"{where}: unknown Settings field(s) {', '.join(unknown)}")
    return Settings(
        node_loss=_section(doc, "nodeLoss", _NODE_LOSS_FIELDS, NodeLoss, where),
        controller_manager=_section(doc, "controllerManager", _CONTROLLER_MANAGER_FIELDS, ControllerManager, where),
        karpenter=_section(doc, "karpenter", _CLIENT_FIELDS, KarpenterClient, where),
        cluster_autoscaler=_section(doc, "clusterAutoscaler", _CLIENT_FIELDS, ClusterAutoscalerClient, where),
        api_server=_section(doc, "apiServer", _API_SERVER_FIELDS, ApiServer, where),
        capacity=capacity_mod.from_doc(doc.get("capacity"), where),
        kubelet=_section(doc, "kubelet", _KUBELET_FIELDS, Kubelet, where),
    )


def split(objects: Iterable[Mapping[str, Any]]) -> tuple[Settings, list[dict[str, Any]]]:
    """The scenario's Settings (the last document wins; defaults without one) and the other objects."""
    found = Settings()
    rest: list[dict[str, Any]] = []
    for obj in objects:
        if is_settings(obj):
            found = from_doc(obj, f"Settings {((obj.get('metadata') or {}).get('name') or '')!r}")
        else:
            rest.append(dict(obj))
    return found, rest
