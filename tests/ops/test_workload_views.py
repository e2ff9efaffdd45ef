"""The cycle's polls read the workloads through ``cycle.WorkloadViews``: parsed again only where written."""

from __future__ import annotations

from spotguard.ops import cycle, serving
from spotguard.policy.moves import MOVE
from spotguard.policy.workloads import SURGE
from spotguard.sim import store as store_mod

from tests.interruption import sim_scenario


def test_only_the_workloads_written_since_the_last_poll_are_parsed_again() -> None:
    st = store_mod.Store()
    st.apply_objects([sim_scenario.namespace("shop"), sim_scenario.deployment("web", 3),
                      sim_scenario.deployment("api", 2)])
    views = cycle.WorkloadViews(st)
    first = views()
    assert sorted(first) == ["Deployment/shop/api", "Deployment/shop/web"]
    again = views()
    assert all(again[k] is first[k] for k in first)  # unchanged: the same views
    # WHEN web gets a move record
    st.mutate("deployments", "web", "shop",
              lambda d: d["metadata"].setdefault("annotations", {}).__setitem__(MOVE, "{}"))
    after = views()
    # THEN web is read again (with it), api is not
    assert after["Deployment/shop/api"] is first["Deployment/shop/api"]
    assert MOVE in after["Deployment/shop/web"].annotations
    # AND a deleted workload goes
    st.delete("deployments", "api", "shop")
    assert sorted(views()) == ["Deployment/shop/web"]


def test_busy_while_a_move_or_a_surge_is_recorded_or_pods_are_missing() -> None:
    st = store_mod.Store()
    st.apply_objects([sim_scenario.namespace("shop"), sim_scenario.deployment("web", 2)])
    tracker = serving.Serving(lambda: 0.0, lambda labels: serving.SPOT)
    views = cycle.WorkloadViews(st)
    # no pod serves yet: busy
    assert views.busy(tracker)
    both = serving.Counts(serving={serving.SPOT: 2, serving.ON_DEMAND: 0})
    tracker.snapshot = lambda: {"Deployment/shop/web": both}  # type: ignore[method-assign]
    assert not views.busy(tracker)
    for key in (MOVE, SURGE):
        st.mutate("deployments", "web", "shop",
                  lambda d, key=key: d["metadata"].setdefault("annotations", {}).__setitem__(key, '{"x": 1}'))
        assert views.busy(tracker), key
        st.mutate("deployments", "web", "shop",
                  lambda d, key=key: d["metadata"]["annotations"].pop(key))
