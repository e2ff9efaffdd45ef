"""The policy package stays pure: it imports only the standard library and itself."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

POLICY = Path(__file__).resolve().parents[2] / "shared" / "spotguard" / "policy"
# Standard-library modules that do I/O or reach the network are not allowed either.
FORBIDDEN_STDLIB = {
    "socket",
    "http",
    "urllib",
    "ssl",
    "subprocess",
    "asyncio",
    "threading",
    "os",
    "io",
    "pathlib",
    "shutil",
    "tempfile",
    "time",
    "random",
    "logging",
}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


MODULES = sorted(POLICY.glob("*.py"))


def test_policy_modules_exist() -> None:
    assert len(MODULES) >= 8


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_policy_imports_only_stdlib_and_itself(path: Path) -> None:
    for module in imported_modules(path):
        top = module.split(".")[0]
        if module.startswith("spotguard."):
            assert module.startswith("spotguard.policy"), f"{path.name} imports {module}"
            continue
        assert top in sys.stdlib_module_names or top == "__future__", f"{path.name} imports third-party {module}"
        assert top not in FORBIDDEN_STDLIB, f"{path.name} imports {module}, which does I/O"


def test_the_checker_catches_a_forbidden_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import kubernetes\nfrom boto3 import client\nimport socket\n")
    assert imported_modules(bad) == {"kubernetes", "boto3", "socket"}
