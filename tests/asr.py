"""Speech recognition for intelligibility checks: pocketsphinx's bundled US English model.

`transcribe(pcm, sample_rate_hz)` resamples to 16 kHz with soxr and returns lower-case
words; `word_error_rate(ref, hyp)` compares normalised word sequences.
"""

from __future__ import annotations

import re
import threading
from functools import lru_cache

import numpy as np
import soxr

ASR_RATE_HZ = 16000
_LOCK = threading.Lock()  # one pocketsphinx decoder, one utterance at a time


@lru_cache(maxsize=1)
def _decoder():  # -> pocketsphinx.Decoder
    from pocketsphinx import Decoder

    return Decoder(samprate=ASR_RATE_HZ, loglevel="FATAL")


def transcribe(pcm: np.ndarray, sample_rate_hz: int) -> str:
    """Words heard in mono PCM (float32 in [-1, 1], or int16)."""
    audio = np.asarray(pcm)
    if audio.dtype == np.int16:
        audio = audio.astype(np.float32) / 32768.0
    audio = audio.astype(np.float32, copy=False).reshape(-1)
    if sample_rate_hz != ASR_RATE_HZ:
        audio = soxr.resample(audio, sample_rate_hz, ASR_RATE_HZ)
    pcm16 = (np.clip(audio, -1.0, 1.0) * 32767.0).astype(np.int16)
    with _LOCK:
        decoder = _decoder()
        decoder.start_utt()
        decoder.process_raw(pcm16.tobytes(), no_search=False, full_utt=True)
        decoder.end_utt()
        hypothesis = decoder.hyp()
    return normalize(hypothesis.hypstr) if hypothesis is not None else ""


def normalize(text: str) -> str:
    """Lower case, punctuation dropped (apostrophes kept), single spaces."""
    words = re.sub(r"[^a-z0-9' ]+", " ", text.lower()).split()
    return " ".join(w.strip("'") for w in words if w.strip("'"))


def word_error_rate(ref: str, hyp: str) -> float:
    """(substitutions + deletions + insertions) / reference words, after normalize()."""
    ref_words = normalize(ref).split()
    hyp_words = normalize(hyp).split()
    if not ref_words:
        return 0.0 if not hyp_words else 1.0
    previous = list(range(len(hyp_words) + 1))
    for i, ref_word in enumerate(ref_words, start=1):
        current = [i] + [0] * len(hyp_words)
        for j, hyp_word in enumerate(hyp_words, start=1):
            current[j] = min(
                previous[j] + 1,  # deletion
                current[j - 1] + 1,  # insertion
                previous[j - 1] + (ref_word != hyp_word),  # substitution or match
            )
        previous = current
    return previous[-1] / len(ref_words)
