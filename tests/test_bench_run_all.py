"""bench/run_all.py: the README's performance section is the table of the last full run."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_all() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_run_all", ROOT / "bench" / "run_all.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_table_goes_between_the_markers_and_nothing_else_changes(tmp_path: Path) -> None:
    ra = run_all()
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\nbefore\n{ra.README_START}\nold table\n{ra.README_END}\nafter\n", encoding="utf-8")
    held = ra.Run("chaos", [sys.executable, "bench/chaos.py"], result={
        "promise_held": True, "time_scale": 20.0, "runs": [{"faults": "none", "worst_margin": 0,
                                                           "margin_seconds": {"Deployment/shop/web": 78.8,
                                                                              "Deployment/shop/api": 81.5},
                                                           "recovered_after_s": 239.0},
                                                          {"faults": "mixed", "time_scale": 4.0, "worst_margin": 0,
                                                           "recovered_after_s": 300.0}]},
        load_before="0.50/0.40/0.30", load_after="1.00/0.50/0.30", date="2026-11-26 12:00")
    broken = ra.Run("sim", [sys.executable, "bench/sim.py"], error="exit 1", load_before="1", load_after="1",
                    date="2026-11-26 12:05")
    ra.write_readme([held, broken], readme)
    text = readme.read_text(encoding="utf-8")
    assert text.startswith("# x\n\nbefore\n") and text.endswith(f"{ra.README_END}\nafter\n")
    assert "old table" not in text
    section = text.split(ra.README_START)[1].split(ra.README_END)[0]
    assert "| `bench/chaos.py` |" in section and "**promise held: True**" in section and "| met |" in section
    assert "smallest margin in time 79 s before the reclaim" in section
    assert "mixed (at x4): worst margin 0, smallest margin in time n/a" in section
    assert "| `bench/sim.py` |" in section and "| failed |" in section
    assert "2026-11-26 12:00 UTC" in section
    # written twice, the section is replaced, not repeated
    ra.write_readme([held], readme)
    assert readme.read_text(encoding="utf-8").count(ra.README_START) == 1


def test_a_readme_without_the_markers_is_refused(tmp_path: Path) -> None:
    ra = run_all()
    readme = tmp_path / "README.md"
    readme.write_text("# no section\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="has no"):
        ra.write_readme([], readme)
    assert readme.read_text(encoding="utf-8") == "# no section\n"


def test_the_repository_readme_has_the_section() -> None:
    ra = run_all()
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert text.count(ra.README_START) == 1 and text.count(ra.README_END) == 1


def test_the_cost_row_gives_the_notice_cycle_and_the_steady_state_beside_all_on_demand() -> None:
    ra = run_all()
    figures = ra.KNOWN["cost"].figures({"scenario": "s.yaml", "runs": {
        "spotguard": {"cost_per_hour_usd": 0.19, "saving_vs_all_on_demand": -0.08, "steady_per_hour_usd": 0.215,
                      "steady_saving_vs_all_on_demand": -0.25, "workloads_below_before": 0},
        "all-on-demand": {"cost_per_hour_usd": 0.172, "saving_vs_all_on_demand": 0.0, "steady_per_hour_usd": 0.172,
                          "steady_saving_vs_all_on_demand": 0.0, "workloads_below_before": 0},
        "spot-drainer": {"cost_per_hour_usd": 0.11, "saving_vs_all_on_demand": 0.34, "workloads_below_before": 6},
    }})
    assert figures.startswith("s.yaml: spotguard $0.190/h over the notice cycle (8% dearer than all on-demand), "
                              "$0.215/h steady (25% dearer than all on-demand), 0 workloads below")
    assert "all-on-demand $0.172/h over the notice cycle, $0.172/h steady, 0 workloads" in figures
    # (a result from before the steady figures: no steady part)
    assert "spot-drainer $0.110/h over the notice cycle (34% cheaper than all on-demand), 6 workloads" in figures
