"""The AWS template: cfn-lint clean, and its queues admit only the EventBridge rules, over TLS.

``infra/check`` (CI) also runs cfn-lint and parliament (``infra/aws/check_iam.py``,
tested in tests/infra/test_manifests.py); cfn-lint runs here too so that a
plain ``pytest`` catches a broken template. Queue encryption and the
NoticeQueue's allow statement are asserted in tests/infra/test_manifests.py;
this adds every queue, the TLS-only deny, and that no policy allows anyone else.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.infra import test_manifests as manifests

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "infra" / "aws" / "template.yaml"


def cfn_lint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [manifests.tool("cfn-lint"), str(path)], capture_output=True, text=True, timeout=300, check=False
    )


def test_cfn_lint_passes_and_catches_a_broken_template(tmp_path: Path) -> None:
    done = cfn_lint(TEMPLATE)
    assert done.returncode == 0, done.stdout + done.stderr
    text = TEMPLATE.read_text()
    broken = text.replace("MessageRetentionPeriod: 1209600", "MessageRetentionPeriod: 99999999", 1)
    assert broken != text
    (tmp_path / "broken.yaml").write_text(broken)
    assert cfn_lint(tmp_path / "broken.yaml").returncode != 0


def statements(policy: dict[str, Any]) -> list[dict[str, Any]]:
    found = policy["Properties"]["PolicyDocument"]["Statement"]
    return [found] if isinstance(found, dict) else list(found)


def sends_to(rule: dict[str, Any], queue: str) -> bool:
    """A rule whose target, or whose target's dead-letter queue, is ``queue``."""
    wanted = {"Fn::GetAtt": [queue, "Arn"]}
    for target in rule["Properties"].get("Targets") or []:
        if target.get("Arn") == wanted or (target.get("DeadLetterConfig") or {}).get("Arn") == wanted:
            return True
    return False


@pytest.mark.parametrize("queue", sorted(manifests.resources("AWS::SQS::Queue")))
def test_every_queue_admits_only_the_rules_and_only_over_tls(queue: str) -> None:
    props = manifests.sam()["Resources"][queue]["Properties"]
    assert props.get("SqsManagedSseEnabled") is True or "KmsMasterKeyId" in props, f"{queue} is not encrypted"
    policies = [
        p for p in manifests.resources("AWS::SQS::QueuePolicy").values() if {"Ref": queue} in p["Properties"]["Queues"]
    ]
    assert len(policies) == 1, f"{queue}: expected one queue policy, found {len(policies)}"
    rules = sorted(
        f"{name}.Arn" for name, rule in manifests.resources("AWS::Events::Rule").items() if sends_to(rule, queue)
    )
    allows = [s for s in statements(policies[0]) if s["Effect"] == "Allow"]
    denies = [s for s in statements(policies[0]) if s["Effect"] == "Deny"]
    assert allows, f"{queue}: nothing may send to it"
    for statement in allows:
        assert statement["Principal"] == {"Service": "events.amazonaws.com"}, statement
        assert statement["Action"] in ("sqs:SendMessage", ["sqs:SendMessage"]), statement
        arns = statement["Condition"]["ArnEquals"]["aws:SourceArn"]
        assert sorted(".".join(a["Fn::GetAtt"]) for a in arns) == rules, statement
    assert any(
        s["Principal"] == "*" and s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}} for s in denies
    ), f"{queue}: no deny of requests without TLS"


def test_the_public_function_url_checks_a_generated_secret_and_its_cost_is_capped() -> None:
    template = manifests.sam()
    function = template["Resources"]["AdmissionFunction"]["Properties"]
    assert function["FunctionUrlConfig"]["AuthType"] == "NONE"  # the API server cannot sign
    assert function["Environment"]["Variables"]["SPOTGUARD_WEBHOOK_SECRET_ARN"] == {"Ref": "AdmissionWebhookSecret"}
    secret = template["Resources"]["AdmissionWebhookSecret"]["Properties"]["GenerateSecretString"]
    assert secret["PasswordLength"] >= 32 and secret["ExcludePunctuation"] is True  # a URL path segment
    [policy] = [p for p in template["Resources"]["AdmissionRole"]["Properties"]["Policies"] if "PolicyName" in p]
    reads = [s for s in policy["PolicyDocument"]["Statement"] if s["Action"] == "secretsmanager:GetSecretValue"]
    assert [s["Resource"] for s in reads] == [{"Ref": "AdmissionWebhookSecret"}]
    assert int(template["Parameters"]["AdmissionReservedConcurrency"]["Default"]) > 0
    webhook = (ROOT / "infra" / "aws" / "webhook.yaml").read_text()
    for obj in manifests.objects(webhook):
        for hook in obj["webhooks"]:
            assert "/SECRET/" in hook["clientConfig"]["url"], hook["name"]


def test_the_namespace_and_a_private_endpoint_are_parameters() -> None:
    template = manifests.sam()
    assert template["Parameters"]["Namespace"]["Default"] == "spotguard"
    variables = template["Globals"]["Function"]["Environment"]["Variables"]
    assert variables["SPOTGUARD_NAMESPACE"] == {"Ref": "Namespace"}
    association = template["Resources"]["SqsSourcePodIdentity"]["Properties"]
    assert association["Namespace"] == {"Ref": "Namespace"}
    vpc = template["Globals"]["Function"]["VpcConfig"]["Fn::If"]
    wanted = {"SubnetIds": {"Ref": "SubnetIds"}, "SecurityGroupIds": {"Ref": "SecurityGroupIds"}}
    assert vpc == ["InVpc", wanted, {"Ref": "AWS::NoValue"}]
    for role in ("SpotInterruptionRole", "NodeAddedRole", "AdmissionRole"):
        policies = template["Resources"][role]["Properties"]["Policies"]
        conditional = [p["Fn::If"] for p in policies if "Fn::If" in p]
        assert [(c[0], c[1]["PolicyName"], c[2]) for c in conditional] == [
            ("InVpc", "vpc-access", {"Ref": "AWS::NoValue"})
        ], role
        actions = json.dumps(conditional[0][1]["PolicyDocument"])
        assert "ec2:CreateNetworkInterface" in actions and "ec2:DeleteNetworkInterface" in actions, role
    association_text = TEMPLATE.read_text().split("SqsSourcePodIdentity:", 1)[1].split("\n\n", 1)[0]
    assert "Namespace: !Ref Namespace" in association_text


def test_advance_notices_reach_the_queue_and_the_function_may_hold_and_complete_lifecycle_actions() -> None:
    template = manifests.sam()
    rules = template["Resources"]
    lifecycle = rules["LifecycleTerminateRule"]["Properties"]["EventPattern"]
    assert lifecycle == {"source": ["aws.autoscaling"], "detail-type": ["EC2 Instance-terminate Lifecycle Action"]}
    health = rules["ScheduledChangeRule"]["Properties"]["EventPattern"]
    assert health["source"] == ["aws.health"] and health["detail-type"] == ["AWS Health Event"]
    assert health["detail"] == {"service": ["EC2"], "eventTypeCategory": ["scheduledChange"]}
    for rule in ("LifecycleTerminateRule", "ScheduledChangeRule"):
        assert sends_to(rules[rule], "NoticeQueue") and sends_to(rules[rule], "NoticeDeadLetterQueue"), rule
    [policy] = [p for p in rules["SpotInterruptionRole"]["Properties"]["Policies"] if "PolicyName" in p]
    actions = {
        a
        for s in policy["PolicyDocument"]["Statement"]
        for a in (s["Action"] if isinstance(s["Action"], list) else [s["Action"]])
    }
    wanted = {
        "autoscaling:RecordLifecycleActionHeartbeat",
        "autoscaling:CompleteLifecycleAction",
        "autoscaling:DescribeLifecycleHooks",
        "ec2:DescribeInstances",
    }
    assert wanted <= actions
    variables = rules["SpotInterruptionFunction"]["Properties"]["Environment"]["Variables"]
    assert variables["SPOTGUARD_MANAGED_TAG"] == {"Ref": "ManagedTag"}
    assert template["Parameters"]["ManagedTag"]["Default"] == ""
