"""The codec-LM backend: CSM (transformers) as a step-wise talker, Mimi as the vocoder.

Needs the `codec-lm` extra (torch, transformers). The package itself imports neither:
its names load on first use, and without the extra that use raises an ImportError that
says what to install (`extra.missing_extra`, which the settings loader also asks).
"""

from __future__ import annotations

import importlib
from typing import Any

_NAMES = {
    "CodecLMBackend": "pipeline.backends.codec_lm.backend",
    "LoadedModel": "pipeline.backends.codec_lm.loading",
    "load_model": "pipeline.backends.codec_lm.loading",
    "resolve_device": "pipeline.backends.codec_lm.loading",
}

__all__ = list(_NAMES)


def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from pipeline.backends.codec_lm.extra import missing_extra

    if (missing := missing_extra()) is not None:
        raise ImportError(f"the codec_lm backend {missing}")
    return getattr(importlib.import_module(_NAMES[name]), name)
