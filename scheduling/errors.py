"""Errors raised by scheduling/."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field."""
