"""What the socket does to the schedule (sim backend, live server): playback.position acks
move vocoder turns between players, and cancel stops an utterance within one chunk.

Each ack test compares a run with acks against the same run without, so it fails when
acks change nothing. The sim's vocoder sleeps its set cost, so the runs are alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from api_support import expected_audio_s, live_server, sim_settings
from ws_client import WsClient, connect, speak

CONFIG = {"voice": "sim", "response_format": "pcm"}
LONG = "This sentence is one of many in a long answer that keeps the vocoder busy. " * 12
SAMPLES_PER_MS = 24  # pcm at 24 kHz, s16le: 48 bytes per ms
CHUNK_FRAMES = 8  # chunking.chunk_frames of the sim settings
FRAME_SAMPLES = 1920


def _settings(vocoder_per_frame_ms: float, *extra: str):  # type: ignore[no-untyped-def]
    return sim_settings(
        "admission.enabled=false",
        "scheduling.active_stream_window=1",
        f"sim.vocoder_per_frame_ms={vocoder_per_frame_ms}",
        *extra,
    )


def _received_ms(client: WsClient) -> float:
    return len(client.audio.get(0, b"")) / 2 / SAMPLES_PER_MS


async def _drain(client: WsClient, stop: asyncio.Event) -> None:
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await client.receive(timeout_s=0.05)


# the runs without acks, by vocoder cost: two tests compare against the one at 15 ms, run once
_PLAIN: dict[float, tuple[float, float]] = {}


async def _plain_audio_ms(vocoder_per_frame_ms: float) -> tuple[float, float]:
    if vocoder_per_frame_ms not in _PLAIN:
        _PLAIN[vocoder_per_frame_ms] = await _subject_audio_ms("none", vocoder_per_frame_ms)
    return _PLAIN[vocoder_per_frame_ms]


async def _subject_audio_ms(mode: str, vocoder_per_frame_ms: float) -> tuple[float, float]:
    """Three listeners speak LONG at once; the subject's player acks per `mode`:
    "none" (no acks), "paused" (played_ms stays 0 from its first audio) or "behind" (from
    `warmup_s` on, its buffer is empty: it has played all it received). Returns the audio
    the subject and the others (mean) received in the window after `warmup_s`, in ms."""
    warmup_s, window_s = 1.0, 3.0  # a window of several chunks per player
    with live_server(_settings(vocoder_per_frame_ms)) as live:
        async with (
            connect(live.base_url, config=CONFIG) as subject,
            connect(live.base_url, config=CONFIG) as other1,
            connect(live.base_url, config=CONFIG) as other2,
        ):
            clients = (subject, other1, other2)
            for client in clients:
                await client.send("input.text", text=LONG)
                await client.send("input.done")
            stop = asyncio.Event()
            drains = [asyncio.create_task(_drain(c, stop)) for c in clients]
            started_s = time.monotonic()
            at_window: list[float] = []
            while True:
                elapsed_s = time.monotonic() - started_s
                if not at_window and elapsed_s >= warmup_s:
                    at_window = [_received_ms(c) for c in clients]
                if elapsed_s >= warmup_s + window_s:
                    break
                if subject.current is not None:
                    if mode == "paused":
                        await subject.send("playback.position", played_ms=0, utterance=0)
                    elif mode == "behind" and elapsed_s >= warmup_s:
                        played_ms = _received_ms(subject)
                        await subject.send("playback.position", played_ms=played_ms, utterance=0)
                await asyncio.sleep(0.1)
            gained = [
                _received_ms(c) - before for c, before in zip(clients, at_window, strict=True)
            ]
            stop.set()
            await asyncio.gather(*drains)
            for client in clients:
                await client.send("cancel")
    return gained[0], (gained[1] + gained[2]) / 2


@pytest.mark.parametrize(
    ("vocoder_per_frame_ms", "load"),
    [(35.0, "overload: capacity ~2.3 streams for 3"), (15.0, "busy: capacity ~5 streams for 3")],
)
async def test_a_paused_player_gets_fewer_vocoder_turns(
    vocoder_per_frame_ms: float, load: str
) -> None:
    plain, plain_others = await _plain_audio_ms(vocoder_per_frame_ms)
    paused, paused_others = await _subject_audio_ms("paused", vocoder_per_frame_ms)
    print(
        f"\n{load}: paused player {paused:.0f} ms vs {plain:.0f} ms without acks; "
        f"the others {paused_others:.0f} vs {plain_others:.0f} ms"
    )
    assert plain > 0
    assert paused < 0.5 * plain
    assert paused_others > plain_others  # the turns it gave up went to the others


async def test_a_player_behind_the_estimate_gets_turns_sooner() -> None:
    # The vocoder is busy building every player's buffer ahead of playback; a player that
    # reports an empty buffer (it played all it got) is served before the others.
    plain, plain_others = await _plain_audio_ms(15.0)
    behind, behind_others = await _subject_audio_ms("behind", 15.0)
    print(
        f"\nbehind player {behind:.0f} ms vs {plain:.0f} ms without acks; "
        f"the others {behind_others:.0f} vs {plain_others:.0f} ms"
    )
    # one chunk is 640 ms: without acks the three players differ by a chunk or so in 3 s
    assert behind > 1.3 * plain
    assert behind_others < plain_others


async def test_cancel_stops_within_one_chunk_and_the_next_utterance_follows() -> None:
    # The vocoder makes a 640 ms chunk in ~320 ms: audio flows, and piles up nowhere.
    with live_server(_settings(40.0)) as live:
        async with connect(live.base_url, config=CONFIG) as client:
            await client.send("input.text", text=LONG)
            await client.send("input.done")
            while len(client.audio.get(0, b"")) < 3 * CHUNK_FRAMES * FRAME_SAMPLES * 2:
                await client.receive()
            before = len(client.audio[0])
            cancelled_at_s = await client.send("cancel")
            done = await client.until("audio.done")
            after = len(client.audio[0]) - before
            print(
                f"\ncancel -> audio.done {1000 * (done.at_s - cancelled_at_s):.1f} ms, "
                f"{after} bytes after the cancel"
            )
            assert done.event == {
                "type": "audio.done",
                "utterance": 0,
                "audio_ms": pytest.approx(len(client.audio[0]) / 2 / SAMPLES_PER_MS, abs=0.1),
                "cancelled": True,
            }
            assert after <= CHUNK_FRAMES * FRAME_SAMPLES * 2  # at most the chunk in flight
            engine = live.app.state.playhead.engine
            assert engine.stats().active_streams == 0  # text, frames and state dropped
            # The next utterance does not wait for the cancelled one's queued work.
            done = await speak(client, "Next one. ")
            assert done["utterance"] == 1 and "cancelled" not in done
            assert client.pcm(1).size / 24000 == pytest.approx(
                expected_audio_s(live.settings, "Next one. "), abs=1e-3
            )
            # No audio of the cancelled utterance came after its audio.done.
            kinds = [a.event["type"] if a.event else "audio" for a in client.arrivals]
            first_done = kinds.index("audio.done")
            assert kinds[first_done + 1] == "audio.start"
        assert len(client.audio[0]) < 0.5 * 2 * 24000 * expected_audio_s(live.settings, LONG)
