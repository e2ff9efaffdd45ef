"""Audit every IAM policy document in infra/aws/template.yaml with parliament.

    python infra/aws/check_iam.py [TEMPLATE]

The template's intrinsic functions are stubbed with plausible values (account
123456789012, region us-east-1, ARNs in each service's real format), so
parliament can check actions, resource ARN formats and conditions:

- identity policies (``Policies`` of ``AWS::IAM::Role``, ``AWS::IAM::Policy``,
  ``AWS::IAM::ManagedPolicy``, inline ``Policies`` statements of a SAM
  function) and resource policies (``AWS::SQS::QueuePolicy``,
  ``AWS::SNS::TopicPolicy``, ``AWS::S3::BucketPolicy``) go through parliament,
  with its community auditors. A finding of severity MEDIUM or above fails, and
  so does RESOURCE_STAR (LOW in parliament): parliament reports it only for
  actions that do support resource-level permissions, so "*" there is never
  needed. Actions without resource-level permissions (ec2:DescribeInstances)
  may use "*" and are not reported by parliament.
- trust policies (``AssumeRolePolicyDocument``) are not parliament's domain (it
  reports every one as MALFORMED for lacking a Resource, which a trust policy
  must not have), so they are checked here instead: each statement allows
  only sts:AssumeRole/sts:TagSession to an AWS service principal, never "*",
  and carries an ``aws:SourceAccount`` or ``aws:SourceArn`` condition against
  the confused deputy.
- AWS managed policies and SAM policy templates cannot be read here: any use
  of them fails the check, so that nothing escapes the audit.

Exit status 1 on any failure; every document checked is listed.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import parliament
import yaml

ACCOUNT = "123456789012"
REGION = "us-east-1"
PARTITION = "aws"
STACK = "spotguard"
SEVERITIES = ["MUTE", "INFO", "LOW", "MEDIUM", "HIGH", "CRITICAL"]
FAIL_AT = "MEDIUM"
ALWAYS_FAIL = {"RESOURCE_STAR"}
TRUST_ACTIONS = {"sts:AssumeRole", "sts:TagSession"}
DEPUTY_KEYS = {"aws:sourceaccount", "aws:sourcearn"}
PSEUDO = {
    "AWS::AccountId": ACCOUNT,
    "AWS::Region": REGION,
    "AWS::Partition": PARTITION,
    "AWS::StackName": STACK,
    "AWS::StackId": f"arn:aws:cloudformation:{REGION}:{ACCOUNT}:stack/{STACK}/0",
    "AWS::URLSuffix": "amazonaws.com",
}
SAMPLE_PARAMETERS = {"ClusterName": "example-cluster"}


class NoValue:
    """AWS::NoValue: the enclosing key or list item disappears."""


NO_VALUE = NoValue()


@dataclass
class Tagged:
    """A CloudFormation short-form intrinsic (``!Ref x``) read from YAML."""

    tag: str
    value: Any


def _loader() -> type[yaml.SafeLoader]:
    class Loader(yaml.SafeLoader):
        pass

    def construct(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
        if isinstance(node, yaml.ScalarNode):
            value: Any = loader.construct_scalar(node)
            if suffix == "GetAtt":
                value = str(value).split(".", 1)
        elif isinstance(node, yaml.SequenceNode):
            value = loader.construct_sequence(node, deep=True)
        else:
            value = loader.construct_mapping(node, deep=True)  # type: ignore[arg-type]
        name = suffix if suffix in ("Ref", "Condition") else f"Fn::{suffix}"
        return {name: value}

    Loader.add_multi_constructor("!", construct)
    return Loader


def load_template(path: Path) -> dict[str, Any]:
    data = yaml.load(path.read_text(encoding="utf-8"), Loader=_loader())
    if not isinstance(data, dict) or "Resources" not in data:
        raise SystemExit(f"check_iam: {path} is not a CloudFormation template (no Resources)")
    return data


class Resolver:
    """Stub CloudFormation intrinsics with plausible values."""

    def __init__(self, template: dict[str, Any]) -> None:
        self.resources: dict[str, Any] = template.get("Resources") or {}
        self.parameters: dict[str, Any] = template.get("Parameters") or {}

    def name(self, logical_id: str) -> str:
        return f"{STACK}-{logical_id}"

    def ref(self, target: str) -> Any:
        if target == "AWS::NoValue":
            return NO_VALUE
        if target in PSEUDO:
            return PSEUDO[target]
        if target in self.parameters:
            if target in SAMPLE_PARAMETERS:
                return SAMPLE_PARAMETERS[target]
            default = self.parameters[target].get("Default")
            return str(default) if default not in (None, "") else f"example-{target.lower()}"
        resource = self.resources.get(target)
        if resource is None:
            raise ValueError(f"Ref to unknown {target!r}")
        kind = resource.get("Type", "")
        name = self.name(target)
        if kind == "AWS::SQS::Queue":
            return f"https://sqs.{REGION}.amazonaws.com/{ACCOUNT}/{name}"
        if kind == "AWS::SecretsManager::Secret":
            return f"arn:{PARTITION}:secretsmanager:{REGION}:{ACCOUNT}:secret:{name}-AbCdEf"
        props = resource.get("Properties") or {}
        if kind == "AWS::Logs::LogGroup" and "LogGroupName" in props:
            return str(self.resolve(props["LogGroupName"]))
        return name

    def get_att(self, target: str, attribute: str) -> str:
        resource = self.resources.get(target)
        if resource is None:
            raise ValueError(f"GetAtt of unknown {target!r}")
        kind = resource.get("Type", "")
        name = self.name(target)
        props = resource.get("Properties") or {}
        if attribute == "Arn":
            if kind == "AWS::SQS::Queue":
                return f"arn:{PARTITION}:sqs:{REGION}:{ACCOUNT}:{name}"
            if kind == "AWS::Events::Rule":
                return f"arn:{PARTITION}:events:{REGION}:{ACCOUNT}:rule/{name}"
            if kind == "AWS::Logs::LogGroup":
                group = self.resolve(props["LogGroupName"]) if "LogGroupName" in props else name
                return f"arn:{PARTITION}:logs:{REGION}:{ACCOUNT}:log-group:{group}:*"
            if kind == "AWS::IAM::Role":
                return f"arn:{PARTITION}:iam::{ACCOUNT}:role/{name}"
            if kind in ("AWS::Serverless::Function", "AWS::Lambda::Function"):
                function = self.resolve(props["FunctionName"]) if "FunctionName" in props else name
                return f"arn:{PARTITION}:lambda:{REGION}:{ACCOUNT}:function:{function}"
            if kind == "AWS::KMS::Key":
                return f"arn:{PARTITION}:kms:{REGION}:{ACCOUNT}:key/00000000-0000-0000-0000-000000000000"
            if kind == "AWS::SNS::Topic":
                return f"arn:{PARTITION}:sns:{REGION}:{ACCOUNT}:{name}"
            if kind == "AWS::S3::Bucket":
                return f"arn:{PARTITION}:s3:::{name.lower()}"
        if kind == "AWS::SQS::Queue" and attribute == "QueueName":
            return name
        raise ValueError(f"no stub for GetAtt {target}.{attribute} ({kind})")

    def sub(self, text: str, variables: dict[str, Any]) -> str:
        def replace(match: re.Match[str]) -> str:
            key = match.group(1)
            if key.startswith("!"):
                return "${" + key[1:] + "}"
            if key in variables:
                return str(self.resolve(variables[key]))
            if "." in key:
                target, attribute = key.split(".", 1)
                return self.get_att(target, attribute)
            return str(self.ref(key))

        return re.sub(r"\$\{([^}]+)\}", replace, text)

    def resolve(self, value: Any) -> Any:
        if isinstance(value, list):
            items = [self.resolve(v) for v in value]
            return [v for v in items if v is not NO_VALUE]
        if not isinstance(value, dict):
            return value
        if len(value) == 1:
            ((key, arg),) = value.items()
            if key == "Ref":
                return self.ref(arg)
            if key == "Fn::GetAtt":
                target, attribute = arg if isinstance(arg, list) else str(arg).split(".", 1)
                return self.get_att(target, attribute)
            if key == "Fn::Sub":
                if isinstance(arg, list):
                    return self.sub(arg[0], arg[1] if len(arg) > 1 else {})
                return self.sub(arg, {})
            if key == "Fn::Join":
                separator, items = arg
                return separator.join(str(i) for i in self.resolve(items))
            if key == "Fn::Select":
                index, items = arg
                return self.resolve(items)[int(self.resolve(index))]
            if key == "Fn::If":
                # Audit the most permissive branch: the one that is not NoValue.
                _, when_true, when_false = arg
                first = self.resolve(when_true)
                return first if first is not NO_VALUE else self.resolve(when_false)
            if key.startswith("Fn::") or key == "Condition":
                raise ValueError(f"no stub for {key}")
        resolved = {k: self.resolve(v) for k, v in value.items()}
        return {k: v for k, v in resolved.items() if v is not NO_VALUE}


@dataclass
class Document:
    where: str
    kind: str  # "identity", "resource" or "trust"
    policy: Any


def documents(template: dict[str, Any]) -> Iterator[Document | str]:
    """Every policy document, or a message for what cannot be audited."""
    for logical_id, resource in (template.get("Resources") or {}).items():
        kind = resource.get("Type", "")
        props = resource.get("Properties") or {}
        if kind == "AWS::IAM::Role":
            yield Document(f"{logical_id}.AssumeRolePolicyDocument", "trust", props.get("AssumeRolePolicyDocument"))
            for i, item in enumerate(props.get("Policies") or []):
                policy = item
                if isinstance(item, dict) and set(item) == {"Fn::If"}:
                    # A conditional policy: audit its branch that is not NoValue.
                    _, when_true, when_false = item["Fn::If"]
                    policy = when_true if when_true != {"Ref": "AWS::NoValue"} else when_false
                    if policy == {"Ref": "AWS::NoValue"}:
                        continue
                name = policy.get("PolicyName", i)
                yield Document(f"{logical_id}.Policies[{name}]", "identity", policy.get("PolicyDocument"))
            for arn in props.get("ManagedPolicyArns") or []:
                yield f"{logical_id}: managed policy {arn} cannot be audited here; write it inline"
        elif kind in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy"):
            yield Document(f"{logical_id}.PolicyDocument", "identity", props.get("PolicyDocument"))
        elif kind in ("AWS::SQS::QueuePolicy", "AWS::SNS::TopicPolicy", "AWS::S3::BucketPolicy"):
            yield Document(f"{logical_id}.PolicyDocument", "resource", props.get("PolicyDocument"))
        elif kind == "AWS::Serverless::Function":
            policies = props.get("Policies")
            if policies is None:
                continue
            if isinstance(policies, dict) and "Statement" in policies:
                yield Document(f"{logical_id}.Policies", "identity", policies)
            else:
                yield f"{logical_id}: SAM Policies (templates or managed policies) cannot be audited here; use a Role"
        elif kind == "AWS::Serverless::StateMachine" and props.get("Policies") is not None:
            yield f"{logical_id}: SAM Policies cannot be audited here; use a Role"


def check_trust(policy: Any) -> list[str]:
    problems: list[str] = []
    statements = policy.get("Statement") if isinstance(policy, dict) else None
    if not isinstance(statements, list) or not statements:
        return ["no Statement list"]
    for i, statement in enumerate(statements):
        if statement.get("Effect") != "Allow":
            continue
        actions = statement.get("Action")
        actions = [actions] if isinstance(actions, str) else actions or []
        if not set(actions) <= TRUST_ACTIONS:
            problems.append(f"statement {i}: actions {actions} (only {sorted(TRUST_ACTIONS)})")
        principal = statement.get("Principal")
        services = principal.get("Service") if isinstance(principal, dict) else None
        services = [services] if isinstance(services, str) else services or []
        if not services or set(principal) != {"Service"}:
            problems.append(f"statement {i}: principal {principal!r} is not only AWS services")
        elif any(not str(s).endswith(".amazonaws.com") for s in services):
            problems.append(f"statement {i}: unknown service principal in {services}")
        keys = {
            key.lower()
            for operator in (statement.get("Condition") or {}).values()
            if isinstance(operator, dict)
            for key in operator
        }
        if not keys & DEPUTY_KEYS:
            problems.append(f"statement {i}: no aws:SourceAccount/aws:SourceArn condition (confused deputy)")
    return problems


def check_parliament(policy: Any) -> tuple[list[str], list[str]]:
    """Return (failures, notes) from parliament's analysis."""
    analysed = parliament.analyze_policy_string(json.dumps(policy), include_community_auditors=True)
    failures: list[str] = []
    notes: list[str] = []
    for raw in analysed.findings:
        finding = parliament.enhance_finding(raw)
        text = f"{finding.severity} {finding.issue}: {finding.title} {json.dumps(finding.detail)[:300]}"
        severity = finding.severity if finding.severity in SEVERITIES else "CRITICAL"
        if SEVERITIES.index(severity) >= SEVERITIES.index(FAIL_AT) or finding.issue in ALWAYS_FAIL:
            failures.append(text)
        else:
            notes.append(text)
    return failures, notes


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0]) if args else Path(__file__).with_name("template.yaml")
    template = load_template(path)
    resolver = Resolver(template)
    failed = 0
    checked = 0
    for item in documents(template):
        if isinstance(item, str):
            print(f"check_iam: FAIL {item}", file=sys.stderr)
            failed += 1
            continue
        try:
            policy = resolver.resolve(item.policy)
        except ValueError as exc:
            print(f"check_iam: FAIL {item.where}: cannot resolve intrinsics: {exc}", file=sys.stderr)
            failed += 1
            continue
        checked += 1
        if item.kind == "trust":
            failures, notes = check_trust(policy), list[str]()
            how = "trust policy rules"
        else:
            failures, notes = check_parliament(policy)
            how = f"parliament ({item.kind} policy)"
        for note in notes:
            print(f"check_iam: note {item.where}: {note}")
        if failures:
            failed += 1
            for failure in failures:
                print(f"check_iam: FAIL {item.where}: {failure}", file=sys.stderr)
        else:
            print(f"check_iam: ok {item.where} [{how}]")
    print(f"check_iam: {path}: {checked} policy documents checked, {failed} failed")
    if checked == 0:
        print("check_iam: FAIL no policy document found", file=sys.stderr)
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
