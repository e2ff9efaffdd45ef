"""The cycle's polls read the workloads through ``cycle.WorkloadViews``: parsed again only where written."""

from __future__ import annotations

from spotguard.ops import cycle, serving
from spotguard.policy.moves import MOVE
from spotguard.policy.workloads import SURGE
from spotguard_sim import store as store_mod

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


def test_a_return_that_timed_out_says_which_workloads_were_not_back_and_what_held_them() -> None:
    from spotguard.policy import moves
    from spotguard.policy.workloads import Kind, Workload

    record = moves.MoveRecord(direction=moves.Direction.TO_SPOT, method=moves.Method.SCALE, pod="web-1", uid="u",
                              replicas=4, scaled_to=5, started=100.0, on_demand=2)
    held = moves.held(record, 200.0, "the new replica did not land on spot")
    web = Workload(Kind.DEPLOYMENT, "shop", "web", 4, {MOVE: held.to_json()})
    api = Workload(Kind.DEPLOYMENT, "shop", "api", 3, {})
    counts = {web.key: serving.Counts(serving={serving.SPOT: 1, serving.ON_DEMAND: 3}),
              api.key: serving.Counts(serving={serving.SPOT: 2, serving.ON_DEMAND: 1})}
    wls = {web.key: web, api.key: api}
    text = cycle._not_back(counts, wls, {web.key: 1, api.key: 1}, wls)
    assert text == ("Deployment/shop/web 1 of 3 on spot, 4 serving for 4; held: the new replica did not land on spot")
