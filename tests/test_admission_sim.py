"""Admission in virtual time (benchmarks/simulate.py runs the engine's own policy and
queue, scheduling/admission.py) on configs/sim.yaml: what the issue "Admission you can
trust" asks of it under load, decided in a second of wall time."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from app.settings import Settings, load_settings
from benchmarks.simulate import Scenario, SimResult, simulate

SIM_YAML = Path(__file__).resolve().parent.parent / "configs" / "sim.yaml"
# ~9.4 s of audio on the sim backend
TEN_SECONDS = "The quick brown fox jumps over the lazy dog near the quiet river bank. " * 2


@cache
def sim_yaml() -> Settings:
    return load_settings(str(SIM_YAML), [], environ={})


def run(streams: int, clients: int, texts: list[str] | None = None, **fields: object) -> SimResult:
    s = sim_yaml()
    scenario = Scenario(
        label="admission",
        streams=streams,
        clients=clients,
        scheduling=s.scheduling,
        chunking=s.chunking,
        admission=s.admission,
        talker=s.talker,
        sim=s.sim,
        engine=s.engine,
        after_playback=False,  # the next request once the last byte is read
        **fields,  # type: ignore[arg-type]
    )
    return simulate(scenario, texts)


def test_a_sequential_client_is_never_refused_by_its_own_finished_requests() -> None:
    """One client, 50 requests of ~10 s audio, each read to its last byte (far faster
    than it plays) before the next: a finished stream owes no work, so no 429."""
    result = run(50, 1, [TEN_SECONDS], warmup_s=0.0)
    summary = result.summary
    assert summary.audio_s / 50 > 9.0
    assert (summary.streams_ok, summary.rejected) == (50, 0)


def test_twice_the_capacity_is_refused_cleanly_and_the_capacity_stays_used() -> None:
    """2 C closed-loop clients (retrying after Retry-After): the admitted streams play
    without a stall, the capacity is used (audio out per second ~ C), a first audio
    comes within the queue bound and a ramp, and every refusal names a Retry-After."""
    result = run(200, 18, warmup_s=10.0)
    summary = result.summary
    capacity = result.capacity_audio_s_per_s
    assert 18 / capacity > 1.9
    assert summary.stall_free_share == 1.0 and summary.interruptions == 0
    assert summary.xrt / capacity > 0.95
    bound_ms = sim_yaml().admission.queue_max_wait_s * 1000
    assert summary.ttfa_p99_ms is not None and summary.ttfa_p99_ms < bound_ms + 1000
    assert summary.rejected > 0 and min(summary.retry_after_s) >= 1


async def test_a_sequential_http_client_gets_50_x_200_on_sim_yaml() -> None:
    """The same over HTTP, on configs/sim.yaml calibrated at start-up, its costs scaled
    down 10x (a fraction of a minute) and admission.max_streams=3 (so that, as on the
    unscaled sim, streams whose players still play would fill the slots if they were
    counted): 50 requests of ~10 s audio, each read to its end before the next, all 200."""
    from api_support import asgi_client, speech_body

    scaled = (
        "sim.vocoder_base_ms=0.4",
        "sim.vocoder_per_frame_ms=0.9",
        "sim.talker_step_base_ms=0.1",
        "sim.talker_step_per_stream_ms=0.02",
        "admission.max_streams=3",
    )
    settings = load_settings(str(SIM_YAML), list(scaled), environ={})
    statuses: list[int] = []
    audio_bytes: list[int] = []
    async with asgi_client(settings) as client:
        engine = client.app.state.playhead.engine
        assert engine.calibrated_capacity > 0
        body = speech_body(TEN_SECONDS, response_format="pcm")
        for _ in range(50):
            response = await client.post("/v1/audio/speech", json=body)
            statuses.append(response.status_code)
            audio_bytes.append(len(response.content))
    assert statuses == [200] * 50
    assert min(audio_bytes) / 2 / 24000 > 9.0  # ~10 s of 16-bit audio each
