"""What the Cartesia routes share: the voice, admission, the pipeline's errors in
Cartesia's shape, the API key, and the word timestamps of a stream.

Admission is the one front every protocol uses (`pipeline.admission.admit`, see
docs/admission.md): Rejected is a 429 with Retry-After, NotReady a 503, and the
reservation goes to `Engine.submit(..., reservation=)`.
"""

from __future__ import annotations

from typing import Any

from app.cartesia.schema import CartesiaError, is_cartesia_voice_id
from app.client_json import quote
from app.errors import ApiError
from app.security import check_credentials
from pipeline import Engine, NotReady, PipelineError, Rejected, StreamFailed, UnknownVoice, Voice
from pipeline.alignment import Alignment, WordTiming

PROTOCOL = "cartesia"


def resolve_voice(engine: Engine, voice_id: str | None) -> Voice:
    """A Playhead voice, else (a Cartesia UUID, or none given) the default voice, else 400."""
    if voice_id is None:
        return engine.resolve_voice(engine.backend.default_voice())
    try:
        return engine.resolve_voice(voice_id)
    except UnknownVoice as exc:
        if is_cartesia_voice_id(voice_id):
            return engine.resolve_voice(engine.backend.default_voice())
        raise CartesiaError(
            f"Voice {quote(voice_id)} not found. Playhead's voices: {', '.join(exc.available)} "
            "(a Cartesia voice id, a UUID, speaks with the default voice).",
            error_code="voice_not_found",
        ) from None


def pipeline_error(exc: PipelineError) -> CartesiaError:
    """The pipeline's exceptions in Cartesia's shape."""
    if isinstance(exc, Rejected):
        retry_after_s = max(1, int(exc.decision.retry_after_s or 1))
        return CartesiaError(
            f"The server is at capacity ({exc.decision.reason}); retry after {retry_after_s} s.",
            error_code="concurrency_limited",
            status_code=429,
            retry_after_s=retry_after_s,
        )
    if isinstance(exc, NotReady):
        return CartesiaError(
            f"The engine is not running ({exc}).", error_code="service_unavailable", status_code=503
        )
    if isinstance(exc, StreamFailed):
        return CartesiaError(
            f"Speech generation failed: {exc.cause}",
            error_code="generation_failed",
            status_code=500,
        )
    return CartesiaError(
        f"Speech generation failed: {exc}", error_code="generation_failed", status_code=500
    )


def check_key(expected: str | None, headers: Any, query_key: str | None = None) -> None:
    """The API key as Cartesia's clients send it: `X-API-Key`, `Authorization: Bearer`
    (the official SDK), or `?api_key=` on the socket. CartesiaError 401 otherwise."""
    if expected is None:
        return
    presented = dict(headers.items())
    if query_key is not None and not any(k in presented for k in ("authorization", "x-api-key")):
        presented["x-api-key"] = query_key
    try:
        check_credentials(expected, presented)
    except ApiError as exc:
        message = (
            "Missing API key: send it in an X-API-Key header."
            if exc.code == "missing_api_key"
            else "Invalid API key."
        )
        raise CartesiaError(message, error_code="unauthorized", status_code=401) from None


class WordCursor:
    """The words of a stream's alignment whose audio has been sent, once each.

    `breaks`: offsets into the stream's text where a word ends though no white space
    follows (pipecat sends sentences without the space between them: "morning.We" is two
    words); a word across one is split there, its second part starting when the voice
    says the character at the break."""

    def __init__(self, alignment: Alignment, breaks: set[int] | None = None) -> None:
        self._alignment = alignment
        self._breaks = breaks if breaks is not None else set()
        self._cursor = 0
        self._char_cursor = 0
        self._heard_chars = 0

    def take(self, sent_s: float) -> dict[str, list[Any]] | None:
        """Cartesia's `word_timestamps` of the words starting before `sent_s` (seconds
        of audio sent) not taken yet; None when there are none."""
        words, self._cursor = self._alignment.words_before(sent_s, self._cursor)
        if not words:
            return None
        taken: dict[str, list[Any]] = {"words": [], "start": [], "end": []}
        for word in words:
            for text, start_s, end_s in self._split(word):
                taken["words"].append(text)
                taken["start"].append(round(start_s, 4))
                taken["end"].append(round(end_s, 4))
        return taken

    def _split(self, word: WordTiming) -> list[tuple[str, float, float]]:
        cuts = sorted(b for b in self._breaks if word.start_index < b < word.end_index)
        if not cuts:
            return [(word.word, word.start_s, word.end_s)]
        bounds = [word.start_index, *cuts, word.end_index]
        starts = [word.start_s, *(self._char_start_s(b, word) for b in cuts)]
        ends = [*starts[1:], word.end_s]
        pieces = []
        for i in range(len(cuts) + 1):
            text = word.word[bounds[i] - word.start_index : bounds[i + 1] - word.start_index]
            pieces.append((text, starts[i], max(starts[i], ends[i])))
        return pieces

    def _char_start_s(self, index: int, word: WordTiming) -> float:
        chars = self._alignment.chars
        char = chars[index] if index < len(chars) and chars[index].index == index else None
        if char is None:
            char = next((c for c in chars if c.index == index), None)
        return min(max(char.start_s, word.start_s), word.end_s) if char else word.start_s

    def heard_chars(self, sent_s: float) -> int:
        """One past the highest text index whose character starts before `sent_s`."""
        chars, self._char_cursor = self._alignment.chars_before(sent_s, self._char_cursor)
        for char in chars:
            self._heard_chars = max(self._heard_chars, char.index + 1)
        return self._heard_chars
