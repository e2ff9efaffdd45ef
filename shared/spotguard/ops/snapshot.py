"""Capture a cluster as a scenario: nodes, namespaces, workloads, pods, budgets and autoscalers.

Reads the cluster the kubeconfig names (--kubeconfig, else $KUBECONFIG, else
~/.kube/config, as kubectl; read-only: list calls only) and writes
one multi-document YAML file that `spotguard simulate --scenario` and
`spotguard replay --scenario` load as they load any scenario. Nothing secret
is written: no Secrets, no ConfigMaps but spotguard's own settings, no
service-account token volumes, environment variable values redacted, no
managed fields, no last-applied annotations, no server-set fields (uid,
resourceVersion, creationTimestamp) and no status but a node's capacity.
A `kubectl get nodes,deployments,statefulsets,... -A -o yaml` export is
accepted as a scenario too.

example:
  spotguard snapshot --kubeconfig ~/.kube/config -o cluster.yaml
  spotguard simulate --scenario cluster.yaml --interrupt all-spot
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

from spotguard import flags
from spotguard.logs import UserError
from spotguard.ops import objects

Obj = dict[str, Any]
REDACTED = "<redacted by spotguard snapshot>"
SETTINGS = ("spotguard", "spotguard-config")  # (namespace, name) of spotguard's ConfigMap


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    flags.add_kubeconfig(parser, "the cluster to capture (default: $KUBECONFIG, else ~/.kube/config, as kubectl)")
    parser.add_argument("-o", "--output", required=True, metavar="FILE", help="where to write the scenario YAML")
    parser.add_argument("--force", action="store_true", help="overwrite FILE if it exists")


def resources() -> list[Any]:
    from spotguard.gateway import resources as r

    return [r.NODES, r.NAMESPACES, r.DEPLOYMENTS, r.STATEFULSETS, r.PODDISRUPTIONBUDGETS, r.HPAS, r.PODS]


def capture(kube: Any) -> list[Obj]:
    """Every object to write, cleaned, in an order a loader can apply."""
    from spotguard.gateway import resources as r

    out: list[Obj] = []
    for res in resources():
        for raw in kube.list(res):
            raw.setdefault("apiVersion", res.api_version)
            raw["kind"] = res.kind
            out.append(redact(objects.clean(raw)))
    try:
        settings = kube.get(r.CONFIGMAPS, SETTINGS[1], SETTINGS[0])
    except Exception:  # absent (NotFound) or not readable: the defaults apply
        settings = None
    if settings is not None:
        settings.setdefault("apiVersion", "v1")
        settings["kind"] = "ConfigMap"
        out.append(objects.clean(settings))
    return out


def redact(obj: Obj) -> Obj:
    """Environment variable values out, token volumes out (in pods and in workloads' templates)."""
    spec = obj.get("spec") or {}
    pod_specs = [spec] if obj.get("kind") == "Pod" else [((spec.get("template") or {}).get("spec") or {})]
    for ps in pod_specs:
        for c in (ps.get("containers") or []) + (ps.get("initContainers") or []):
            for env in c.get("env") or []:
                if "value" in env:
                    env["value"] = REDACTED
        volumes = ps.get("volumes")
        if volumes:
            kept = [v for v in volumes if not _token_volume(v)]
            names = {v.get("name") for v in volumes} - {v.get("name") for v in kept}
            ps["volumes"] = kept
            for c in (ps.get("containers") or []) + (ps.get("initContainers") or []):
                if c.get("volumeMounts"):
                    c["volumeMounts"] = [m for m in c["volumeMounts"] if m.get("name") not in names]
    return obj


def _token_volume(volume: Obj) -> bool:
    if "secret" in volume:
        return True
    sources = (volume.get("projected") or {}).get("sources") or []
    return any("serviceAccountToken" in s or "secret" in s for s in sources)


def write(path: Path, objs: list[Obj], source: str) -> None:
    counts: dict[str, int] = {}
    for o in objs:
        counts[o["kind"]] = counts.get(o["kind"], 0) + 1
    header = (
        f"# spotguard snapshot of {source}\n"
        f"# {', '.join(f'{n} {k}' for k, n in counts.items())}\n"
        "# Load with: spotguard simulate --scenario THIS_FILE --interrupt all-spot\n"
    )
    text = header + yaml.safe_dump_all(objs, sort_keys=False, explicit_start=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def run(args: argparse.Namespace) -> int:
    from spotguard.gateway import errors, kube

    from_env = flags.env_kubeconfig()
    config = Path(args.kubeconfig or from_env or "~/.kube/config").expanduser()
    if not config.is_file():
        if args.kubeconfig or from_env:
            raise UserError(f"{'--kubeconfig' if args.kubeconfig else '$KUBECONFIG'} {config}: no such file")
        raise UserError(f"which cluster? give --kubeconfig FILE or set KUBECONFIG ({config} does not exist)")
    out = Path(args.output)
    if not out.parent.is_dir():
        raise UserError(f"-o {out}: the folder {out.parent} does not exist")
    if out.exists() and not args.force:
        raise UserError(f"-o {out}: the file exists; give --force to overwrite it")
    try:
        k = kube.connect(str(config))
    except Exception as exc:
        raise UserError(f"cannot use the kubeconfig {config}: {exc}") from exc
    try:
        objs = capture(k)
    except errors.ApiError as exc:
        raise UserError(f"could not read the cluster through {config}: {exc}") from exc
    except OSError as exc:
        raise UserError(f"could not reach the cluster of {config}: {exc}") from exc
    write(out, objs, str(getattr(k.api_client.configuration, "host", config)))
    nodes = sum(1 for o in objs if o["kind"] == "Node")
    workloads = sum(1 for o in objs if o["kind"] in ("Deployment", "StatefulSet"))
    pods = sum(1 for o in objs if o["kind"] == "Pod")
    print(f"wrote {out}: {nodes} nodes, {workloads} workloads, {pods} pods ({len(objs)} objects)")
    return 0
