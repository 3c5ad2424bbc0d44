"""The discrete-event simulator: small runs of the engine's own stream book, scheduling code
and sim backend in virtual time, checked against physics (the bound), against what each
policy is for, and against the sim backend's costs (tests/test_engine_vs_simulator.py
checks it decides as the engine does)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from benchmarks.loadgen import load_corpus
from benchmarks.sim_run import simulate
from benchmarks.sim_scenario import (
    DEFAULT_SIM,
    DEFAULT_TEXT,
    DEFAULT_WINDOW,
    Scenario,
    SimResult,
    mean_audio_s,
    prepare_texts,
    replica_capacity,
)
from benchmarks.simulate import policy_scenario, run_plan
from scheduling import AdmissionConfig, SchedulingConfig

C = replica_capacity()  # 64 streams per replica with the default sim costs


def run(name: str, factor: float, streams: int = 400, **kw: object) -> SimResult:
    return simulate(
        policy_scenario(name, DEFAULT_WINDOW, streams=streams, clients=round(factor * C), **kw)
    )


def test_capacity_of_the_default_replica() -> None:
    # K=16 chunks of 8 frames (640 ms) per call of 32 ms + 128 * 1 ms
    assert pytest.approx(16 * 0.64 / 0.160) == C


def test_under_capacity_edf_is_stall_free_and_fast() -> None:
    res = run("edf K", 0.5)
    s = res.summary
    assert s.streams_ok == 400
    assert s.stall_free_share == 1.0
    assert s.interruptions == 0
    assert s.ttfa_p99_ms is not None and s.ttfa_p99_ms < 1000
    assert s.xrt <= res.capacity_audio_s_per_s * 1.001  # nothing beats the vocoder


def test_at_twice_capacity_edf_sits_on_the_bound() -> None:
    res = run("edf K", 2.0)
    row = res.row()
    s = res.summary
    # Over the players actually listening (L), no schedule beats max(0, L/C - 1) ...
    bound = row["stall_ratio_bound_listening"]
    assert s.stall_ratio >= bound - 1e-3
    # ... and edf loses little throughput doing it (partial batches at stream edges).
    assert s.stall_ratio <= bound + 0.05
    assert s.xrt >= 0.95 * res.capacity_audio_s_per_s
    # The closed loop's N-bound is higher: new streams wait for first audio instead.
    assert s.stall_ratio <= row["stall_ratio_bound"]
    assert s.ttfa_p50_ms is not None and s.ttfa_p50_ms > 1000


NAMES = ("fifo K=0", "edf K")


def test_fifo_without_window_is_worse_than_edf_at_capacity() -> None:
    plan = [policy_scenario(name, DEFAULT_WINDOW, streams=400, clients=round(C)) for name in NAMES]
    fifo, edf = (result.summary for result in run_plan(plan, jobs=2))
    assert edf.stall_free_share == 1.0
    # every turn decodes everyone: turns grow long, first chunks wait and run dry
    assert fifo.stall_free_share < 0.99
    assert fifo.ttfa_p99_ms > 1.5 * edf.ttfa_p99_ms


def test_sticky_fifo_window_trades_ttfa_for_smoothness() -> None:
    s = run("fifo K", 1.5).summary
    assert s.stall_free_share == 1.0
    assert s.ttfa_p50_ms > 3000  # streams queue behind the K slot holders


def test_admission_at_twice_capacity_keeps_accepted_streams_clean() -> None:
    s = run("edf K + admission", 2.0).summary
    assert s.rejected > 0
    assert s.stall_free_share >= 0.99
    # a first audio within a second once admitted; a request may first wait in the
    # queue up to admission.queue_max_wait_s (its wait counts in its TTFA)
    bound_ms = 1000 + 1000 * AdmissionConfig().queue_max_wait_s
    assert s.ttfa_p99_ms is not None and s.ttfa_p99_ms <= bound_ms
    assert all(r > 0 for r in s.retry_after_s)


def test_routers_over_four_replicas_at_capacity() -> None:
    mean_s = mean_audio_s(prepare_texts(load_corpus(), DEFAULT_TEXT, DEFAULT_SIM))
    plan = [
        Scenario(
            label=router,
            streams=600,
            rate_per_s=4 * C / mean_s,  # offered audio = C over 4 replicas
            replicas=4,
            router=router,
            scheduling=SchedulingConfig(policy="edf", active_stream_window=DEFAULT_WINDOW),
            admission=AdmissionConfig(enabled=False),
            seed=6,  # 600 arrivals: a seed where the coin toss overloads a replica (0.86)
        )
        for router in ("random", "least-loaded", "slack")
    ]
    # seeded: the figures do not depend on the worker processes (run_plan's doc)
    results = {r.scenario.label: r.summary for r in run_plan(plan, jobs=2)}
    for s in results.values():
        assert s.streams_ok == 600
    # A coin toss overloads some replica now and then; informed routers spread the load.
    assert results["random"].stall_free_share < 0.99
    assert results["least-loaded"].stall_free_share >= 0.99
    assert results["slack"].stall_free_share > results["random"].stall_free_share
    assert results["slack"].stall_ratio < results["random"].stall_ratio


def test_same_seed_same_numbers() -> None:
    a = run("edf K", 1.0, streams=150, seed=3).summary
    b = run("edf K", 1.0, streams=150, seed=3).summary
    assert a == b
    assert not math.isnan(a.stall_ratio)


def test_the_talker_costs_are_the_sim_backends() -> None:
    """A talker step made slow in SimConfig (the one cost model) slows the talker."""
    fast = run("edf K", 0.5, streams=150)
    slow_sim = replace(DEFAULT_SIM, talker_step_base_ms=400.0)
    slow = run("edf K", 0.5, streams=150, sim=slow_sim)
    assert fast.summary.ttfa_p50_ms is not None and slow.summary.ttfa_p50_ms is not None
    # a first chunk needs one talker step: its cost shows in every stream's first audio
    assert slow.summary.ttfa_p50_ms > 400 > fast.summary.ttfa_p50_ms
    assert slow.talker_steps < fast.talker_steps


def test_a_client_that_hangs_up_frees_its_place_at_once() -> None:
    """Poisson arrivals over capacity, admission on: streams cut short leave the book (and
    the count admission uses) at once, so fewer later arrivals are turned away."""
    rate = 1.4 * C / mean_audio_s(prepare_texts(load_corpus(), DEFAULT_TEXT, DEFAULT_SIM))

    def scenario(hangup_share: float) -> Scenario:
        return Scenario(
            label=f"hang up {hangup_share}",
            streams=600,
            rate_per_s=rate,
            admission=AdmissionConfig(enabled=True),
            hangup_share=hangup_share,
            seed=11,
        )

    staying, leaving = run_plan([scenario(0.0), scenario(1.0)], jobs=2)
    assert staying.hangups == 0
    assert leaving.hangups > 120
    assert leaving.summary.rejected < 0.6 * staying.summary.rejected
    assert leaving.summary.stall_free_share >= 0.99


def test_parallel_plan_gives_the_same_figures() -> None:
    plan = [
        policy_scenario("edf K", DEFAULT_WINDOW, streams=100, clients=round(f * C), seed=2)
        for f in (0.5, 1.5)
    ]
    alone = [r.row() for r in run_plan(plan, jobs=1)]
    together = [r.row() for r in run_plan(plan, jobs=2)]
    for a, b in zip(alone, together, strict=True):
        a.pop("sim_wall_s")
        b.pop("sim_wall_s")
        assert a == b
