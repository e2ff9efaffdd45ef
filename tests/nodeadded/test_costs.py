"""A move's deletion-cost patches are tried again at once where they fail transiently."""

from __future__ import annotations

from typing import Any

import pytest
from spotguard.gateway import resources as r
from spotguard.gateway.errors import NotFound, Transient
from spotguard.nodeadded import reconciler
from spotguard.policy import config, moves
from spotguard.policy.workloads import DELETION_COST


class Flaky:
    """A Kube whose pod patches fail ``fails`` times (500) before they go through."""

    def __init__(self, fails: int) -> None:
        self.fails = fails
        self.patches: list[tuple[str, Any]] = []

    def patch(self, res: r.Resource, name: str, body: Any, namespace: str | None = None, *a: Any) -> dict[str, Any]:
        self.patches.append((name, body))
        if self.fails:
            self.fails -= 1
            raise Transient(500, "InternalError", "injected")
        return {}


def test_a_cost_patch_that_fails_transiently_is_tried_again_at_once() -> None:
    """A batch of 10 ranked one patch a pod, with one try each, got through one pass in nine under
    20 % failed requests (chaos spot-refused-after-reclaim under 500s): each is tried again within
    the pass (a merge patch of an absolute value: made twice, no harm)."""
    k = Flaky(fails=2)
    rec = reconciler.Reconciler(k, config.Config(), clock=lambda: 0.0)  # type: ignore[arg-type]
    rec._rank("shop", [moves.Marked("web-1", "u1")])
    assert [n for n, _ in k.patches] == ["web-1"] * 3
    assert k.patches[-1][1] == {"metadata": {"annotations": {DELETION_COST: str(moves.FIRST_TO_GO)}}}
    # a pod that keeps failing fails the step (the next pass tries again)
    k = Flaky(fails=100)
    rec = reconciler.Reconciler(k, config.Config(), clock=lambda: 0.0)  # type: ignore[arg-type]
    with pytest.raises(Transient):
        rec._rank("shop", [moves.Marked("web-1", "u1")])
    assert len(k.patches) == 4


def test_a_pod_gone_is_not_tried_again() -> None:
    class Gone(Flaky):
        def patch(self, *a: Any, **kw: Any) -> dict[str, Any]:
            self.patches.append(("gone", None))
            raise NotFound(404, "NotFound", "gone")

    k = Gone(0)
    rec = reconciler.Reconciler(k, config.Config(), clock=lambda: 0.0)  # type: ignore[arg-type]
    rec._rank("shop", [moves.Marked("web-1", "u1"), moves.Marked("web-2", "u2")])
    assert len(k.patches) == 2
