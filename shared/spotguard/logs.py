"""Structured logging: one JSON object a line, with extra fields passed as ``extra``.

``log.info("surged", extra={"event_id": eid, "workload": key})`` prints
``{"level": "info", "logger": ..., "msg": "surged", "event_id": ..., ...}``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class UserError(Exception):
    """An error the user can fix (bad flag, missing file): printed without a traceback."""


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["error"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    """One line a record for a person: ``time level logger: message key=value ...``."""

    def format(self, record: logging.LogRecord) -> str:
        when = time.strftime("%H:%M:%S", time.localtime(record.created))
        extra = " ".join(
            f"{k}={v}" for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")
        )
        line = f"{when} {record.levelname.lower():7} {record.name}: {record.getMessage()}"
        if extra:
            line += f"  {extra}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


FORMATS = ("json", "text")


class StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is at the time of each record (it may be replaced)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def configure(level: str | None = None, fmt: str | None = None) -> None:
    """Log to stderr at ``level`` (or $SPOTGUARD_LOG_LEVEL, default INFO) as ``fmt``:
    ``json`` lines for machines (the default, or $SPOTGUARD_LOG_FORMAT) or ``text`` for a person."""
    name = (level or os.environ.get("SPOTGUARD_LOG_LEVEL") or "INFO").upper()
    kind = (fmt or os.environ.get("SPOTGUARD_LOG_FORMAT") or "json").lower()
    formatter = TextFormatter() if kind == "text" else JsonFormatter()
    root = logging.getLogger()
    ours = [h for h in root.handlers if getattr(h, "_spotguard", False)]
    if ours:
        for h in ours:
            h.setFormatter(formatter)
    else:
        handler = StderrHandler()
        handler.setFormatter(formatter)
        handler._spotguard = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    number = getattr(logging, name, logging.INFO)
    root.setLevel(number)
    # At DEBUG botocore logs the canonical request and the signature of everything it
    # signs: with the EKS token's presigned URL, enough to rebuild the token (a bearer
    # credential for the cluster). That logger never goes below INFO.
    logging.getLogger("botocore.auth").setLevel(max(number, logging.INFO))
