"""Logs: text for a person at a terminal, JSON for servers, every line through one formatter.

The servers and runtimes around spotguard bring their own handlers (hypercorn,
gunicorn, func-python's ``logging.basicConfig``, the Lambda runtime's handler on
the root logger): each of their lines must come out once, in spotguard's format,
and a traceback is a field of its own.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import pty
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from spotguard import logs
from spotguard_sim import testing

from tests.admission.servers import free_port
from tests.ops.support import ROOT, SCENARIOS, plain_error, spotguard

EVENTS = ROOT / "tests" / "events"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with testing.running_cluster(SCENARIOS / "small.yaml", time_scale=10) as sim:
        yield sim


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPOTGUARD_", "AWS_LAMBDA"))}
    env.pop("KUBECONFIG", None)
    env.update(extra)
    return env


def _lines_until(proc: subprocess.Popen[bytes], fd: int, words: str, timeout: float = 60) -> list[str]:
    """Lines read from ``fd`` until one holds ``words`` and a second more (a copy of a line would
    follow at once); the process is then still running."""
    buffer = b""
    deadline = time.monotonic() + timeout
    found_at = None
    while found_at is None or time.monotonic() < found_at + 1.0:
        assert proc.poll() is None, buffer.decode(errors="replace")
        assert time.monotonic() < deadline, buffer.decode(errors="replace")
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            with contextlib.suppress(OSError):  # a pty whose other end closed
                buffer += os.read(fd, 65536)
        if found_at is None and words.encode() in buffer:
            found_at = time.monotonic()
    return [line for line in buffer.decode(errors="replace").replace("\r\n", "\n").split("\n") if line.strip()]


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def _all_json(lines: list[str]) -> list[dict[str, Any]]:
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            pytest.fail(f"not a JSON log line: {line!r} in {lines}")
    return out


def test_a_person_at_a_terminal_gets_text_and_a_pipe_gets_json(tmp_path: Path) -> None:
    args = [sys.executable, "-m", "spotguard.cli", "--log-level", "INFO", "sim", "serve"]
    # GIVEN stderr is a terminal (a person ran the command), no --log-format
    controller, terminal = pty.openpty()
    proc = subprocess.Popen([*args, "--kubeconfig", str(tmp_path / "a")], stderr=terminal, env=_env())
    os.close(terminal)
    try:
        lines = _lines_until(proc, controller, "simulated cluster serving")
    finally:
        _stop(proc)
        os.close(controller)
    # THEN the line is text for a person
    line = next(x for x in lines if "simulated cluster serving" in x)
    assert not line.startswith("{") and " info " in line and "url=" in line, line
    # GIVEN stderr is a pipe (a container, a log collector) THEN JSON lines
    proc = subprocess.Popen([*args, "--kubeconfig", str(tmp_path / "b")], stderr=subprocess.PIPE, env=_env())
    try:
        assert proc.stderr is not None
        lines = _lines_until(proc, proc.stderr.fileno(), "simulated cluster serving")
    finally:
        _stop(proc)
    assert any(r["msg"] == "simulated cluster serving" for r in _all_json(lines))


def test_a_traceback_is_a_field_of_its_own_beside_the_error_field() -> None:
    record = logging.LogRecord("spotguard.x", logging.ERROR, __file__, 1, "reconcile failed", (), None)
    try:
        raise ValueError("bad\nthing")
    except ValueError:
        record.exc_info = sys.exc_info()
    record.error = "ValueError"  # as log.exception(..., extra={"error": ...}) does
    line = logs.JsonFormatter().format(record)
    assert "\n" not in line
    out = json.loads(line)
    assert out["msg"] == "reconcile failed" and out["error"] == "ValueError"
    assert out["exc_type"] == "ValueError" and out["exc_info"].startswith("Traceback (most recent call last):")
    assert out["exc_info"].rstrip().endswith("thing")


def test_hypercorn_lines_once_and_as_json(cluster: Any, tmp_path: Path) -> None:
    # GIVEN node-added served by hypercorn, its logs to a pipe
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "spotguard.cli", "--log-level", "INFO", "serve", "node-added", "--port", str(port),
         "--kubeconfig", cluster.kubeconfig],
        stderr=subprocess.PIPE, env=_env(),
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        lines = _lines_until(proc, proc.stderr.fileno(), "Running on")
    finally:
        _stop(proc)
    # THEN hypercorn's own line is JSON, once
    records = _all_json(lines)
    running = [r for r in records if "Running on" in r["msg"]]
    assert len(running) == 1 and running[0]["logger"] == "hypercorn.error", records


def test_gunicorn_lines_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    from gunicorn import config
    from spotguard.admission import server

    # GIVEN the admission server's gunicorn settings, and spotguard's logging as a server has it
    logs.configure("INFO", "json")
    cfg = config.Config()
    for key, value in server.options(host="127.0.0.1", port=8443, certfile=None, keyfile=None).items():
        cfg.set(key, value)
    # WHEN gunicorn logs (a worker timeout, a bad request)
    log = cfg.logger_class(cfg)
    log.error("Worker (pid:%s) was sent SIGKILL! Perhaps out of memory?", 42)
    try:
        raise OSError("reset by peer")
    except OSError:
        log.exception("Error handling request")
    # THEN each line is JSON, once, with the traceback as a field
    records = _all_json(capsys.readouterr().err.splitlines())
    assert [r["msg"] for r in records] == [
        "Worker (pid:42) was sent SIGKILL! Perhaps out of memory?", "Error handling request",
    ]  # fmt: skip
    assert records[0]["logger"] == "gunicorn.error" and "reset by peer" in records[1]["exc_info"]


LAMBDA_RUNTIME = """
import json, logging, sys
# What the Lambda runtime (awslambdaric's bootstrap.run) does before it imports the handler
# module: a handler of its own on the root logger, text, with the request id.
class LambdaLoggerHandler(logging.Handler):
    def emit(self, record):
        sys.stdout.write(self.format(record) + "\\n")
class LambdaLoggerFilter(logging.Filter):
    def filter(self, record):
        record.aws_request_id = "8f5c1b2e-request"
        return True
handler = LambdaLoggerHandler()
handler.setFormatter(logging.Formatter("[%(levelname)s]\\t%(asctime)s.%(msecs)dZ\\t%(aws_request_id)s\\t%(message)s\\n"))
handler.addFilter(LambdaLoggerFilter())
logging.getLogger().addHandler(handler)
sys.path.insert(0, sys.argv[1])
import lambda_function
print(json.dumps(lambda_function.lambda_handler(json.load(open(sys.argv[2])), None)))
"""


def test_lambda_lines_through_the_runtimes_handler_as_json(tmp_path: Path) -> None:
    # GIVEN the spot-interruption Lambda in a runtime that logs as the real one does, its cluster unreachable
    driver = tmp_path / "runtime.py"
    driver.write_text(LAMBDA_RUNTIME)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n"
        "current-context: c\n"
    )
    env = _env(AWS_LAMBDA_FUNCTION_NAME="spotguard-spot-interruption", KUBECONFIG=str(kubeconfig),
               AWS_DEFAULT_REGION="us-east-2", AWS_ACCESS_KEY_ID="x", AWS_SECRET_ACCESS_KEY="x",
               AWS_EC2_METADATA_DISABLED="true")  # fmt: skip
    # WHEN a batch with malformed, foreign and real notices arrives (acknowledged before any connection)
    proc = subprocess.run(
        [sys.executable, str(driver), str(ROOT / "functions" / "spot-interruption"),
         str(EVENTS / "sqs-batch-mixed.json")],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    # THEN every line the runtime wrote is JSON, with the request id, and none went around it
    records = _all_json(proc.stdout.splitlines())
    logged = [r for r in records if "msg" in r]
    assert any("malformed" in r["msg"] for r in logged) and any("foreign" in r["msg"] for r in logged), logged
    assert all(r["aws_request_id"] == "8f5c1b2e-request" for r in logged), logged
    assert proc.stderr.strip() == "", proc.stderr


def _knative_function_lines(cluster: Any, name: str, server: str) -> list[str]:
    """stderr of ``functions/<name>`` served by func-python itself (``func_python.<server>``:
    its basicConfig, its hypercorn) until it runs and answers its liveness probe."""
    port = free_port()
    code = f"from func_python.{server} import serve; from function import new; serve(new)"
    proc = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT / "functions" / name, stderr=subprocess.PIPE,
        env=_env(LISTEN_ADDRESS=f"127.0.0.1:{port}", KUBECONFIG=cluster.kubeconfig),
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        lines = _lines_until(proc, proc.stderr.fileno(), "Running on")
        assert requests.get(f"http://127.0.0.1:{port}/health/liveness", timeout=10).ok
    finally:
        _stop(proc)
    return lines


def test_knative_function_lines_as_json(cluster: Any) -> None:
    # GIVEN the node-added Knative function served by func-python itself (its basicConfig, its hypercorn)
    lines = _knative_function_lines(cluster, "node-added", "cloudevent")
    # THEN func-python's lines and hypercorn's are JSON, each once
    records = _all_json(lines)
    assert len([r for r in records if r["msg"].startswith("function starting on")]) == 1, records
    assert len([r for r in records if "Running on" in r["msg"]]) == 1, records


def test_the_admission_knative_function_lines_as_json(cluster: Any) -> None:
    # GIVEN the admission Knative function served by func-python itself (its ASGI server, its hypercorn)
    lines = _knative_function_lines(cluster, "admission", "http")
    # THEN hypercorn's lines are JSON, once, like the other functions'
    records = _all_json(lines)
    assert len([r for r in records if "Running on" in r["msg"]]) == 1, records


def test_an_invalid_log_level_is_refused() -> None:
    plain_error(spotguard("--log-level", "LOUD", "demo", timeout=60), "LOUD", "DEBUG, INFO, WARNING, ERROR")
    proc = subprocess.run(
        [sys.executable, "-m", "spotguard.cli", "demo", "--scenario", "none.yaml"],
        capture_output=True, text=True, timeout=60, env=_env(SPOTGUARD_LOG_LEVEL="loud"), check=False,
    )  # fmt: skip
    plain_error(proc, "SPOTGUARD_LOG_LEVEL", "loud")


def test_a_server_with_an_invalid_level_in_its_environment_says_so_and_runs() -> None:
    stream = io.StringIO()
    level, fmt, problems = logs.settings(env={"SPOTGUARD_LOG_LEVEL": "verbose"}, stream=stream)
    assert (level, fmt) == ("INFO", "json") and problems and "verbose" in problems[0]
