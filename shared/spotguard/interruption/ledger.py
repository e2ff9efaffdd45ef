"""The surge ledger: a copy of every surge record where users' tools do not rewrite it.

The record on the workload (``spotguard.io/surge``) is what the plans read. It is
lost when someone replaces the whole object (``kubectl replace``, Argo CD
``Replace=true``, a Helm upgrade with ``--force``): then the replicas, the
autoscaler's minimum and the temporary budget would stay raised for good. So
every surge in progress is also kept in one ConfigMap per workload namespace,
``spotguard-surges-<namespace>``, in spotguard's own namespace (the settings'
``$SPOTGUARD_NAMESPACE``, default ``spotguard``); keys ``<Kind>.<name>``, values
the record's JSON.

The ledger is written after the workloads, one write per namespace and plan
(a burst of 500 notices costs a handful of writes), guarded by its
resourceVersion; a write that fails is logged and made good by the next
reconcile. A ledger entry whose workload has no record is a lost record: the
handler ends that surge (the owner's spec wins) and nothing stays raised.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor

from spotguard.gateway import kube as kube_mod
from spotguard.gateway import resources as r
from spotguard.gateway import settings
from spotguard.gateway.errors import AlreadyExists, ApiError, Conflict, NotFound
from spotguard.policy import interruption
from spotguard.policy.surges import SurgeRecord

log = logging.getLogger("spotguard.interruption")

PREFIX = "spotguard-surges-"
LABEL = "spotguard.io/ledger"
ATTEMPTS = 3


def namespace() -> str:
    return settings.Source.from_env(os.environ).namespace


def name_for(workload_namespace: str) -> str:
    return (PREFIX + workload_namespace)[:253]


def entry_key(workload_key: str) -> str:
    """``Deployment/shop/web`` -> ``Deployment.web`` (a valid ConfigMap key)."""
    kind, _ns, name = workload_key.split("/", 2)
    return f"{kind}.{name}"


def read(kube: kube_mod.Kube) -> dict[str, SurgeRecord]:
    """Workload key -> its record in the ledger.

    An unreadable ledger raises (``ApiError``), as any list of the snapshot does: read as
    empty, a record a replace took looked like no surge at all, and the plan surged again
    from what it saw then, the pods already evicted from the doomed nodes not counted; with
    the copy, that smaller surge shrank the copy below what the Deployment lacked (chaos
    ``argocd-replace-drainer`` under 500s: worker 8 -> 7 at +87 s). A failed read now fails
    the pass: a handling's notices are retried, a reconcile tries again at its next turn."""
    try:
        items = kube.list(r.CONFIGMAPS, namespace(), label_selector=f"{LABEL}=true")
    except ApiError as exc:
        log.warning("could not read the surge ledger", extra={"error": str(exc)})
        raise
    out: dict[str, SurgeRecord] = {}
    for cm in items:
        ns = str(((cm.get("metadata") or {}).get("annotations") or {}).get(LABEL + "-namespace") or "")
        if not ns:
            continue
        for key, text in (cm.get("data") or {}).items():
            kind, _, name = key.partition(".")
            record = SurgeRecord.parse(str(text))
            if record is not None and name:
                out[f"{kind}/{ns}/{name}"] = record
    return out


def sync(kube: kube_mod.Kube, want: Mapping[str, SurgeRecord | None], known: Mapping[str, SurgeRecord]) -> None:
    """Make the ledger hold ``want`` (workload key -> record, None: drop the entry).

    ``known`` is what the ledger held when the snapshot was read; namespaces whose
    entries are unchanged are not written.
    """
    by_ns: dict[str, dict[str, str | None]] = {}
    for key, wanted in want.items():
        record = None if wanted is None or wanted.done else wanted
        old = known.get(key)
        if (old is None and record is None) or (
            old is not None and record is not None and old.to_json() == _plain(record).to_json()
        ):
            continue
        ns = key.split("/", 2)[1]
        by_ns.setdefault(ns, {})[entry_key(key)] = None if record is None else _plain(record).to_json()
    if len(by_ns) <= 1:
        for ns, changes in by_ns.items():
            _write(kube, ns, changes)
        return
    with ThreadPoolExecutor(max_workers=min(8, len(by_ns))) as pool:
        list(pool.map(lambda item: _write(kube, *item), by_ns.items()))


def _plain(record: SurgeRecord) -> SurgeRecord:
    return dataclasses.replace(record, lost=False)


def _write(kube: kube_mod.Kube, workload_ns: str, changes: Mapping[str, str | None]) -> None:
    home = namespace()
    name = name_for(workload_ns)
    for _ in range(ATTEMPTS):
        creating = False
        try:
            current = kube.find(r.CONFIGMAPS, name, home)
            if current is None:
                data = {k: v for k, v in changes.items() if v is not None}
                if not data:
                    return
                creating = True  # a create answered 404 only where the namespace is missing
                kube.create(r.CONFIGMAPS, _configmap(home, name, workload_ns, data), home)
                return
            data = dict(current.get("data") or {})
            for k, v in changes.items():
                if v is None:
                    data.pop(k, None)
                else:
                    data[k] = v
            if not data:
                rv = str((current.get("metadata") or {}).get("resourceVersion") or "")
                kube.delete(r.CONFIGMAPS, name, home, resource_version=rv or None)
                return
            current["data"] = data
            kube.replace(r.CONFIGMAPS, current)
            return
        except (Conflict, AlreadyExists):
            continue
        except NotFound:
            if creating:
                log.warning(
                    "no namespace for the surge ledger: a replaced workload's surge cannot be undone",
                    extra={"namespace": home},
                )
                return
            continue
        except ApiError as exc:
            log.warning("could not write the surge ledger", extra={"ledger": f"{home}/{name}", "error": str(exc)})
            return
    log.warning("the surge ledger kept changing; the next reconcile writes it", extra={"ledger": f"{home}/{name}"})


def _configmap(home: str, name: str, workload_ns: str, data: Mapping[str, str]) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": home,
            "labels": {LABEL: "true", interruption.MANAGED_BY_LABEL: interruption.MANAGED_BY},
            "annotations": {LABEL + "-namespace": workload_ns},
        },
        "data": dict(data),
    }


def lost(
    workload_keys: Iterable[str],
    records_on_workloads: Mapping[str, SurgeRecord | None],
    ledger: Mapping[str, SurgeRecord],
) -> dict[str, SurgeRecord]:
    """Ledger entries whose workload exists but carries no record: the record was lost."""
    out: dict[str, SurgeRecord] = {}
    for key in workload_keys:
        if key in ledger and records_on_workloads.get(key) is None:
            out[key] = ledger[key]
    return out
