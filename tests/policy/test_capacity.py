"""Node capacity classification under every default label scheme, and custom schemes."""

from __future__ import annotations

import pytest
from spotguard.policy import capacity
from spotguard.policy.capacity import Capacity


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ({"node.kubernetes.io/capacity": "spot"}, Capacity.SPOT),
        ({"node.kubernetes.io/capacity": "on-demand"}, Capacity.ON_DEMAND),
        ({"karpenter.sh/capacity-type": "spot"}, Capacity.SPOT),
        ({"karpenter.sh/capacity-type": "on-demand"}, Capacity.ON_DEMAND),
        ({"karpenter.sh/capacity-type": "reserved"}, Capacity.ON_DEMAND),  # not interruptible
        ({"eks.amazonaws.com/capacityType": "SPOT"}, Capacity.SPOT),
        ({"eks.amazonaws.com/capacityType": "ON_DEMAND"}, Capacity.ON_DEMAND),
        ({"cloud.google.com/gke-spot": "true"}, Capacity.SPOT),
        # GKE preemptible VMs are reclaimed like spot ones
        ({"cloud.google.com/gke-preemptible": "true"}, Capacity.SPOT),
        ({"cloud.google.com/gke-preemptible": "true", "cloud.google.com/gke-nodepool": "pool"}, Capacity.SPOT),
        ({"kubernetes.azure.com/scalesetpriority": "spot"}, Capacity.SPOT),
        ({"kubernetes.azure.com/scalesetpriority": "regular"}, Capacity.ON_DEMAND),
        # unknown: no label, an unknown value, the wrong case, GKE's non-spot marker
        ({}, Capacity.UNKNOWN),
        ({"kubernetes.io/hostname": "n1"}, Capacity.UNKNOWN),
        ({"node.kubernetes.io/capacity": "reserved"}, Capacity.UNKNOWN),
        ({"eks.amazonaws.com/capacityType": "spot"}, Capacity.UNKNOWN),
        ({"karpenter.sh/capacity-type": "Spot"}, Capacity.UNKNOWN),
        ({"cloud.google.com/gke-spot": "false"}, Capacity.UNKNOWN),
        ({"cloud.google.com/gke-preemptible": "false"}, Capacity.UNKNOWN),
        ({"kubernetes.azure.com/scalesetpriority": ""}, Capacity.UNKNOWN),
        # an unknown value under one scheme lets the next scheme decide
        (
            {"node.kubernetes.io/capacity": "weird", "karpenter.sh/capacity-type": "spot"},
            Capacity.SPOT,
        ),
        # spot under any scheme wins over on-demand under another (the node is interruptible)
        (
            {"node.kubernetes.io/capacity": "on-demand", "karpenter.sh/capacity-type": "spot"},
            Capacity.SPOT,
        ),
        (
            {"eks.amazonaws.com/capacityType": "ON_DEMAND", "cloud.google.com/gke-spot": "true"},
            Capacity.SPOT,
        ),
    ],
)
def test_default_schemes(labels: dict[str, str], expected: Capacity) -> None:
    assert capacity.classify(labels) is expected


def test_six_default_schemes() -> None:
    assert [s.key for s in capacity.DEFAULT_SCHEMES] == [
        "node.kubernetes.io/capacity",
        "karpenter.sh/capacity-type",
        "eks.amazonaws.com/capacityType",
        "cloud.google.com/gke-spot",
        "cloud.google.com/gke-preemptible",
        "kubernetes.azure.com/scalesetpriority",
    ]


def test_custom_schemes_replace_the_defaults() -> None:
    schemes = capacity.parse_schemes("example.com/lifecycle=preemptible|spot:dedicated")
    assert schemes == (capacity.scheme("example.com/lifecycle", ["preemptible", "spot"], ["dedicated"]),)
    assert capacity.classify({"example.com/lifecycle": "spot"}, schemes) is Capacity.SPOT
    assert capacity.classify({"example.com/lifecycle": "dedicated"}, schemes) is Capacity.ON_DEMAND
    assert capacity.classify({"karpenter.sh/capacity-type": "spot"}, schemes) is Capacity.UNKNOWN


def test_parse_spot_only_scheme_and_whitespace() -> None:
    schemes = capacity.parse_schemes(" cloud.google.com/gke-spot=true: , a=s:o ,")
    assert [(s.key, s.spot, s.on_demand) for s in schemes] == [
        ("cloud.google.com/gke-spot", frozenset({"true"}), frozenset()),
        ("a", frozenset({"s"}), frozenset({"o"})),
    ]


@pytest.mark.parametrize("text", ["", " , ", "key", "key=spot", "=spot:od", "key=:od"])
def test_parse_invalid_schemes(text: str) -> None:
    with pytest.raises(ValueError, match="scheme"):
        capacity.parse_schemes(text)
