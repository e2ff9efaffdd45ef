"""``spotguard reconcile``'s text says what a pass did to the on-demand headroom (``--dry-run``: what it would)."""

from __future__ import annotations

from spotguard.nodeadded import report
from spotguard.nodeadded.headroom import Step
from spotguard.nodeadded.reconciler import Report
from spotguard.policy.headroom import Cover, Headroom

HELD = Headroom(Cover.LARGEST_NODE, count=3, cpu=500, memory=256 * 2**20, wanted=3, pods=5,
                need_cpu=1400, need_memory=700 * 2**20, nodes=("spot-1",))  # fmt: skip


def test_a_dry_run_says_the_headroom_would_be_written() -> None:
    out = report.text(Report(dry_run=True, headroom=HELD, headroom_step=Step.PLANNED))
    line = next(x for x in out.splitlines() if "headroom" in x)
    assert line.strip() == (
        "headroom largest-node: 3 placeholder(s) of 500m CPU and 256 MiB for 5 pod(s) at risk "
        "(1400m, 700 MiB) on spot-1: would be written"
    )


def test_a_failed_write_and_nothing_at_risk_are_said() -> None:
    failed = report.text(Report(headroom=HELD, headroom_step=Step.FAILED))
    assert "the write failed (see the log): the next pass tries again" in failed
    quiet = report.text(Report(headroom=Headroom(Cover.ALL_SPOT), headroom_step=Step.UNCHANGED))
    assert "headroom all-spot: nothing at risk: kept as it is" in quiet


def test_headroom_off_and_untouched_says_nothing() -> None:
    assert "headroom" not in report.text(Report())
    # turned off this pass: the placeholders' Deployment deleted is said
    assert "headroom off: deleted" in report.text(Report(headroom_step=Step.DELETED))
