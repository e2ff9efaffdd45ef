"""The command line's manner: every command has help with an example; logs as JSON or text."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from spotguard import cli
from spotguard_sim import testing

from tests.ops.support import EVENTS, SCENARIOS, last_json, plain_error, spotguard

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


def _subcommands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    found = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found[(*path, name)] = child
                found.update(_subcommands(child, (*path, name)))
    return found


def test_every_subcommand_has_a_description() -> None:
    commands = _subcommands(cli.build_parser())
    assert ("serve",) in commands and ("package", "knative") in commands
    for path, parser in commands.items():
        assert parser.description and len(parser.description) > 20, path
    # as a person sees it
    proc = spotguard("serve", "--help", timeout=60)
    assert proc.returncode == 0 and "spotguard serve FUNCTION --help" in proc.stdout.replace("\n", " ")


def test_one_host_default_for_every_server() -> None:
    parser = cli.build_parser()
    hosts = {name: parser.parse_args(["serve", name]).host for name in ("admission", "spot-interruption", "node-added")}
    assert set(hosts.values()) == {"127.0.0.1"}, hosts


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env.update(extra)
    return env


def test_kubeconfig_from_the_environment_wherever_a_cluster_is_taken(tmp_path: Path) -> None:
    with testing.running_cluster(SCENARIOS / "small.yaml", time_scale=10) as sim:
        env = _env(KUBECONFIG=f"{tmp_path / 'missing'}{os.pathsep}{sim.kubeconfig}")  # kubectl's list: the first file
        # snapshot without --kubeconfig captures the cluster $KUBECONFIG names
        proc = spotguard("snapshot", "-o", str(tmp_path / "cluster.yaml"), env=env, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert "7 nodes" in proc.stdout
        # replay without a target replays against it
        proc = spotguard("replay", str(EVENTS / "pingsource.json"), "--dry-run", "--output", "json", env=env,
                         timeout=120)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        [result] = last_json(proc)["results"]
        assert result["result"] == "planned" and result["kind"] == "pingsource"
    # and a $KUBECONFIG that names no file is said so
    proc = spotguard("snapshot", "-o", str(tmp_path / "c2.yaml"), env=_env(KUBECONFIG=str(tmp_path / "nope")))
    plain_error(proc, "$KUBECONFIG", "no such file")
    plain_error(spotguard("replay", str(EVENTS / "pingsource.json"), env=_env(), timeout=60), "--kubeconfig")
