"""Validation of MutatingWebhookConfigurations, as kube-apiserver's
pkg/apis/admissionregistration/validation does for admissionregistration.k8s.io/v1
(https://kubernetes.io/docs/reference/access-authn-authz/extensible-admission-controllers/):
a fully qualified, unique webhook name; ``admissionReviewVersions`` required and
including v1 or v1beta1; ``sideEffects`` required, None or NoneOnDryRun;
``failurePolicy`` Ignore or Fail; ``timeoutSeconds`` 1 to 30; exactly one of
``clientConfig.url`` (https, no user info, fragment or query) and
``clientConfig.service``; rules with known operations; at most 64
``matchConditions`` with unique names and expressions that compile.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from spotguard_sim import cel

_QUALIFIED = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?){2,}$")
_OPERATIONS = {"*", "CREATE", "UPDATE", "DELETE", "CONNECT"}
MAX_MATCH_CONDITIONS = 64


def _cause(field: str, message: str) -> dict[str, str]:
    return {"field": field, "message": message}


def causes(config: dict[str, Any]) -> list[dict[str, str]]:
    """Why the configuration is invalid (empty when it is valid)."""
    out: list[dict[str, str]] = []
    seen: set[str] = set()
    for i, hook in enumerate(config.get("webhooks") or []):
        at = f"webhooks[{i}]"
        if not isinstance(hook, dict):
            out.append(_cause(at, "Invalid value: must be an object"))
            continue
        name = str(hook.get("name") or "")
        if not name:
            out.append(_cause(f"{at}.name", "Required value"))
        elif not _QUALIFIED.match(name):
            out.append(_cause(f"{at}.name", f'Invalid value: "{name}": should be a domain with at '
                              "least three segments separated by dots"))
        elif name in seen:
            out.append(_cause(f"{at}.name", f'Duplicate value: "{name}"'))
        seen.add(name)
        versions = hook.get("admissionReviewVersions")
        if not versions:
            out.append(_cause(f"{at}.admissionReviewVersions", "Required value: must specify one "
                              "of v1, v1beta1"))
        elif not {"v1", "v1beta1"} & set(versions):
            out.append(_cause(f"{at}.admissionReviewVersions", "Invalid value: must include at "
                              "least one of v1, v1beta1"))
        side = hook.get("sideEffects")
        if side is None:
            out.append(_cause(f"{at}.sideEffects", "Required value: must specify one of None, "
                              "NoneOnDryRun"))
        elif side not in ("None", "NoneOnDryRun"):
            out.append(_cause(f"{at}.sideEffects", f'Unsupported value: "{side}": supported '
                              'values: "None", "NoneOnDryRun"'))
        if hook.get("failurePolicy", "Fail") not in ("Ignore", "Fail"):
            out.append(_cause(f"{at}.failurePolicy", f'Unsupported value: "{hook["failurePolicy"]}"'))
        timeout = hook.get("timeoutSeconds", 10)
        if not isinstance(timeout, int) or not 1 <= timeout <= 30:
            out.append(_cause(f"{at}.timeoutSeconds", f"Invalid value: {timeout!r}: the timeout "
                              "value must be between 1 and 30 seconds"))
        out += _client_causes(hook.get("clientConfig") or {}, f"{at}.clientConfig")
        for j, rule in enumerate(hook.get("rules") or []):
            for op in (rule or {}).get("operations") or []:
                if op not in _OPERATIONS:
                    out.append(_cause(f"{at}.rules[{j}].operations", f'Unsupported value: "{op}"'))
        out += _condition_causes(hook.get("matchConditions") or [], f"{at}.matchConditions")
    return out


def _client_causes(client: dict[str, Any], at: str) -> list[dict[str, str]]:
    url, service = client.get("url"), client.get("service")
    if bool(url) == bool(service):
        return [_cause(at, "Required value: exactly one of url or service is required")]
    if not url:
        return []
    parts = urlsplit(str(url))
    if parts.scheme != "https":
        return [_cause(f"{at}.url", f'Invalid value: "{url}": \'https\' is the only allowed URL '
                       "scheme")]
    if not parts.hostname:
        return [_cause(f"{at}.url", f'Invalid value: "{url}": host must be specified')]
    if parts.username or parts.password:
        return [_cause(f"{at}.url", f'Invalid value: "{url}": user information is not permitted '
                       "in the URL")]
    if parts.fragment or parts.query:
        return [_cause(f"{at}.url", f'Invalid value: "{url}": fragments and query parameters are '
                       "not permitted in the URL")]
    return []


def _condition_causes(conditions: list[Any], at: str) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    if len(conditions) > MAX_MATCH_CONDITIONS:
        out.append(_cause(at, f"Too many: {len(conditions)}: must have at most "
                          f"{MAX_MATCH_CONDITIONS} items"))
    names: set[str] = set()
    for k, cond in enumerate(conditions):
        where = f"{at}[{k}]"
        name = str((cond or {}).get("name") or "")
        if not name:
            out.append(_cause(f"{where}.name", "Required value"))
        elif name in names:
            out.append(_cause(f"{where}.name", f'Duplicate value: "{name}"'))
        names.add(name)
        expression = str((cond or {}).get("expression") or "")
        if not expression:
            out.append(_cause(f"{where}.expression", "Required value"))
            continue
        try:
            cel.compile(expression)
        except cel.CelError as exc:
            out.append(_cause(f"{where}.expression", f"Invalid value: compilation failed: {exc}"))
    return out
