"""A pass's report as text (``spotguard reconcile``, ``--dry-run`` included)."""

from __future__ import annotations

from spotguard.nodeadded.headroom import Step
from spotguard.nodeadded.reconciler import Report
from spotguard.policy.headroom import Cover
from spotguard.policy.moves import Action, Method


def text(rep: Report) -> str:
    verb = "would " if rep.dry_run else ""
    lines: list[str] = []
    plan = rep.plan
    lines.append(
        f"{len(plan.surplus)} workload(s) above their floor on on-demand, {len(plan.deficits)} below it"
        + (" (dry run: nothing written)" if rep.dry_run else "")
    )
    for p in rep.progress:
        if p.action is Action.WAIT:
            lines.append(f"  {p.workload.key}: move in progress ({p.reason})")
        else:
            lines.append(f"  {p.workload.key}: {verb}{p.action} the recorded move ({p.reason})")
    for m in rep.started:
        how = "scale up one, then back with it ranked first" if m.method is Method.SCALE else "evict it"
        lines.append(f"  {m.workload.key}: {verb}move {m.pod.name} {m.direction} ({how}): {m.reason}")
    for s in plan.skipped:
        lines.append(f"  {s.workload.key}: left alone, {s.reason}: {s.detail}")
    for lease in rep.leases:
        lines.append(f"  lease {lease.namespace}/{lease.name}: {verb}delete (ReplicaSet {lease.replicaset} is gone)")
    for pod in rep.stranded:
        lines.append(
            f"  pod {pod.namespace}/{pod.name}: {verb}evict (Pending on a move's spot requirement no longer asked for)"
        )
    for key in rep.surges_over:
        lines.append(f"  {key}: surge over; the spot-interruption reconcile {verb}scale(s) it back")
    if rep.headroom.cover is not Cover.OFF or rep.headroom_step is not Step.UNCHANGED:
        lines.append(f"  {rep.headroom.describe()}: {_headroom_step(rep.headroom_step)}")
    for node, value in sorted(rep.node_labels.items()):
        action = "label spotguard.io/spot=true" if value is not None else "remove its spotguard.io/spot label"
        lines.append(f"  node {node}: {verb}{action}")
    if rep.optimal:
        lines.append("the cluster is at its optimum: nothing to do")
    if rep.failures:
        lines.append(f"{rep.failures} write(s) failed; see the log")
    return "\n".join(lines) + "\n"


def _headroom_step(step: Step) -> str:
    """What the pass did to the placeholders' Deployment, in words."""
    return {
        Step.UNCHANGED: "kept as it is",
        Step.CREATED: "created",
        Step.RESIZED: "resized",
        Step.DELETED: "deleted",
        Step.FOREIGN: "a Deployment of that name that spotguard did not make: left alone",
        Step.FAILED: "the write failed (see the log): the next pass tries again",
        Step.PLANNED: "would be written",
    }[step]
