"""Running ``spotguard`` as a user does, in a child process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "infra" / "scenarios"
EVENTS = ROOT / "infra" / "events"


def spotguard(*args: str, timeout: float = 300, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spotguard.cli", *args], capture_output=True, check=False, text=True, timeout=timeout,
        env=env,
    )  # fmt: skip


def last_json(proc: subprocess.CompletedProcess[str]) -> Any:
    lines = proc.stdout.strip().splitlines()
    assert lines, proc.stderr[-3000:]
    return json.loads(lines[-1])


def plain_error(proc: subprocess.CompletedProcess[str], *words: str) -> None:
    """Exit 2 with a sentence on stderr: no JSON log line, no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-1000:], proc.stderr[-2000:])
    err = proc.stderr.strip()
    assert err.startswith("spotguard: ") or err.startswith("usage:"), err
    assert "Traceback" not in err and not err.startswith("{"), err
    for w in words:
        assert w in err, (w, err)
