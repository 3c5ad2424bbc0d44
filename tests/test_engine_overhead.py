"""benchmarks/engine_overhead.py --virtual: the engine on a virtual clock does the same
work on every run (what makes a before/after profile of its hot path comparable)."""

from __future__ import annotations

from benchmarks.engine_overhead import measure_virtual


def test_the_virtual_closed_loop_makes_the_same_turns_every_run() -> None:
    first = measure_virtual(200, 16, seconds=0.5, warmup_s=0.2)
    second = measure_virtual(200, 16, seconds=0.5, warmup_s=0.2)
    work = ("turns", "chunks", "talker_plans")
    assert {key: first[key] for key in work} == {key: second[key] for key in work}
    # a turn every 5 virtual ms, each a full window of 16 chunks
    assert first["turns"] == 100 and first["chunks"] == 16 * 100
    assert first["talker_plans"] > 0 and first["engine_cpu_ms_per_turn"] > 0
