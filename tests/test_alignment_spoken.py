"""A stream's spoken alignment (`Alignment.spoken`, ElevenLabs' normalizedAlignment): every
character of the text the voice says (the engine's, normalised), once, in order, each at
its own time, next to the client's alignment, which it leaves as it was."""

from __future__ import annotations

import asyncio
from contextlib import aclosing

import pytest
from conftest import EngineFactory
from test_alignment import FRAME_S, TimedSim, check_alignment, read_checking

from pipeline.alignment import Alignment, CharTiming
from pipeline.backends.sim import frames_for_text
from pipeline.config import TalkerConfig, TextConfig
from pipeline.normalize import StreamNormalizer, normalize_mapped, normalizer_for
from pipeline.stream import Stream
from pipeline.text import segment_options, split_text

WRITTEN = "It costs $3.50 now. Call me at 10 tomorrow, or on 5/6."


def check_spoken(alignment: Alignment, spoken: str, audio_s: float) -> list[CharTiming]:
    """Every spoken character once, in order, its own character; starts never decrease,
    every character within the audio."""
    said = alignment.spoken
    assert [c.index for c in said] == list(range(len(spoken)))
    assert "".join(c.char for c in said) == spoken
    starts = [c.start_s for c in said]
    assert starts == sorted(starts)
    assert all(c.start_s >= 0.0 and c.duration_s >= 0.0 for c in said)
    assert all(c.end_s <= audio_s + 1e-9 for c in said)
    return said


async def read_spoken_checking(stream: Stream) -> float:
    """Read the stream; no spoken character timed after a chunk arrived starts before that
    chunk's end (its timing came before the audio it describes)."""
    sent_s = 0.0
    seen: list[tuple[float, int]] = []
    async with aclosing(stream.chunks()) as chunks:
        async for pcm in chunks:
            sent_s += len(pcm) / stream.sample_rate_hz
            seen.append((sent_s, len(stream.alignment.spoken)))
    said = stream.alignment.spoken
    for received_s, timed in seen:
        late = [c for c in said[timed:] if c.start_s < received_s - 1e-9]
        assert not late, f"timed after {received_s:.3f}s of audio was received: {late[:3]}"
    return sent_s


async def test_normalised_text_is_timed_as_spoken_and_the_client_text_as_sent(
    make_engine: EngineFactory,
) -> None:
    engine = await make_engine()
    spoken = normalize_mapped(WRITTEN, "en_US")
    assert "three dollars" in spoken and "ten" in spoken and "$" not in spoken
    stream = engine.submit(spoken, voice="sim")
    audio_s = await read_checking(stream)
    check_alignment(stream.alignment, WRITTEN, audio_s)  # the client's text, unchanged
    said = check_spoken(stream.alignment, str(spoken), audio_s)
    # each spoken word at its own time: "three", "dollars", "fifty" one after the other,
    # all within the time the client's alignment gives "$3.50"
    at = {word: said[str(spoken).index(word)].start_s for word in ("three", "dollars", "fifty")}
    assert at["three"] < at["dollars"] < at["fifty"]
    money = [c for c in stream.alignment.chars if 9 <= c.index < 14]
    assert "".join(c.char for c in money) == "$3.50"
    assert money[0].start_s == pytest.approx(at["three"])
    assert at["fifty"] < money[-1].end_s


async def test_each_spoken_character_gets_its_own_backend_time(
    make_engine: EngineFactory,
) -> None:
    """With the backend's timing, a spoken character starts exactly where its segment
    character does (the client's "10" gets the spread of "ten" instead)."""
    talker = TalkerConfig(high_water_s=3600.0)
    engine = await make_engine(TimedSim(), talker=talker)
    spoken = normalize_mapped("Call me at 10 now. It is 3 and 4 and 5!", "en_US")
    stream = engine.submit(spoken, voice="sim")
    audio_s = await read_checking(stream)
    said = check_spoken(stream.alignment, str(spoken), audio_s)
    segments = split_text(str(spoken), **segment_options(TextConfig()))
    expected: list[float] = []
    offset = 0
    for segment in segments:
        frames = frames_for_text(segment)
        expected += [
            (offset + k * frames / len(segment)) * FRAME_S
            for k, char in enumerate(segment)
            if not char.isspace()
        ]
        offset += frames
    assert [c.start_s for c in said if not c.char.isspace()] == pytest.approx(expected, abs=1e-9)
    # a space between two words: from the end of the one before to the start of the next
    for before, space, after in zip(said, said[1:], said[2:], strict=False):
        if space.char == " " and not before.char.isspace() and not after.char.isspace():
            assert space.start_s == pytest.approx(min(before.end_s, after.start_s))
            assert space.end_s == pytest.approx(after.start_s)


async def test_live_pieces_are_timed_in_the_concatenated_spoken_text(
    make_engine: EngineFactory,
) -> None:
    """Text arriving in pieces through the stream normaliser (as the sockets send it):
    the spoken alignment indexes the concatenation of the pieces the engine was given."""
    engine = await make_engine()
    rules = normalizer_for("en_US")
    assert rules is not None
    normalizer = StreamNormalizer(rules)
    written = ["It costs $", "3.50 now. Call me ", "at 10 tomorrow", ", please."]
    pieces = [normalizer.push(piece) for piece in written] + [normalizer.flush()]
    spoken = "".join(str(p) for p in pieces)
    assert "three dollars and fifty cents" in spoken
    stream = engine.submit(pieces[0], voice="sim", final=False)
    reading = asyncio.create_task(read_spoken_checking(stream))
    for piece in pieces[1:-1]:
        await asyncio.sleep(0.01)
        engine.append_text(stream.id, piece)
    engine.append_text(stream.id, pieces[-1], final=True)
    audio_s = await reading
    check_spoken(stream.alignment, spoken, audio_s)
    check_alignment(stream.alignment, "".join(written), audio_s)


async def test_plain_text_is_its_own_spoken_text(make_engine: EngineFactory) -> None:
    engine = await make_engine()
    text = "No numbers here.  Two spaces, then a second sentence!"
    stream = engine.submit(text, voice="sim")
    audio_s = await read_spoken_checking(stream)
    said = check_spoken(stream.alignment, text, audio_s)
    # each character said at the time the client's alignment gives it (each stands for
    # itself, and the even spread never overlaps two characters)
    client = [c for c in stream.alignment.chars if not c.char.isspace()]
    mine = [c for c in said if not c.char.isspace()]
    assert [c.char for c in mine] == [c.char for c in client]
    assert [c.start_s for c in mine] == pytest.approx([c.start_s for c in client], abs=1e-9)
    assert [c.end_s for c in mine] == pytest.approx([c.end_s for c in client], abs=1e-9)
