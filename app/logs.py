"""Log lines that a client cannot forge or break.

A client's string can reach a log line (a path, a model id, an exception's message that
quotes it). `EscapingFormatter` escapes, in the message part of every record, each
character that could end the line or hide what follows: control characters (newline,
carriage return, escape...), Unicode line and paragraph separators, and lone surrogates.
A traceback, formatted apart from the message, keeps its own lines. `playhead serve`
installs it on the root handler, so uvicorn's lines go through it too.
"""

from __future__ import annotations

import logging
import re

_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def _escape_char(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape_log_text(text: str) -> str:
    """`text` on one line: each unsafe character as a \\xNN or \\uNNNN escape."""
    return _UNSAFE.sub(_escape_char, text)


class EscapingFormatter(logging.Formatter):
    """A Formatter whose message part is always one safe line (see the module doc)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        original = record.message
        record.message = escape_log_text(original)
        try:
            return super().formatMessage(record)
        finally:
            record.message = original


def configure_logging(level: str, fmt: str) -> None:
    """The root handler (stderr) with an EscapingFormatter, at `level`."""
    logging.basicConfig(level=level.upper(), force=True)
    for handler in logging.getLogger().handlers:
        handler.setFormatter(EscapingFormatter(fmt))
