"""An incremental PyAV decoder fed a response body as it streams: when is audio decodable?

`StreamDecoder(fmt).feed(data)` hands it the bytes that just arrived; `.settle()` waits until
the decoder has either decoded a sample or asked for bytes that have not arrived (it is
starved), and says which. `first_sample_s` is the `time.perf_counter()` at which the first
decoded sample came out, `bytes_at_first_sample` how many body bytes had been fed by then.

Two ways to decode, as players do:
- "parse" (default): an elementary stream (mp3, aac/ADTS, flac) goes through libavcodec's
  parser and decoder, which emit a codec frame as soon as its bytes are in (what a
  low-latency player of a self-synchronising stream does; FLAC's parser still waits for
  several following frame headers, see docs/api.md). Ogg (opus) and wav go through
  libavformat's demuxer, reading from a pipe.
- "demux": everything through libavformat's demuxer on a pipe (`ffplay -fflags nobuffer
  -probesize 32 -analyzeduration 0 -` does this). Its mp3 demuxer reads 1024-byte packets
  after a 3-frame sync check, so at 64 kb/s it needs about 6 frames (144 ms at 24 kHz)
  before a sample, whatever the server does.

pcm needs no decoder: two bytes are a sample.
"""

from __future__ import annotations

import queue
import threading
import time

import av

DEMUXERS = {"mp3": "mp3", "opus": "ogg", "aac": "aac", "flac": "flac", "wav": "wav"}
PARSED = {"mp3": "mp3float", "aac": "aac", "flac": "flac"}
# libavformat with as little probing and buffering as it allows: the options LiveKit's
# AudioStreamDecoder opens a TTS body with (livekit.agents.utils.codecs)
LOW_LATENCY_OPTIONS = {
    "probesize": "32",
    "analyzeduration": "0",
    "fflags": "nobuffer+flush_packets",
    "flags": "low_delay",
    "reorder_queue_size": "0",
    "max_delay": "0",
    "avioflags": "direct",
}
AVIO_BUFFER_BYTES = 256
WAV_HEADER_BYTES = 44
MODES = ("parse", "demux")


class _Pipe:
    """A blocking, non-seekable file for libavformat: `read` returns what has arrived,
    blocking while nothing has; `starved` is set while it waits."""

    def __init__(self) -> None:
        self._chunks: queue.Queue[bytes | None] = queue.Queue()
        self._buffer = b""
        self._eof = False
        self.starved = threading.Event()

    def put(self, data: bytes | None) -> None:
        self._chunks.put(data)

    @property
    def idle(self) -> bool:
        """Waiting for bytes, with none queued."""
        return self.starved.is_set() and self._chunks.empty()

    def read(self, size: int) -> bytes:
        while not self._buffer and not self._eof:
            try:
                item = self._chunks.get_nowait()
            except queue.Empty:
                self.starved.set()
                item = self._chunks.get()
                self.starved.clear()
            if item is None:
                self._eof = True
            else:
                self._buffer += item
        out, self._buffer = self._buffer[:size], self._buffer[size:]
        return out


class StreamDecoder:
    """Decodes one response body incrementally; see the module docstring."""

    def __init__(self, fmt: str, rate_hz: int = 24000, mode: str = "parse") -> None:
        if mode not in MODES:
            raise ValueError(f"mode {mode!r} is not one of {MODES}")
        self.fmt = fmt
        self.rate_hz = rate_hz
        self.fed_bytes = 0
        self.samples = 0
        self.first_sample_s: float | None = None
        self.bytes_at_first_sample: int | None = None
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._codec: av.CodecContext | None = None
        self._pipe: _Pipe | None = None
        self._thread: threading.Thread | None = None
        if fmt in ("pcm", "wav") and mode == "parse":
            self._skip = WAV_HEADER_BYTES if fmt == "wav" else 0
        elif fmt in PARSED and mode == "parse":
            self._codec = av.CodecContext.create(PARSED[fmt], "r")
        else:
            self._pipe = _Pipe()
            self._thread = threading.Thread(target=self._demux, name=f"decode-{fmt}", daemon=True)
            self._thread.start()

    def _got(self, samples: int) -> None:
        with self._lock:
            if samples and self.first_sample_s is None:
                self.first_sample_s = time.perf_counter()
                self.bytes_at_first_sample = self.fed_bytes
            self.samples += samples

    def feed(self, data: bytes) -> None:
        """The body bytes that just arrived."""
        if not data:  # b"" would be the parser's end of stream (and PyAV crashes after it)
            return
        with self._lock:
            self.fed_bytes += len(data)
        if self._pipe is not None:
            self._pipe.put(data)
        elif self._codec is not None:
            try:
                for packet in self._codec.parse(data):
                    for frame in self._codec.decode(packet):
                        self._got(frame.samples)
            except av.FFmpegError as exc:
                self.error = exc
        else:  # pcm, wav: s16le mono once past the header
            skipped = min(self._skip, len(data))
            self._skip -= skipped
            self._got((len(data) - skipped) // 2)

    def end(self, timeout_s: float = 5.0) -> None:
        """The body ended: decode what is left (the parser's last frame) and stop."""
        if self._pipe is not None and self._thread is not None:
            self._pipe.put(None)
            self._thread.join(timeout_s)
        elif self._codec is not None:
            try:
                for packet in self._codec.parse(b""):
                    for frame in self._codec.decode(packet):
                        self._got(frame.samples)
                for frame in self._codec.decode(None):
                    self._got(frame.samples)
            except av.FFmpegError as exc:
                self.error = exc

    def settle(self, timeout_s: float = 5.0) -> bool:
        """Wait until the bytes fed so far are decoded as far as they go; True when a
        sample has come out (False: the decoder is starved, or failed)."""
        if self._pipe is None:
            return self.first_sample_s is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.first_sample_s is not None:
                return True
            if self.error is not None or (self._thread and not self._thread.is_alive()):
                return self.first_sample_s is not None
            if self._pipe.idle:
                time.sleep(0.002)  # the decoder may still be finishing the last bytes
                if self._pipe.idle and self.first_sample_s is None:
                    return False
            time.sleep(0.0005)
        raise TimeoutError(f"the {self.fmt} decoder neither decoded nor asked for bytes")

    def _demux(self) -> None:
        assert self._pipe is not None
        options = dict(LOW_LATENCY_OPTIONS)
        fmt = DEMUXERS.get(self.fmt, "s16le")
        if fmt == "s16le":
            options.update(sample_rate=str(self.rate_hz), ch_layout="mono")
        try:
            with av.open(
                self._pipe, format=fmt, options=options, buffer_size=AVIO_BUFFER_BYTES
            ) as container:
                stream = container.streams.audio[0]
                for packet in container.demux(stream):
                    for frame in packet.decode():
                        self._got(frame.samples)
        except (av.FFmpegError, ValueError) as exc:
            self.error = exc
