"""Playhead's pipeline: the engine that moves text through a talker and a vocoder."""

from __future__ import annotations

from pipeline.backend import Backend, TalkRequest, TalkStep, VocodeItem, Voice
from pipeline.backends import build_backend
from pipeline.engine import Engine
from pipeline.errors import (
    BackendError,
    NotReady,
    PipelineError,
    Rejected,
    StreamCancelled,
    StreamFailed,
    UnknownVoice,
)
from pipeline.events import EngineEvents, EngineStats, NullEvents, TurnTiming
from pipeline.stream import Stream, StreamState, StreamStats

__all__ = [
    "Backend",
    "BackendError",
    "Engine",
    "EngineEvents",
    "EngineStats",
    "NotReady",
    "NullEvents",
    "PipelineError",
    "Rejected",
    "Stream",
    "StreamCancelled",
    "StreamFailed",
    "StreamState",
    "StreamStats",
    "TalkRequest",
    "TalkStep",
    "TurnTiming",
    "UnknownVoice",
    "VocodeItem",
    "Voice",
    "build_backend",
]
