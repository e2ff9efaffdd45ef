"""The live progress view of a cycle: time, nodes left, surges, lowest serving per workload.

On a terminal it is a rich ``Live`` table redrawn a few times a second; elsewhere
(a pipe, CI) it prints one plain line every 20 simulated seconds after the notice
(every 10 real seconds before it).
"""

from __future__ import annotations

import time
from typing import Any

from spotguard.ops import cycle, serving
from spotguard.policy.workloads import Kind, Workload

ROWS = 12


class LiveView:
    def __init__(self, console: Any, enabled: bool = True) -> None:
        self.console = console
        self.enabled = enabled
        self.live: Any = None
        self.last_line = -1e9
        self.last_draw = 0.0
        self.last_phase = ""

    def __enter__(self) -> LiveView:
        if self.enabled and self.console.is_terminal:
            from rich.live import Live

            self.live = Live(console=self.console, refresh_per_second=4, transient=False)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)

    def __call__(
        self, phase: cycle.Phase, tracker: serving.Serving, wls: dict[str, Workload], floor: dict[str, int]
    ) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if self.live is None:
            armed = tracker.armed_at is not None
            due = phase.t - self.last_line >= 20 if armed else now - self.last_draw >= 10
            if phase.name != self.last_phase or due:
                self.last_phase, self.last_line, self.last_draw = phase.name, phase.t, now
                self.console.print(self._line(phase, tracker, wls, floor), highlight=False)
            return
        if now - self.last_draw < 0.2:
            return
        self.last_draw = now
        self.live.update(self._table(phase, tracker, wls, floor))

    def _required(self, key: str, c: serving.Counts, wls: dict[str, Workload], floor: dict[str, int]) -> int:
        return c.before if wls[key].kind is Kind.DEPLOYMENT else floor.get(key, 0)

    def _line(
        self, phase: cycle.Phase, tracker: serving.Serving, wls: dict[str, Workload], floor: dict[str, int]
    ) -> str:
        counts = tracker.snapshot()
        armed = tracker.armed_at is not None
        worst = ""
        if armed and wls:
            key = min(
                wls,
                key=lambda k: (
                    counts.get(k, serving.Counts()).lowest
                    - self._required(k, counts.get(k, serving.Counts()), wls, floor)
                ),
            )
            c = counts.get(key, serving.Counts())
            worst = f", closest to breaking: {key} lowest {c.lowest} of {self._required(key, c, wls, floor)}"
        t = f"t={phase.t:.0f}s  " if armed else ""
        return (
            f"{t}{phase.name}: spot nodes {phase.spot_nodes}, surges {phase.surges}, "
            f"serving {sum(c.total for c in counts.values())}{worst}"
        )

    def _table(
        self, phase: cycle.Phase, tracker: serving.Serving, wls: dict[str, Workload], floor: dict[str, int]
    ) -> Any:
        from rich.table import Table

        counts = tracker.snapshot()
        armed = tracker.armed_at is not None
        t = Table(
            title=f"{f't={phase.t:.0f}s  ' if armed else ''}{phase.name}   spot nodes {phase.spot_nodes}   "
            f"surges in progress {phase.surges}",
            title_justify="left",
        )
        for col in ("workload", "desired", "floor", "serving", "on spot", "before", "lowest"):
            t.add_column(col, justify="left" if col == "workload" else "right")
        keys = sorted(
            wls,
            key=lambda k: (counts.get(k, serving.Counts()).lowest - self._required(k, counts.get(k, serving.Counts()),
                                                                                    wls, floor), k),
        )[:ROWS]  # fmt: skip
        for key in sorted(keys):
            c = counts.get(key, serving.Counts())
            broke = armed and c.lowest < self._required(key, c, wls, floor)
            t.add_row(
                key,
                str(wls[key].replicas),
                str(floor.get(key, 0)),
                str(c.total),
                str(c.serving[serving.SPOT]),
                str(c.before) if armed else "",
                (f"[red]{c.lowest}[/red]" if broke else str(c.lowest)) if armed else "",
            )
        if len(wls) > ROWS:
            t.caption = f"the {ROWS} workloads closest to breaking the promise, of {len(wls)}"
        return t
