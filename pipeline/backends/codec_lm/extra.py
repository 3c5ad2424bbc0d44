"""Whether the codec-LM backend's packages (the `codec-lm` extra) are installed, asked
without importing them: the rest of Playhead runs without torch and transformers."""

from __future__ import annotations

import importlib.util

INSTALL_HINT = "pip install 'playhead[codec-lm]'"


def missing_extra() -> str | None:
    """None when torch and transformers (with CSM) are importable, else what to install."""
    missing = [name for name in ("torch", "transformers") if not _found(name)]
    if missing:
        return f"needs {' and '.join(missing)} (the codec-lm extra): {INSTALL_HINT}"
    if not _found("transformers.models.csm"):
        return f"needs a transformers with CSM (>= 4.52): {INSTALL_HINT}"
    return None


def _found(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent package missing, or a broken stub
        return False
