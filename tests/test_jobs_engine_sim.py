"""A job beside live listeners on the Engine itself, in virtual time (benchmarks/jobs_sim.py:
the sim backend's costs, admission on): a feasible finish_by is met at live loads of 0.3,
0.9 and 1.5 C while every listener's stream is stall-free (1.5 C is overload: admission
refuses listeners, counting the rate promised to the job), and a best-effort job under
overload never costs a listener a stall. A job's segments count as streams in the engine's
load (a live stream beside one is not alone), never as listeners to protect."""

from __future__ import annotations

import pytest

from benchmarks.jobs_sim import run_job_beside_listeners


@pytest.mark.parametrize("live_load", [0.3, 0.9, 1.5])
def test_a_feasible_finish_by_is_met_and_listeners_stay_stall_free(live_load: float) -> None:
    run = run_job_beside_listeners(live_load)
    assert run.feasible and run.finish_by_s is not None
    assert run.finished_s is not None and run.finished_s <= run.finish_by_s
    assert run.live_streams >= run.listeners  # every listener was served, some twice
    assert run.live_stalled == 0
    if live_load > 1:
        assert run.refused > 0  # overload: admission refused listeners, not the job


def test_a_best_effort_job_under_overload_costs_listeners_nothing() -> None:
    run = run_job_beside_listeners(1.5, job_share=None, run_s=30.0)
    assert run.feasible and run.finish_by_s is None
    assert run.live_streams >= run.listeners and run.live_stalled == 0
