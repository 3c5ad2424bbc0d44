"""MultiBackend: several backends behind one, each request routed by its voice.

`backend.kind: multi` with `multi.kinds: [piper, kokoro]` serves every voice of each kind
(each built from its own section), so every listing (/v1/audio/voices, ElevenLabs',
Cartesia's, Wyoming's describe) shows them all with their languages, and each segment and
chunk goes to the backend of its stream's voice. A voice id two kinds both serve is the
first kind's.

How the cores are shared is one decision, the engine's: there is one talker thread (two
lanes where every part allows it) and one set of vocoder workers for all backends, and
every vocoder turn goes to the earliest playback deadline whatever its voice (EDF). So a
backend gets the cores its streams' deadlines ask for, never a fixed share.
Capabilities are the parts' common ones (a flag is on when every part has it), except
`prepares_segments`, which each part that has it serves for its own voices.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.backend import (
    AbortHandle,
    Backend,
    BackendCapabilities,
    SegmentState,
    TalkRequest,
    TalkStep,
    VocodeItem,
    Voice,
)
from scheduling.errors import ConfigError
from scheduling.validation import check_names, check_text

logger = logging.getLogger("playhead.multi")


@dataclass(frozen=True)
class MultiConfig:
    kinds: tuple[str, ...] = ("piper", "kokoro")  # the backends served, each from its section
    default_voice: str | None = None  # None: the first kind's default voice

    def __post_init__(self) -> None:
        kinds = check_names("kinds", self.kinds)
        if not kinds:
            raise ConfigError("kinds must name at least one backend kind")
        if "multi" in kinds or len(set(kinds)) != len(kinds):
            raise ConfigError(f"kinds must name other kinds, each once, got {list(kinds)}")
        object.__setattr__(self, "kinds", kinds)
        check_text("default_voice", self.default_voice, optional=True)


@dataclass(slots=True)
class _Routed:
    part: int
    state: SegmentState


class _Abort:
    """One handle per part that aborts; calling it aborts the part calls it was given to."""

    __slots__ = ("handles",)

    def __init__(self, handles: dict[int, AbortHandle]) -> None:
        self.handles = handles

    def __call__(self) -> None:
        for handle in self.handles.values():
            handle()


class MultiBackend(Backend):
    name = "multi"

    def __init__(self, parts: Sequence[Backend], default_voice: str | None = None) -> None:
        if not parts:
            raise ValueError("a MultiBackend needs at least one backend")
        self._parts = list(parts)
        self._route: dict[str, int] = {}
        self._voices: list[Voice] = []
        for index, part in enumerate(self._parts):
            for voice in part.voices():
                if voice.id in self._route:
                    logger.warning(
                        "voice %s of backend %s is also %s's: served by the first",
                        voice.id,
                        part.name,
                        self._parts[self._route[voice.id]].name,
                    )
                    continue
                self._route[voice.id] = index
                self._voices.append(voice)
        self._default = default_voice or self._parts[0].default_voice()
        if self._default not in self._route:
            raise ConfigError(
                f"multi.default_voice {self._default!r} is none of {', '.join(self._route)}"
            )
        flags = [part.capabilities for part in self._parts]
        self._preparing = [f.prepares_segments for f in flags]
        self.capabilities = BackendCapabilities(
            concurrent_talker_steps=all(f.concurrent_talker_steps for f in flags),
            concurrent_vocode_calls=all(f.concurrent_vocode_calls for f in flags),
            prepares_segments=any(self._preparing),
            aborts_vocode=all(f.aborts_vocode for f in flags),
        )
        default = self._voices[[v.id for v in self._voices].index(self._default)]
        self.sample_rate_hz = default.sample_rate_hz
        self.samples_per_frame = default.samples_per_frame

    @property
    def parts(self) -> tuple[Backend, ...]:
        return tuple(self._parts)

    def part_of(self, voice_id: str) -> Backend:
        """The backend that serves `voice_id` (KeyError naming the voices otherwise)."""
        return self._parts[self._part_index(voice_id)]

    def _part_index(self, voice_id: str) -> int:
        index = self._route.get(voice_id)
        if index is None:
            raise KeyError(f"unknown voice {voice_id!r}; voices: {', '.join(self._route)}")
        return index

    def voices(self) -> list[Voice]:
        return list(self._voices)

    def default_voice(self) -> str:
        return self._default

    def open_segment(self, request: TalkRequest) -> _Routed:
        index = self._part_index(request.voice)
        return _Routed(index, self._parts[index].open_segment(request))

    def step(self, segments: Sequence[_Routed]) -> list[TalkStep]:
        out: list[TalkStep | None] = [None] * len(segments)
        by_part: dict[int, list[int]] = {}
        for position, routed in enumerate(segments):
            by_part.setdefault(routed.part, []).append(position)
        for part, positions in by_part.items():
            steps = self._parts[part].step([segments[p].state for p in positions])
            for position, step in zip(positions, steps, strict=True):
                out[position] = step
        return out  # type: ignore[return-value]  # every position is filled above

    def close_segment(self, segment: _Routed) -> None:
        self._parts[segment.part].close_segment(segment.state)

    def vocode(
        self, items: Sequence[VocodeItem], abort: AbortHandle | None = None
    ) -> list[np.ndarray]:
        if abort is not None and not isinstance(abort, _Abort):
            raise TypeError("abort must be a handle from this backend's vocode_abort")
        out: list[np.ndarray | None] = [None] * len(items)
        by_part: dict[int, list[int]] = {}
        for position, item in enumerate(items):
            by_part.setdefault(self._part_index(item.voice), []).append(position)
        for part, positions in by_part.items():
            handle = None if abort is None else abort.handles.get(part)
            pcm = self._parts[part].vocode([items[p] for p in positions], handle)
            for position, audio in zip(positions, pcm, strict=True):
                out[position] = audio
        return out  # type: ignore[return-value]  # every position is filled above

    def vocode_abort(self) -> _Abort:
        return _Abort({i: part.vocode_abort() for i, part in enumerate(self._parts)})

    def prepare_segment(self, request: TalkRequest) -> Future[Any] | None:
        index = self._part_index(request.voice)
        if not self._preparing[index]:
            return None
        return self._parts[index].prepare_segment(request)

    def drop_prepared(self) -> None:
        for part, preparing in zip(self._parts, self._preparing, strict=True):
            if preparing:
                part.drop_prepared()

    def close(self) -> None:
        for part in self._parts:
            part.close()
