"""Golden files: each sample in tests/events, converted, equals tests/interruption/golden/<name>.

GIVEN a real payload (the AWS documentation's EventBridge samples, Lambda SQS
batches wrapping them, CloudEvents in both HTTP modes) WHEN it is converted the
way its transport converts it THEN the notice (or the acknowledged error) is
exactly the golden one. Set SPOTGUARD_UPDATE_GOLDEN=1 to rewrite the golden
files after a deliberate change, and review the diff.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from spotguard.interruption import cloudevents, dispatch, events, sqs

from tests.interruption.transport_support import EVENTS, GOLDEN

SAMPLES = sorted(p.name for p in EVENTS.glob("*.json"))


def _item(item: dispatch.Delivery) -> dict[str, Any]:
    if item.notice is not None and item.more:
        return {"key": item.key, "notices": [events.to_json(n) for n in item.notices]}
    if item.notice is not None:
        return {"key": item.key, "notice": events.to_json(item.notice)}
    assert item.error is not None
    return {"key": item.key, "error": item.error.kind, "reason": item.error.message}


def convert(name: str) -> Any:
    payload = json.loads((EVENTS / name).read_text())
    if name.startswith("sqs-batch"):
        assert sqs.is_batch(payload)
        return [_item(sqs.decode_record(r, i)) for i, r in enumerate(payload["Records"])]
    if name.startswith("cloudevent-"):
        event = cloudevents.decode_http(payload["headers"], payload["body"].encode())
        out: dict[str, Any] = {"id": event.get_id(), "type": event.get_type(), "source": event.get_source()}
        if event.get_type() == cloudevents.PING:
            return {**out, "reconcile": True}
        return {**out, **_item(cloudevents.delivery(event))}
    try:
        notices = events.decode_all(payload)
        if len(notices) > 1:  # an AWS Health event names every affected instance
            return {"notices": [events.to_json(n) for n in notices]}
        return {"notice": events.to_json(notices[0])}
    except events.EventError as exc:
        return {"error": exc.kind, "reason": exc.message}


@pytest.mark.parametrize("name", SAMPLES)
def test_conversion_matches_golden_file(name: str) -> None:
    got = convert(name)
    golden = GOLDEN / name
    if os.environ.get("SPOTGUARD_UPDATE_GOLDEN"):
        golden.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n")
    assert golden.exists(), f"no golden file {golden}; run with SPOTGUARD_UPDATE_GOLDEN=1 and review it"
    assert got == json.loads(golden.read_text())


def test_every_golden_file_has_its_sample() -> None:
    assert sorted(p.name for p in GOLDEN.glob("*.json")) == SAMPLES
