"""Assertions about spotguard's rendered deployment manifests.

Renders with the real tools from .venv/bin (kubectl kustomize, helm template)
and reads the SAM template with the same loader check_iam uses. A missing tool
fails the test: run scripts/setup.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from cryptography import x509

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".venv" / "bin"
INFRA = ROOT / "infra"
CHART = INFRA / "helm" / "spotguard"
FUNCTIONS = ("admission", "spot-interruption", "node-added")
WEBHOOK_SVC = "spotguard-admission.spotguard.svc"


def tool(name: str) -> str:
    path = BIN / name
    if not path.exists():
        pytest.fail(f"{path} is missing: run scripts/setup")
    return str(path)


def run(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=60, env=env, check=False)
    if done.returncode != 0:
        pytest.fail(f"{' '.join(args)} failed ({done.returncode}):\n{done.stderr}")
    return done.stdout


def objects(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


@cache
def kustomize(path: str) -> tuple[dict[str, Any], ...]:
    return tuple(objects(run(tool("kubectl"), "kustomize", str(INFRA / path))))


@cache
def helm(*sets: str) -> tuple[dict[str, Any], ...]:
    # Rendered without a cluster, which certs.mode=generate (the default) refuses unless told.
    args = [tool("helm"), "template", "spotguard", str(CHART), "--namespace", "spotguard"]
    for item in ("certs.generate.renderWithoutCluster=true", *sets):
        args += ["--set", item]
    return tuple(objects(run(*args)))


def load_module(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


check_iam = load_module("spotguard_infra_check_iam", INFRA / "aws" / "check_iam.py")
validate_manifests = load_module("spotguard_infra_validate_manifests", INFRA / "validate_manifests.py")


def of_kind(objs: tuple[dict[str, Any], ...] | list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o.get("kind") == kind]


def one(objs: tuple[dict[str, Any], ...] | list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in of_kind(objs, kind) if o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


# Every shape that carries the webhook configuration.
SHAPES: dict[str, Any] = {
    "kustomize base": lambda: kustomize("kubernetes/base"),
    "kustomize cert-manager": lambda: kustomize("kubernetes/cert-manager"),
    "kustomize knative": lambda: kustomize("knative"),
    "helm generate": helm,
    "helm cert-manager": lambda: helm("certs.mode=cert-manager"),
    "helm static": lambda: helm("certs.mode=static", "certs.static.caBundle=Q0E=", "certs.static.existingSecret=x"),
    "aws webhook.yaml": lambda: tuple(objects((INFRA / "aws" / "webhook.yaml").read_text())),
}


@pytest.fixture(params=sorted(SHAPES))
def shape(request: pytest.FixtureRequest) -> tuple[dict[str, Any], ...]:
    rendered: tuple[dict[str, Any], ...] = SHAPES[request.param]()
    return rendered


# ---------------------------------------------------------------- webhook


def test_webhook_fails_open_fast_and_idempotent(shape: tuple[dict[str, Any], ...]) -> None:
    [config] = of_kind(shape, "MutatingWebhookConfiguration")
    [hook] = config["webhooks"]
    assert hook["failurePolicy"] == "Ignore"
    assert 1 <= hook["timeoutSeconds"] <= 3
    assert hook["sideEffects"] == "NoneOnDryRun"
    assert hook["reinvocationPolicy"] == "IfNeeded"
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["rules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ]
    client = hook["clientConfig"]
    if "service" in client:
        assert client["service"]["namespace"] == "spotguard"
        assert client["service"]["path"] == "/mutate"
        assert client["service"]["port"] == 443
    else:
        assert client["url"].startswith("https://") and client["url"].endswith("/mutate")


def test_every_shape_ships_the_eviction_guard(shape: tuple[dict[str, Any], ...]) -> None:
    """The validating webhook for pods/eviction: fails open, writes nothing, same server, and
    the same namespaces left out as the pod-create webhook; with a CA wherever the pod-create
    webhook has one."""
    [config] = of_kind(shape, "ValidatingWebhookConfiguration")
    [hook] = config["webhooks"]
    assert hook["failurePolicy"] == "Ignore"
    assert 1 <= hook["timeoutSeconds"] <= 3
    assert hook["sideEffects"] == "None"
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                              "resources": ["pods/eviction"], "scope": "Namespaced"}]
    [pods_config] = of_kind(shape, "MutatingWebhookConfiguration")
    [pods_hook] = pods_config["webhooks"]
    assert hook["namespaceSelector"] == pods_hook["namespaceSelector"]
    assert (config["metadata"].get("annotations") or {}) == (pods_config["metadata"].get("annotations") or {})
    assert ("caBundle" in hook["clientConfig"]) == ("caBundle" in pods_hook["clientConfig"])
    client = hook["clientConfig"]
    if "service" in client:
        assert client["service"] == {**pods_hook["clientConfig"]["service"], "path": "/evictions"}
    else:
        assert client["url"] == pods_hook["clientConfig"]["url"].removesuffix("/mutate") + "/evictions"


def test_webhook_skips_system_own_and_opted_out_namespaces(shape: tuple[dict[str, Any], ...]) -> None:
    [config] = of_kind(shape, "MutatingWebhookConfiguration")
    [hook] = config["webhooks"]
    expressions = hook["namespaceSelector"]["matchExpressions"]
    by_key = {e["key"]: e for e in expressions}
    names = by_key["kubernetes.io/metadata.name"]
    assert names["operator"] == "NotIn"
    assert {"kube-system", "spotguard"} <= set(names["values"])
    opt_out = by_key["spotguard.io/enabled"]
    assert (opt_out["operator"], opt_out["values"]) == ("NotIn", ["false"])
    assert "matchLabels" not in hook["namespaceSelector"]


def test_webhook_ca_comes_from_the_certificate_source() -> None:
    cm = kustomize("kubernetes/cert-manager")
    config = one(cm, "MutatingWebhookConfiguration", "spotguard-admission")
    namespace, name = config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].split("/")
    certificate = one(cm, "Certificate", name)
    assert certificate["metadata"]["namespace"] == namespace
    assert WEBHOOK_SVC in certificate["spec"]["dnsNames"]
    deployment = one(cm, "Deployment", "spotguard-admission")
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == certificate["spec"]["secretName"]
    base = one(kustomize("kubernetes/base"), "MutatingWebhookConfiguration", "spotguard-admission")
    assert "caBundle" not in base["webhooks"][0]["clientConfig"]


def test_helm_generated_certificate_is_signed_by_the_webhook_ca() -> None:
    rendered = helm()
    secret = one(rendered, "Secret", "spotguard-admission-tls")
    config = one(rendered, "MutatingWebhookConfiguration", "spotguard-admission")
    ca_pem = base64.b64decode(config["webhooks"][0]["clientConfig"]["caBundle"])
    assert ca_pem == base64.b64decode(secret["data"]["ca.crt"])
    ca = x509.load_pem_x509_certificate(ca_pem)
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert WEBHOOK_SVC in names.get_values_for_type(x509.DNSName)


def test_helm_generate_refuses_a_render_without_the_cluster() -> None:
    """helm template (Argo CD renders the same way) cannot see the Secret generate keeps."""
    base = [tool("helm"), "template", "spotguard", str(CHART), "--namespace", "spotguard"]
    done = subprocess.run(base, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode != 0
    assert "certs.mode=cert-manager" in done.stderr and "helm template" in done.stderr
    for mode in ("cert-manager", "static"):
        extra = (
            ["--set", "certs.static.caBundle=Q0E=", "--set", "certs.static.existingSecret=x"]
            if mode == "static"
            else []
        )
        ok = subprocess.run(
            [*base, "--set", f"certs.mode={mode}", *extra], capture_output=True, text=True, timeout=120, check=False
        )
        assert ok.returncode == 0, ok.stderr
    notes = (CHART / "templates" / "NOTES.txt").read_text()
    assert "Argo CD" in notes


def test_static_certs_overlay_uses_spotguard_certs(tmp_path: Path) -> None:
    shutil.copytree(INFRA / "kubernetes", tmp_path / "kubernetes", ignore=shutil.ignore_patterns("generated"))
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "SPOTGUARD": tool("spotguard")}
    run(str(tmp_path / "kubernetes" / "static-certs" / "prepare"), env=env)
    rendered = objects(run(tool("kubectl"), "kustomize", str(tmp_path / "kubernetes" / "static-certs")))
    config = one(rendered, "MutatingWebhookConfiguration", "spotguard-admission")
    generated = tmp_path / "kubernetes" / "static-certs" / "generated"
    ca_bundle = config["webhooks"][0]["clientConfig"]["caBundle"]
    assert base64.b64decode(ca_bundle) == (generated / "ca.crt").read_bytes()
    [secret] = of_kind(rendered, "Secret")
    deployment = one(rendered, "Deployment", "spotguard-admission")
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == secret["metadata"]["name"]
    assert base64.b64decode(secret["data"]["tls.crt"]) == (generated / "tls.crt").read_bytes()


# ----------------------------------------------------- admission server


@pytest.mark.parametrize("source", ["kustomize", "helm"])
def test_admission_server_is_redundant_and_probed_over_https(source: str) -> None:
    rendered = kustomize("kubernetes/base") if source == "kustomize" else helm()
    deployment = one(rendered, "Deployment", "spotguard-admission")
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]
    [container] = pod["spec"]["containers"]
    assert container["command"] == ["spotguard"]
    assert container["args"][:2] == ["serve", "admission"]
    probe = container["readinessProbe"]["httpGet"]
    assert (probe["path"], probe["scheme"]) == ("/readyz", "HTTPS")
    assert pod["spec"]["serviceAccountName"] == "spotguard-admission"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    budget = one(rendered, "PodDisruptionBudget", "spotguard-admission")
    assert budget["spec"]["minAvailable"] == 1
    labels = pod["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in budget["spec"]["selector"]["matchLabels"].items())
    service = one(rendered, "Service", "spotguard-admission")
    assert service["spec"]["ports"][0]["port"] == 443


# ------------------------------------------------------------------ RBAC


def rbac_sources() -> Iterator[tuple[str, tuple[dict[str, Any], ...]]]:
    yield "kustomize base", kustomize("kubernetes/base")
    yield "kustomize knative", kustomize("knative")
    yield "helm", helm()


def test_rbac_is_least_privilege() -> None:
    for source, rendered in rbac_sources():
        roles = of_kind(rendered, "ClusterRole") + of_kind(rendered, "Role")
        assert roles, source
        for role in roles:
            where = f"{source}: {role['kind']} {role['metadata']['name']}"
            for rule in role["rules"]:
                assert "*" not in rule["verbs"], where
                assert "*" not in rule["resources"], where
                assert "*" not in rule.get("apiGroups", []), where
                assert "secrets" not in rule["resources"], where
                assert not {"escalate", "bind", "impersonate", "deletecollection"} & set(rule["verbs"]), where
                assert "nonResourceURLs" not in rule, where
                if "leases" in rule["resources"]:
                    assert role["kind"] == "Role", f"{where}: leases only in the spotguard namespace"
                    assert role["metadata"]["namespace"] == "spotguard", where
                if "configmaps" in rule["resources"]:
                    assert role["kind"] == "Role" and role["metadata"]["namespace"] == "spotguard", where
                    # Only spot-interruption's reconcile writes ConfigMaps: its surge ledger in its own
                    # namespace (node-added runs that reconcile on every pass).
                    if rule.get("resourceNames") != ["spotguard-config"]:
                        writers = ("spotguard-spot-interruption", "spotguard-node-added")
                        assert role["metadata"]["name"] in writers, where


def test_admission_writes_only_leases_and_events() -> None:
    for source, rendered in rbac_sources():
        cluster = one(rendered, "ClusterRole", "spotguard-admission")
        for rule in cluster["rules"]:
            writes = set(rule["verbs"]) - {"get", "list", "watch"}
            assert not writes or rule["resources"] == ["events"], f"{source}: {rule}"
        role = one(rendered, "Role", "spotguard-admission")
        leases = [r for r in role["rules"] if "leases" in r["resources"]]
        assert leases and set(leases[0]["verbs"]) == {"get", "create", "update"}, source


def test_each_function_is_bound_to_its_service_account_and_eks_group() -> None:
    for source, rendered in rbac_sources():
        for function in FUNCTIONS:
            name = f"spotguard-{function}"
            for kind in ("ClusterRoleBinding", "RoleBinding"):
                binding = one(rendered, kind, name)
                assert binding["roleRef"]["name"] == name, source
                subjects = {(s["kind"], s["name"]) for s in binding["subjects"]}
                assert subjects == {("ServiceAccount", name), ("Group", f"spotguard:{function}")}, source


def test_kustomize_and_helm_grant_the_same_rules() -> None:
    def rules(rendered: tuple[dict[str, Any], ...]) -> dict[tuple[str, str], Any]:
        return {
            (r["kind"], r["metadata"]["name"]): sorted(json.dumps(rule, sort_keys=True) for rule in r["rules"])
            for r in of_kind(rendered, "ClusterRole") + of_kind(rendered, "Role")
        }

    assert rules(kustomize("kubernetes/base")) == rules(helm())


# --------------------------------------------------------------- Knative


@cache
def knative_with_node_added() -> tuple[dict[str, Any], ...]:
    """infra/knative with its node-added component, rendered from a scratch copy (as infra/check does)."""
    scratch = Path(tempfile.mkdtemp(prefix="spotguard-knative-"))
    try:
        shutil.copytree(INFRA / "knative", scratch / "knative", ignore=shutil.ignore_patterns("validate"))
        shutil.copytree(INFRA / "kubernetes", scratch / "kubernetes", ignore=shutil.ignore_patterns("generated"))
        with (scratch / "knative" / "kustomization.yaml").open("a") as f:
            f.write("components:\n  - node-added\n")
        return tuple(objects(run(tool("kubectl"), "kustomize", str(scratch / "knative"))))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def knative_services(rendered: tuple[dict[str, Any], ...]) -> dict[str, dict[str, Any]]:
    return {s["metadata"]["name"]: s for s in rendered if s["apiVersion"] == "serving.knative.dev/v1"}


def test_knative_deploys_only_functions_that_exist() -> None:
    from spotguard import cli

    existing = {d.name for d in (ROOT / "functions").iterdir() if (d / "func.yaml").is_file()} & set(cli.SERVE)
    services = knative_services(kustomize("knative"))
    assert {"admission", "spot-interruption"} <= existing
    assert set(services) == {f"spotguard-{f}" for f in existing}, (
        "infra/knative must deploy exactly the functions that exist (functions/<name>/ and `spotguard serve <name>`);"
        " add the node-added component to infra/knative/kustomization.yaml once node-added exists"
    )
    parser = cli.build_parser()
    for name, service in services.items():
        [container] = service["spec"]["template"]["spec"]["containers"]
        assert container["args"][:2] == ["serve", name.removeprefix("spotguard-")]
        parser.parse_args(container["args"])
    # Every object the default render carries belongs to a function it deploys.
    for obj in kustomize("knative"):
        ref = ((obj.get("spec") or {}).get("subscriber") or {}).get("ref") or {}
        assert not ref or ref["name"] in services
    # The component for node-added renders on its own terms.
    assert "spotguard-node-added" in knative_services(knative_with_node_added())


def test_knative_admission_stays_warm_and_cluster_local() -> None:
    rendered = kustomize("knative")
    services = knative_services(rendered)
    assert {"spotguard-admission", "spotguard-spot-interruption"} <= set(services)
    admission = services["spotguard-admission"]
    annotations = admission["spec"]["template"]["metadata"]["annotations"]
    assert annotations["autoscaling.knative.dev/min-scale"] == "1"
    for service in services.values():
        assert service["metadata"]["labels"]["networking.knative.dev/visibility"] == "cluster-local"
        [container] = service["spec"]["template"]["spec"]["containers"]
        assert container["ports"] == [{"containerPort": 8080}]
        assert "--port=8080" in container["args"] and "--host=0.0.0.0" in container["args"]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        function = service["metadata"]["name"]
        assert service["spec"]["template"]["spec"]["serviceAccountName"] == function
    hook = one(rendered, "MutatingWebhookConfiguration", "spotguard-admission")["webhooks"][0]
    assert hook["clientConfig"]["service"]["name"] == "spotguard-admission"


def test_knative_events_reach_the_right_function() -> None:
    rendered = knative_with_node_added()
    brokers = {b["metadata"]["name"] for b in of_kind(rendered, "Broker")}
    services = {s["metadata"]["name"] for s in rendered if s["apiVersion"] == "serving.knative.dev/v1"}
    routes: dict[str, set[str]] = {}
    for trigger in of_kind(rendered, "Trigger"):
        assert trigger["spec"]["broker"] in brokers
        subscriber = trigger["spec"]["subscriber"]["ref"]
        assert subscriber["name"] in services
        routes.setdefault(trigger["spec"]["filter"]["attributes"]["type"], set()).add(subscriber["name"])
    assert routes["dev.knative.eventing.aws-sqs"] == {"spotguard-spot-interruption"}
    assert routes["dev.knative.apiserver.resource.add"] == {"spotguard-node-added"}
    assert routes["dev.knative.sources.ping"] == {"spotguard-spot-interruption", "spotguard-node-added"}
    default_routes = {t["spec"]["subscriber"]["ref"]["name"] for t in of_kind(kustomize("knative"), "Trigger")}
    assert default_routes == {"spotguard-spot-interruption", "spotguard-node-added"}  # node-added included
    [sqs] = of_kind(rendered, "IntegrationSource")
    assert sqs["apiVersion"] == "sources.knative.dev/v1alpha1"
    assert sqs["spec"]["aws"]["sqs"]["arn"].startswith("arn:aws:sqs:")
    assert sqs["spec"]["sink"]["ref"]["name"] in brokers
    [nodes] = of_kind(rendered, "ApiServerSource")
    assert nodes["spec"]["resources"] == [{"apiVersion": "v1", "kind": "Node"}]
    account = one(rendered, "ServiceAccount", nodes["spec"]["serviceAccountName"])
    assert account["metadata"]["namespace"] == "spotguard"
    for ping in of_kind(rendered, "PingSource"):
        assert ping["spec"]["schedule"] == "* * * * *"
        source = f"/apis/v1/namespaces/spotguard/pingsources/{ping['metadata']['name']}"
        assert any(t["spec"]["filter"]["attributes"].get("source") == source for t in of_kind(rendered, "Trigger"))


def retry_span(delivery: dict[str, Any]) -> float:
    """Seconds from the first failure to the last retry (Knative: linear n*delay, exponential delay*2^n)."""
    delay = float(delivery["backoffDelay"].removeprefix("PT").removesuffix("S"))
    tries = range(1, delivery["retry"] + 1)
    if delivery["backoffPolicy"] == "linear":
        return sum(n * delay for n in tries)
    return sum(delay * 2 ** (n - 1) for n in tries)


def test_knative_notices_are_retried_for_two_minutes_then_dead_lettered() -> None:
    rendered = knative_with_node_added()
    [broker] = of_kind(rendered, "Broker")
    [sink] = of_kind(rendered, "IntegrationSink")
    sink_ref = {"apiVersion": "sinks.knative.dev/v1alpha1", "kind": "IntegrationSink", "name": sink["metadata"]["name"]}
    assert broker["spec"]["delivery"]["deadLetterSink"]["ref"] == sink_ref
    [source] = of_kind(rendered, "IntegrationSource")
    assert sink["spec"]["aws"]["sqs"]["arn"] != source["spec"]["aws"]["sqs"]["arn"]
    assert sink["spec"]["aws"]["auth"]["serviceAccountName"] == source["spec"]["aws"]["auth"]["serviceAccountName"]
    for trigger in of_kind(rendered, "Trigger"):
        attributes = trigger["spec"]["filter"]["attributes"]
        delivery = trigger["spec"].get("delivery")
        if attributes["type"] == "dev.knative.eventing.aws-sqs":
            # a notice: retried over most of its two minutes, then kept in the dead-letter queue
            assert delivery["deadLetterSink"]["ref"] == sink_ref
            assert 60 <= retry_span(delivery) <= 120
        else:
            # pings and node events: their own delivery, so the Broker's dead-letter queue never fills with them
            assert delivery is not None and "deadLetterSink" not in delivery, trigger["metadata"]["name"]


def test_the_dead_letter_sink_may_write_to_the_dead_letter_queue() -> None:
    role = sam()["Resources"]["SqsSourceRole"]["Properties"]
    statements = [s for p in role["Policies"] for s in p["PolicyDocument"]["Statement"]]
    sends = [s for s in statements if "sqs:SendMessage" in s["Action"]]
    assert [s["Resource"] for s in sends] == [{"Fn::GetAtt": ["NoticeDeadLetterQueue", "Arn"]}]
    association = sam()["Resources"]["SqsSourcePodIdentity"]["Properties"]
    [sink] = of_kind(kustomize("knative"), "IntegrationSink")
    assert association["ServiceAccount"] == sink["spec"]["aws"]["auth"]["serviceAccountName"]


# ------------------------------------------------------------------- SAM


@cache
def sam() -> dict[str, Any]:
    template: dict[str, Any] = check_iam.load_template(INFRA / "aws" / "template.yaml")
    return template


def resources(kind: str) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in sam()["Resources"].items() if v["Type"] == kind}


def test_sam_event_source_mapping_reports_partial_failures() -> None:
    [mapping] = resources("AWS::Lambda::EventSourceMapping").values()
    props = mapping["Properties"]
    assert props["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    assert props["EventSourceArn"] == {"Fn::GetAtt": ["NoticeQueue", "Arn"]}
    assert props["FunctionName"] == {"Ref": "SpotInterruptionFunction"}
    assert 0 < props["MaximumBatchingWindowInSeconds"] <= 5
    function = sam()["Resources"]["SpotInterruptionFunction"]["Properties"]
    queue = sam()["Resources"]["NoticeQueue"]["Properties"]
    visibility = queue["VisibilityTimeout"]
    # Lambda requires at least the function timeout; a retry must land inside the two-minute
    # window even when the function dies, and a failed notice comes back within seconds.
    assert function["Timeout"] <= visibility <= 60
    assert 0 < int(function["Environment"]["Variables"]["SPOTGUARD_SQS_RETRY_SECONDS"]) <= 5


def test_sam_queue_is_encrypted_bounded_and_dead_lettered() -> None:
    queues = resources("AWS::SQS::Queue")
    assert set(queues) == {"NoticeQueue", "NoticeDeadLetterQueue"}
    for name, queue in queues.items():
        props = queue["Properties"]
        assert props.get("SqsManagedSseEnabled") is True or "KmsMasterKeyId" in props, name
    notice = queues["NoticeQueue"]["Properties"]
    redrive = notice["RedrivePolicy"]
    assert redrive["deadLetterTargetArn"] == {"Fn::GetAtt": ["NoticeDeadLetterQueue", "Arn"]}
    assert 1 <= redrive["maxReceiveCount"] <= 10
    # Retention matches a two-minute notice, yet outlives every retry.
    assert 300 <= notice["MessageRetentionPeriod"] <= 900
    assert notice["MessageRetentionPeriod"] > redrive["maxReceiveCount"] * notice["VisibilityTimeout"]
    dead = queues["NoticeDeadLetterQueue"]["Properties"]
    assert dead["MessageRetentionPeriod"] > notice["MessageRetentionPeriod"]


def queue_rules() -> dict[str, Any]:
    """The rules that feed the notice queue (the node-added rule targets its function)."""
    return {
        name: rule
        for name, rule in resources("AWS::Events::Rule").items()
        if rule["Properties"]["Targets"][0]["Arn"] == {"Fn::GetAtt": ["NoticeQueue", "Arn"]}
    }


def test_sam_rules_deliver_the_notices_to_the_queue() -> None:
    rules = queue_rules()
    detail_types: set[tuple[str, str]] = set()
    for rule in rules.values():
        pattern = rule["Properties"]["EventPattern"]
        [source] = pattern["source"]
        detail_types.update((source, d) for d in pattern["detail-type"])
        [target] = rule["Properties"]["Targets"]
        assert target["Arn"] == {"Fn::GetAtt": ["NoticeQueue", "Arn"]}
    assert detail_types == {
        ("aws.ec2", "EC2 Spot Instance Interruption Warning"),
        ("aws.ec2", "EC2 Instance Rebalance Recommendation"),
        ("aws.ec2", "EC2 Instance State-change Notification"),
        # the advance notices (tests/security/test_aws_template.py checks their patterns)
        ("aws.autoscaling", "EC2 Instance-terminate Lifecycle Action"),
        ("aws.health", "AWS Health Event"),
    }


def test_sam_node_added_runs_when_an_instance_runs_and_every_minute() -> None:
    rules = {n: r for n, r in resources("AWS::Events::Rule").items() if n not in queue_rules()}
    [(name, rule)] = rules.items()
    assert rule["Properties"]["EventPattern"]["detail"] == {"state": ["running"]}
    [target] = rule["Properties"]["Targets"]
    assert target["Arn"] == {"Fn::GetAtt": ["NodeAddedFunction", "Arn"]}
    source = {"Fn::GetAtt": [name, "Arn"]}
    [permission] = [p for p in resources("AWS::Lambda::Permission").values() if p["Properties"]["SourceArn"] == source]
    assert permission["Properties"]["Principal"] == "events.amazonaws.com"
    schedules = [
        s for s in resources("AWS::Scheduler::Schedule").values()
        if s["Properties"]["Target"]["Arn"] == {"Fn::GetAtt": ["NodeAddedFunction", "Arn"]}
    ]
    [schedule] = schedules
    assert json.loads(schedule["Properties"]["Target"]["Input"])["spotguard"] == "reconcile"
    entries = resources("AWS::EKS::AccessEntry")
    assert entries["NodeAddedAccessEntry"]["Properties"]["KubernetesGroups"] == ["spotguard:node-added"]


def test_sam_queue_policy_admits_only_the_rules() -> None:
    rule_arns = [{"Fn::GetAtt": [name, "Arn"]} for name in queue_rules()]
    policies = resources("AWS::SQS::QueuePolicy")
    covered: set[str] = set()
    for policy in policies.values():
        covered.update(q["Ref"] for q in policy["Properties"]["Queues"])
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            if statement["Effect"] != "Allow":
                continue
            assert statement["Principal"] == {"Service": "events.amazonaws.com"}
            assert statement["Action"] == "sqs:SendMessage"
            arns = statement["Condition"]["ArnEquals"]["aws:SourceArn"]
            assert sorted(map(json.dumps, arns)) == sorted(map(json.dumps, rule_arns))
    assert "NoticeQueue" in covered


def test_sam_function_url_and_cluster_access() -> None:
    functions = resources("AWS::Serverless::Function")
    admission = functions["AdmissionFunction"]["Properties"]
    assert admission["FunctionUrlConfig"]["AuthType"] == "NONE"
    assert admission["Handler"] == "lambda_function.lambda_handler"
    assert admission["Timeout"] <= 10
    assert "ProvisionedConcurrencyConfig" in admission
    groups = {
        entry["Properties"]["PrincipalArn"]["Fn::GetAtt"][0]: entry["Properties"]["KubernetesGroups"]
        for entry in resources("AWS::EKS::AccessEntry").values()
    }
    assert groups == {
        "AdmissionRole": ["spotguard:admission"],
        "SpotInterruptionRole": ["spotguard:spot-interruption"],
        "NodeAddedRole": ["spotguard:node-added"],
    }
    env = sam()["Globals"]["Function"]["Environment"]["Variables"]
    assert env["SPOTGUARD_EKS_CLUSTER"] == {"Ref": "ClusterName"}
    [schedule] = [
        s
        for s in resources("AWS::Scheduler::Schedule").values()
        if s["Properties"]["Target"]["Arn"] == {"Fn::GetAtt": ["SpotInterruptionFunction", "Arn"]}
    ]
    assert schedule["Properties"]["ScheduleExpression"] == "rate(1 minute)"
    target = schedule["Properties"]["Target"]
    assert json.loads(target["Input"]) == {"spotguard": "reconcile"}


def test_check_iam_passes_and_catches_a_wildcard(tmp_path: Path) -> None:
    python = tool("python")
    ok = subprocess.run([python, str(INFRA / "aws" / "check_iam.py")], capture_output=True, text=True, check=False)
    assert ok.returncode == 0, ok.stderr
    text = (INFRA / "aws" / "template.yaml").read_text()
    broad = text.replace("Resource: !GetAtt AdmissionLogGroup.Arn", 'Resource: "*"', 1)
    assert broad != text
    (tmp_path / "broad.yaml").write_text(broad)
    bad = subprocess.run(
        [python, str(INFRA / "aws" / "check_iam.py"), str(tmp_path / "broad.yaml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 1
    assert "RESOURCE_STAR" in bad.stderr


def test_check_iam_trust_rules() -> None:
    good = {
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Service": "lambda.amazonaws.com"},
                "Action": "sts:AssumeRole",
                "Condition": {"StringEquals": {"aws:SourceAccount": "123456789012"}},
            }
        ]
    }
    assert check_iam.check_trust(good) == []
    deputy = {"Statement": [{**good["Statement"][0], "Condition": {}}]}
    assert any("confused deputy" in p for p in check_iam.check_trust(deputy))
    anyone = {"Statement": [{**good["Statement"][0], "Principal": "*"}]}
    assert check_iam.check_trust(anyone)


# ------------------------------------------------------------ validators


def test_strict_validation_catches_misspelt_fields() -> None:
    version = validate_manifests.kubernetes_validate.latest_version()
    pdb = one(kustomize("kubernetes/base"), "PodDisruptionBudget", "spotguard-admission")
    assert validate_manifests.check([("pdb", pdb)], version)[3] == []
    typo = {**pdb, "spec": {**pdb["spec"], "minAvailabel": 1}}
    assert validate_manifests.check([("typo", typo)], version)[3]
    service = next(s for s in kustomize("knative") if s["apiVersion"] == "serving.knative.dev/v1")
    template = service["spec"]["template"]
    container = {**template["spec"]["containers"][0], "imagePullPolicyy": "Always"}
    bad = {**service, "spec": {"template": {**template, "spec": {**template["spec"], "containers": [container]}}}}
    problems = validate_manifests.check([("ksvc", bad)], version)[3]
    assert problems and "imagePullPolicyy" in problems[0]
    unknown = {"apiVersion": "example.com/v1", "kind": "Gadget", "metadata": {"name": "x"}}
    assert validate_manifests.check([("crd", unknown)], version)[3]


def test_every_knative_object_kind_is_known_to_the_validator() -> None:
    # The Node validator (run by infra/check) resolves models by group/version/kind;
    # this pins the kinds the manifests use to the ones @kubernetes-models/knative ships.
    kinds = {(o["apiVersion"], o["kind"]) for o in knative_with_node_added() if "knative.dev" in o["apiVersion"]}
    assert kinds == {
        ("serving.knative.dev/v1", "Service"),
        ("eventing.knative.dev/v1", "Broker"),
        ("eventing.knative.dev/v1", "Trigger"),
        ("sources.knative.dev/v1", "PingSource"),
        ("sources.knative.dev/v1", "ApiServerSource"),
        ("sources.knative.dev/v1alpha1", "IntegrationSource"),
        ("sinks.knative.dev/v1alpha1", "IntegrationSink"),
    }
    lock = json.loads((INFRA / "knative" / "validate" / "package-lock.json").read_text())
    assert lock["packages"]["node_modules/@kubernetes-models/knative"]["version"] == "4.0.0"


def test_helm_chart_refuses_a_longer_webhook_timeout() -> None:
    done = subprocess.run(
        [tool("helm"), "template", "spotguard", str(CHART), "--set", "admission.timeoutSeconds=10"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0
    assert "timeoutSeconds" in done.stderr


# ------------------------------------------------------- Helm: shipping


def helm_with(values: str, namespace: str = "platform", *sets: str) -> tuple[dict[str, Any], ...]:
    args = [tool("helm"), "template", "sg", str(CHART), "--namespace", namespace, "-f", str(CHART / "ci" / values)]
    for item in sets:
        args += ["--set", item]
    return tuple(objects(run(*args)))


NAMESPACED = {"ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Deployment", "Service", "PodDisruptionBudget",
              "Secret", "Certificate", "Issuer", "ServiceMonitor"}  # fmt: skip


@pytest.mark.parametrize(
    ("values", "sets", "namespace"),
    [
        ("generate-values.yaml", (), "platform"),
        ("cert-manager-values.yaml", (), "platform"),
        ("generate-values.yaml", ("namespaceOverride=tools",), "tools"),
        ("queue-processor-values.yaml", (), "platform"),
        ("node-added-off-values.yaml", (), "platform"),
        ("node-added-tuned-values.yaml", (), "platform"),
    ],
)
def test_helm_puts_everything_in_the_release_namespace(values: str, sets: tuple[str, ...], namespace: str) -> None:
    rendered = helm_with(values, "platform", *sets)
    kinds = {o["kind"] for o in rendered}
    assert kinds & NAMESPACED
    for obj in rendered:
        if obj["kind"] in NAMESPACED:
            assert obj["metadata"]["namespace"] == namespace, f"{obj['kind']} {obj['metadata']['name']}"
        for subject in obj.get("subjects") or []:
            if subject["kind"] == "ServiceAccount":
                assert subject["namespace"] == namespace
    for deployment in of_kind(rendered, "Deployment"):
        [container] = deployment["spec"]["template"]["spec"]["containers"]
        assert {"name": "SPOTGUARD_NAMESPACE", "value": namespace} in container["env"]
    config = one(rendered, "ConfigMap", "spotguard-config")
    assert namespace in config["data"]["excluded-namespaces"].split(",")
    for hook_config in of_kind(rendered, "MutatingWebhookConfiguration"):
        [hook] = hook_config["webhooks"]
        assert hook["clientConfig"]["service"]["namespace"] == namespace
        names = {e["key"]: e for e in hook["namespaceSelector"]["matchExpressions"]}["kubernetes.io/metadata.name"]
        assert namespace in names["values"]
    for certificate in of_kind(rendered, "Certificate"):
        if certificate["metadata"]["name"] == "spotguard-admission":
            assert f"spotguard-admission.{namespace}.svc" in certificate["spec"]["dnsNames"]


def test_helm_node_added_is_turned_on_and_off_by_its_values() -> None:
    off = helm_with("node-added-off-values.yaml")
    assert "spotguard-node-added" not in {d["metadata"]["name"] for d in of_kind(off, "Deployment")}
    assert one(off, "ClusterRole", "spotguard-node-added")  # its identity stays, for Knative or Lambda
    tuned = helm_with("node-added-tuned-values.yaml")
    pod = one(tuned, "Deployment", "spotguard-node-added")["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert "--reconcile-interval=30" in container["args"] and "--port=9090" in container["args"]
    assert pod["serviceAccountName"] == "spotguard-rebalancer"
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pod["priorityClassName"] == "system-cluster-critical"
    account = one(tuned, "ServiceAccount", "spotguard-rebalancer")
    assert "eks.amazonaws.com/role-arn" in account["metadata"]["annotations"]


def test_helm_generated_certificate_names_the_release_namespace() -> None:
    rendered = helm_with("generate-values.yaml", "platform")
    cert = x509.load_pem_x509_certificate(
        base64.b64decode(one(rendered, "Secret", "spotguard-admission-tls")["data"]["tls.crt"])
    )
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "spotguard-admission.platform.svc" in names.get_values_for_type(x509.DNSName)


def test_helm_webhook_defaults_match_the_node_termination_handler() -> None:
    pod = one(helm(), "Deployment", "spotguard-admission")["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert pod["securityContext"]["runAsNonRoot"] is True
    keys = [c["topologyKey"] for c in pod["topologySpreadConstraints"]]
    assert keys == ["kubernetes.io/hostname", "topology.kubernetes.io/zone"]
    assert "nodeAffinity" in pod["affinity"]
    assert not of_kind(helm(), "ServiceMonitor")
    assert "spotguard-spot-interruption" not in {d["metadata"]["name"] for d in of_kind(helm(), "Deployment")}


def test_helm_pod_settings_and_service_accounts_are_per_component() -> None:
    rendered = helm_with("queue-processor-values.yaml")
    accounts = {a["metadata"]["name"]: a for a in of_kind(rendered, "ServiceAccount")}
    # admission: create false, an existing account is bound instead
    assert "existing-admission" not in accounts and "spotguard-admission" not in accounts
    irsa = accounts["spot-interruption"]["metadata"]["annotations"]
    assert irsa == {"eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/spotguard-spot-interruption"}
    assert "spotguard-node-added" in accounts
    for kind in ("ClusterRoleBinding", "RoleBinding"):
        subjects = one(rendered, kind, "spotguard-admission")["subjects"]
        assert subjects == [{"kind": "ServiceAccount", "name": "existing-admission", "namespace": "platform"}]
        subjects = one(rendered, kind, "spotguard-spot-interruption")["subjects"]
        assert [s["name"] for s in subjects] == ["spot-interruption"]
    admission = one(rendered, "Deployment", "spotguard-admission")["spec"]["template"]
    assert admission["spec"]["serviceAccountName"] == "existing-admission"
    assert admission["metadata"]["annotations"]["prometheus.io/scrape"] == "false"
    assert "priorityClassName" not in admission["spec"]
    required = admission["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert required["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == ["ON_DEMAND"]
    assert [c["whenUnsatisfiable"] for c in admission["spec"]["topologySpreadConstraints"]] == ["DoNotSchedule"]
    poller = one(rendered, "Deployment", "spotguard-spot-interruption")
    template = poller["spec"]["template"]
    assert poller["spec"]["replicas"] == 2
    assert template["spec"]["serviceAccountName"] == "spot-interruption"
    assert template["metadata"]["labels"]["example.com/tier"] == "system"
    assert template["metadata"]["annotations"]["example.com/team"] == "platform"
    assert template["spec"]["priorityClassName"] == "system-node-critical"
    assert template["spec"]["tolerations"] == [{"key": "CriticalAddonsOnly", "operator": "Exists"}]
    assert template["spec"]["nodeSelector"] == {"kubernetes.io/os": "linux"}
    # the selector still matches the pods whatever podLabels adds
    selector = poller["spec"]["selector"]["matchLabels"]
    assert all(template["metadata"]["labels"][k] == v for k, v in selector.items())


def test_helm_poller_runs_the_cli_against_the_queue() -> None:
    rendered = helm_with("queue-processor-values.yaml")
    pod = one(rendered, "Deployment", "spotguard-spot-interruption")["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["command"] == ["spotguard"]
    args = container["args"]
    assert args[:2] == ["serve", "spot-interruption"]
    assert "--sqs-queue-url=https://sqs.eu-west-1.amazonaws.com/123456789012/spotguard-NoticeQueue-abc" in args
    assert "--region=eu-west-1" in args and "--host=0.0.0.0" in args
    # every flag the chart passes is one the command accepts
    from spotguard import cli

    parser = cli.build_parser()
    parser.parse_args(args)
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"


def test_helm_metrics_are_plain_http_and_the_service_monitor_finds_them() -> None:
    rendered = helm_with("queue-processor-values.yaml")
    [monitor] = of_kind(rendered, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    [endpoint] = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["scheme"], endpoint["path"]) == ("metrics", "http", "/metrics")
    selected = [
        s
        for s in of_kind(rendered, "Service")
        if all(s["metadata"]["labels"].get(k) == v for k, v in monitor["spec"]["selector"]["matchLabels"].items())
    ]
    assert {s["metadata"]["name"] for s in selected} == {
        "spotguard-admission",
        "spotguard-spot-interruption-metrics",
        "spotguard-node-added-metrics",
    }
    deployments = {d["metadata"]["name"]: d for d in of_kind(rendered, "Deployment")}
    for service in selected:
        [port] = [p for p in service["spec"]["ports"] if p["name"] == "metrics"]
        pod = next(
            d["spec"]["template"]
            for d in deployments.values()
            if all(
                d["spec"]["template"]["metadata"]["labels"].get(k) == v for k, v in service["spec"]["selector"].items()
            )
        )
        [container] = pod["spec"]["containers"]
        assert port["targetPort"] in {p["name"] for p in container["ports"]}
    admission = deployments["spotguard-admission"]["spec"]["template"]["spec"]["containers"][0]
    assert "--metrics-port=9090" in admission["args"]
    cli_args = admission["args"]
    from spotguard import cli

    cli.build_parser().parse_args(cli_args)


def test_helm_without_metrics_has_no_metrics_port() -> None:
    rendered = helm("metrics.enabled=false")
    container = one(rendered, "Deployment", "spotguard-admission")["spec"]["template"]["spec"]["containers"][0]
    assert not [a for a in container["args"] if a.startswith("--metrics-port")]
    assert [p["name"] for p in one(rendered, "Service", "spotguard-admission")["spec"]["ports"]] == ["https"]


# ------------------------------------------------------------- images


def test_every_in_cluster_shape_runs_the_one_image() -> None:
    renders = {
        "kustomize": kustomize("kubernetes/base"),
        "knative": kustomize("knative"),
        "helm": helm_with("queue-processor-values.yaml"),
    }
    for source, rendered in renders.items():
        pods = [d["spec"]["template"]["spec"] for d in of_kind(rendered, "Deployment")]
        pods += [s["spec"]["template"]["spec"] for s in rendered if s["apiVersion"] == "serving.knative.dev/v1"]
        assert pods, source
        for pod in pods:
            for container in pod["containers"]:
                assert container["image"] == "ghcr.io/spotguard/spotguard:0.1.0", source
                assert container["command"] == ["spotguard"], source
                assert container["args"][0] == "serve", source


# ---------------------------------------------------------- SAM: shipping


def test_sam_functions_deploy_the_packaged_zips() -> None:
    lambda_functions = sorted(d.name for d in (ROOT / "functions").iterdir() if (d / "lambda_function.py").is_file())
    code = {name: props["Properties"]["CodeUri"] for name, props in resources("AWS::Serverless::Function").items()}
    assert sorted(code.values()) == sorted(f"dist/{f}.zip" for f in lambda_functions)
    assert not resources("AWS::Serverless::LayerVersion")
    assert "Layers" not in sam()["Globals"]["Function"]
    for name, props in resources("AWS::Serverless::Function").items():
        assert "Metadata" not in props or "BuildMethod" not in props["Metadata"], name
    assert not (INFRA / "aws" / "Makefile").exists()


def test_sam_alarms_on_dead_letters_and_errors() -> None:
    alarms = resources("AWS::CloudWatch::Alarm")

    def watching(namespace: str, metric: str) -> list[dict[str, Any]]:
        return [
            a["Properties"]
            for a in alarms.values()
            if a["Properties"]["Namespace"] == namespace and a["Properties"]["MetricName"] == metric
        ]

    [dead] = watching("AWS/SQS", "ApproximateNumberOfMessagesVisible")
    assert dead["Dimensions"] == [
        {"Name": "QueueName", "Value": {"Fn::GetAtt": ["NoticeDeadLetterQueue", "QueueName"]}}
    ]
    assert (dead["Threshold"], dead["ComparisonOperator"]) == (1, "GreaterThanOrEqualToThreshold")
    errors = {a["Dimensions"][0]["Value"]["Ref"] for a in watching("AWS/Lambda", "Errors")}
    assert errors == set(resources("AWS::Serverless::Function"))
    [retries] = watching("spotguard", "BatchItemFailures")
    assert retries["Dimensions"] == [{"Name": "service", "Value": "spot-interruption"}]
    for alarm in alarms.values():
        props = alarm["Properties"]
        assert props["TreatMissingData"] == "notBreaching"
        assert props["AlarmActions"] == {
            "Fn::If": ["HasAlarmTopic", [{"Ref": "AlarmTopicArn"}], {"Ref": "AWS::NoValue"}]
        }


@cache
def kustomize_with_spot_interruption() -> tuple[dict[str, Any], ...]:
    """infra/kubernetes/base with the spot-interruption component, from a scratch overlay (as infra/check)."""
    scratch = Path(tempfile.mkdtemp(prefix="spotguard-kustomize-"))
    try:
        shutil.copytree(INFRA / "kubernetes", scratch / "kubernetes", ignore=shutil.ignore_patterns("generated"))
        overlay = scratch / "kubernetes" / "with-spot-interruption"
        overlay.mkdir()
        (overlay / "kustomization.yaml").write_text(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
            "resources: [../base]\ncomponents: [../spot-interruption]\n"
        )
        return tuple(objects(run(tool("kubectl"), "kustomize", str(overlay))))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def test_kustomize_and_helm_run_the_same_commands() -> None:
    from spotguard import cli

    parser = cli.build_parser()
    kustomized = kustomize_with_spot_interruption()
    helmed = helm(
        "spotInterruption.enabled=true",
        "spotInterruption.sqsQueueUrl=https://sqs.us-east-1.amazonaws.com/123456789012/q",
        "spotInterruption.region=us-east-1",
    )
    for name in ("spotguard-admission", "spotguard-spot-interruption"):
        k = one(kustomized, "Deployment", name)["spec"]["template"]["spec"]
        h = one(helmed, "Deployment", name)["spec"]["template"]["spec"]
        [kc], [hc] = k["containers"], h["containers"]
        assert kc["image"] == hc["image"] == "ghcr.io/spotguard/spotguard:0.1.0"

        def flags(args: list[str]) -> list[str]:
            return sorted(a.split("=")[0] for a in args)

        assert flags(kc["args"]) == flags(hc["args"]), name
        parser.parse_args(kc["args"])
        assert kc["env"] == [{"name": "SPOTGUARD_NAMESPACE", "value": "spotguard"}]
        # Helm also names the ConfigMap (its prefix may be overridden); kustomize keeps the default.
        assert hc["env"] == [*kc["env"], {"name": "SPOTGUARD_CONFIGMAP", "value": "spotguard-config"}]
        assert {p["name"] for p in kc["ports"]} == {p["name"] for p in hc["ports"]}
        assert kc["securityContext"]["readOnlyRootFilesystem"] is True
        assert k["serviceAccountName"] == f"spotguard-{name.removeprefix('spotguard-')}"
    # the metrics Services match as well
    for service in ("spotguard-admission", "spotguard-spot-interruption-metrics"):
        kp = {p["name"]: p["port"] for p in one(kustomized, "Service", service)["spec"]["ports"]}
        hp = {p["name"]: p["port"] for p in one(helmed, "Service", service)["spec"]["ports"]}
        assert kp == hp, service


def test_helm_chart_conventions_name_image_extras_and_one_excluded_list() -> None:
    """nameOverride/fullnameOverride, the image by digest, extraArgs and extraEnv on every
    component, one list of excluded namespaces, and a metrics Service per component."""
    from spotguard import cli

    rendered = helm_with("conventions-values.yaml")
    named = {(o["kind"], o["metadata"]["name"]) for o in rendered}
    for kind, name in named:
        if kind not in ("Namespace", "Certificate") or name.startswith("spotguard"):
            assert name.startswith("spotguard-blue") or kind == "ServiceAccount", (kind, name)
    digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
    deployments = {d["metadata"]["name"]: d for d in of_kind(rendered, "Deployment")}
    assert set(deployments) == {f"spotguard-blue-{n}" for n in ("admission", "spot-interruption", "node-added")}
    parser = cli.build_parser()
    for name, deployment in deployments.items():
        [container] = deployment["spec"]["template"]["spec"]["containers"]
        assert container["image"] == f"ghcr.io/spotguard/spotguard@{digest}", name
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["SPOTGUARD_LOG_FORMAT"] == "json" and env["SPOTGUARD_CONFIGMAP"] == "spotguard-blue-config", name
        extra = {
            "admission": "--threads=8",
            "spot-interruption": "--visibility-timeout=30",
            "node-added": "--kubeconfig=",
        }
        assert container["args"][-1] == extra[name.removeprefix("spotguard-blue-")], name
        parser.parse_args(container["args"])
    poller = deployments["spotguard-blue-spot-interruption"]["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "SPOTGUARD_MANAGED_TAG", "value": "aws-node-termination-handler/managed"} in poller["env"]
    # One list: the webhooks' selector and the functions' setting say the same.
    [config] = of_kind(rendered, "ConfigMap")
    assert config["metadata"]["name"] == "spotguard-blue-config"
    setting = config["data"]["excluded-namespaces"].split(",")
    assert sorted(setting) == sorted(["platform", "kube-system", "kube-public", "kube-node-lease", "monitoring"])
    hooks = of_kind(rendered, "MutatingWebhookConfiguration") + of_kind(rendered, "ValidatingWebhookConfiguration")
    assert len(hooks) == 2
    for hook in hooks:
        [webhook] = hook["webhooks"]
        [by_name] = [
            e for e in webhook["namespaceSelector"]["matchExpressions"] if e["key"] == "kubernetes.io/metadata.name"
        ]
        assert sorted(by_name["values"]) == sorted(setting)
        assert webhook["clientConfig"]["service"]["name"] == "spotguard-blue-admission"
    roles = {r["metadata"]["name"]: r for r in of_kind(rendered, "Role")}
    assert any(
        rule.get("resourceNames") == ["spotguard-blue-config"] for role in roles.values() for rule in role["rules"]
    )
    # the old second list is refused, as is the setting written by hand
    values = CHART / "values.yaml"
    assert "excludedNamespaces" not in yaml.safe_load(values.read_text())["admission"]
    done = subprocess.run(
        [
            tool("helm"),
            "template",
            "x",
            str(CHART),
            "--set",
            "certs.mode=cert-manager",
            "--set",
            "config.excluded-namespaces=a",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode != 0
    # every component's metrics Service is scraped
    [monitor] = of_kind(rendered, "ServiceMonitor")
    selected = {
        s["metadata"]["name"]
        for s in of_kind(rendered, "Service")
        if all(s["metadata"]["labels"].get(k) == v for k, v in monitor["spec"]["selector"]["matchLabels"].items())
    }
    assert selected == {
        "spotguard-blue-admission",
        "spotguard-blue-spot-interruption-metrics",
        "spotguard-blue-node-added-metrics",
    }
    # nameOverride sets the prefix too
    other = helm_with("conventions-values.yaml", "platform", "fullnameOverride=", "nameOverride=guard")
    assert "guard-admission" in {d["metadata"]["name"] for d in of_kind(other, "Deployment")}


def test_every_served_container_listens_beyond_its_own_pod() -> None:
    # `spotguard serve` listens on 127.0.0.1 by default (a laptop); in a pod the probes, the
    # API server and Prometheus reach it through the pod's address: every manifest says 0.0.0.0.
    renders = {
        "kustomize": kustomize("kubernetes/base") + kustomize_with_spot_interruption(),
        "knative": kustomize("knative"),
        "helm": helm_with("queue-processor-values.yaml"),
    }
    served = 0
    for source, rendered in renders.items():
        pods = [d["spec"]["template"]["spec"] for d in of_kind(rendered, "Deployment")]
        pods += [s["spec"]["template"]["spec"] for s in rendered if s["apiVersion"] == "serving.knative.dev/v1"]
        for pod in pods:
            for container in pod["containers"]:
                if container.get("args", [])[:1] == ["serve"] and container.get("ports"):
                    served += 1
                    assert "--host=0.0.0.0" in container["args"], (source, container["name"], container["args"])
    assert served >= 6


def test_the_event_functions_are_ready_only_when_they_can_do_their_job() -> None:
    # /healthz is the process (liveness); /readyz says whether the function can do its job
    # (spotguard.readiness): every readiness probe of spot-interruption and node-added asks it.
    renders = {
        "kustomize": kustomize("kubernetes/base") + kustomize_with_spot_interruption(),
        "knative": kustomize("knative") + kustomize("knative/node-added"),
        "helm": helm_with("queue-processor-values.yaml"),
    }
    probed = set()
    for source, rendered in renders.items():
        pods = [d["spec"]["template"]["spec"] for d in of_kind(rendered, "Deployment")]
        pods += [s["spec"]["template"]["spec"] for s in rendered if s["apiVersion"] == "serving.knative.dev/v1"]
        for pod in pods:
            for container in pod["containers"]:
                function = container.get("args", ["", ""])[1:2]
                if function in (["spot-interruption"], ["node-added"]):
                    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz", (source, function)
                    if "livenessProbe" in container:
                        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz", (source, function)
                    probed.add((source, function[0]))
    assert len(probed) == 6, probed
