"""The instance catalogue of the simulated cloud: shapes and prices in us-east-1 (pure data).

On-demand prices are Karpenter's own snapshot of the AWS Price List API for
us-east-1 (aws/karpenter-provider-aws ``pkg/providers/pricing/zz_generated.pricing_aws.go``,
"generated at 2026-07-20T13:44:30Z for us-east-1"), USD per instance-hour, Linux.

Spot prices move every few minutes and no snapshot of them is reachable from where
this was built; each is the on-demand price times ``SPOT_RATIO`` (0.5): the ratio of
the lowest-zone spot price to the on-demand price in AWS's own us-east-1 example
(EC2 Auto Scaling User Guide, "Spot price per unit hour example": c5.2xlarge
$0.170 vs $0.34). That is a smaller saving than the "up to 90%" AWS advertises, so a
figure built on it is never kinder than the cloud. A scenario may set its own prices
(``Settings.capacity.prices``).

Shapes: vCPUs and memory as EC2 DescribeInstanceTypes reports them; the pod limit is
the VPC CNI's ENI formula ``ENIs x (IPv4 addresses per ENI - 1) + 2`` (amazon-eks-ami
``eni-max-pods.txt``; Karpenter's ``ENILimitedPods``). ``allocatable`` subtracts what
Karpenter subtracts (``pkg/providers/instancetype/types.go``): VM memory overhead 7.5 %
(``VM_MEMORY_OVERHEAD_PERCENT``), kube-reserved CPU (6 % of the first core, 1 % of the
second, 0.5 % of the next two, 0.25 % above) and memory (11 MiB per pod + 255 MiB), and
the 100 MiB hard eviction threshold.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

REGION = "us-east-1"
ZONES = ("us-east-1a", "us-east-1b", "us-east-1c")
PRICES_DATED = "2026-07-20"
SPOT_RATIO = 0.5
VM_MEMORY_OVERHEAD = 0.075
EVICTION_HARD_MIB = 100


@dataclasses.dataclass(frozen=True)
class InstanceType:
    name: str
    vcpus: int
    memory_mib: int
    enis: int
    ips_per_eni: int
    on_demand: float  # USD per hour

    @property
    def family(self) -> str:
        return self.name.split(".", 1)[0]

    @property
    def size(self) -> str:
        return self.name.split(".", 1)[1]

    @property
    def category(self) -> str:
        return self.family[0]

    @property
    def generation(self) -> str:
        return "".join(ch for ch in self.family[1:] if ch.isdigit())

    @property
    def max_pods(self) -> int:
        return self.enis * (self.ips_per_eni - 1) + 2

    @property
    def spot(self) -> float:
        return round(self.on_demand * SPOT_RATIO, 6)

    def price(self, capacity_type: str) -> float:
        """USD per hour for ``capacity_type`` (reserved capacity is paid up front: 0 here)."""
        if capacity_type == "spot":
            return self.spot
        if capacity_type == "reserved":
            return 0.0
        return self.on_demand

    def allocatable(self) -> dict[str, str]:
        """What the kubelet reports allocatable (Karpenter's own estimate of it)."""
        cpu_m = self.vcpus * 1000
        reserved_cpu = 0.0
        for start, end, share in ((0, 1000, 0.06), (1000, 2000, 0.01), (2000, 4000, 0.005), (4000, 1 << 31, 0.0025)):
            if cpu_m >= start:
                reserved_cpu += int((min(cpu_m, end) - start) * share)
        memory = self.memory_mib - -(-self.memory_mib * VM_MEMORY_OVERHEAD // 1)
        memory -= 11 * self.max_pods + 255 + EVICTION_HARD_MIB
        return {"cpu": f"{cpu_m - int(reserved_cpu)}m", "memory": f"{int(memory)}Mi",
                "pods": str(self.max_pods)}

    def capacity(self) -> dict[str, str]:
        return {"cpu": str(self.vcpus), "memory": f"{self.memory_mib}Mi", "pods": str(self.max_pods)}


def _t(name: str, vcpus: int, gib: int, enis: int, ips: int, price: float) -> InstanceType:  # noqa: PLR0917
    return InstanceType(name, vcpus, gib * 1024, enis, ips, price)


TYPES: dict[str, InstanceType] = {t.name: t for t in (
    _t("m5.large", 2, 8, 3, 10, 0.096),
    _t("m5.xlarge", 4, 16, 4, 15, 0.192),
    _t("m5.2xlarge", 8, 32, 4, 15, 0.384),
    _t("m5.4xlarge", 16, 64, 8, 30, 0.768),
    _t("m5a.large", 2, 8, 3, 10, 0.086),
    _t("m5a.xlarge", 4, 16, 4, 15, 0.172),
    _t("m5a.2xlarge", 8, 32, 4, 15, 0.344),
    _t("m6i.large", 2, 8, 3, 10, 0.096),
    _t("m6i.xlarge", 4, 16, 4, 15, 0.192),
    _t("m6i.2xlarge", 8, 32, 4, 15, 0.384),
    _t("c5.large", 2, 4, 3, 10, 0.085),
    _t("c5.xlarge", 4, 8, 4, 15, 0.170),
    _t("c5.2xlarge", 8, 16, 4, 15, 0.340),
    _t("r5.large", 2, 16, 3, 10, 0.126),
    _t("r5.xlarge", 4, 32, 4, 15, 0.252),
)}


@dataclasses.dataclass(frozen=True)
class Prices:
    """Prices per hour by (instance type, capacity type): the catalogue's, or a scenario's own."""

    overrides: Mapping[str, Mapping[str, float]] = dataclasses.field(default_factory=dict)

    def hourly(self, instance_type: str, capacity_type: str) -> float | None:
        """USD per hour; None for an instance type neither the catalogue nor the scenario prices."""
        own = self.overrides.get(instance_type) or {}
        key = {"on-demand": "onDemand", "spot": "spot", "reserved": "reserved"}.get(capacity_type, "onDemand")
        if key in own:
            return float(own[key])
        known = TYPES.get(instance_type)
        if known is None:
            return None
        return known.price(capacity_type)


def get(name: str) -> InstanceType | None:
    return TYPES.get(name)
