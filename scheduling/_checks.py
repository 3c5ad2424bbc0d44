"""Validation helpers shared by the config dataclasses; every error names its field."""

from __future__ import annotations

import math
from numbers import Integral, Real

from scheduling.errors import ConfigError


def _is_real(value: object) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def check_int(name: str, value: object, minimum: int) -> int:
    """An integer (not a bool) >= minimum, returned as a plain int."""
    if not (isinstance(value, Integral) and not isinstance(value, bool) and value >= minimum):
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_positive(name: str, value: object) -> None:
    if not (_is_real(value) and math.isfinite(value) and value > 0):
        raise ConfigError(f"{name} must be a finite number > 0, got {value!r}")


def check_non_negative(name: str, value: object) -> None:
    if not (_is_real(value) and math.isfinite(value) and value >= 0):
        raise ConfigError(f"{name} must be a finite number >= 0, got {value!r}")


def check_fraction(name: str, value: object) -> None:
    """A finite number in (0, 1]."""
    if not (_is_real(value) and math.isfinite(value) and 0 < value <= 1):
        raise ConfigError(f"{name} must be a finite number in (0, 1], got {value!r}")


def check_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be true or false, got {value!r}")


def require_finite_time(name: str, value: float) -> None:
    """Times passed in at run time (not config): a NaN or inf would corrupt the ordering."""
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number of seconds, got {value!r}")
