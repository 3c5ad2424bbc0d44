"""The one set of validation helpers behind every configuration section.

Every config dataclass (scheduling/, pipeline/config.py, app/encoding_config.py,
app/settings.py's ServerConfig) checks its fields in `__post_init__` with these helpers, so
each rule is written once and every error is a ConfigError whose message starts with the
field's name (app/settings.py relies on that to name the section and field). They live in
scheduling/, the bottom layer, because pipeline/ and app/ both import from it; they are
pure (no I/O).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from numbers import Integral, Real

from scheduling.errors import ConfigError


def _is_real(value: object) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def _is_int(value: object) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool)


def _unit(unit: str) -> str:
    return f" {unit}" if unit else ""


def check_int(name: str, value: object, minimum: int) -> int:
    """An integer (not a bool) >= minimum, returned as a plain int."""
    if not (_is_int(value) and value >= minimum):
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)  # type: ignore[arg-type]


def check_int_in(name: str, value: object, bounds: tuple[int, int], unit: str = "") -> int:
    """An integer (not a bool) in bounds, both ends included, returned as a plain int."""
    low, high = bounds
    if not (_is_int(value) and low <= value <= high):
        raise ConfigError(f"{name} must be an integer in {low}..{high}{_unit(unit)}, got {value!r}")
    return int(value)  # type: ignore[arg-type]


def check_positive(name: str, value: object) -> None:
    if not (_is_real(value) and math.isfinite(value) and value > 0):  # type: ignore[arg-type]
        raise ConfigError(f"{name} must be a finite number > 0, got {value!r}")


def check_non_negative(name: str, value: object) -> None:
    if not (_is_real(value) and math.isfinite(value) and value >= 0):  # type: ignore[arg-type]
        raise ConfigError(f"{name} must be a finite number >= 0, got {value!r}")


def check_optional_non_negative(name: str, value: object) -> None:
    """None (meaning: not set), or a finite number >= 0."""
    if value is not None and not (
        _is_real(value) and math.isfinite(value) and value >= 0  # type: ignore[arg-type]
    ):
        raise ConfigError(f"{name} must be null or a finite number >= 0, got {value!r}")


def check_fraction(name: str, value: object) -> None:
    """A finite number in (0, 1]."""
    if not (_is_real(value) and math.isfinite(value) and 0 < value <= 1):  # type: ignore[operator]
        raise ConfigError(f"{name} must be a finite number in (0, 1], got {value!r}")


def check_number_in(
    name: str, value: object, bounds: tuple[float, float], unit: str = "", note: str = ""
) -> None:
    """A finite number in bounds, both ends included; `note` explains a special value."""
    low, high = bounds
    if not (_is_real(value) and math.isfinite(value) and low <= value <= high):  # type: ignore[operator]
        hint = f" ({note})" if note else ""
        raise ConfigError(
            f"{name} must be a number in {low}..{high}{_unit(unit)}{hint}, got {value!r}"
        )


def check_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be true or false, got {value!r}")


def check_choice(name: str, value: object, choices: Collection[str]) -> None:
    if not (isinstance(value, str) and value in choices):
        raise ConfigError(f"{name} must be one of {', '.join(choices)}, got {value!r}")


def check_text(name: str, value: object, *, optional: bool = False) -> None:
    """A string with something in it other than whitespace (or None when `optional`)."""
    if value is None and optional:
        return
    if not (isinstance(value, str) and value.strip()):
        allowed = " (use null for none)" if optional else ""
        raise ConfigError(f"{name} must be a non-empty string{allowed}, got {value!r}")


def check_int_list(name: str, value: object, minimum: int) -> tuple[int, ...]:
    """A list of integers >= minimum (an item's error names it `name[i]`), as a tuple."""
    if not isinstance(value, list | tuple):
        raise ConfigError(f"{name} must be a list of integers >= {minimum}, got {value!r}")
    return tuple(check_int(f"{name}[{i}]", item, minimum) for i, item in enumerate(value))


def check_names(name: str, value: object) -> tuple[str, ...]:
    """A non-empty list of distinct non-empty strings, as a tuple."""
    if not isinstance(value, list | tuple) or not value:
        raise ConfigError(f"{name} must be a non-empty list of names, got {value!r}")
    names: Sequence[object] = value
    for i, item in enumerate(names):
        check_text(f"{name}[{i}]", item)
    if len(set(names)) != len(names):
        raise ConfigError(f"{name} has duplicates: {list(names)!r}")
    return tuple(names)  # type: ignore[arg-type]


def require_finite_time(name: str, value: float) -> None:
    """Times passed in at run time (not config): a NaN or inf would corrupt the ordering."""
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number of seconds, got {value!r}")
