"""A stream's alignment on the sim backend: every character of the text as sent, once, in
order, in the audio's clock, appended before the audio it describes."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from contextlib import aclosing

import pytest
from conftest import FAST_SIM, EngineFactory, until

from pipeline.alignment import Alignment, SpokenText
from pipeline.backend import SegmentTiming, TalkRequest, TalkStep
from pipeline.backends.sim import SimBackend, SimSegment, expected_frames, frames_for_text
from pipeline.config import TalkerConfig, TextConfig
from pipeline.stream import Stream
from pipeline.text import segment_options, split_text

FRAME_S = FAST_SIM.samples_per_frame / FAST_SIM.sample_rate_hz


async def read_checking(stream: Stream) -> float:
    """Read the stream; no character timed after a chunk arrived may start before that
    chunk's end (its timing came before the audio it describes). Returns the audio's
    length in seconds."""
    sent_s = 0.0
    seen: list[tuple[float, int]] = []  # (audio received, characters timed) at each chunk
    async with aclosing(stream.chunks()) as chunks:
        async for pcm in chunks:
            sent_s += len(pcm) / stream.sample_rate_hz
            seen.append((sent_s, len(stream.alignment.chars)))
    chars = stream.alignment.chars
    for received_s, timed in seen:
        late = [c for c in chars[timed:] if c.start_s < received_s - 1e-9]
        assert not late, f"timed after {received_s:.3f}s of audio was received: {late[:3]}"
    return sent_s


def check_alignment(alignment: Alignment, text: str, audio_s: float) -> None:
    """Every character once, in order, with its own character; times in the audio, in
    order; words are the text's runs of non-space characters, timed by their characters."""
    chars = alignment.chars
    assert [c.index for c in chars] == list(range(len(text)))
    assert "".join(c.char for c in chars) == text
    starts = [c.start_s for c in chars]
    assert starts == sorted(starts)
    assert all(c.start_s >= 0.0 and c.duration_s >= 0 for c in chars)
    assert all(c.end_s <= audio_s + 1e-9 for c in chars)
    words = [(w.word, w.start_index, w.end_index) for w in alignment.words]
    expected = []
    index = 0
    for word in text.split():
        index = text.index(word, index)
        expected.append((word, index, index + len(word)))
        index += len(word)
    assert words == expected
    for word in alignment.words:
        assert word.start_s == chars[word.start_index].start_s
        assert word.end_s == pytest.approx(chars[word.end_index - 1].end_s)


async def test_a_whole_text_is_timed_once_in_order_before_its_audio(
    make_engine: EngineFactory,
) -> None:
    engine = await make_engine()
    text = "Hello there, this is the sim voice.  Two spaces, then a second sentence!"
    stream = engine.submit(text, voice="sim")
    audio_s = await read_checking(stream)
    assert audio_s == pytest.approx(expected_frames(text) * FRAME_S)
    check_alignment(stream.alignment, text, audio_s)
    # the sim backend cannot time its characters: they are spread evenly over each
    # segment's frames, so the first sentence ends where its frames do
    first = expected_frames("Hello there, this is the sim voice.") * FRAME_S
    second_word = stream.alignment.words[7]
    assert second_word.word == "Two"
    assert second_word.start_s == pytest.approx(first, abs=FRAME_S)


async def test_live_text_gets_offsets_into_the_concatenated_text(
    make_engine: EngineFactory,
) -> None:
    """Pieces arrive while the stream talks (one mid-word): indices run on across them."""
    engine = await make_engine()
    pieces = ["The first piece. ", "And the sec", "ond one. ", "A third sentence", " ends here."]
    text = "".join(pieces)
    stream = engine.submit(pieces[0], voice="sim", final=False)
    reading = asyncio.create_task(read_checking(stream))
    for piece in pieces[1:-1]:
        await until(lambda: len(stream.alignment.chars) > 0)
        await asyncio.sleep(0.02)
        engine.append_text(stream.id, piece)
    engine.append_text(stream.id, pieces[-1], final=True)
    audio_s = await reading
    check_alignment(stream.alignment, text, audio_s)
    assert [w.word for w in stream.alignment.words][5:7] == ["second", "one."]


async def test_spoken_text_maps_back_to_the_span_it_stands_for(
    make_engine: EngineFactory,
) -> None:
    """A SpokenText's characters are timed as the client's characters they stand for."""
    engine = await make_engine()
    source = "It costs $3.50 now."
    spoken_words = ["It", "costs", "three dollars fifty", "now."]
    spans: list[tuple[int, int]] = []
    spoken = ""
    at = 0
    for word in source.split():
        start = source.index(word, at)
        at = start + len(word)
        said = spoken_words[len(spans) and source[:start].count(" ")]
        if spoken:
            spoken += " "
            spans.append((start - 1, start))
        spoken += said
        spans.extend(
            [(start, at)] * len(said)
            if said != word
            else [(start + i, start + i + 1) for i in range(len(word))]
        )
    text = SpokenText(spoken, source, tuple(spans))
    stream = engine.submit(text, voice="sim")
    audio_s = await read_checking(stream)
    check_alignment(stream.alignment, source, audio_s)
    money = [c for c in stream.alignment.chars if 9 <= c.index < 14]
    assert "".join(c.char for c in money) == "$3.50"
    # "three dollars fifty" is 19 of the 36 spoken characters: about half the audio
    span_s = money[-1].end_s - money[0].start_s
    assert 0.35 * audio_s < span_s < 0.65 * audio_s
    # spread evenly over the span's characters, each after the one before
    assert [c.duration_s for c in money] == pytest.approx([span_s / 5] * 5)


class TimedSim(SimBackend):
    """The sim backend, timing its characters itself: segment character k of n is heard
    over frames [k F / n, (k + 1) F / n) of the segment's F frames (or a broken timing)."""

    def __init__(self, *, broken: bool = False) -> None:
        super().__init__(FAST_SIM)
        self.broken = broken
        self._texts: dict[int, str] = {}

    def open_segment(self, request: TalkRequest) -> SimSegment:
        segment = super().open_segment(request)
        self._texts[id(segment)] = request.text
        return segment

    def step(self, segments: Sequence[SimSegment]) -> list[TalkStep]:
        steps = super().step(segments)
        out = []
        for segment, step in zip(segments, steps, strict=True):
            text = self._texts.pop(id(segment), None)
            timing = None
            if text is not None:
                frames = frames_for_text(text)
                n = len(text)
                starts = tuple(k * frames / n for k in range(n))
                ends = tuple((k + 1) * frames / n for k in range(n))
                timing = SegmentTiming(("x",) * n if self.broken else starts, ends)  # type: ignore[arg-type]
            out.append(TalkStep(step.frames, step.done, timing))
        return out


async def test_a_backend_timing_lands_at_its_segment_offset(make_engine: EngineFactory) -> None:
    """The engine turns segment frames into stream seconds exactly: each said character at
    (frames of the segments before + its frame in its segment) * seconds per frame."""
    talker = TalkerConfig(high_water_s=3600.0)
    engine = await make_engine(TimedSim(), talker=talker)
    text = "One two three. Four, five and six! Seven eight nine ten eleven twelve."
    stream = engine.submit(text, voice="sim")
    audio_s = await read_checking(stream)
    check_alignment(stream.alignment, text, audio_s)
    segments = split_text(text, **segment_options(TextConfig()))
    assert len(segments) >= 3
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
    said = [c.start_s for c in stream.alignment.chars if not c.char.isspace()]
    assert said == pytest.approx(expected, abs=1e-9)


async def test_a_broken_timing_stops_the_alignment_not_the_audio(
    make_engine: EngineFactory, caplog: pytest.LogCaptureFixture
) -> None:
    engine = await make_engine(TimedSim(broken=True))
    text = "One two three. Four five six."
    stream = engine.submit(text, voice="sim")
    audio_s = await read_checking(stream)
    assert audio_s == pytest.approx(expected_frames(text) * FRAME_S)
    assert len(stream.alignment.chars) < len(text)
    assert "alignment stops here" in caplog.text
