"""Typed validation results: what was wrong with a value, never an exception."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One invalid setting or annotation, and what was used instead."""

    field: str
    value: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}={self.value!r}: {self.message}"
