"""The pipeline's exceptions.

    PipelineError
    ├── Rejected        admission refused the stream (.decision.retry_after_s: int >= 1)
    ├── UnknownVoice    no voice has this id or name (.voice, .available)
    ├── NotReady        the engine is not running (not started yet, or stopping)
    ├── StreamFailed    a backend call failed for this stream (raised from Stream.chunks();
                        the backend's exception is the __cause__ and .cause)
    └── StreamCancelled the stream was cancelled (its client left, engine.cancel, engine
                        stop); raised from Stream.chunks(), unread audio dropped
    BackendError        (a RuntimeError) the backend broke its contract: wrong count or
                        length of PCM; fails the streams of that vocoder call

Backend exceptions are translated here, at the boundary: one stream's failure never
escapes into the engine's loops.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scheduling import Decision


class PipelineError(Exception):
    """Base of the pipeline's exceptions."""


class Rejected(PipelineError):
    """Admission refused a new stream; the app answers 429 with Retry-After."""

    def __init__(self, decision: Decision) -> None:
        super().__init__(f"rejected: {decision.reason} (retry after {decision.retry_after_s} s)")
        self.decision = decision

    @property
    def retry_after_s(self) -> int:
        """Whole seconds >= 1 after which a slot is predicted (the Retry-After)."""
        return max(1, int(self.decision.retry_after_s or 1))


class UnknownVoice(PipelineError):
    """No voice has this id or name."""

    def __init__(self, voice: str, available: list[str]) -> None:
        super().__init__(f"unknown voice {voice!r}; available: {', '.join(available)}")
        self.voice = voice
        self.available = available


class NotReady(PipelineError):
    """The engine is not running: not started yet, stopping, or a loop died."""


class StreamFailed(PipelineError):
    """The pipeline failed for this stream (a backend call raised)."""

    def __init__(self, stream_id: str, cause: BaseException) -> None:
        super().__init__(f"stream {stream_id} failed: {type(cause).__name__}: {cause}")
        self.stream_id = stream_id
        self.cause = cause


class BackendError(RuntimeError):
    """The backend broke its contract (e.g. PCM of the wrong length)."""


class StreamCancelled(PipelineError):
    """The stream was cancelled; its unread audio was dropped."""

    def __init__(self, stream_id: str) -> None:
        super().__init__(f"stream {stream_id} was cancelled")
        self.stream_id = stream_id
