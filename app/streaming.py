"""Response bodies of POST /v1/audio/speech: raw audio or OpenAI's SSE events.

A `SpeechBody` owns one engine stream and its encoder from the moment the route submitted
the request; `SpeechResponse` sends it and, whatever happens (done, failure, the client
gone), closes it: the engine stream is cancelled (idempotent) and the encoder freed.

Each PCM chunk is encoded as soon as the engine yields it. Measured on this machine's CPU
(1 s of audio, 22050 Hz in, 24 kHz out): mp3 ~10-14 ms, opus ~4.5 ms, aac ~3.8 ms,
flac ~0.7 ms, wav/pcm ~0.2 ms. PyAV and soxr release the GIL while they work (a thread
encoding 20 s of mp3 left the loop thread gaps of at most 0.4 ms), so a chunk longer than
`encoding.inline_encode_max_s` (default 0.1 s: < ~1.5 ms of work) is encoded in a worker
thread and the event loop, which also runs the engine's loops, is never blocked for more
than about a millisecond by an encoder. pcm and wav have no codec (about 1 ms for the
longest chunk, 2.2 s): they always encode inline, where the hand-off to a thread and back
cost a lone request more than the encoding itself (docs/voice-tuning.md). The worker
threads are the encoders' own small pool (`EncoderThreads`, `encoding.encoder_threads`,
default 1), not asyncio's default pool: encoding is a small share of the work, and on a
2-core machine every extra runnable thread takes CPU from the talker and vocoder threads
whose turns players wait on.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import json
import logging
import threading
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing
from typing import Any

import anyio
import numpy as np
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from app.audio import EncoderClosed, EncoderError, StreamEncoder
from app.disconnect import client_watch
from app.encoding_config import DEFAULT_ENCODING
from app.errors import ApiError, pipeline_api_error
from pipeline import Engine, PipelineError, Stream

logger = logging.getLogger("playhead.app")

SSE_CONTENT_TYPE = "text/event-stream"
ENCODER_THREAD_PREFIX = "playhead-encoder"


class EncoderThreads:
    """The encoders' thread pool (see the module doc); started on first use, and again
    after `close` (an app whose lifespan runs twice)."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self._pool: ThreadPoolExecutor | None = None

    async def run(self, fn: Callable[..., bytes], /, *args: Any) -> bytes:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix=ENCODER_THREAD_PREFIX)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args))

    def close(self) -> None:
        """Let the calls in flight end on their own; later calls start a new pool."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)


def sse_event(payload: dict[str, Any]) -> bytes:
    """One SSE event: a `data:` line of compact JSON and a blank line."""
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def delta_event(audio: bytes) -> bytes:
    return sse_event({"type": "speech.audio.delta", "audio": base64.b64encode(audio).decode()})


def done_event(input_tokens: int, output_tokens: int) -> bytes:
    usage = {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "total_tokens": input_tokens + output_tokens,
    }
    return sse_event({"type": "speech.audio.done", "usage": usage})


def error_event(error: ApiError) -> bytes:
    """The last event of an SSE body that failed after it started: the error's envelope."""
    return sse_event({"type": "error", **error.envelope()})


def encoding_error(exc: Exception) -> ApiError:
    return ApiError(f"Audio encoding failed: {exc}", code="encoding_failed")


class StreamAborted(Exception):
    """The audio body ended by a failure after the first byte: send no end of body."""


class SpeechBody:
    """The bytes of one response, from one engine stream through one encoder.

    `await start()` waits for the first PCM chunk before the response begins, so that a
    failure before any audio is still a status code (it costs no latency: no audio byte
    could leave earlier). Usage (SSE): input_tokens = characters of the trimmed input;
    output_tokens = codec frames produced (Piper: 256 samples at 22050 Hz, 11.6 ms each).
    """

    def __init__(
        self,
        engine: Engine,
        stream: Stream,
        encoder: StreamEncoder,
        *,
        sse: bool,
        input_chars: int,
        inline_encode_max_s: float = DEFAULT_ENCODING.inline_encode_max_s,
        encoder_threads: EncoderThreads | None = None,
    ) -> None:
        """`encoder_threads`: where chunks too long to encode inline go (None: asyncio's
        default pool)."""
        self._engine = engine
        self._stream = stream
        self._encoder = encoder
        self._sse = sse
        self._input_chars = input_chars
        # chunks of at most this many samples are encoded on the event loop
        self._inline_max_samples = inline_encode_max_s * stream.sample_rate_hz
        self._threads = encoder_threads
        self._chunks = stream.chunks()
        self._first: np.ndarray | None = None
        self._lock = threading.Lock()  # one encoder call at a time, close included
        self._closed = False

    @property
    def stream_id(self) -> str:
        return self._stream.id

    async def start(self) -> None:
        """Wait for the first chunk. Raises the pipeline's error (StreamFailed), or
        ServiceUnavailable when the engine stopped meanwhile; the caller closes the body on
        any error."""
        with contextlib.suppress(StopAsyncIteration):  # a stream with no audio at all
            self._first = await anext(self._chunks)
        # StreamCancelled (the engine stopped under us; a client gone never gets here)
        # reaches the app's handler: 503 shutting_down

    def _call_encoder(self, method: Callable[..., bytes], *args: Any) -> bytes:
        with self._lock:
            if self._closed:
                return b""
            return method(*args)

    async def _encode(self, pcm: np.ndarray) -> bytes:
        if self._encoder.raw or pcm.size <= self._inline_max_samples:
            return self._call_encoder(self._encoder.encode, pcm)
        if self._threads is not None:
            return await self._threads.run(self._call_encoder, self._encoder.encode, pcm)
        return await asyncio.to_thread(self._call_encoder, self._encoder.encode, pcm)

    async def _pcm(self) -> AsyncGenerator[np.ndarray, None]:
        if self._first is not None:
            first, self._first = self._first, None
            yield first
        async for pcm in self._chunks:
            yield pcm

    async def iter_bytes(self) -> AsyncGenerator[bytes, None]:
        """The response body. A failure after the first byte (the engine stream or the
        encoder) ends an SSE body with an error event; an audio body raises StreamAborted,
        so that it is cut."""
        try:
            # StreamCancelled here means the engine stopped under us: a PipelineError
            async with aclosing(self._chunks), aclosing(self._pcm()) as chunks:
                async for pcm in chunks:
                    data = await self._encode(pcm)
                    if data:
                        yield delta_event(data) if self._sse else data
            tail = self._call_encoder(self._encoder.finish)
        except (ApiError, PipelineError, EncoderError, EncoderClosed, ValueError) as exc:
            # Exception subclasses only: a cancellation (client gone) still propagates.
            if isinstance(exc, ApiError):
                error = exc
            elif isinstance(exc, PipelineError):
                error = pipeline_api_error(exc)
            else:  # the encoder refused the PCM or the codec failed
                error = encoding_error(exc)
            logger.error("stream %s failed after the response started: %s", self.stream_id, exc)
            if self._sse:
                yield error_event(error)
                return
            raise StreamAborted(error.message) from exc
        if self._sse:
            if tail:
                yield delta_event(tail)
            yield done_event(self._input_chars, self._stream.stats.frames)
        elif tail:
            yield tail

    def close(self) -> None:
        """Cancel the engine stream (a no-op once it finished) and free the encoder.

        When a worker thread is still encoding (its task was cancelled), this waits for
        that one call: at most a few ms, and only on a disconnect."""
        self._engine.cancel(self._stream.id)
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._encoder.close()


class SpeechResponse(StreamingResponse):
    """A StreamingResponse that always listens for the client going away and always closes
    its body: sender and the request's disconnect watch (app/disconnect.py) in one task
    group, whichever ends first cancels the other, cleanup in `finally`.

    Starlette's own response skips the listener for ASGI spec 2.4 servers (it waits for the
    next send to fail), which would keep a stream whose engine is slow alive for one more
    chunk; and it never closes an iterator interrupted while sending.
    """

    def __init__(
        self, body: SpeechBody, *, media_type: str, headers: dict[str, str] | None = None
    ) -> None:
        self._body = body
        self._body_bytes = body.iter_bytes()
        super().__init__(self._body_bytes, media_type=media_type, headers=headers)

    async def stream_response(self, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        try:
            async for chunk in self.body_iterator:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except StreamAborted:
            # End without the last chunk: the server closes the connection and the client
            # sees a cut transfer, not a short file that looks whole.
            return
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as task_group:

                async def sender() -> None:
                    try:
                        await self.stream_response(send)
                    except OSError:
                        pass  # the client went away while we were sending (ASGI 2.4)
                    except Exception:
                        logger.exception("stream %s: sending failed", self._body.stream_id)
                    task_group.cancel_scope.cancel()

                task_group.start_soon(sender)
                await client_watch(scope, receive).gone()
                task_group.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await self._body_bytes.aclose()
            self._body.close()
