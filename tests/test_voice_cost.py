"""Voices of different costs in one server (scheduling/voice_cost.py): admission sums the
work owed in machine time, each stream counting its backend's cost against the reference
voice's, and the calibration measures each backend's cost. Fakes: two sim backends of
different vocoder costs behind one MultiBackend (the decision code is the server's)."""

from __future__ import annotations

import asyncio
import math
from dataclasses import replace

import pytest
from conftest import FAST_SIM, EngineFactory, read_all
from test_multi_backend import RenamedSim

from pipeline.backends.multi import MultiBackend
from pipeline.backends.sim import VOICE_ID, SimBackend
from pipeline.config import EngineConfig
from pipeline.errors import Rejected
from scheduling import Admission, AdmissionConfig, LoadView, StreamLoad
from scheduling.voice_cost import VoiceCosts

DEAR = "dear-sim"


def admission(**kw: object) -> Admission:
    return Admission(AdmissionConfig(capacity_headroom=1.0, **kw))  # type: ignore[arg-type]


# The pure policy.


def test_a_dear_stream_counts_its_cost_in_the_load() -> None:
    a = admission(start_cost=0.0)
    cheap = [StreamLoad(10.0) for _ in range(4)]
    dear = [StreamLoad(10.0, cost=4.0)]
    assert a.load_units(LoadView(10.0, cheap)) == pytest.approx(4.0)
    assert a.load_units(LoadView(10.0, dear)) == pytest.approx(4.0)
    assert a.load_units(LoadView(10.0, [*cheap, *dear])) == pytest.approx(8.0)
    # starting: the start's extra is the reference's, whatever the voice
    starting = Admission(AdmissionConfig(capacity_headroom=1.0, start_cost=1.0))
    assert starting.load_units(LoadView(10.0, [StreamLoad(10.0, 1.0, cost=4.0)])) == 5.0
    assert starting.load_units(LoadView(10.0, [], granted=2, granted_cost=8.0)) == 10.0


def test_under_overload_a_cheap_request_fits_where_a_dear_one_does_not() -> None:
    a = admission(start_cost=0.0)
    # 7 of 10 reference streams taken by a mix: 3 cheap + 1 dear (cost 4)
    loads = [StreamLoad(10.0), StreamLoad(10.0), StreamLoad(10.0), StreamLoad(10.0, cost=4.0)]
    assert a.fits(LoadView(10.0, loads, new_stream_cost=1.0))
    assert a.fits(LoadView(10.0, loads, new_stream_cost=3.0))
    assert not a.fits(LoadView(10.0, loads, new_stream_cost=4.0))
    refused = a.offer(0.0, "dear", LoadView(10.0, loads, new_stream_cost=4.0), wait=False)
    assert not refused.accept and refused.reason == "capacity"
    # counted in audio seconds (every cost 1) the dear one would have been let in
    flat = [replace(load, cost=1.0) for load in loads]
    assert a.fits(LoadView(10.0, flat, new_stream_cost=1.0, granted=0))


def test_granted_tickets_count_their_costs() -> None:
    a = admission(start_cost=0.0)
    view = LoadView(10.0, [StreamLoad(10.0)], granted=2, granted_cost=8.0)
    assert a.load_units(view) == pytest.approx(9.0)
    assert a.fits(view) and not a.fits(replace(view, new_stream_cost=2.0))
    assert a.fits(replace(view, granted_cost=None, new_stream_cost=2.0))  # 1 + 2 + 2


def test_the_queue_grants_in_order_each_waiter_at_its_cost() -> None:
    a = admission(start_cost=0.0, queue_max_wait_s=10.0, first_audio_bound_s=0.0)
    full = LoadView(4.0, [StreamLoad(1.0, cost=4.0)], new_stream_audio_s=1.0)
    assert a.offer(0.0, "dear", replace(full, new_stream_cost=3.0)).queued
    assert a.offer(0.0, "cheap", replace(full, new_stream_cost=1.0)).queued
    # 2 reference streams free: the dear head (3) does not fit, and the cheap one behind
    # it waits its turn (first come, first served)
    half = LoadView(4.0, [StreamLoad(1.0, cost=2.0)])
    assert a.grant(half) == []
    # all free: the dear one (3) and then the cheap one (1) fit together in 4
    assert a.grant(LoadView(4.0, [])) == ["dear", "cheap"]
    assert a.waiting == 0


def test_the_predicted_wait_runs_a_dear_stream_at_its_cost() -> None:
    a = admission(start_cost=0.0)
    # capacity 1 reference stream, one stream owing 2 s: cost 1 ends after 2 s, cost 3 after 6
    for cost, wait_s in ((1.0, 2.0), (3.0, 6.0)):
        view = LoadView(1.0, [StreamLoad(2.0, cost=cost)], new_stream_audio_s=2.0)
        assert a.predict_wait_s(view) == pytest.approx(wait_s)


def test_voice_costs_from_each_backends_capacity() -> None:
    costs = VoiceCosts({"en": "piper", "ja-1": "kokoro", "ja-2": "kokoro"}, "piper")
    assert costs.groups == ["kokoro", "piper"]  # the reference last
    assert costs.cost("ja-1") == costs.most == 1.0  # before a calibration
    costs.set_capacities({"piper": 30.0, "kokoro": 3.0})
    assert costs.cost("ja-2") == pytest.approx(10.0) and costs.cost("en") == 1.0
    assert costs.capacities(30.0) == pytest.approx({"piper": 30.0, "kokoro": 3.0})
    costs.set_capacities({"kokoro": 5.0})  # no reference reading: nothing changes
    assert costs.cost("ja-1") == pytest.approx(10.0)
    with pytest.raises(ValueError, match="reference"):
        VoiceCosts({"en": "piper"}, "kokoro")


# The engine: two sim backends, one ~4x the other's vocoder cost per audio second.


def two_costs() -> MultiBackend:
    cheap = SimBackend(replace(FAST_SIM, vocoder_base_ms=0.5, vocoder_per_frame_ms=0.5))
    dear_config = replace(FAST_SIM, vocoder_base_ms=2.0, vocoder_per_frame_ms=2.0)
    dear = RenamedSim(DEAR, dear_config)
    return MultiBackend([cheap, dear])


CALIBRATE = EngineConfig(calibration_calls=12, recalibrate_idle_s=0)


async def test_the_calibration_measures_each_backends_cost(make_engine: EngineFactory) -> None:
    engine = await make_engine(two_costs(), window=1, engine=CALIBRATE)
    costs = engine.voice_costs
    assert costs.reference == "sim-0" and costs.groups == ["sim-1", "sim-0"]
    assert costs.cost(VOICE_ID) == 1.0
    # a frame costs 4x (2 against 0.5 ms, the base too): the cost reads ~4
    assert 2.5 < costs.cost(DEAR) < 6.0, costs.cost(DEAR)
    assert engine.calibrated_capacity > 0


async def admitted(engine, voice: str) -> int:
    """Reservations granted at once for `voice` before the first refusal (none released)."""
    granted = []
    try:
        for _ in range(500):
            reservation = engine.reserve(voice)
            if reservation.queued:
                reservation.release()
                break
            granted.append(reservation)
    except Rejected:
        pass
    for reservation in granted:
        reservation.release()
    return len(granted)


async def test_overload_admits_dear_voices_at_their_cost(make_engine: EngineFactory) -> None:
    engine = await make_engine(
        two_costs(),
        window=1,
        engine=CALIBRATE,
        admission=AdmissionConfig(start_cost=0.0, queue_max_wait_s=0.0),
    )
    cost = engine.voice_cost(DEAR)
    cheap, dear = await admitted(engine, VOICE_ID), await admitted(engine, DEAR)
    capacity = engine.capacity() * 0.95  # the headroom
    assert cheap == math.floor(capacity + 1e-9)
    assert dear == max(1, math.floor(capacity / cost + 1e-9))
    assert cheap >= 2 * dear  # a dear burst is refused long before a cheap one would be
    # a voice the engine does not know is counted at the dearest cost
    assert engine.voice_cost("nobody") == pytest.approx(cost)
    # a mix: one dear stream granted leaves room for `capacity - cost` cheap ones
    held = engine.reserve(DEAR)
    assert await admitted(engine, VOICE_ID) == math.floor(capacity - cost + 1e-9)
    held.release()


async def test_the_capacity_stays_in_reference_streams_under_a_dear_load(
    make_engine: EngineFactory,
) -> None:
    """The stages record a dear voice's audio at its cost: saturated by dear streams
    alone, the capacity still reads the reference voice's streams, not a quarter of it."""
    engine = await make_engine(two_costs(), window=1, engine=CALIBRATE)
    calibrated = engine.calibrated_capacity
    text = "A long sentence for the dear voice to say, again and again. " * 4
    streams = [engine.submit(text, voice=DEAR) for _ in range(6)]
    await asyncio.gather(*(read_all(stream) for stream in streams))
    assert engine.vocoder.rate.measured
    assert 0.5 * calibrated < engine.capacity() < 2.0 * calibrated, (
        engine.capacity(),
        calibrated,
    )


async def test_a_request_reserved_before_its_voice_is_decided_again_at_its_cost(
    make_engine: EngineFactory,
) -> None:
    """The OpenAI route reserves before it reads the body (voice None: the default
    voice's cost); a dearer voice's stream is decided again at submit, at its cost."""
    engine = await make_engine(
        two_costs(),
        window=1,
        engine=CALIBRATE,
        admission=AdmissionConfig(start_cost=0.0, queue_max_wait_s=0.0),
    )
    capacity = engine.capacity() * 0.95
    cost = engine.voice_cost(DEAR)
    assert cost > 2
    # hold all but 2 reference streams' room: a cheap request fits, a dear one does not
    held = [engine.reserve(VOICE_ID) for _ in range(math.floor(capacity) - 2)]
    cheap = engine.reserve()
    assert not cheap.queued
    engine.cancel(engine.submit("Cheap enough.", voice=VOICE_ID, reservation=cheap).id)
    dear = engine.reserve()
    assert not dear.queued and dear.granted
    with pytest.raises(Rejected):
        engine.submit("Too dear for the room left.", voice=DEAR, reservation=dear)
    assert not dear.granted  # used up: its room is given back
    for reservation in held:
        reservation.release()
    assert engine.admission.granted == 0
