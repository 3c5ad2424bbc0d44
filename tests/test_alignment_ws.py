"""WS /v1/audio/speech/stream's alignment events (opt-in): the utterance's text as sent,
every character once, in order, each event before the audio it describes (sim backend)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from api_support import LiveServer, live_server, sim_settings
from ws_client import WsClient, connect, speak

CONFIG = {"voice": "sim", "response_format": "pcm", "alignment": True}
PIECES = ["It costs $3.", "50 now,  said Dr. Smith. ", "In 1995 we had ", "23 cats 🐱. "]
TEXT = "".join(PIECES)
RATE_HZ = 24000  # the session's output rate (pcm, s16le)


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    with live_server(sim_settings()) as live:
        yield live


def received(client: WsClient, utterance: int) -> list[tuple[dict[str, Any] | None, float]]:
    """(event or None for audio, ms of the utterance's audio received before it)."""
    out = []
    audio_ms = 0.0
    current = None
    for arrival in client.arrivals:
        event = arrival.event
        if event is not None and event["type"] == "audio.start":
            current = event["utterance"]
        if event is None:
            if current == utterance:
                audio_ms += arrival.size / 2 / RATE_HZ * 1000.0
            continue
        if event.get("utterance") == utterance:
            out.append((event, audio_ms))
    return out


async def test_alignment_events_cover_the_text_as_sent_before_its_audio(
    server: LiveServer,
) -> None:
    async with connect(server.base_url, config=CONFIG) as client:
        done = await speak(client, *PIECES)
    events = [(e, before) for e, before in received(client, 0) if e["type"] == "alignment"]
    assert events
    chars: list[str] = []
    starts: list[float] = []
    for event, audio_before_ms in events:
        assert event["start_index"] == len(chars) or not event["chars"]
        assert len(event["chars"]) == len(event["char_start_ms"]) == len(event["char_duration_ms"])
        # sent before the audio it describes: nothing in it starts in audio already sent
        assert all(start >= audio_before_ms - 0.1 for start in event["char_start_ms"])
        chars.extend(event["chars"])
        starts.extend(event["char_start_ms"])
    assert "".join(chars) == TEXT  # the text as sent: "$3.50", the emoji, both spaces
    assert starts == sorted(starts)
    assert all(0 <= start <= done["audio_ms"] for start in starts)
    words = [w for event, _ in events for w in event["words"]]
    assert [w["word"] for w in words] == TEXT.split()
    for word in words:
        assert TEXT[word["start_index"] : word["end_index"]] == word["word"]
        assert word["start_ms"] <= word["end_ms"] <= done["audio_ms"] + 0.1
    money = next(w for w in words if w["word"] == "$3.50")
    # the span's time is spread evenly over its five characters
    durations = [
        d
        for event, _ in events
        for i, d in enumerate(event["char_duration_ms"])
        if money["start_index"] <= event["start_index"] + i < money["end_index"]
    ]
    span_ms = money["end_ms"] - money["start_ms"]
    assert durations == pytest.approx([span_ms / 5] * 5, abs=0.2)
    # "three dollars and fifty cents": the longest stretch of the first sentence's audio
    others = [w["end_ms"] - w["start_ms"] for w in words[:8] if w is not money]
    assert money["end_ms"] - money["start_ms"] > max(others)
    # the first alignment event comes after audio.start and before the first audio
    kinds = [e["type"] for e, _ in received(client, 0)]
    assert kinds.index("audio.start") < kinds.index("alignment")
    assert events[0][1] == 0.0


async def test_no_alignment_events_unless_asked(server: LiveServer) -> None:
    async with connect(server.base_url, config={**CONFIG, "alignment": False}) as client:
        await speak(client, "Nothing extra here. ")
    assert client.events("alignment") == []


async def test_a_bad_alignment_flag_is_refused(server: LiveServer) -> None:
    async with connect(server.base_url, config={**CONFIG, "alignment": "yes"}) as client:
        error = (await client.until("error")).event
    assert error["error"]["param"] == "alignment"
