"""Cron schedules as the CronJob controller reads them (robfig/cron v3, standard
five fields: minute hour day-of-month month day-of-week; ``*``, ``*/n``,
``a-b``, ``a-b/n``, lists, month and weekday names, ``?``, and the macros
``@yearly``/``@annually``, ``@monthly``, ``@weekly``, ``@daily``/``@midnight``,
``@hourly``). As in cron, when both day fields are restricted a day matching
either runs. https://kubernetes.io/docs/concepts/workloads/controllers/cron-jobs/#schedule-syntax
"""

from __future__ import annotations

import datetime
import zoneinfo
from dataclasses import dataclass

MACROS = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
          "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
          "@hourly": "0 * * * *"}
_MONTHS = {m: i + 1 for i, m in enumerate(
    ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"])}
_DAYS = {d: i for i, d in enumerate(["sun", "mon", "tue", "wed", "thu", "fri", "sat"])}
_BOUNDS = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 6))


class ScheduleError(ValueError):
    pass


@dataclass(frozen=True)
class Schedule:
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    days_any: bool
    weekdays_any: bool
    tz: datetime.tzinfo

    def matches(self, t: datetime.datetime) -> bool:
        if t.minute not in self.minutes or t.hour not in self.hours or t.month not in self.months:
            return False
        dom = t.day in self.days
        dow = (t.isoweekday() % 7) in self.weekdays
        if self.days_any or self.weekdays_any:
            return dom and dow
        return dom or dow

    def next_after(self, when: float) -> float:
        """The first scheduled time strictly after ``when`` (epoch seconds)."""
        t = datetime.datetime.fromtimestamp(when, self.tz).replace(second=0, microsecond=0)
        t += datetime.timedelta(minutes=1)
        for _ in range(366 * 24 * 60 * 5):
            if self.matches(t):
                return t.timestamp()
            if t.month not in self.months:
                t = (t.replace(day=1, hour=0, minute=0) + datetime.timedelta(days=32)).replace(day=1)
                continue
            if t.hour not in self.hours:
                t = t.replace(minute=0) + datetime.timedelta(hours=1)
                continue
            t += datetime.timedelta(minutes=1)
        raise ScheduleError("the schedule never runs")


def _field(text: str, index: int) -> tuple[frozenset[int], bool]:
    lo, hi = _BOUNDS[index]
    names = _MONTHS if index == 3 else _DAYS if index == 4 else {}
    out: set[int] = set()
    star = False
    for item in text.lower().split(","):
        step = 1
        part = item
        if "/" in item:
            part, step_text = item.split("/", 1)
            if not step_text.isdigit() or int(step_text) == 0:
                raise ScheduleError(f"bad step in {text!r}")
            step = int(step_text)
        if part in ("*", "?"):
            start, end = lo, hi
            star = star or step == 1
        elif "-" in part:
            a, b = part.split("-", 1)
            start, end = _value(a, names), _value(b, names)
        else:
            start = _value(part, names)
            end = hi if step > 1 else start
        if index == 4 and end == 7:
            end = 6 if start <= 6 else 0
            out.add(0)
        if start < lo or end > hi or start > end:
            raise ScheduleError(f"{text!r} is out of range {lo}-{hi}")
        out.update(range(start, end + 1, step))
    return frozenset(x % 7 if index == 4 else x for x in out), star


def _value(text: str, names: dict[str, int]) -> int:
    if text in names:
        return names[text]
    if not text.isdigit():
        raise ScheduleError(f"{text!r} is not a number")
    return int(text)


def parse(schedule: str, time_zone: str | None = None) -> Schedule:
    """Parse ``spec.schedule`` (a leading ``TZ=``/``CRON_TZ=`` is refused, as upstream)."""
    text = schedule.strip()
    if text.startswith(("TZ=", "CRON_TZ=")):
        raise ScheduleError("cannot use TZ or CRON_TZ in schedule, use timeZone field instead")
    text = MACROS.get(text, text)
    fields = text.split()
    if len(fields) != 5:
        raise ScheduleError(f"expected exactly 5 fields, found {len(fields)}: {schedule!r}")
    try:
        tz: datetime.tzinfo = zoneinfo.ZoneInfo(time_zone) if time_zone else datetime.UTC
    except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
        raise ScheduleError(f"unknown time zone {time_zone!r}") from exc
    parsed = [_field(f, i) for i, f in enumerate(fields)]
    return Schedule(parsed[0][0], parsed[1][0], parsed[2][0], parsed[3][0], parsed[4][0],
                    parsed[2][1], parsed[4][1], tz)
