"""Playhead's scheduling core: pure policy code, no I/O, no asyncio, the clock passed in.

- PlaybackScheduler: per-stream playback horizons; which K streams get the next vocoder
  turn (fifo or edf), see docs/scheduling.md sections 1-2;
- ChunkPlanner: how each stream's codec frames are cut into vocoder chunks (section 3);
- Admission: admit a new stream now, queue it briefly (one fair queue), or refuse it
  with a Retry-After, against the work still owed (docs/admission.md);
- plan_talker_step: which streams' segments take the next talker step (deadline order,
  high-water mark).

Config dataclasses validate themselves and raise ConfigError (a ValueError naming the
field); misuse at run time (a NaN time, a chunk committed that was not planned) raises
ValueError.
"""

from __future__ import annotations

from scheduling.admission import Admission, AdmissionConfig, Decision, LoadView, StreamLoad
from scheduling.chunking import (
    MIN_FIRST_CHUNK_FRAMES,
    Chunk,
    ChunkingConfig,
    ChunkPlanner,
    warn_if_first_chunk_too_short,
)
from scheduling.errors import ConfigError
from scheduling.first_audio import FirstAudioWindow
from scheduling.horizon import StreamState
from scheduling.policies import PolicyName
from scheduling.scheduler import PlaybackScheduler, SchedulingConfig
from scheduling.talker import (
    TalkerCandidate,
    TalkerOrderConfig,
    TalkerPlan,
    TalkerQueue,
    plan_talker_step,
    talker_key,
)

__all__ = [
    "MIN_FIRST_CHUNK_FRAMES",
    "Admission",
    "AdmissionConfig",
    "Chunk",
    "ChunkPlanner",
    "ChunkingConfig",
    "ConfigError",
    "Decision",
    "FirstAudioWindow",
    "LoadView",
    "PlaybackScheduler",
    "PolicyName",
    "SchedulingConfig",
    "StreamLoad",
    "StreamState",
    "TalkerCandidate",
    "TalkerOrderConfig",
    "TalkerPlan",
    "TalkerQueue",
    "plan_talker_step",
    "talker_key",
    "warn_if_first_chunk_too_short",
]
