"""kube-scheduler's InterPodAffinity and NodePorts filters, over plain dicts.

Pure, like ``spotguard_sim.scheduler`` that calls it. Follows
https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/#inter-pod-affinity-and-anti-affinity
and pkg/scheduler/framework/plugins/{interpodaffinity,nodeports}:
- a term selects pods by ``labelSelector`` (plus ``matchLabelKeys`` /
  ``mismatchLabelKeys`` taken from the pod that has the term) in ``namespaces``
  and/or the namespaces ``namespaceSelector`` selects (``{}``: every
  namespace); with neither, the namespace of the pod that has the term;
- required affinity: every term needs a selected pod in the candidate node's
  domain (its ``topologyKey`` label value), unless no pod anywhere is selected
  and the pod selects itself (the first pod of a group);
- required anti-affinity: no selected pod in the domain; and no existing pod
  whose own required anti-affinity selects the incoming pod may share its domain
  (symmetry). Terminating pods still count, as they do in the scheduler's cache;
- host ports: a (protocol, hostPort) pair in use on the node conflicts when the
  host IPs are equal or either is the wildcard.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

Labels = Mapping[str, str]
HostPort = tuple[str, str, int]  # (protocol, hostIP, hostPort)
WILDCARD = ("", "0.0.0.0", "::")


def _match(selector: Mapping[str, Any] | None, labels: Labels) -> bool:
    from spotguard_sim import scheduler

    return scheduler.match_label_selector(selector, labels)


@dataclass(frozen=True)
class Term:
    selector: dict[str, Any] | None
    namespaces: frozenset[str]
    namespace_selector: dict[str, Any] | None  # {} selects every namespace
    topology_key: str

    def selects(self, namespace: str, labels: Labels, ns_labels: Mapping[str, Labels]) -> bool:
        if namespace not in self.namespaces and (
            self.namespace_selector is None
            or not _match(self.namespace_selector,
                          ns_labels.get(namespace, {"kubernetes.io/metadata.name": namespace}))
        ):
            return False
        return _match(self.selector, labels)


def _term(raw: Mapping[str, Any], namespace: str, labels: Labels) -> Term:
    selector = raw.get("labelSelector")
    extra = [{"key": k, "operator": "In", "values": [labels[k]]}
             for k in raw.get("matchLabelKeys") or [] if k in labels]
    extra += [{"key": k, "operator": "NotIn", "values": [labels[k]]}
              for k in raw.get("mismatchLabelKeys") or [] if k in labels]
    if extra and selector is not None:
        selector = {**selector, "matchExpressions": [*(selector.get("matchExpressions") or []), *extra]}
    names = frozenset(raw.get("namespaces") or [])
    ns_selector = raw.get("namespaceSelector")
    if not names and ns_selector is None:
        names = frozenset([namespace])
    return Term(selector, names, ns_selector, str(raw.get("topologyKey", "")))


def required_terms(spec: Mapping[str, Any], kind: str, namespace: str, labels: Labels) -> list[Term]:
    """``kind`` is podAffinity or podAntiAffinity."""
    section = ((spec.get("affinity") or {}).get(kind) or {})
    return [_term(t, namespace, labels)
            for t in section.get("requiredDuringSchedulingIgnoredDuringExecution") or []]


def preferred_terms(spec: Mapping[str, Any], kind: str, namespace: str,
                    labels: Labels) -> list[tuple[int, Term]]:
    section = ((spec.get("affinity") or {}).get(kind) or {})
    return [(int(t.get("weight") or 0), _term(t.get("podAffinityTerm") or {}, namespace, labels))
            for t in section.get("preferredDuringSchedulingIgnoredDuringExecution") or []]


def host_ports(spec: Mapping[str, Any]) -> list[HostPort]:
    out = []
    for c in list(spec.get("initContainers") or []) + list(spec.get("containers") or []):
        for p in c.get("ports") or []:
            if p.get("hostPort"):
                out.append((str(p.get("protocol") or "TCP"), str(p.get("hostIP") or "0.0.0.0"),
                            int(p["hostPort"])))
    return out


def ports_conflict(wanted: Iterable[HostPort], used: Iterable[HostPort]) -> bool:
    used = list(used)
    for proto, ip, port in wanted:
        for u_proto, u_ip, u_port in used:
            if proto == u_proto and port == u_port and (ip == u_ip or ip in WILDCARD or u_ip in WILDCARD):
                return True
    return False


@dataclass
class Existing:
    """A pod bound to a node, as the affinity filter sees it."""

    node: str
    namespace: str
    labels: Labels
    anti: list[Term] = field(default_factory=list)


@dataclass
class State:
    """One scheduling cycle's inter-pod affinity state for the incoming pod."""

    affinity: list[tuple[Term, set[str], bool]]  # term, domain values with a selected pod, any?
    anti: list[tuple[Term, set[str]]]
    forbidden: set[tuple[str, str]]  # (topologyKey, value) an existing pod's anti-affinity forbids
    self_affine: list[bool]

    @property
    def empty(self) -> bool:
        return not (self.affinity or self.anti or self.forbidden)

    def reason(self, node_labels: Labels) -> str | None:
        for (term, values, anywhere), own in zip(self.affinity, self.self_affine, strict=True):
            value = node_labels.get(term.topology_key)
            if value is None:
                return "node(s) didn't match pod affinity rules"
            if value not in values and (anywhere or not own):
                return "node(s) didn't match pod affinity rules"
        for term, values in self.anti:
            if node_labels.get(term.topology_key) in values:
                return "node(s) didn't match pod anti-affinity rules"
        for key, value in self.forbidden:
            if node_labels.get(key) == value:
                return "node(s) didn't satisfy existing pods anti-affinity rules"
        return None


def state(namespace: str, labels: Labels, *, affinity: list[Term], anti: list[Term],
          pods: Iterable[Existing], with_anti: Iterable[Existing],
          node_labels: Mapping[str, Labels], ns_labels: Mapping[str, Labels]) -> State:
    """Build the cycle state from the bound pods (``pods`` is only read when the incoming
    pod has terms; ``with_anti`` are the bound pods that have required anti-affinity)."""
    aff: list[tuple[Term, set[str], bool]] = [(t, set(), False) for t in affinity]
    anti_values: list[tuple[Term, set[str]]] = [(t, set()) for t in anti]
    if affinity or anti:
        for p in pods:
            labels_of_node = node_labels.get(p.node)
            if labels_of_node is None:
                continue
            for i, (t, values, _) in enumerate(aff):
                if t.selects(p.namespace, p.labels, ns_labels):
                    aff[i] = (t, values, True)
                    if t.topology_key in labels_of_node:
                        values.add(labels_of_node[t.topology_key])
            for t, values in anti_values:
                if t.topology_key in labels_of_node and t.selects(p.namespace, p.labels, ns_labels):
                    values.add(labels_of_node[t.topology_key])
    forbidden: set[tuple[str, str]] = set()
    for p in with_anti:
        labels_of_node = node_labels.get(p.node) or {}
        for t in p.anti:
            if t.topology_key in labels_of_node and t.selects(namespace, labels, ns_labels):
                forbidden.add((t.topology_key, labels_of_node[t.topology_key]))
    own = [t.selects(namespace, labels, ns_labels) for t in affinity]
    return State(aff, anti_values, forbidden, own)
