"""The Backend protocol: the one narrow interface between the engine and a voice model.

A backend has two halves, each called only from its own stage thread (see
pipeline/executor.py):

- the talker works in steps, like an autoregressive language model. `open_segment` takes
  one text segment of one stream and returns the backend's per-segment state (for a codec
  LM: a cache slot and a position; for Piper: the phoneme ids). `step` advances a batch
  of open segments by one model step: for each it returns the new frames (none, one or
  many) and whether the segment ended. `close_segment` frees a segment's state; the
  engine calls it exactly once per opened segment, after its last step, on cancel and on
  failure. Segments join and leave the batch between steps (continuous batching); a
  segment left out of a step keeps its state.
- the vocoder turns a batch of chunks (new frames plus left/right context) into PCM,
  with the context already trimmed away.

Frames are numpy arrays with frames on axis 0 (Piper: float32 [frames, 192]; sim:
int64 [frames, 2]; codec LM: int64 [frames, codebooks]). PCM is float32 mono in [-1, 1]
at the voice's sample rate.

Capabilities: what a backend can do beyond that is part of the interface, as data
(`Backend.capabilities`, a `BackendCapabilities`), never probed. The engine reads it once,
when it builds its stages:

- `concurrent_talker_steps`: `step` may run in two threads at once (each step works on
  its own segments, no state shared between them); the engine then gives the talker a
  second lane for streams' first segments (pipeline/talker.py). Off: every talker call
  runs in one thread.
- `concurrent_vocode_calls`: `vocode` may run in several threads at once; the engine then
  runs `vocoder.workers` vocoder turns side by side (pipeline/vocoder.py). Off: one
  vocoder worker, whatever `vocoder.workers` says.
- `prepares_segments`: `prepare_segment(request)` does real work. The talker will open
  this segment soon (the stream's next one), so the backend may start its costly part in
  the background, on a helper thread of its own, and return at once (a
  concurrent.futures.Future done when that work is, or None); `open_segment` for a
  request with the same text, voice and speed then takes that work. Meanwhile the stream
  counts as talking (no chunk of it is decoded ahead on a second vocoder worker). The
  engine calls it from the talker thread, only while few streams have work
  (`alone.prepare_next`), and never relies on it: a prepared segment never
  opened changes nothing but the time. With it goes
  `drop_prepared()`, which the engine calls from the event loop (it must only set flags)
  once more streams have work: the backend gives up the work not yet taken, so that no
  talker waits on a background thread that the busy cores starve. Off: the engine calls
  neither.
- `aborts_vocode`: `vocode_abort()` makes a handle (an `AbortHandle`) that, passed as
  `vocode(items, abort=handle)` and called from any thread, ends that call early (it
  raises; the backend stays usable). The engine does so for a call that decodes one
  stream, when that stream ends (a barge-in's next request then finds the worker free).
  Off: the engine never calls `vocode_abort` and always passes `abort=None`.

A class that subclasses `Backend` explicitly inherits the defaults below: no capability,
`prepare_segment` returning None, `drop_prepared` doing nothing, `vocode_abort` raising
(never called while `aborts_vocode` is off). A backend turns a capability on by setting
`capabilities` and overriding its operation.

Timing: a backend that knows where each character of a segment is heard (Piper's
duration predictor gives every phoneme its frames) returns a `SegmentTiming` on the
segment's first step with frames (`TalkStep.timing`); the engine turns it into the
stream's alignment (pipeline/alignment.py) before any of those frames are vocoded. A
backend that cannot (the sim backend, a codec LM) returns None: the engine then spreads
the segment's characters evenly over its frames as they come (estimates).

Errors: an exception from `open_segment` fails that one stream; one from `step` fails
the streams of that step; one from `vocode` fails the streams of that turn. The engine's
loops survive all three.
"""

from __future__ import annotations

import inspect
from abc import abstractmethod
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True)
class BackendCapabilities:
    """What a backend can do beyond the required calls; each is off unless said (the module
    doc says what the engine does with each)."""

    concurrent_talker_steps: bool = False  # `step` may run in two threads at once
    concurrent_vocode_calls: bool = False  # `vocode` may run in several threads at once
    prepares_segments: bool = False  # `prepare_segment` / `drop_prepared` do real work
    aborts_vocode: bool = False  # `vocode_abort` makes handles that end a `vocode` call

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not isinstance(value, bool):
                raise TypeError(f"BackendCapabilities.{name} must be a bool, got {value!r}")


NO_CAPABILITIES = BackendCapabilities()


class AbortHandle(Protocol):
    """Made by `Backend.vocode_abort`; called from any thread, it ends the `vocode` call it
    was passed to (that call raises). Calling it after the call is over is harmless."""

    def __call__(self) -> None: ...


@dataclass(frozen=True)
class Voice:
    """A voice a backend serves."""

    id: str
    name: str
    language: str
    sample_rate_hz: int
    samples_per_frame: int


@dataclass(frozen=True)
class TalkRequest:
    """One text segment for the talker."""

    text: str
    voice: str
    speed: float  # 1.0 = natural; 2.0 = twice as fast (shorter audio)
    stream_tag: int  # small integer naming the stream (the sim backend encodes it)
    segment_index: int  # 0, 1, 2 ... within the stream
    first_frame_index: int  # frames this stream's talker produced before this segment
    # the stream's player needs this segment's first frames soon: it has no audio yet, or
    # less than talker.urgent_slack_s of audio ahead (buffered plus talked). A backend may
    # make a segment that is not urgent in fewer, larger steps (Piper: its whole flow at
    # once), which costs less per frame but makes its first frames later
    urgent: bool = True
    # nothing else runs on the machine (the stream is alone, no vocode call runs, nothing
    # is prepared beside it): the segment's first step may use every core (Piper: its
    # encoder and first flow step on sessions of `piper.alone_intra_op_threads` threads)
    all_cores: bool = False


@dataclass(frozen=True)
class SegmentTiming:
    """Where each character of a segment's text (`TalkRequest.text`) is heard, in frames
    of the segment (frame 0: the segment's first frame; fractions allowed).

    One (start, end) pair per character, starts non-decreasing, `start <= end`. A
    character the voice does not speak on its own (a space) may have `start == end`.
    """

    start_frames: tuple[float, ...]
    end_frames: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.start_frames) != len(self.end_frames):
            raise ValueError("a segment timing needs as many starts as ends")


@dataclass(frozen=True)
class TalkStep:
    """One open segment's outcome of one talker step."""

    frames: np.ndarray  # new frames, frames on axis 0; may hold none
    done: bool  # the segment ended: no more frames will come; close it
    # where the segment's characters are heard, from a backend that knows (Piper: its
    # duration predictor), given once per segment, on a step no later than the one with
    # the segment's first frames; None: the engine spreads the characters evenly over
    # the segment's frames (an estimate)
    timing: SegmentTiming | None = None


class VocodeItem(NamedTuple):
    """One chunk to decode: `frames` spans [context_start, context_stop) of a segment."""

    voice: str
    frames: np.ndarray  # frames on axis 0, context included
    emit_offset_frames: int  # index in `frames` of the first new frame (= left context)
    emit_frames: int  # new frames to return audio for


class SegmentState(Protocol):
    """A backend's per-segment talker state (opaque to the engine)."""


@runtime_checkable
class Backend(Protocol):
    """A voice model split into a step-wise talker and a batched vocoder.

    `samples_per_frame` and `sample_rate_hz` describe the default voice; every Voice
    carries its own. A class that subclasses this one explicitly must define the abstract
    methods and inherits the optional operations' defaults (see the module doc).
    """

    name: str
    samples_per_frame: int
    sample_rate_hz: int
    capabilities: BackendCapabilities = NO_CAPABILITIES

    @abstractmethod
    def voices(self) -> list[Voice]: ...

    @abstractmethod
    def default_voice(self) -> str: ...

    @abstractmethod
    def open_segment(self, request: TalkRequest) -> SegmentState:
        """Per-segment state for one text segment (talker thread)."""
        ...

    @abstractmethod
    def step(self, segments: Sequence[SegmentState]) -> list[TalkStep]:
        """One model step for every segment given, in order (talker thread)."""
        ...

    @abstractmethod
    def close_segment(self, segment: SegmentState) -> None:
        """Free a segment's state; idempotent (talker thread)."""
        ...

    @abstractmethod
    def vocode(
        self, items: Sequence[VocodeItem], abort: AbortHandle | None = None
    ) -> list[np.ndarray]:
        """PCM per item, `emit_frames * samples_per_frame` samples each, context trimmed.
        `abort`: a handle from `vocode_abort` (only with `capabilities.aborts_vocode`; the
        engine passes None otherwise)."""
        ...

    @abstractmethod
    def close(self) -> None: ...

    def prepare_segment(self, request: TalkRequest) -> Future[Any] | None:
        """Start the costly part of opening `request` in the background; None or a future
        done when that work is (talker thread). Called only with
        `capabilities.prepares_segments`; the default does nothing."""
        return None

    def drop_prepared(self) -> None:
        """Give up prepared work not yet taken; only sets flags (event loop). Called only
        with `capabilities.prepares_segments`; the default does nothing."""
        return None

    def vocode_abort(self) -> AbortHandle:
        """A fresh handle for one `vocode` call (event loop). Called only with
        `capabilities.aborts_vocode`; the default raises."""
        raise NotImplementedError(f"{type(self).__name__} cannot abort a vocode call")

    def sustained_streams(self) -> float | None:
        """Streams at 1x the backend's batched loop sustains, from its own figures of what
        a step and a decode cost by batch (a GPU codec LM: a step costs nearly the same
        at 1 and 256 rows, so what its calls produce at light load says nothing of it);
        the engine's capacity then (audio s per s). None (the default): the engine
        measures its capacity from the calls it sees (pipeline/capacity.py)."""
        return None


# each capability and the operations a backend must define itself when it claims it
_OPERATIONS = {
    "prepares_segments": ("prepare_segment", "drop_prepared"),
    "aborts_vocode": ("vocode_abort",),
}


def backend_capabilities(backend: Backend) -> BackendCapabilities:
    """`backend.capabilities`, checked once when an engine is built: a BackendCapabilities,
    and every capability that is on comes with the backend's own operations (not the
    defaults above, which do nothing). Raises TypeError naming what is missing."""
    kind = type(backend).__name__
    try:
        capabilities = backend.capabilities
    except AttributeError:
        raise TypeError(
            f"backend {kind} declares no capabilities (a BackendCapabilities)"
        ) from None
    if not isinstance(capabilities, BackendCapabilities):
        raise TypeError(
            f"backend {kind}: capabilities must be a BackendCapabilities, "
            f"got {type(capabilities).__name__}"
        )
    claimed = {name for name, on in asdict(capabilities).items() if on}
    for capability, operations in _OPERATIONS.items():
        if capability not in claimed:
            continue
        for operation in operations:
            own = inspect.getattr_static(type(backend), operation, None)
            if own is None or own is Backend.__dict__[operation]:
                raise TypeError(
                    f"backend {kind} claims {capability} but does not define {operation}"
                )
    return capabilities
