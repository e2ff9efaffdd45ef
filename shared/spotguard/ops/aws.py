"""The AWS side of a local run: moto in server mode with the rule and queue that infra/aws deploys.

:func:`running_bus` starts moto on loopback (real HTTP), creates the notice
queue and the EventBridge rule for ``EC2 Spot Instance Interruption Warning``
targeting it (as ``infra/aws/template.yaml`` does), and yields a :class:`Bus`.
:meth:`Bus.warn` puts one warning per instance on the bus with PutEvents, as
EC2 emits them; the rule delivers each to the queue, where spotguard's SQS
poller reads it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

REGION = "us-east-1"
CREDENTIALS = {"aws_access_key_id": "spotguard-demo", "aws_secret_access_key": "spotguard-demo"}
# The interruption rule of infra/aws/template.yaml (NoticeRule).
INTERRUPTION_PATTERN = {"source": ["aws.ec2"], "detail-type": ["EC2 Spot Instance Interruption Warning"]}
# the SAM template's second rule into the same queue (infra/aws/template.yaml, RebalanceRecommendationRule)
REBALANCE_PATTERN = {"source": ["aws.ec2"], "detail-type": ["EC2 Instance Rebalance Recommendation"]}
QUEUE = "spotguard-notices"


@dataclass
class Bus:
    url: str  # moto's endpoint
    queue_url: str

    def client(self, service: str) -> Any:
        import boto3

        return boto3.client(service, endpoint_url=self.url, region_name=REGION, **CREDENTIALS)

    def warn(self, instance_ids: Sequence[str], when: float) -> list[str]:
        """PutEvents one interruption warning per instance, dated ``when``; returns the event ids."""
        return self._put(instance_ids, when, "EC2 Spot Instance Interruption Warning", {"instance-action": "terminate"})

    def recommend_rebalance(self, instance_ids: Sequence[str], when: float) -> list[str]:
        """PutEvents one rebalance recommendation per instance, dated ``when`` (EC2's shape:
        ``detail`` carries the instance id only); returns the event ids."""
        return self._put(instance_ids, when, "EC2 Instance Rebalance Recommendation", {})

    def _put(self, instance_ids: Sequence[str], when: float, detail_type: str, detail: dict[str, str]) -> list[str]:
        events = self.client("events")
        ids: list[str] = []
        for i in range(0, len(instance_ids), 10):  # PutEvents takes up to 10 entries
            entries = [
                {
                    "Source": "aws.ec2",
                    "DetailType": detail_type,
                    "Detail": json.dumps({"instance-id": iid, **detail}),
                    "Resources": [f"arn:aws:ec2:{REGION}a:instance/{iid}"],
                    "Time": datetime.fromtimestamp(when, UTC),
                }
                for iid in instance_ids[i : i + 10]
            ]
            answer = events.put_events(Entries=entries)
            if answer.get("FailedEntryCount"):
                raise RuntimeError(f"EventBridge refused {answer['FailedEntryCount']} event(s): {answer['Entries']}")
            ids.extend(str(e["EventId"]) for e in answer["Entries"])
        return ids


@contextlib.contextmanager
def running_bus() -> Iterator[Bus]:
    """moto on loopback with the notice queue and the rule feeding it; stopped on exit."""
    # The EC2 backend loads every public AMI when it starts (seconds); nothing here needs them.
    os.environ.setdefault("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        bus = Bus(f"http://{host}:{port}", "")
        sqs = bus.client("sqs")
        bus.queue_url = sqs.create_queue(QueueName=QUEUE, Attributes={"VisibilityTimeout": "30"})["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=bus.queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        events = bus.client("events")
        events.put_rule(Name="spotguard-interruption", EventPattern=json.dumps(INTERRUPTION_PATTERN), State="ENABLED")
        events.put_targets(Rule="spotguard-interruption", Targets=[{"Id": "spotguard-notices", "Arn": arn}])
        events.put_rule(Name="spotguard-rebalance", EventPattern=json.dumps(REBALANCE_PATTERN), State="ENABLED")
        events.put_targets(Rule="spotguard-rebalance", Targets=[{"Id": "spotguard-notices", "Arn": arn}])
        yield bus
    finally:
        server.stop()
