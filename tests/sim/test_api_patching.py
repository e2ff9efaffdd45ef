"""Strategic merge patch and selector parsing, the pure parts of the API server.

https://kubernetes.io/docs/tasks/manage-kubernetes-objects/update-api-object-kubectl-patch/
https://github.com/kubernetes/community/blob/master/contributors/devel/sig-api-machinery/strategic-merge-patch.md
"""

from __future__ import annotations

from typing import Any

import pytest
from spotguard_sim import errors, patching, selectors


def pod_spec(**extra: Any) -> dict[str, Any]:
    return {"spec": {"containers": [
        {"name": "app", "image": "a:1", "env": [{"name": "A", "value": "1"},
                                                {"name": "B", "value": "1"}],
         "ports": [{"containerPort": 80}]},
        {"name": "side", "image": "s:1"}], **extra}}


def test_lists_with_merge_keys_merge_by_key() -> None:
    """containers merge by name, env by name, ports by containerPort"""
    out = patching.strategic(pod_spec(), {"spec": {"containers": [
        {"name": "app", "env": [{"name": "B", "value": "2"}, {"name": "C", "value": "3"}],
         "ports": [{"containerPort": 81}]}]}})
    app = out["spec"]["containers"][0]
    assert [c["name"] for c in out["spec"]["containers"]] == ["app", "side"]
    assert app["image"] == "a:1"
    assert app["env"] == [{"name": "A", "value": "1"}, {"name": "B", "value": "2"},
                          {"name": "C", "value": "3"}]
    assert [p["containerPort"] for p in app["ports"]] == [80, 81]


def test_lists_without_strategy_are_replaced() -> None:
    """tolerations (atomic) and node taints are replaced whole, as kubectl taint relies on"""
    base = pod_spec(tolerations=[{"key": "a", "operator": "Exists"}])
    out = patching.strategic(base, {"spec": {"tolerations": [{"key": "b", "operator": "Exists"}]}})
    assert out["spec"]["tolerations"] == [{"key": "b", "operator": "Exists"}]
    node = {"spec": {"taints": [{"key": "x", "effect": "NoSchedule"}]}}
    assert patching.strategic(node, {"spec": {"taints": []}})["spec"]["taints"] == []


def test_directives() -> None:
    """$patch delete/replace, $retainKeys, $setElementOrder, $deleteFromPrimitiveList, null"""
    out = patching.strategic(pod_spec(), {"spec": {"containers": [
        {"name": "side", "$patch": "delete"}]}})
    assert [c["name"] for c in out["spec"]["containers"]] == ["app"]
    out = patching.strategic(pod_spec(), {"spec": {"$setElementOrder/containers": [
        {"name": "side"}, {"name": "app"}]}})
    assert [c["name"] for c in out["spec"]["containers"]] == ["side", "app"]
    deploy = {"spec": {"strategy": {"type": "RollingUpdate",
                                    "rollingUpdate": {"maxSurge": "25%"}}}}
    out = patching.strategic(deploy, {"spec": {"strategy": {
        "$retainKeys": ["type"], "type": "Recreate", "rollingUpdate": None}}})
    assert out["spec"]["strategy"] == {"type": "Recreate"}
    meta = {"metadata": {"finalizers": ["a", "b"], "labels": {"x": "1", "y": "2"}}}
    out = patching.strategic(meta, {"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"],
                                                 "labels": {"x": None}}})
    assert out["metadata"] == {"finalizers": ["b"], "labels": {"y": "2"}}
    out = patching.strategic(meta, {"metadata": {"labels": {"$patch": "replace", "z": "3"}}})
    assert out["metadata"]["labels"] == {"z": "3"}
    with pytest.raises(errors.BadRequest):
        patching.strategic(pod_spec(), {"spec": {"containers": [{"image": "no-name"}]}})


def test_merge_patch_replaces_lists_and_deletes_nulls() -> None:
    """https://www.rfc-editor.org/rfc/rfc7386"""
    out = patching.merge(pod_spec(), {"spec": {"containers": [{"name": "only"}]}, "x": None})
    assert out["spec"]["containers"] == [{"name": "only"}]


def test_json_patch_errors_are_invalid() -> None:
    with pytest.raises(errors.Invalid):
        patching.apply({"a": 1}, [{"op": "remove", "path": "/missing"}], "json")
    with pytest.raises(errors.UnsupportedMediaType):
        patching.apply({"a": 1}, {}, "apply")


@pytest.mark.parametrize(("text", "labels", "expected"), [
    ("app=web", {"app": "web"}, True),
    ("app==web,tier!=db", {"app": "web", "tier": "fe"}, True),
    ("tier in (fe, be)", {"tier": "be"}, True),
    ("tier notin (fe)", {}, True),
    ("!tier", {"tier": "x"}, False),
    ("example.com/key", {"example.com/key": ""}, True),
])
def test_label_selector_syntax(text: str, labels: dict[str, str], expected: bool) -> None:
    """https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors"""
    assert selectors.parse_labels(text).matches(labels) is expected


def test_label_selector_objects() -> None:
    """https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#resources-that-support-set-based-requirements
    (an empty selector selects everything; a null PDB selector nothing)"""
    assert selectors.from_dict({}).matches({"a": "b"})
    assert not selectors.from_dict(None).matches({"a": "b"})
    sel = {"matchLabels": {"app": "web"},
           "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["db"]}]}
    assert selectors.matches(sel, {"app": "web", "tier": "fe"})
    assert not selectors.matches(sel, {"app": "web", "tier": "db"})
    with pytest.raises(errors.BadRequest):
        selectors.parse_labels("bad key!=x")
    with pytest.raises(errors.BadRequest):
        selectors.parse_fields("spec.nope=x", "pods")
