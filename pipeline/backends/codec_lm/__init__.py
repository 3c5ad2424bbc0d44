"""The codec-LM backend: CSM (transformers) as a step-wise talker, Mimi as the vocoder."""

from __future__ import annotations

from pipeline.backends.codec_lm.backend import CodecLMBackend
from pipeline.backends.codec_lm.loading import LoadedModel, load_model, resolve_device

__all__ = ["CodecLMBackend", "LoadedModel", "load_model", "resolve_device"]
