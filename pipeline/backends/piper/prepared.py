"""Segments prepared ahead (`PiperBackend.prepare_segment`): a stream's next segment is
phonemised and encoded on one helper thread of the backend's own while the talker steps
the segment before it, and `open_segment` takes that work by (voice, text, speed)."""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from pipeline.backend import TalkRequest
from pipeline.backends.piper.sessions import VocodeAbort

logger = logging.getLogger("playhead.piper")
# Prepared segments kept for `open_segment` at most; an older one is dropped (a stream
# that ended before opening its prepared segment leaves nothing behind for long).
PREPARED_MAX = 4


@dataclass(frozen=True, slots=True)
class Prepared:
    """A segment's work done ahead."""

    phoneme_ids: list[int]
    prior: np.ndarray | None  # the encoder's output (None: not run)
    mask: np.ndarray | None
    phonemes: list[str] = field(default_factory=list)
    owners: list[int] = field(default_factory=list)
    durations: np.ndarray | None = None  # frames per phoneme id (None: not run)


_Key = tuple[str, str, float]  # voice, text, speed


class PreparedSegments:
    """The work `work(request, abort)` started ahead per request, at most PREPARED_MAX
    of them; `abort` ends a running one early (ONNX Runtime's terminate flag)."""

    def __init__(self, work: Callable[[TalkRequest, VocodeAbort], Prepared]) -> None:
        self._work = work
        self._entries: OrderedDict[_Key, tuple[Future[Prepared], VocodeAbort]] = OrderedDict()
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self.started = 0  # requests whose work was started

    @staticmethod
    def _key(request: TalkRequest) -> _Key:
        return (request.voice, request.text, request.speed)

    def start(self, request: TalkRequest) -> Future[Prepared] | None:
        """Start `request`'s work on the helper thread; its future (None: already asked)."""
        key = self._key(request)
        with self._lock:
            if key in self._entries:
                return None
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="playhead-prepare")
            abort = VocodeAbort()
            future = self._pool.submit(self._work, request, abort)
            self.started += 1
            self._entries[key] = (future, abort)
            while len(self._entries) > PREPARED_MAX:
                _, (dropped, dropped_abort) = self._entries.popitem(last=False)
                dropped.cancel()  # not started: it never runs
                dropped_abort()  # running: it ends early
        return future

    def drop(self) -> None:
        """Give up every entry: those not started never run, a running one ends early."""
        with self._lock:
            dropped = list(self._entries.values())
            self._entries.clear()
        for future, abort in dropped:
            future.cancel()
            abort()

    def take(self, request: TalkRequest) -> Prepared | None:
        """The work for `request`, waiting for it if it runs; None when there is none, it
        had not started (then it never will), was dropped or failed."""
        with self._lock:
            entry = self._entries.pop(self._key(request), None)
        if entry is None:
            return None
        future, abort = entry
        if future.cancel():
            return None
        try:
            return future.result()
        except CancelledError:
            return None
        except Exception:
            if not abort.options.terminate:  # an abort is no failure
                logger.exception("preparing a segment failed; the talker encodes it itself")
            return None

    def close(self) -> None:
        """Drop every entry and wait for the helper thread to end."""
        with self._lock:
            pool, self._pool = self._pool, None
        self.drop()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
