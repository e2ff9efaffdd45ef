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
    args = [tool("helm"), "template", "spotguard", str(CHART), "--namespace", "spotguard"]
    for item in sets:
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
                    # Only spot-interruption writes ConfigMaps: its surge ledger in its own namespace.
                    if rule.get("resourceNames") != ["spotguard-config"]:
                        assert role["metadata"]["name"] == "spotguard-spot-interruption", where


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


def test_knative_admission_stays_warm_and_cluster_local() -> None:
    rendered = kustomize("knative")
    services = {s["metadata"]["name"]: s for s in rendered if s["apiVersion"] == "serving.knative.dev/v1"}
    assert set(services) == {f"spotguard-{f}" for f in FUNCTIONS}
    admission = services["spotguard-admission"]
    annotations = admission["spec"]["template"]["metadata"]["annotations"]
    assert annotations["autoscaling.knative.dev/min-scale"] == "1"
    for service in services.values():
        assert service["metadata"]["labels"]["networking.knative.dev/visibility"] == "cluster-local"
        [container] = service["spec"]["template"]["spec"]["containers"]
        assert container["ports"] == [{"containerPort": 8080}]
        function = service["metadata"]["name"]
        assert service["spec"]["template"]["spec"]["serviceAccountName"] == function
    hook = one(rendered, "MutatingWebhookConfiguration", "spotguard-admission")["webhooks"][0]
    assert hook["clientConfig"]["service"]["name"] == "spotguard-admission"


def test_knative_events_reach_the_right_function() -> None:
    rendered = kustomize("knative")
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


def test_sam_rules_deliver_the_three_notices_to_the_queue() -> None:
    rules = queue_rules()
    detail_types: set[str] = set()
    for rule in rules.values():
        pattern = rule["Properties"]["EventPattern"]
        assert pattern["source"] == ["aws.ec2"]
        detail_types.update(pattern["detail-type"])
        [target] = rule["Properties"]["Targets"]
        assert target["Arn"] == {"Fn::GetAtt": ["NoticeQueue", "Arn"]}
    assert detail_types == {
        "EC2 Spot Instance Interruption Warning",
        "EC2 Instance Rebalance Recommendation",
        "EC2 Instance State-change Notification",
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
    kinds = {(o["apiVersion"], o["kind"]) for o in kustomize("knative") if "knative.dev" in o["apiVersion"]}
    assert kinds == {
        ("serving.knative.dev/v1", "Service"),
        ("eventing.knative.dev/v1", "Broker"),
        ("eventing.knative.dev/v1", "Trigger"),
        ("sources.knative.dev/v1", "PingSource"),
        ("sources.knative.dev/v1", "ApiServerSource"),
        ("sources.knative.dev/v1alpha1", "IntegrationSource"),
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
