"""Client JSON, read defensively: a request body or a WebSocket message.

Python's `json.loads` accepts what JSON does not (NaN, Infinity) and fails on valid JSON
with exceptions no client should see as a 500: a RecursionError for deep nesting, a
ValueError for an integer of more than 4,300 digits. A lone UTF-16 surrogate (`\\ud800`)
is valid JSON but not a Unicode character: it cannot be encoded back to UTF-8 (a log line,
a response that echoes it) nor spoken. `load_client_json` turns each of these into one
`ClientJsonError` with a message written for people, so every caller answers 400.

`quote` renders a client string for a message or a log line: JSON-quoted with every
non-ASCII or control character escaped (a newline cannot forge a log line), and cut.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

# Longer integers are refused before int() parses them (Python's own limit is 4,300
# digits; nothing in a request needs more than a few).
MAX_INT_DIGITS = 64
QUOTE_MAX_CHARS = 64

_SURROGATE = re.compile("[\ud800-\udfff]")


class ClientJsonError(ValueError):
    """The client's JSON cannot be used; `message` says why, for people."""

    def __init__(self, message: str, code: str = "invalid_json") -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def quote(text: str, max_chars: int = QUOTE_MAX_CHARS) -> str:
    """`text` as a quoted, escaped ASCII literal (cut at `max_chars`, marked with ...)."""
    cut = text if len(text) <= max_chars else text[:max_chars]
    quoted = json.dumps(cut, ensure_ascii=True)
    return quoted if cut is text else quoted[:-1] + '..."'


def _refuse_constant(name: str) -> Any:
    raise ClientJsonError(
        f"The JSON contains {name}, which is not a JSON number (JSON has no NaN or Infinity).",
        code="invalid_json",
    )


def _parse_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise ClientJsonError(
            f"The JSON contains an integer of {len(digits.lstrip('-'))} digits; at most "
            f"{MAX_INT_DIGITS} are accepted.",
            code="invalid_json",
        )
    return int(digits)


def _parse_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ClientJsonError(
            f"The JSON contains a number too large to represent ({quote(text, 24)}).",
            code="invalid_json",
        )
    return value


def _check_strings(data: Any) -> None:
    """Refuse a lone surrogate in any key or string value (iterative: any depth)."""
    pending = [data]
    while pending:
        value = pending.pop()
        if isinstance(value, str):
            found = _SURROGATE.search(value)
            if found:
                raise ClientJsonError(
                    "The JSON contains a lone UTF-16 surrogate "
                    f"({quote(found.group())}), which is not a Unicode character.",
                    code="invalid_unicode",
                )
        elif isinstance(value, dict):
            pending.extend(value.keys())
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)


def load_client_json(raw: bytes | str) -> Any:
    """Parse client JSON, or raise ClientJsonError (never anything else)."""
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ClientJsonError(
                f"The body is not valid UTF-8 text (a bad byte at offset {exc.start}).",
                code="invalid_json",
            ) from None
    try:
        data = json.loads(
            raw, parse_constant=_refuse_constant, parse_int=_parse_int, parse_float=_parse_float
        )
    except ClientJsonError:
        raise
    except json.JSONDecodeError as exc:
        raise ClientJsonError(
            f"The JSON is malformed: {exc.msg.lower()} at line {exc.lineno}, column {exc.colno}.",
        ) from None
    except RecursionError:
        raise ClientJsonError("The JSON nests arrays or objects too deeply.") from None
    except (ValueError, TypeError, OverflowError, MemoryError):
        raise ClientJsonError("The JSON could not be read.") from None
    _check_strings(data)
    return data
