"""What a kubelet reports in a Node's status when it registers and posts status.

``fill(node)`` adds what is missing (never overwrites): every ``nodeInfo``
field the API requires (the official client refuses a NodeSystemInfo without
machineID, systemUUID, bootID, kernelVersion, kubeProxyVersion...), the
``addresses`` (InternalIP, Hostname), ``daemonEndpoints``, and the four
conditions a kubelet posts (MemoryPressure, DiskPressure, PIDPressure False;
Ready True). https://kubernetes.io/docs/reference/node/node-status/
"""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

Obj = dict[str, Any]

NODE_INFO_DEFAULTS = {
    "architecture": "amd64",
    "operatingSystem": "linux",
    "osImage": "Amazon Linux 2023",
    "kernelVersion": "6.1.0-sim",
    "containerRuntimeVersion": "containerd://2.1.4",
    "kubeletVersion": "v1.35.0",
    "kubeProxyVersion": "",  # deprecated, the kubelet reports it empty since 1.31
}
PRESSURE = (
    ("MemoryPressure", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
    ("DiskPressure", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
    ("PIDPressure", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
)


REQUIRED_NODE_INFO = ("machineID", "systemUUID", "bootID", "kernelVersion", "osImage", "containerRuntimeVersion",
                      "kubeletVersion", "kubeProxyVersion", "operatingSystem", "architecture")


def complete(node: Obj) -> bool:
    """Whether the status has what a kubelet always reports (nodeInfo, addresses)."""
    status = node.get("status") or {}
    info = status.get("nodeInfo") or {}
    return all(k in info for k in REQUIRED_NODE_INFO) and bool(status.get("addresses"))


def internal_ip(name: str) -> str:
    """A stable 10.x address for a node name (EC2 style private address)."""
    digest = hashlib.sha256(name.encode()).digest()
    return f"10.{digest[0]}.{digest[1]}.{digest[2] % 254 + 1}"


def fill(node: Obj) -> Obj:
    """Complete ``node``'s status in place as its kubelet would; returns it."""
    name = str((node.get("metadata") or {}).get("name") or "")
    labels = (node.get("metadata") or {}).get("labels") or {}
    status = node.setdefault("status", {})
    info = status.setdefault("nodeInfo", {})
    ids = uuid.uuid5(uuid.NAMESPACE_DNS, f"{name}.node.sim.spotguard.io")
    info.setdefault("machineID", ids.hex)
    info.setdefault("systemUUID", str(ids))
    info.setdefault("bootID", str(uuid.uuid5(ids, "boot")))
    from_labels = {"architecture": labels.get("kubernetes.io/arch"), "operatingSystem": labels.get("kubernetes.io/os")}
    for key, value in NODE_INFO_DEFAULTS.items():
        info.setdefault(key, str(from_labels.get(key) or value))
    if not status.get("addresses"):
        status["addresses"] = [
            {"type": "InternalIP", "address": internal_ip(name)},
            {"type": "Hostname", "address": str(labels.get("kubernetes.io/hostname") or name)},
        ]
    status.setdefault("daemonEndpoints", {"kubeletEndpoint": {"Port": 10250}})
    if "allocatable" in status and "capacity" not in status:
        status["capacity"] = dict(status["allocatable"])
    if "capacity" in status and "allocatable" not in status:
        status["allocatable"] = dict(status["capacity"])
    return node


def post_ready(node: Obj, now: str) -> None:
    """The conditions a healthy kubelet posts (pressure False, Ready True)."""
    fill(node)
    conds = node["status"].setdefault("conditions", [])
    have = {c.get("type") for c in conds}
    for kind, reason, message in PRESSURE:
        if kind not in have:
            conds.append({"type": kind, "status": "False", "reason": reason, "message": message,
                          "lastHeartbeatTime": now, "lastTransitionTime": now})
    for cond in conds:
        if cond.get("type") == "Ready":
            if cond.get("status") != "True":
                cond["lastTransitionTime"] = now
            cond.update(status="True", reason="KubeletReady", message="kubelet is posting ready status",
                        lastHeartbeatTime=now)
            return
    conds.append({"type": "Ready", "status": "True", "reason": "KubeletReady",
                  "message": "kubelet is posting ready status", "lastHeartbeatTime": now,
                  "lastTransitionTime": now})
