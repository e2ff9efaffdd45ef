"""Scenario files: ordinary Kubernetes YAML (multi-document, or a ``kind: List``)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from spotguard.logs import UserError


def load(source: str | os.PathLike[str] | Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The objects of a scenario: a path to YAML, or a list of dicts."""
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        try:
            text = path.read_text()
        except OSError as exc:
            raise UserError(f"cannot read scenario {path}: {exc}") from exc
        try:
            docs = list(yaml.safe_load_all(text))
        except yaml.YAMLError as exc:
            raise UserError(f"scenario {path} is not valid YAML: {exc}") from exc
        return flatten(docs, str(path))
    return flatten(list(source), "scenario")


def flatten(docs: list[Any], where: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for index, doc in enumerate(docs):
        if doc is None:
            continue
        if not isinstance(doc, Mapping):
            raise UserError(f"{where}: document {index + 1} is not a mapping")
        if str(doc.get("kind", "")).endswith("List") and "items" in doc:
            out.extend(flatten(list(doc.get("items") or []), where))
            continue
        if not doc.get("kind") or not doc.get("apiVersion"):
            raise UserError(f"{where}: document {index + 1} has no kind or apiVersion")
        out.append(dict(doc))
    return out
