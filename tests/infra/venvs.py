"""Fresh virtual environments for the packaging tests (the image's install, the function
folders, the Lambda zips): made from the interpreter running the tests, never from .venv,
with pip's ordinary cache so a second build costs little."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".venv" / "bin"
PYTHON_VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"
LAMBDA_ARCH = {"x86_64": "x86_64", "aarch64": "arm64", "arm64": "arm64"}.get(platform.machine(), platform.machine())


def base_python() -> str:
    """The interpreter .venv was made from (no packages of .venv visible)."""
    base = getattr(sys, "_base_executable", "") or sys.executable
    return str(Path(base).resolve()) if Path(base).exists() else sys.executable


def clean_env(**extra: str) -> dict[str, str]:
    """The environment for a subprocess: nothing of .venv or PYTHON* leaks in."""
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS")
    env = {k: v for k, v in os.environ.items() if k in keep or k.startswith("PIP_CACHE")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "/usr/bin:/bin").split(os.pathsep) if str(BIN) not in p)
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env.update(extra)
    return env


def run(args: list[str], *, timeout: float = 600, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [str(a) for a in args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=env if env is not None else clean_env(),
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(
            f"{' '.join(map(str, args))} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
        )
    return done.stdout


def new_venv(path: Path, *, with_pip: bool = True) -> Path:
    """A new virtual environment at ``path``; its python."""
    args = [base_python(), "-m", "venv", str(path)]
    if not with_pip:
        args.insert(3, "--without-pip")
    run(args, timeout=120)
    return path / "bin" / "python"
