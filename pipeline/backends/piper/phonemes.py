"""Text to Piper phoneme ids, through piper's bundled espeak-ng bridge (no system espeak)."""

from __future__ import annotations

import threading
import unicodedata

from pipeline.backends.piper.voices import VoiceSpec

# espeak-ng keeps global state (the current voice): one caller at a time in this process.
_ESPEAK_LOCK = threading.Lock()
_espeak = None

BOS, EOS, PAD = "^", "$", "_"


def _espeak_phonemizer():  # -> piper.phonemize_espeak.EspeakPhonemizer
    global _espeak
    if _espeak is None:
        from piper.phonemize_espeak import EspeakPhonemizer

        _espeak = EspeakPhonemizer()  # piper's bundled espeak-ng-data
    return _espeak


def phonemize(voice: VoiceSpec, text: str) -> list[str]:
    """The phonemes of `text`, sentences joined by a space (one talker call per segment)."""
    if voice.phoneme_type == "text":
        return list(unicodedata.normalize("NFD", text))
    with _ESPEAK_LOCK:
        sentences = _espeak_phonemizer().phonemize(
            voice.espeak_voice, text, vowel_clusters=voice.vowel_clusters
        )
    phonemes: list[str] = []
    for sentence in sentences:
        if not sentence:
            continue
        if phonemes and phonemes[-1] != " ":
            phonemes.append(" ")
        phonemes.extend(sentence)
    return phonemes


def phonemes_to_ids(voice: VoiceSpec, phonemes: list[str]) -> list[int]:
    """Piper's id layout: BOS PAD (phoneme PAD)* EOS; phonemes missing from the map are dropped."""
    return phonemes_to_owned_ids(voice, phonemes)[0]


def phonemes_to_owned_ids(voice: VoiceSpec, phonemes: list[str]) -> tuple[list[int], list[int]]:
    """`phonemes_to_ids`, and for each id the index in `phonemes` of the phoneme it
    sounds: a phoneme's own ids and the PAD before it (the way into it) are its; BOS, the
    last PAD and EOS belong to none (-1). (Giving each phoneme the PAD after it instead
    put word starts 20 ms later against a recogniser's, tests/test_alignment_piper.py.)"""
    id_map = voice.phoneme_id_map
    pad = id_map.get(PAD, ())
    bos = id_map.get(BOS, ())
    ids: list[int] = [*bos, *pad]
    owners = [-1] * len(bos)
    pending = len(pad)  # PAD ids waiting for the phoneme after them
    for index, phoneme in enumerate(phonemes):
        mapped = id_map.get(phoneme)
        if mapped is None:
            continue
        ids.extend(mapped)
        ids.extend(pad)
        owners.extend([index] * (pending + len(mapped)))
        pending = len(pad)
    owners.extend([-1] * pending)
    eos = id_map.get(EOS, ())
    ids.extend(eos)
    owners.extend([-1] * len(eos))
    return ids, owners


def text_to_ids(voice: VoiceSpec, text: str) -> list[int]:
    """Phoneme ids for one segment; [] when the text has nothing to say."""
    return text_to_phoneme_ids(voice, text)[0]


def text_to_phoneme_ids(voice: VoiceSpec, text: str) -> tuple[list[int], list[str], list[int]]:
    """(ids, phonemes, owner of each id: `phonemes_to_owned_ids`) for one segment; no
    ids when the text has nothing to say."""
    phonemes = phonemize(voice, text)
    if not any(p in voice.phoneme_id_map and p not in (" ", PAD) for p in phonemes):
        return [], phonemes, []
    ids, owners = phonemes_to_owned_ids(voice, phonemes)
    return ids, phonemes, owners
