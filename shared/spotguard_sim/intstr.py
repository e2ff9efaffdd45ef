"""IntOrString values ("25%" or 3), as k8s.io/apimachinery/pkg/util/intstr scales them."""

from __future__ import annotations

import math
from typing import Any


def scaled(value: Any, total: int, round_up: bool) -> int:
    """GetScaledValueFromIntOrPercent; raises ValueError on a malformed value."""
    if value is None:
        return 0
    if isinstance(value, bool):
        raise ValueError(f"invalid value {value!r}")
    if isinstance(value, int):
        return value
    text = str(value)
    if not text.endswith("%"):
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"invalid value for IntOrString: {value!r}") from None
    try:
        percent = int(text[:-1])
    except ValueError:
        raise ValueError(f"invalid value for IntOrString: {value!r}") from None
    exact = percent * total / 100
    return math.ceil(exact) if round_up else math.floor(exact)


def is_percent(value: Any) -> bool:
    return isinstance(value, str) and value.endswith("%")
