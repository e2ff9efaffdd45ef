"""`spotguard package knative` writes under the current directory, not into spotguard's checkout.

GIVEN spotguard installed from this checkout, WHEN `spotguard package knative` runs
in another directory (with and without ``--out``), THEN the function folders, each
with the spotguard wheel in vendor/, are there, and the checkout's functions/ is
left as it was.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from tests.infra import venvs

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

FUNCTIONS = sorted(d.name for d in (venvs.ROOT / "functions").iterdir() if (d / "func.yaml").is_file())


def checkout_state() -> dict[str, int]:
    """Every file under the checkout's functions/ and when it last changed."""
    return {str(p): p.stat().st_mtime_ns for p in (venvs.ROOT / "functions").rglob("*") if p.is_file()}


@pytest.mark.parametrize("out", [None, "elsewhere/staged"])
def test_the_folders_are_written_where_it_runs(tmp_path: Path, out: str | None) -> None:
    before = checkout_state()
    args = [str(venvs.BIN / "spotguard"), "package", "knative"] + (["--out", out] if out else [])
    printed = venvs.run(args, cwd=tmp_path)
    target = tmp_path / (out or "functions")
    assert sorted(d.name for d in target.iterdir()) == FUNCTIONS
    for name in FUNCTIONS:
        assert (target / name / "func.yaml").read_bytes() == (
            venvs.ROOT / "functions" / name / "func.yaml"
        ).read_bytes()
        [wheel] = (target / name / "vendor").glob("spotguard-*-py3-none-any.whl")
        assert str(wheel) in printed
        # A function carries what it runs: not the simulated cluster nor the operator's commands.
        with zipfile.ZipFile(wheel) as whl:
            files = whl.namelist()
        assert "spotguard/admission/__init__.py" in files and "spotguard/cli.py" in files
        assert not [f for f in files if f.startswith(("spotguard_sim/", "spotguard/ops/", "spotguard/demo.py"))]
    assert checkout_state() == before
