"""The measured runs (demo, simulate, replay, the benchmarks) let a deleted pod keep its node's
room for its grace period, as a kubelet does; the scenario may cap it (``kubelet.terminationSeconds``).
The test harness alone caps it at 1 s, so contract tests do not wait."""

from __future__ import annotations

import math
import time
from typing import Any

import pytest
from spotguard.logs import UserError
from spotguard.ops import cycle
from spotguard_sim import scenario as scenario_mod
from spotguard_sim import settings as settings_mod

from tests.ops.support import SCENARIOS

SETTINGS = {"apiVersion": settings_mod.API_VERSION, "kind": settings_mod.KIND, "metadata": {"name": "k"}}


def test_the_setting_defaults_to_the_grace_period_and_is_validated() -> None:
    assert settings_mod.Settings().kubelet.termination_seconds == math.inf
    got = settings_mod.from_doc({**SETTINGS, "kubelet": {"terminationSeconds": 5}})
    assert got.kubelet.termination_seconds == 5.0
    with pytest.raises(UserError, match=r"kubelet\.terminationSeconds must be a non-negative number"):
        settings_mod.from_doc({**SETTINGS, "kubelet": {"terminationSeconds": -1}})
    with pytest.raises(UserError, match="unknown kubelet field"):
        settings_mod.from_doc({**SETTINGS, "kubelet": {"gracePeriod": 5}})


def gone_after(objects: list[dict[str, Any]]) -> float:
    """Simulated seconds from a workload pod's deletion to its removal, in the cluster the
    measured runs use (cycle.loaded_cluster: the scenario's settings)."""
    with cycle.loaded_cluster(objects, time_scale=20.0) as sim:

        def bound_replica() -> dict[str, Any] | None:
            # The controllers create the pods after the load (a fresh-clone CI run found none
            # yet): a Deployment's pod bound to a node, whose kubelet then runs its grace period.
            for p in sim.store.list("pods")[0]:
                owner = (p["metadata"].get("ownerReferences") or [{}])[0]
                if owner.get("kind") == "ReplicaSet" and p["spec"].get("nodeName"):
                    return p
            return None

        ends = time.monotonic() + 60
        while (pod := bound_replica()) is None:
            assert time.monotonic() < ends, "no Deployment pod was bound within 60 s"
            time.sleep(0.05)
        name, ns = pod["metadata"]["name"], pod["metadata"]["namespace"]
        start = sim.clock.now()
        sim.store.delete("pods", name, ns)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if not any(p["metadata"]["name"] == name for p in sim.store.list("pods", ns)[0]):
                return float(sim.clock.now() - start)
            time.sleep(0.02)
        raise AssertionError(f"{ns}/{name} was not removed")


@pytest.mark.parametrize("cap", [None, 5.0])
def test_a_deleted_pod_keeps_its_room_for_its_grace_period(cap: float | None) -> None:
    objects = scenario_mod.load(SCENARIOS / "small.yaml")
    if cap is not None:
        objects = [*objects, {**SETTINGS, "kubelet": {"terminationSeconds": cap}}]
    took = gone_after(objects)
    if cap is None:
        # terminationGracePeriodSeconds' default, 30 s (the deletionTimestamp has whole seconds)
        assert 29.0 <= took < 45.0, took
    else:
        assert 4.0 <= took < 20.0, took
