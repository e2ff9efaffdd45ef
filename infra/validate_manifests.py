"""Validate rendered Kubernetes manifests with kubernetes-validate (strict).

    python infra/validate_manifests.py [--kubernetes-version X.Y.Z] NAME < rendered.yaml
    python infra/validate_manifests.py NAME FILE...

Every core object (any API group that is not a known custom resource group) is
validated strictly against the OpenAPI schema of the newest Kubernetes version
kubernetes-validate knows: unknown fields, wrong types and unknown kinds fail.
Knative objects (``*.knative.dev``) are left to infra/knative/validate (the
Knative CRD schemas), except that the pod template of a Knative Service is
also validated strictly as a core Pod, which catches misspelt container
fields the Knative schemas let through. cert-manager objects have no schema
here, nor has the Prometheus Operator's ServiceMonitor: both are listed as
skipped. Exit status 1 on any problem.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Iterator
from typing import Any

import kubernetes_validate
import yaml

# Custom resource groups without a schema in this repository: named, not guessed.
SKIPPED_GROUPS = ("cert-manager.io", "monitoring.coreos.com")
# Fields of a Knative revision template spec that a core PodSpec does not have.
KNATIVE_REVISION_FIELDS = (
    "containerConcurrency",
    "timeoutSeconds",
    "responseStartTimeoutSeconds",
    "idleTimeoutSeconds",
)


def group_of(api_version: str) -> str:
    return api_version.split("/", 1)[0] if "/" in api_version else ""


def knative_pod(obj: dict[str, Any]) -> dict[str, Any] | None:
    """The pod template of a Knative Service as a core Pod, or None."""
    if obj.get("apiVersion") != "serving.knative.dev/v1" or obj.get("kind") != "Service":
        return None
    template = (obj.get("spec") or {}).get("template") or {}
    spec = {k: v for k, v in (template.get("spec") or {}).items() if k not in KNATIVE_REVISION_FIELDS}
    name = (obj.get("metadata") or {}).get("name", "knative-service")
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {**(template.get("metadata") or {}), "name": name},
        "spec": spec,
    }


def load(streams: Iterable[tuple[str, str]]) -> Iterator[tuple[str, Any]]:
    for where, text in streams:
        for doc in yaml.safe_load_all(text):
            if doc is not None:
                yield where, doc


def check(
    objects: Iterable[tuple[str, Any]], version: str, per_file: dict[str, int] | None = None
) -> tuple[int, int, list[str], list[str]]:
    """Return (validated, knative, skipped, problems); count valid objects per file in per_file."""
    validated = knative = 0
    skipped: list[str] = []
    problems: list[str] = []
    per_file = {} if per_file is None else per_file
    for where, obj in objects:
        per_file.setdefault(where, 0)
        if not isinstance(obj, dict) or not obj.get("apiVersion") or not obj.get("kind"):
            problems.append(f"{where}: not a Kubernetes object (apiVersion and kind are required)")
            continue
        name = f"{obj['kind']} {(obj.get('metadata') or {}).get('name', '?')}"
        group = group_of(str(obj["apiVersion"]))
        targets: list[tuple[str, dict[str, Any]]] = []
        if group.endswith("knative.dev"):
            knative += 1
            pod = knative_pod(obj)
            if pod is not None:
                targets.append((f"{name} (pod template as a core Pod)", pod))
        elif group in SKIPPED_GROUPS:
            skipped.append(f"{obj['apiVersion']} {name}")
        else:
            targets.append((name, obj))
        for label, target in targets:
            try:
                kubernetes_validate.validate(target, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                path = "/".join(str(p) for p in exc.path)
                problems.append(f"{where}: {label}: {path}: {exc.message}")
            except kubernetes_validate.SchemaNotFoundError:
                problems.append(f"{where}: {label}: no schema for {obj['apiVersion']} {obj['kind']}")
            except Exception as exc:
                problems.append(f"{where}: {label}: {type(exc).__name__}: {exc}")
            else:
                validated += 1
                per_file[where] += 1
    return validated, knative, skipped, problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", help="what is being checked (for the output)")
    parser.add_argument("files", nargs="*", help="YAML files (default: standard input)")
    parser.add_argument(
        "--kubernetes-version",
        default=kubernetes_validate.latest_version(),
        help="Kubernetes version to validate against (default: the newest known)",
    )
    args = parser.parse_args(argv)
    if args.files:
        streams = [(f, open(f, encoding="utf-8").read()) for f in args.files]  # noqa: SIM115
    else:
        streams = [(args.name, sys.stdin.read())]
    try:
        objects = list(load(streams))
    except yaml.YAMLError as exc:
        print(f"kubernetes-validate: FAIL {args.name}: cannot parse YAML: {exc}", file=sys.stderr)
        return 1
    per_file: dict[str, int] = {}
    validated, knative, skipped, problems = check(objects, args.kubernetes_version, per_file)
    if len(per_file) > 1:
        for where, count in per_file.items():
            print(f"kubernetes-validate: {where}: {count} objects valid")
    for problem in problems:
        print(f"kubernetes-validate: FAIL {problem}", file=sys.stderr)
    for item in skipped:
        print(f"kubernetes-validate: skipped (no schema here) {item}")
    print(
        f"kubernetes-validate: {args.name}: {validated} objects valid (strict, Kubernetes "
        f"{args.kubernetes_version}), {knative} Knative objects, {len(skipped)} skipped, "
        f"{len(problems)} problems"
    )
    if not objects:
        print(f"kubernetes-validate: FAIL {args.name}: no objects", file=sys.stderr)
        return 1
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
