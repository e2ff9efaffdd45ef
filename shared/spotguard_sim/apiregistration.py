"""apiregistration.k8s.io/v1 APIServices, as kube-apiserver's aggregator keeps them
(kubernetes/kube-aggregator at 232ca687: ``pkg/registry/apiservice/strategy.go``,
``pkg/apis/apiregistration/v1/defaults.go``, ``pkg/apis/apiregistration/validation``,
``pkg/controllers/status/{local,remote}``).

- Defaults: ``spec.service.port`` 443.
- Create: the status sent is dropped; a local APIService (no ``spec.service``) is
  Available at once (``PrepareForCreate``); update keeps the stored status, the
  ``status`` subresource keeps the rest.
- Validation (422): the name must be ``spec.version + "." + spec.group``; the group a DNS
  subdomain (empty only for ``v1``), the version a DNS-1035 label;
  ``groupPriorityMinimum`` 1..20000, ``versionPriority`` 1..1000; a local APIService has
  no ``caBundle`` nor ``insecureSkipTLSVerify``; a service needs a namespace, a name and a
  valid port, and not both ``insecureSkipTLSVerify`` and ``caBundle``; conditions' status
  True, False or Unknown.
- ``available(apiservice, service)`` is the availability controllers' condition. No
  aggregated API server runs in the simulated cluster and no EndpointSlices are served, so
  a service-backed APIService is never Available: ``ServiceNotFound``,
  ``ServicePortError``, then, for a ClusterIP service, ``EndpointsNotFound`` (upstream
  goes on to its endpoints and a discovery request, which fail with no server behind the
  service; for other types the discovery request is that failure).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from typing import Any

Obj = dict[str, Any]
GROUP = "apiregistration.k8s.io"
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
# validation.RegexError's texts (apimachinery pkg/util/validation/validation.go)
_SUBDOMAIN_RULE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must "
    "start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
_DNS1035_RULE = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic "
    "character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for "
    "validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"
)
LOCAL_REASON = "Local"
LOCAL_MESSAGE = "Local APIServices are always available"


def _cause(field: str, message: str) -> dict[str, str]:
    return {"field": field, "message": message}


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def default(obj: Obj) -> None:
    """SetDefaults_ServiceReference: the service's port is 443 unless set."""
    spec = obj.get("spec")
    service = spec.get("service") if isinstance(spec, dict) else None
    if isinstance(service, dict) and service.get("port") is None:
        service["port"] = 443


def condition(status: str, reason: str, message: str, now: str) -> Obj:
    return {"type": "Available", "status": status, "lastTransitionTime": now, "reason": reason,
            "message": message}


def prepare_create(obj: Obj, now: str) -> None:
    """PrepareForCreate: no status from the client; a local APIService is Available."""
    obj["status"] = {}
    spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
    if not (spec or {}).get("service"):
        obj["status"]["conditions"] = [condition("True", LOCAL_REASON, LOCAL_MESSAGE, now)]


def _ca_bytes(value: Any) -> int:
    if not value:
        return 0
    try:
        return len(base64.b64decode(str(value), validate=True))
    except (binascii.Error, ValueError):
        return len(str(value))


def causes(obj: Obj) -> list[dict[str, str]]:
    """ValidateAPIService: why the APIService is invalid (empty when it is valid). The name's
    path-segment rule is the store's, as for RBAC names."""
    spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
    assert isinstance(spec, dict)
    name = str((obj.get("metadata") or {}).get("name") or "")
    group, version = str(spec.get("group") or ""), str(spec.get("version") or "")
    found: list[dict[str, str]] = []
    required = f"{version}.{group}"
    if name and name not in (".", "..") and "/" not in name and "%" not in name and name != required:
        found.append(_cause("metadata.name", f"Invalid value: {json.dumps(name)}: must be "
                            f'`spec.version+"."+spec.group`: {json.dumps(required)}'))
    if not group and version != "v1":
        found.append(_cause("spec.group", "Required value: only v1 may have an empty group and it "
                            "better be legacy kube"))
    if group:
        if len(group) > 253:
            found.append(_cause("spec.group", f"Invalid value: {json.dumps(group)}: must be no more than "
                                "253 characters"))
        if not _SUBDOMAIN.match(group):
            found.append(_cause("spec.group", f"Invalid value: {json.dumps(group)}: {_SUBDOMAIN_RULE}"))
    if len(version) > 63:
        found.append(_cause("spec.version", f"Invalid value: {json.dumps(version)}: must be no more than "
                            "63 characters"))
    if not _DNS1035.match(version):
        found.append(_cause("spec.version", f"Invalid value: {json.dumps(version)}: {_DNS1035_RULE}"))
    minimum, priority = _int(spec.get("groupPriorityMinimum")), _int(spec.get("versionPriority"))
    if minimum <= 0 or minimum > 20000:
        found.append(_cause("spec.groupPriorityMinimum", f"Invalid value: {minimum}: must be positive and "
                            "less than 20000"))
    if priority <= 0 or priority > 1000:
        found.append(_cause("spec.versionPriority", f"Invalid value: {priority}: must be positive and "
                            "less than 1000"))
    service = spec.get("service")
    ca_bytes = _ca_bytes(spec.get("caBundle"))
    insecure = spec.get("insecureSkipTLSVerify") is True
    if not service:
        if ca_bytes:
            found.append(_cause("spec.caBundle", f'Invalid value: "{ca_bytes} bytes": local APIServices '
                                "may not have a caBundle"))
        if insecure:
            found.append(_cause("spec.insecureSkipTLSVerify", "Invalid value: true: local APIServices may "
                                "not have insecureSkipTLSVerify"))
        return found
    if not isinstance(service, dict):
        return [*found, _cause("spec.service", "Invalid value: must be an object")]
    if not service.get("namespace"):
        found.append(_cause("spec.service.namespace", "Required value"))
    if not service.get("name"):
        found.append(_cause("spec.service.name", "Required value"))
    port = _int(service.get("port"))
    if not 1 <= port <= 65535:
        found.append(_cause("spec.service.port", f"Invalid value: {port}: port is not valid: must be "
                            "between 1 and 65535, inclusive"))
    if insecure and ca_bytes:
        found.append(_cause("spec.insecureSkipTLSVerify", "Invalid value: true: may not be true if "
                            "caBundle is present"))
    return found


def status_causes(obj: Obj) -> list[dict[str, str]]:
    """ValidateAPIServiceStatus: each condition's status is True, False or Unknown."""
    found = []
    conditions = (obj.get("status") or {}).get("conditions") or []
    for i, cond in enumerate(conditions if isinstance(conditions, list) else []):
        value = cond.get("status") if isinstance(cond, dict) else None
        if value not in ("True", "False", "Unknown"):
            found.append(_cause(f"status.conditions[{i}].status", f"Unsupported value: {json.dumps(value)}: "
                                'supported values: "True", "False", "Unknown"'))
    return found


def available(apiservice: Obj, service: Obj | None) -> tuple[str, str, str]:
    """The Available condition's (status, reason, message) that the local and remote
    availability controllers set, given the service ``spec.service`` names (None: absent)."""
    ref = (apiservice.get("spec") or {}).get("service")
    if not ref:
        return "True", LOCAL_REASON, LOCAL_MESSAGE
    name, namespace = ref.get("name", ""), ref.get("namespace", "")
    if service is None:
        return "False", "ServiceNotFound", f"service/{name} in {json.dumps(namespace)} is not present"
    port = _int(ref.get("port")) or 443
    spec = service.get("spec") or {}
    if spec.get("type", "ClusterIP") == "ClusterIP":
        if not any(_int(p.get("port")) == port for p in spec.get("ports") or [] if isinstance(p, dict)):
            return ("False", "ServicePortError",
                    f"service/{name} in {json.dumps(namespace)} is not listening on port {port}")
        return ("False", "EndpointsNotFound",
                f"cannot find endpointslices for service/{name} in {json.dumps(namespace)}")
    group, version = (apiservice.get("spec") or {}).get("group", ""), (apiservice.get("spec") or {}).get("version", "")
    path = f"/api/{version}" if (apiservice.get("metadata") or {}).get("name") == "v1." else f"/apis/{group}/{version}"
    return ("False", "FailedDiscoveryCheck",
            f"failing or missing response from https://{name}.{namespace}.svc:{port}{path}: "
            "no aggregated API server runs in the simulated cluster")


def set_available(apiservice: Obj, status: str, reason: str, message: str, now: str) -> None:
    """SetAPIServiceCondition: the transition time changes only with the status."""
    conditions = apiservice.setdefault("status", {}).setdefault("conditions", [])
    for cond in conditions:
        if isinstance(cond, dict) and cond.get("type") == "Available":
            if cond.get("status") != status:
                cond["status"] = status
                cond["lastTransitionTime"] = now
            cond["reason"], cond["message"] = reason, message
            return
    conditions.append(condition(status, reason, message, now))
