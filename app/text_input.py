"""The text every protocol takes in, read the same way (one front door for input).

Each adapter (OpenAI's route, ElevenLabs', Cartesia's, Wyoming's) refuses bad text in its
own protocol's shape, but what counts as bad and what is done to good text is decided here:
NUL is not text (refused); the other control characters (a form feed, a bell) separate
words like a space; normalisation (numbers, dates, symbols -> words, by the voice's
language: pipeline/normalize) keeps its map back to the text as sent, so a stream's
timings index what the client wrote, and a long text is normalised off the event loop
(~10 us a character; the loop runs the engine's loops too).
"""

from __future__ import annotations

import re
from functools import partial

import anyio

from pipeline.alignment import SpokenText
from pipeline.config import NormalizeConfig
from pipeline.normalize import normalize_mapped

INLINE_NORMALIZE_MAX_CHARS = 100  # longer texts are normalised in a worker thread
# control characters other than tab, newline and carriage return (NUL is refused)
CONTROL_CHARACTERS = re.compile("[\x01-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def has_nul(text: str) -> bool:
    return "\x00" in text


def words_apart(text: str) -> str:
    """`text` with its control characters (but tab, newline, return) turned into spaces."""
    return CONTROL_CHARACTERS.sub(" ", text)


async def normalized(text: str, language: str, config: NormalizeConfig | None) -> SpokenText:
    """`text` as the voice will say it, with its map to `text` (pipeline/alignment.py)."""
    work = partial(normalize_mapped, text, language, config)
    if len(text) <= INLINE_NORMALIZE_MAX_CHARS:
        return work()
    return await anyio.to_thread.run_sync(work)
