"""The ClusterRole aggregation controller (``pkg/controller/clusterroleaggregation``):
a ClusterRole with an ``aggregationRule`` gets, as its rules, the rules of every other
ClusterRole whose labels match one of its ``clusterRoleSelectors`` (visited in name
order, duplicates dropped), and is rewritten whenever one of them changes.
https://kubernetes.io/docs/reference/access-authn-authz/rbac/#aggregated-clusterroles
"""

from __future__ import annotations

from typing import Any

from spotguard_sim import errors, selectors
from spotguard_sim.controllers import base


class ClusterRoleAggregationController(base.Controller):
    name = "clusterrole-aggregation-controller"
    primary = "clusterroles"
    resync_seconds = 300.0

    def handle(self, event_type: str, resource: str, obj: dict[str, Any]) -> None:
        if resource == "clusterroles":  # any role may feed an aggregated one
            self.queue.add(("", "*"))

    def resync(self) -> None:
        self.queue.add(("", "*"))

    def sync(self, key: Any) -> None:
        roles = sorted(self.store.list("clusterroles")[0], key=lambda r: r["metadata"]["name"])
        for role in roles:
            rule = role.get("aggregationRule")
            if not rule:
                continue
            wanted: list[dict[str, Any]] = []
            for selector in rule.get("clusterRoleSelectors") or []:
                match = selectors.from_dict(selector)
                for other in roles:
                    if other["metadata"]["name"] == role["metadata"]["name"]:
                        continue
                    if not match.matches(other["metadata"].get("labels") or {}):
                        continue
                    wanted += [r for r in other.get("rules") or [] if r not in wanted]
            if (role.get("rules") or []) == wanted:
                continue
            name = role["metadata"]["name"]
            try:
                self.store.mutate("clusterroles", name, None, lambda obj, rules=wanted: obj.__setitem__("rules", rules))
            except errors.NotFound:
                continue
