"""The burst sender: AdmissionReviews all in flight at once, as kube-apiserver sends them.

Shared by ``tests/admission/test_burst.py`` and ``bench/admission.py --burst``.
kube-apiserver calls the webhook once per pod, concurrently, each call on a
connection of its own when a burst outgrows its kept-alive ones, with the
webhook's timeout in the URL (``?timeout=3s``). Each thread here opens a new
TLS connection (one client context per process, as a Go client has one
``tls.Config``), posts its review at the same instant as the others, and hands
the answer to ``store`` (apply the patch, create the pod), as the API server
does; under the shipped ``failurePolicy: Ignore`` a call that fails or times
out still creates its pod, unpatched. A call that fails, times out, answers
non-200, or is answered without deciding (failed open, shed) is a problem of
that call.
"""

from __future__ import annotations

import base64
import dataclasses
import http.client
import json
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import jsonpatch

Obj = dict[str, Any]
UNDECIDED = ("failed_open", "shed")  # answers that admitted the pod without deciding its slot


@dataclasses.dataclass
class Call:
    sent: float  # wall-clock time the request was sent
    answered: float | None  # wall-clock time the answer was read (None: no answer)
    latency_ms: float
    problem: str | None = None


def replicaset_of(dep: Mapping[str, Any], template_hash: str, replicas: int) -> Obj:
    """The Deployment's ReplicaSet as its controller writes it (for a cluster whose
    controllers are off, where the burst is the only creator of pods)."""
    meta = dep["metadata"]
    labels = {**(dep["spec"]["selector"].get("matchLabels") or {}), "pod-template-hash": template_hash}
    owner = {"apiVersion": "apps/v1", "kind": "Deployment", "name": meta["name"], "uid": meta["uid"]}
    owner["controller"] = True
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {
            "name": f"{meta['name']}-{template_hash}",
            "namespace": meta["namespace"],
            "labels": labels,
            "ownerReferences": [owner],
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {**dep["spec"]["template"], "metadata": {"labels": labels}},
        },
    }


def pod_of(rs: Mapping[str, Any]) -> Obj:
    """A pod of the ReplicaSet, as its controller creates it (``generateName``, owner, template)."""
    meta = rs["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": meta["name"] + "-",
            "namespace": meta["namespace"],
            "labels": dict(rs["spec"]["selector"]["matchLabels"]),
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": json.loads(json.dumps(rs["spec"]["template"]["spec"])),
    }


def review_of(pod: Mapping[str, Any]) -> Obj:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": pod["metadata"]["namespace"],
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
            "object": pod,
            "dryRun": False,
        },
    }


def patched(review: Mapping[str, Any], response: Mapping[str, Any]) -> Obj:
    """The pod as the API server stores it after the answer's JSONPatch."""
    pod: Obj = review["request"]["object"]
    if not response.get("patch"):
        return pod
    result: Obj = jsonpatch.apply_patch(pod, json.loads(base64.b64decode(response["patch"])))
    return result


def undecided(response: Mapping[str, Any]) -> str | None:
    """The decision annotation when the webhook admitted the pod without deciding (else None)."""
    decision = str((response.get("auditAnnotations") or {}).get("spotguard.io/decision", ""))
    return decision if decision.split(":", 1)[0] in UNDECIDED else None


def send(
    url: str,
    ca: str,
    reviews: Sequence[Obj],
    *,
    timeout: float,
    store: Callable[[Obj, Obj], None] | None = None,
    at: float | None = None,
) -> list[Call]:
    """Post every review at once (at wall-clock ``at``, or when all threads are ready)."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 443
    path = (parts.path or "/") + f"?timeout={timeout:g}s"
    context = ssl.create_default_context(cafile=ca)
    bodies = [json.dumps(r).encode() for r in reviews]
    ready = threading.Barrier(len(bodies)) if at is None else None
    calls: list[Call | None] = [None] * len(bodies)

    def one(i: int) -> None:
        if ready is not None:
            ready.wait()
        elif at is not None:
            time.sleep(max(0.0, at - time.time()))
        sent, started = time.time(), time.perf_counter()
        answered: float | None = None
        problem: str | None = None
        response: Obj = {}  # failurePolicy Ignore: a failed call's pod is created unpatched
        try:
            conn = http.client.HTTPSConnection(host, port, context=context, timeout=timeout)
            try:
                conn.request("POST", path, body=bodies[i], headers={"Content-Type": "application/json"})
                reply = conn.getresponse()
                data = reply.read()
            finally:
                conn.close()
            answered = time.time()
            if answered - sent > timeout:
                problem = "answered after the timeout"  # the API server gave up and went on without it
            elif reply.status != 200:
                problem = f"HTTP {reply.status}"
            else:
                response = json.loads(data)["response"]
                problem = undecided(response)
        except (OSError, http.client.HTTPException) as exc:
            problem = type(exc).__name__
        calls[i] = Call(sent, answered, (time.perf_counter() - started) * 1000, problem)
        if store is not None:
            store(reviews[i], response if problem is None or problem.split(":", 1)[0] in UNDECIDED else {})

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [c for c in calls if c is not None]
