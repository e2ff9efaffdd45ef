"""spotguard.emf: the Lambda handlers' CloudWatch metrics (embedded metric format)."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
from spotguard import emf

from tests.infra import venvs


def emitted(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if '"_aws"' in line]


def test_a_batch_with_failures_counts_them(capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN a handler that hands one of two messages back for a retry
    def handle(event: Any, context: Any) -> dict[str, Any]:
        return {"batchItemFailures": [{"itemIdentifier": "m-2"}]}

    wrapped = emf.instrument("spot-interruption", emf.sqs_batch)(handle)
    # WHEN Lambda calls it with an SQS batch
    result = wrapped({"Records": [{"messageId": "m-1"}, {"messageId": "m-2"}]}, None)
    # THEN the answer is unchanged and one EMF line counts messages and failures
    assert result == {"batchItemFailures": [{"itemIdentifier": "m-2"}]}
    [line] = emitted(capsys.readouterr().out)
    [directive] = line["_aws"]["CloudWatchMetrics"]
    assert directive["Namespace"] == "spotguard"
    assert ["service"] in directive["Dimensions"]
    assert (line["service"], line["Messages"], line["BatchItemFailures"]) == ("spot-interruption", [2.0], [1.0])


def test_a_schedule_counts_an_invocation(capsys: pytest.CaptureFixture[str]) -> None:
    wrapped = emf.instrument("spot-interruption", emf.sqs_batch)(lambda event, context: {"result": "reconciled"})
    wrapped({"spotguard": "reconcile"}, None)
    [line] = emitted(capsys.readouterr().out)
    assert line["Invocations"] == [1.0] and "BatchItemFailures" not in line


def test_a_handler_that_raises_is_counted_and_still_raises(capsys: pytest.CaptureFixture[str]) -> None:
    def handle(event: Any, context: Any) -> Any:
        raise ConnectionError("cluster unreachable")

    wrapped = emf.instrument("spot-interruption", emf.sqs_batch)(handle)
    with pytest.raises(ConnectionError):
        wrapped({"detail-type": "EC2 Spot Instance Interruption Warning"}, None)
    [line] = emitted(capsys.readouterr().out)
    assert line["HandlerErrors"] == [1.0]


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        ({"statusCode": 200, "body": json.dumps({"response": {"patch": "W10="}})}, (1, 1, 0)),
        ({"statusCode": 200, "body": json.dumps({"response": {"allowed": True}})}, (1, 0, 0)),
        ({"statusCode": 400, "body": "{}"}, (1, 0, 1)),
        ({"statusCode": 200, "body": "not json"}, (1, 0, 0)),
    ],
)
def test_admission_reviews_are_counted(result: dict[str, Any], expected: tuple[int, int, int]) -> None:
    counts = emf.admission_review({}, result)
    assert (counts["Reviews"], counts["Patched"], counts["BadRequests"]) == expected


def test_package_without_functions_is_a_clear_error(tmp_path: Any) -> None:
    done = subprocess.run(
        [str(venvs.BIN / "spotguard"), "package", "lambda", "--out", str(tmp_path), "--functions-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 2
    assert "has a lambda_function.py" in done.stderr
    bare = subprocess.run([str(venvs.BIN / "spotguard"), "package"], capture_output=True, text=True, check=False)
    assert bare.returncode == 2 and "spotguard package {lambda,knative}" in bare.stderr
