"""Log set-up: text or JSON lines on stderr, with secrets masked and control characters
escaped in every record."""

from __future__ import annotations

import json
import logging
import re
import sys
import time

_URL_PASSWORD = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^:/@\s]+:)[^@\s]+@", re.I)
# A word of its own: not a table named "secret" in "shop.secret: version 2"
_KEY_VALUE_SECRET = re.compile(
    r"((?<![\w.`])(?:password|passwd|secret|token)\s*[=:]\s*)(\S+)", re.I)
# What a name may hold that would forge or hide log lines: C0 and C1 controls (newline,
# escape sequences), Unicode line separators and bidirectional overrides
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def escape_controls(text: str) -> str:
    """``text`` with every control character written as its Python escape (``\\n``,
    ``\\x1b``, ``\\u202e``): one record is one line, and shows what it holds."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


def mask_secrets(text: str) -> str:
    text = _URL_PASSWORD.sub(r"\1***@", text)
    return _KEY_VALUE_SECRET.sub(r"\1***", text)


class _MaskingFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = mask_secrets(message)
        if masked != message:
            record.msg, record.args = masked, None
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = mask_secrets(self.formatException(record.exc_info))
        return json.dumps(entry, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """One line per record: the message's control characters are escaped (a table or user
    name cannot start a forged line); a traceback, after it, keeps its lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escape_controls(record.message)
        return super().formatMessage(record)


def setup(level: str = "info", fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_MaskingFilter())
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
