"""Text -> Kokoro tokens, by the voice's language, cut into pieces the model accepts.

Japanese: japanese.py (pyopenjtalk + misaki's romanizer), with each word's span. Other
languages (the voices of a user's voices file): espeak-ng's IPA through the bridge that
piper-tts bundles (no word spans: the engine then spreads the characters evenly).
A piece is at most `max_tokens` tokens, cut after punctuation where it can be.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from pipeline.backends.kokoro.japanese import JapanesePhonemizer, Phonemized, WordSpan

# espeak-ng voice per Kokoro language (the language codes of assets.LANGUAGES)
ESPEAK_VOICES = {
    "en-US": "en-us",
    "en-GB": "en-gb",
    "es": "es",
    "fr": "fr-fr",
    "hi": "hi",
    "it": "it",
    "pt-BR": "pt-br",
    "zh": "cmn",
}
_PUNCTUATION = ",.!?;:—…"
_ESPEAK_LOCK = threading.Lock()


@dataclass(frozen=True)
class Piece:
    """Up to max_tokens tokens of a segment: ids without the pad tokens, and for each id
    its character in the segment's phoneme string."""

    ids: tuple[int, ...]
    phoneme_index: tuple[int, ...]


@dataclass(frozen=True)
class Tokenized:
    phonemes: str
    words: tuple[WordSpan, ...]
    pieces: tuple[Piece, ...]


class Phonemizers:
    """One per backend: the Japanese one loads OpenJTalk's dictionary on first use."""

    def __init__(self) -> None:
        self._japanese: JapanesePhonemizer | None = None
        self._espeak = None
        self._lock = threading.Lock()

    def phonemize(self, language: str, text: str) -> Phonemized:
        if language == "ja":
            with self._lock:
                if self._japanese is None:
                    self._japanese = JapanesePhonemizer()
            return self._japanese(text)
        espeak_voice = ESPEAK_VOICES.get(language)
        if espeak_voice is None:
            raise ValueError(f"no phonemizer for language {language!r}")
        with _ESPEAK_LOCK:
            if self._espeak is None:
                from piper.phonemize_espeak import EspeakPhonemizer

                self._espeak = EspeakPhonemizer()
            sentences = self._espeak.phonemize(espeak_voice, text)
        return Phonemized(" ".join("".join(s) for s in sentences if s), ())


def tokenize(phonemized: Phonemized, vocab: dict[str, int], max_tokens: int) -> Tokenized:
    """The phonemes as token ids (characters the vocabulary lacks are dropped), cut into
    pieces of at most `max_tokens`: after the last punctuation that fits, else after the
    last space, else where the piece is full."""
    kept = [(i, vocab[c]) for i, c in enumerate(phonemized.phonemes) if c in vocab]
    pieces: list[Piece] = []
    start = 0
    while start < len(kept):
        stop = min(len(kept), start + max_tokens)
        if stop < len(kept):
            cut = None
            for mark in (_PUNCTUATION, " "):
                cut = next(
                    (
                        j + 1
                        for j in range(stop - 1, start, -1)
                        if phonemized.phonemes[kept[j][0]] in mark
                    ),
                    None,
                )
                if cut is not None:
                    break
            stop = cut or stop
        while start < stop and phonemized.phonemes[kept[start][0]] == " ":
            start += 1  # a piece never starts with a space
        if start < stop:
            part = kept[start:stop]
            pieces.append(Piece(tuple(t for _, t in part), tuple(i for i, _ in part)))
        start = stop
    return Tokenized(phonemized.phonemes, phonemized.words, tuple(pieces))
