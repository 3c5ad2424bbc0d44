"""The talker's pieces, kept until the vocoder has decoded them whole.

Kokoro's decoder normalises every layer over its whole input (graph_split.py), so a
frame's audio is the whole piece's decode, whatever window the engine's chunking hands the
vocoder. The talker puts each piece here under a serial number (written into its frames'
rows); the vocoder, given any window of a piece, decodes the whole piece once (the first
window that reaches it), keeps its audio and returns each window's slice of it. A piece
leaves when a window emits its last frame, or, when that never comes (a stream cancelled
midway), once `capacity` newer pieces came after it; a window whose piece has left is
decoded as it is (the window's own normalisation: close, not equal; counted in `misses`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np


@dataclass
class _Entry:
    frames: np.ndarray  # the piece's rows
    pcm: np.ndarray | None = None  # its audio, once decoded
    lock: threading.Lock = field(default_factory=threading.Lock)


class PieceStore:
    """Thread-safe: the talker adds, vocoder workers read (two may want one piece)."""

    def __init__(self, capacity: int, samples_per_frame: int) -> None:
        self._capacity = capacity
        self._hop = samples_per_frame
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._lock = threading.Lock()
        self._next = 1
        self.misses = 0  # windows decoded without their whole piece
        self.decodes = 0  # whole pieces decoded

    def add(self, frames: np.ndarray) -> int:
        with self._lock:
            serial = self._next
            self._next += 1
            self._entries[serial] = _Entry(frames)
            while len(self._entries) > self._capacity:
                self._entries.popitem(last=False)
            return serial

    def __len__(self) -> int:
        return len(self._entries)

    def audio(
        self,
        serial: int,
        first_frame: int,
        frames: int,
        emitted_stop: int,
        decode: Callable[[np.ndarray], np.ndarray],
    ) -> np.ndarray | None:
        """The piece's audio for its frames [first_frame, first_frame + frames), decoding
        the whole piece if not yet done; None when the piece is not (or no longer) here.
        `emitted_stop`: the piece's frames up to this one are out once this call returns
        (the window's context after it is not): at the piece's end it leaves the store."""
        with self._lock:
            entry = self._entries.get(serial)
        if entry is None:
            self.misses += 1
            return None
        with entry.lock:
            if entry.pcm is None:
                entry.pcm = decode(entry.frames)
                self.decodes += 1
            pcm = entry.pcm
        stop = first_frame + frames
        if emitted_stop >= entry.frames.shape[0]:
            with self._lock:  # its last frame is out: no window will want it again
                self._entries.pop(serial, None)
        return pcm[first_frame * self._hop : stop * self._hop]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
