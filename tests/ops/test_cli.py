"""The command line's manner: every command has help with an example; logs as JSON or text."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ops.support import spotguard

COMMANDS = ["demo", "simulate", "snapshot", "replay"]


@pytest.mark.parametrize("command", COMMANDS)
def test_help_is_complete(command: str) -> None:
    proc = spotguard(command, "--help", timeout=60)
    assert proc.returncode == 0
    assert "example" in proc.stdout and f"spotguard {command}" in proc.stdout.split("example", 1)[1]


def test_the_top_level_help_lists_the_commands() -> None:
    proc = spotguard("--help", timeout=60)
    assert proc.returncode == 0
    for command in COMMANDS:
        assert command in proc.stdout
    assert "--log-format" in proc.stdout


def _first_log_line(fmt: str, tmp_path: Path) -> str:
    args = [sys.executable, "-m", "spotguard.cli", "--log-format", fmt, "--log-level", "INFO",
            "sim", "serve", "--kubeconfig", str(tmp_path / f"{fmt}.kubeconfig")]  # fmt: skip
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        line = ""
        for line in proc.stderr:
            if "simulated cluster serving" in line:
                break
        return line
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def test_log_format_json_and_text(tmp_path: Path) -> None:
    as_json = json.loads(_first_log_line("json", tmp_path))
    assert as_json["msg"] == "simulated cluster serving" and as_json["level"] == "info"
    text = _first_log_line("text", tmp_path)
    assert not text.startswith("{")
    assert " info " in text and "simulated cluster serving" in text and "url=" in text


def test_a_bad_log_format_is_refused() -> None:
    proc = spotguard("--log-format", "xml", "demo", timeout=60)
    assert proc.returncode == 2 and "invalid choice" in proc.stderr
