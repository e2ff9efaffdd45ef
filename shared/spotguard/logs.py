"""Structured logging: one record a line, with extra fields passed as ``extra``.

``log.info("surged", extra={"event_id": eid, "workload": key})`` prints, as JSON,
``{"time": ..., "level": "info", "logger": ..., "msg": "surged", "event_id": ..., ...}``
or, as text for a person, ``12:00:01 info    spotguard...: surged  event_id=...``.

The format: ``--log-format`` / ``$SPOTGUARD_LOG_FORMAT``, else text when stderr is a
terminal (a person ran the command) and JSON otherwise (a container, a pipe, a
Lambda). A traceback is a field of its own in JSON (``exc_info``, with
``exc_type``; ``stack`` for ``stack_info``), never newlines inside the message.

Every line goes through the same formatter, also the lines of the servers and
runtimes around spotguard: hypercorn and gunicorn log through the root logger
(:mod:`spotguard.serving`, :mod:`spotguard.admission.server`); a console handler
someone else put on the root logger (func-python's ``logging.basicConfig``) is
replaced; in a Lambda the runtime's own handler (it frames each record for
CloudWatch and adds ``aws_request_id``) is kept and given this formatter.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Mapping
from typing import Any

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
FORMATS = ("json", "text")
# Loggers of the servers around spotguard that bring a console handler of their own.
SERVER_LOGGERS = ("hypercorn.error", "hypercorn.access", "gunicorn.error", "gunicorn.access")


class UserError(Exception):
    """An error the user can fix (bad flag, missing file): printed without a traceback."""


def _extra(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update(_extra(record))
        if record.exc_info and record.exc_info[0] is not None:
            out["exc_type"] = record.exc_info[0].__name__
            out["exc_info"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc_info"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    """One line a record for a person: ``time level logger: message key=value ...``; a traceback under it."""

    def format(self, record: logging.LogRecord) -> str:
        when = time.strftime("%H:%M:%S", time.localtime(record.created))
        extra = " ".join(f"{k}={v}" for k, v in _extra(record).items())
        line = f"{when} {record.levelname.lower():7} {record.name}: {record.getMessage()}"
        if extra:
            line += f"  {extra}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return line


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


def level_of(name: str | None) -> str:
    """A level name (any case), or ValueError with a sentence."""
    value = (name or "").strip().upper()
    if value not in LEVELS:
        raise ValueError(f"{name!r} is not a log level: give {', '.join(LEVELS)}")
    return value


def format_of(name: str | None) -> str:
    value = (name or "").strip().lower()
    if value not in FORMATS:
        raise ValueError(f"{name!r} is not a log format: give {' or '.join(FORMATS)}")
    return value


def settings(
    level: str | None = None, fmt: str | None = None, env: Mapping[str, str] | None = None, stream: Any = None
) -> tuple[str, str, list[str]]:
    """(level, format, problems): the arguments, else ``$SPOTGUARD_LOG_LEVEL`` / ``$SPOTGUARD_LOG_FORMAT``,
    else INFO and text on a terminal, JSON elsewhere. An invalid value is a problem (and the default)."""
    env = os.environ if env is None else env
    stream = sys.stderr if stream is None else stream
    problems = []
    try:
        chosen = level_of(level or env.get("SPOTGUARD_LOG_LEVEL") or "INFO")
    except ValueError as exc:
        problems.append(f"{'--log-level' if level else 'SPOTGUARD_LOG_LEVEL'}: {exc}")
        chosen = "INFO"
    try:
        kind = format_of(fmt or env.get("SPOTGUARD_LOG_FORMAT") or ("text" if _is_terminal(stream) else "json"))
    except ValueError as exc:
        problems.append(f"{'--log-format' if fmt else 'SPOTGUARD_LOG_FORMAT'}: {exc}")
        kind = "json"
    return chosen, kind, problems


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def configure(level: str | None = None, fmt: str | None = None, *, strict: bool = False) -> None:
    """Log at ``level`` as ``fmt`` (see :func:`settings`) to stderr, every line through one formatter.

    ``strict`` (the command line): an invalid level or format is a :class:`UserError`;
    otherwise (a server, a Lambda) it is logged and the default is used."""
    name, kind, problems = settings(level, fmt)
    if problems and strict:
        raise UserError("; ".join(problems))
    formatter = TextFormatter() if kind == "text" else JsonFormatter()
    root = logging.getLogger()
    in_lambda = bool(os.environ.get("AWS_LAMBDA_FUNCTION_NAME"))
    for h in list(root.handlers):
        if getattr(h, "_spotguard", False):
            continue
        if _is_console(h):
            root.removeHandler(h)  # a basicConfig handler: ours replaces it (no line twice)
        elif in_lambda:
            h._spotguard = True  # type: ignore[attr-defined]  # the runtime's: kept, with our format
    ours = [h for h in root.handlers if getattr(h, "_spotguard", False)]
    if not ours:
        handler = StderrHandler()
        handler._spotguard = True  # type: ignore[attr-defined]
        root.addHandler(handler)
        ours = [handler]
    for h in ours:
        h.setFormatter(formatter)
    for logger_name in SERVER_LOGGERS:
        through_root(logging.getLogger(logger_name))
    number = logging.getLevelName(name)
    root.setLevel(number)
    # At DEBUG botocore logs the canonical request and the signature of everything it
    # signs: with the EKS token's presigned URL, enough to rebuild the token (a bearer
    # credential for the cluster). That logger never goes below INFO.
    logging.getLogger("botocore.auth").setLevel(max(number, logging.INFO))
    for problem in problems:
        logging.getLogger(__name__).warning("invalid log setting; using the default", extra={"problem": problem})


def _is_console(handler: logging.Handler) -> bool:
    return type(handler) is logging.StreamHandler and getattr(handler, "stream", None) in (
        sys.stderr, sys.stdout, sys.__stderr__, sys.__stdout__,
    )  # fmt: skip


def through_root(logger: logging.Logger) -> logging.Logger:
    """``logger`` without console handlers of its own, its records going to the root logger's."""
    for h in list(logger.handlers):
        if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler):
            logger.removeHandler(h)
    logger.propagate = True
    return logger
