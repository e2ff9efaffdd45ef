"""Replay captured events: see what spotguard does (or would do) with them.

Each EVENT_FILE (or every *.json file of a folder) is recognised by its shape:
an EventBridge event, an SQS message, a Lambda SQS batch, a CloudEvent
(structured JSON, or an HTTP capture {"headers": ..., "body": ...}), an
AdmissionReview, a Knative ApiServerSource or PingSource event, the
EventBridge Scheduler's input (``{"spotguard": "reconcile"}``: a reconcile, as
a ``Scheduled Event``) (examples, one per kind, in infra/events/). Each runs through the same core the functions
use: interruption notices through the spot-interruption handler, reviews
through the admission core, node additions and pings through node-added (and
pings also through the interruption reconcile).

Against --kubeconfig (a real cluster; default $KUBECONFIG), or --scenario (the simulated cluster
loaded from a scenario or a `spotguard snapshot`, its pods placed by the
admission webhook), or --to URL (post each event to a running function,
as its transport would: CloudEvents for spot-interruption and node-added,
the AdmissionReview for admission).

--dry-run writes nothing and prints the plan with reasons: taints, scale
changes, temporary budgets, autoscaler changes, scale-backs, the admission
patch (the review is sent with dryRun: true, so no Lease is written).
Exit status: 0 when every event was handled, 1 when one asks to be delivered
again (a transient failure), 2 for a usage error or a file that is not an event.

examples:
  spotguard replay infra/events/ --scenario infra/scenarios/demo.yaml --dry-run
  spotguard replay infra/events/eventbridge-spot-interruption.json --kubeconfig ~/.kube/config --dry-run
  spotguard replay captured.json --to http://localhost:8080/ --output json
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import logging
import os
import ssl
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spotguard import flags
from spotguard.logs import UserError
from spotguard.ops import eventfiles

Obj = dict[str, Any]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("files", nargs="+", metavar="EVENT_FILE|DIR", help="event files, or folders of *.json")
    target = parser.add_mutually_exclusive_group()
    flags.add_kubeconfig(target, "replay against this cluster (default: $KUBECONFIG, when no --scenario or --to)")
    target.add_argument("--scenario", metavar="FILE", help="replay against the simulated cluster loaded from FILE")
    target.add_argument("--to", metavar="URL", help="post each event to a running function at URL")
    parser.add_argument("--dry-run", action="store_true", help="write nothing; print the plan with reasons")
    parser.add_argument("--ca-cert", metavar="FILE", help="with --to https://: the CA that signed its certificate")
    parser.add_argument("--output", choices=("text", "json"), default="text", help="text for a person, json (text)")


@dataclass
class Result:
    file: str
    kind: str
    function: str
    result: str  # done, planned, ignored, malformed, foreign, retry, skipped, posted, failed
    plan: list[str] = field(default_factory=list)  # what it did or would do, with reasons
    details: Obj = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.result not in ("retry", "failed")

    def to_json(self) -> Obj:
        return {"file": self.file, "kind": self.kind, "function": self.function, "result": self.result,
                "plan": self.plan, **self.details}  # fmt: skip


def run(args: argparse.Namespace) -> int:
    if not (args.kubeconfig or args.scenario or args.to):
        args.kubeconfig = flags.env_kubeconfig()  # as kubectl: $KUBECONFIG names the cluster
    if not (args.kubeconfig or args.scenario or args.to):
        raise UserError("say where to replay: --kubeconfig FILE (or $KUBECONFIG), --scenario FILE, or --to URL")
    if args.to and args.dry_run:
        raise UserError("--dry-run plans against a cluster; with --to the running function decides (drop one)")
    if args.ca_cert and not Path(args.ca_cert).is_file():
        raise UserError(f"--ca-cert {args.ca_cert}: no such file")
    if args.to and not args.to.startswith(("http://", "https://")):
        raise UserError(f"--to {args.to}: give an http:// or https:// URL")
    try:
        files = [eventfiles.read(p) for p in eventfiles.expand(args.files)]
    except eventfiles.BadFile as exc:
        raise UserError(str(exc)) from exc
    if getattr(args, "log_level", None) is None and "SPOTGUARD_LOG_LEVEL" not in os.environ:
        logging.getLogger().setLevel(logging.WARNING)
    from spotguard.ops import signals

    with signals.terminate_as_interrupt():
        if args.to:
            results = [post(f, args.to, args.ca_cert) for f in files]
        else:
            with target(args) as (kube, clock):
                results = [replay_safely(f, kube, clock, args.dry_run) for f in files]
    if args.output == "json":
        print(json.dumps({"dry_run": args.dry_run, "results": [r.to_json() for r in results]}))
    else:
        for r in results:
            print(f"{r.file}: {r.kind} -> {r.function}: {r.result}")
            for line in r.plan:
                print(f"  {line}")
    return 0 if all(r.ok for r in results) else 1


# -- where -------------------------------------------------------------------------------------


@contextlib.contextmanager
def target(args: argparse.Namespace) -> Iterator[tuple[Any, Any]]:
    """(a gateway Kube, a clock) for the cluster to replay against."""
    from spotguard.gateway import kube

    if args.kubeconfig:
        if not Path(args.kubeconfig).is_file():
            raise UserError(f"--kubeconfig {args.kubeconfig}: no such file")
        try:
            k = kube.connect(args.kubeconfig)
        except Exception as exc:
            raise UserError(f"cannot use the kubeconfig {args.kubeconfig}: {exc}") from exc
        reachable(k, args.kubeconfig)
        yield k, time.time
        return
    from spotguard_sim import scenario as scenario_mod

    from spotguard.ops import cycle

    path = Path(args.scenario)
    if not path.is_file():
        raise UserError(f"scenario {path} not found: give a Kubernetes YAML file or a snapshot with --scenario")
    with cycle.loaded_cluster(scenario_mod.load(path)) as sim:
        yield kube.Kube(sim.api_client()), sim.clock.now


def reachable(k: Any, kubeconfig: str) -> None:
    """Read the settings once: a cluster that does not answer (or refuses us) is a sentence, not a traceback."""
    from spotguard.gateway import errors, settings

    server = getattr(k.api_client.configuration, "host", "")
    try:
        settings.read(k, os.environ, settings.Source.from_env(os.environ))
    except errors.ApiError as exc:
        raise UserError(f"cannot reach the cluster of {kubeconfig} ({server}): {exc}") from exc


# -- one file against a cluster -----------------------------------------------------------------


def replay_safely(f: eventfiles.EventFile, k: Any, clock: Any, dry_run: bool) -> Result:
    """:func:`replay_one`, an API error on the way a result of its own (the next file still runs)."""
    from spotguard.gateway import errors

    try:
        return replay_one(f, k, clock, dry_run)
    except errors.ApiError as exc:
        result = "retry" if isinstance(exc, errors.Transient) else "failed"
        return Result(str(f.path), f.kind, f.function, result, [f"the cluster answered: {exc}"])


def replay_one(f: eventfiles.EventFile, k: Any, clock: Any, dry_run: bool) -> Result:
    name = str(f.path)
    if f.function == "admission":
        return _admission(f, k, dry_run)
    if f.kind in ("schedule", "pingsource"):
        return _reconcile(f, k, clock, dry_run)
    if f.function == "node-added":
        return _node_added(f, k, clock, dry_run)
    items = f.deliveries()
    notices = [n for i in items for n in i.notices]
    out = Result(name, f.kind, f.function, "")
    for i in items:
        if i.error is not None:
            kind = "foreign" if i.error.__class__.__name__ == "Foreign" else "malformed"
            out.plan.append(f"{i.key}: {kind}, acknowledged: {i.error.message}")
    if not notices:
        out.result = "foreign" if out.plan and all(": foreign," in p for p in out.plan) else "malformed"
        return out
    handler = _handler(k, clock)
    out.plan.extend(describe_plan(_plan(handler, notices, clock)))
    out.details["notices"] = [_notice_json(n) for n in notices]
    if dry_run:
        out.result = "planned"
        return out
    outcomes = handler.handle(notices)
    values = [str(o) for o in outcomes]
    out.details["outcomes"] = values
    out.result = "retry" if "retry" in values else "done" if "done" in values else "ignored"
    return out


def _handler(k: Any, clock: Any) -> Any:
    from spotguard.gateway import settings
    from spotguard.interruption.handler import Handler

    config, _ = settings.load(k)
    return Handler(k, config, clock=clock)


def _plan(handler: Any, notices: list[Any], clock: Any) -> Any:
    from spotguard.policy import interruption

    snap = handler.snapshot()
    return interruption.plan(
        notices, nodes=snap.node_views, pods=snap.pod_views, workloads=snap.workload_views, config=handler.config,
        now=clock(), budgets=snap.budget_views, autoscalers=snap.autoscaler_views,
        namespace_annotations=snap.namespaces,
    )  # fmt: skip


def describe_plan(plan: Any) -> list[str]:
    """The interruption plan in sentences."""
    lines = []
    for r in plan.notices:
        where = f"node {r.node}" if r.node else f"instance {r.notice.instance_id}"
        lines.append(f"notice {r.notice.event_id} ({r.notice.kind}) for {where}: {r.verdict}, {r.reason}")
    for t in plan.taints:
        lines.append(f"taint node {t.node} spotguard.io/interruption={t.event_id}:NoSchedule (no new pod lands there)")
    for s in plan.surges:
        key = s.workload.key
        if s.added:
            lines.append(
                f"scale {key} {s.workload.replicas} -> {s.replicas}: {s.doomed_pods} pod(s) on doomed nodes, "
                f"{s.ready} Ready; replacements start on on-demand before the nodes go"
            )
        else:
            lines.append(f"{key}: its surge is already recorded (replicas {s.replicas})")
        if s.budget is not None:
            lines.append(
                f"create PodDisruptionBudget {s.workload.namespace}/{s.budget.name} minAvailable "
                f"{s.budget.min_available} (it has none; keeps a drainer from taking Ready pods before replacements)"
            )
        if s.autoscaler is not None:
            lines.append(
                f"raise HorizontalPodAutoscaler {s.workload.namespace}/{s.autoscaler.name} to min "
                f"{s.autoscaler.min_replicas} max {s.autoscaler.max_replicas} (so it does not undo the surge)"
            )
    for w in plan.warnings:
        lines.append(
            f"warning: {w.workload.key} loses {w.doomed} of {w.replicas} replicas with {', '.join(w.nodes)}; "
            f"its floor is {w.floor} (a StatefulSet cannot surge)"
        )
    lines.extend(f"left alone: {s}" for s in plan.skipped)
    return lines or ["nothing to do"]


def _notice_json(n: Any) -> Obj:
    from spotguard.interruption import events

    return dict(events.to_json(n))


def _reconcile(f: eventfiles.EventFile, k: Any, clock: Any, dry_run: bool) -> Result:
    from spotguard.policy import interruption

    out = Result(str(f.path), f.kind, "spot-interruption and node-added", "")
    handler = _handler(k, clock)
    snap = handler.snapshot()
    done, waiting = interruption.finish(
        workloads=snap.workload_views, pods=snap.pod_views, nodes=snap.node_views, now=clock(),
        autoscalers=snap.autoscaler_views, marks=snap.node_notices,
    )  # fmt: skip
    for fin in done:
        if fin.scale:
            out.plan.append(f"scale {fin.workload.key} back to {fin.replicas}: {fin.reason}")
        if fin.budget:
            out.plan.append(f"delete PodDisruptionBudget {fin.workload.namespace}/{fin.budget}: the surge is over")
    out.plan.extend(f"{w.workload.key}: surge in progress, {w.reason}" for w in waiting)
    if not done and not waiting:
        out.plan.append("spot-interruption: no surge in progress")
    node_added = _node_added_core(k, clock, dry_run)
    out.plan.extend(node_added)
    if dry_run:
        out.result = "planned"
        return out
    handler.reconcile()
    out.result = "done"
    return out


def _node_added(f: eventfiles.EventFile, k: Any, clock: Any, dry_run: bool) -> Result:
    out = Result(str(f.path), f.kind, "node-added", "")
    if f.kind == "apiserversource":
        node = eventfiles.node_of(f)
        name = (node or {}).get("metadata", {}).get("name", "?") if node else "?"
        out.plan.append(f"node {name} joined")
    lines = _node_added_core(k, clock, dry_run, f)
    out.plan.extend(lines)
    skipped = any(line.startswith("node-added: skipped") for line in lines)
    failed = any(line.startswith("node-added: failed") for line in lines)
    out.result = "skipped" if skipped else "retry" if failed else "planned" if dry_run else "done"
    return out


def _node_added_core(k: Any, clock: Any, dry_run: bool, f: eventfiles.EventFile | None = None) -> list[str]:
    """What node-added does (or would do) for ``f`` (default: a scheduled pass), in sentences."""
    from spotguard.ops import functions

    if not functions.has_node_added():
        return ["node-added: skipped: this spotguard has no node-added function yet (spotguard.nodeadded)"]
    from spotguard.gateway import settings
    from spotguard.nodeadded import reconciler, service, triggers
    from spotguard.nodeadded import report as report_mod

    try:
        if f is not None and f.event is not None:
            trigger = triggers.from_cloudevent(f.event.get_type(), f.event.get_id(), f.event.get_data())
        elif f is not None and f.kind == "eventbridge":
            trigger = triggers.from_eventbridge(f.payload, str(f.path))
        else:
            trigger = triggers.Trigger(triggers.Kind.SCHEDULE, "replay", detail="replay")
    except ValueError as exc:  # the trigger decoders' Malformed and Foreign
        return [f"node-added: skipped: {exc}"]
    config, _ = settings.load(k)
    # One pass: what the delivery's first pass does (a follow of moves in flight would wait 10 s a pass).
    svc = service.Service(lambda: reconciler.Reconciler(k, config, clock=clock), join_wait=0.0, follow_seconds=0.0)
    try:
        answer = svc.handle(trigger, dry_run=dry_run)
    except service.Transient as exc:
        return [f"node-added: failed (deliver again): {exc}"]
    if answer.report is None:
        return [f"node-added: {answer.result}"]
    return [f"node-added: {line.strip()}" for line in report_mod.text(answer.report).splitlines() if line.strip()]


def _admission(f: eventfiles.EventFile, k: Any, dry_run: bool) -> Result:
    from spotguard.admission import core, errors
    from spotguard.gateway import settings

    out = Result(str(f.path), f.kind, "admission", "")
    review = json.loads(json.dumps(f.payload))
    if dry_run:
        review["request"]["dryRun"] = True
    config, _ = settings.load(k)
    ctx = core.Context(config, k)
    try:
        answer = core.serve(review, ctx)
    except errors.WebhookError as exc:
        out.result = "malformed"
        out.plan.append(f"the webhook would answer {exc.code}: {exc}")
        return out
    response = answer["response"]
    audit = response.get("auditAnnotations") or {}
    out.plan.append(f"allowed: {response.get('allowed')}; {audit.get('spotguard.io/decision', '')}")
    ops = json.loads(base64.b64decode(response["patch"])) if response.get("patch") else []
    for op in ops:
        value = json.dumps(op.get("value"), separators=(",", ":")) if "value" in op else ""
        out.plan.append(f"patch {op['op']} {op['path']} {value}".rstrip())
    out.plan.extend(f"warning: {w}" for w in response.get("warnings") or [])
    out.details["response"] = response
    out.details["patch"] = ops
    out.result = "planned" if dry_run else "done"
    return out


# -- posting to a running function ---------------------------------------------------------------


def requests_for(f: eventfiles.EventFile) -> list[tuple[dict[str, str], bytes]]:
    """The HTTP requests its transport would send for it: (headers, body)."""
    if f.kind == "admission-review":
        return [({"content-type": "application/json"}, json.dumps(f.payload).encode())]
    if f.http:
        return [(dict(f.http["headers"]), f.http["body"])]
    if f.kind == "eventbridge":
        return [_cloudevent("dev.knative.eventing.aws-sqs", "dev.knative.eventing.aws-sqs-source", f.payload)]
    if f.kind == "sqs-message":
        return [_cloudevent("com.amazon.sqs.message", "spotguard-replay", f.payload)]
    if f.kind == "lambda-sqs-batch":
        return [
            _cloudevent("dev.knative.eventing.aws-sqs", "dev.knative.eventing.aws-sqs-source", r.get("body"))
            for r in f.payload["Records"]
        ]
    if f.kind == "schedule":
        return [_cloudevent(eventfiles.PING, "/apis/v1/namespaces/spotguard/pingsources/spotguard-reconcile",
                            {"spotguard": "reconcile"})]  # fmt: skip
    raise UserError(f"{f.path}: cannot be posted ({f.kind})")  # pragma: no cover - every kind is covered


def _cloudevent(ce_type: str, source: str, data: Any) -> tuple[dict[str, str], bytes]:
    body = data.encode() if isinstance(data, str) else json.dumps(data).encode()
    return (
        {
            "ce-specversion": "1.0", "ce-type": ce_type, "ce-source": source, "ce-id": str(uuid.uuid4()),
            "ce-time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "content-type": "application/json",
        },
        body,
    )  # fmt: skip


def post(f: eventfiles.EventFile, url: str, ca_cert: str | None) -> Result:
    out = Result(str(f.path), f.kind, f.function, "posted")
    context = ssl.create_default_context(cafile=ca_cert) if url.startswith("https://") else None
    statuses = []
    for headers, body in requests_for(f):
        request = urllib.request.Request(url, data=body, method="POST", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30, context=context) as r:
                status, text = r.status, r.read().decode(errors="replace")
        except urllib.error.HTTPError as exc:
            status, text = exc.code, exc.read().decode(errors="replace")
        except OSError as exc:
            raise UserError(f"cannot post to {url}: {getattr(exc, 'reason', exc)}") from exc
        statuses.append(status)
        out.plan.append(f"{status}: {text.strip()[:500]}")
    out.details["statuses"] = statuses
    if any(s >= 500 for s in statuses):
        out.result = "retry"
    elif any(s >= 400 for s in statuses):
        out.result = "failed"
    return out
