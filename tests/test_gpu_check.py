"""benchmarks/gpu_check.py runs end to end on the CPU with the tiny model (`--device cpu
--tiny`): every part, its figures written, so a GPU session's one run meets no typo."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import gpu_check
from pipeline.backends.gpu_costs import table_from_dict


def test_the_gpu_check_runs_every_part_on_the_tiny_model(tmp_path: Path, capsys) -> None:
    out = tmp_path / "results"
    figures = gpu_check.main(
        [
            "--device",
            "cpu",
            "--tiny",
            "--out",
            str(out),
            "--duration-s",
            "1",
            "--no-compiled-step",  # compiling takes a minute on a CPU: test_codec_lm_compiled
            "--set",
            f"codec_lm.cache_dir={tmp_path / 'cache'}",
        ]
    )
    printed = capsys.readouterr().out
    assert "failed" not in figures, figures.get("failed")
    for key in ("step_ms", "step_with_arrival_ms", "buckets", "vocoder_turn_ms", "engine"):
        assert key in figures, key
    assert set(figures["step_ms"]) == {1, 4, 8}
    assert all(ms > 0 for ms in figures["step_ms"].values())
    # eager on a CPU: graph = eager trivially; batched = alone is a real check
    assert figures["buckets"] and all(
        row
        == {
            "graph_equals_eager": True,
            "batched_equals_alone": True,
            "greedy_batched_equals_alone": True,
        }
        for row in figures["buckets"].values()
    )
    assert figures["engine"][1]["requests"] >= 1
    # what a GPU run's stalls are read by: where they fell, the stages' call times
    for row in (figures["engine"][4], figures["engine_ramp_2_4"][4]):
        assert row["talker_steps"]["calls"] > 0 and row["vocoder_calls"]["calls"] > 0
        assert row["stall_places"]["stalls"] >= 0
    # the run's costs as the GPU model reads them, and its prediction beside each figure
    table = table_from_dict(figures["cost_table"])
    assert table.decode(1, 128) == figures["step_ms"][4]  # batches 1 and 4: the 4-row bucket
    assert table.decode(8, 128) == figures["step_ms"][8]
    assert table.mimi(1, 16) == round(figures["vocoder_turn_ms"][1], 3)
    # the prefill by tokens carried: 1 and prefill_rows (4) arriving prompts' first chunks
    assert sorted(figures["prefill_ms_by_tokens"]) == [32, 128]
    assert table.prefill_ms == figures["prefill_ms_by_tokens"]
    for row in (figures["engine"][1], figures["engine"][4], figures["engine_ramp_2_4"][4]):
        assert 0.0 <= row["predicted"]["stall_free"] <= 1.0
        assert row["prediction_error"]["stall_free_points"] == round(
            100 * (row["predicted"]["stall_free"] - row["stall_free"]), 1
        )
    assert "model error" in printed and "cost table" in printed
    assert set(figures["profile"]) == {"graph", "eager"}
    assert figures["late_graph_keys"] == []
    assert -100 < figures["mimi_bf16_snr_db"] < 200
    for target in ("step with an arriving prompt", "largest N stall-free", "TTFA p50"):
        assert target in printed
    (text,) = out.glob("gpu-check-tiny-*.txt")
    (data,) = out.glob("gpu-check-tiny-*.json")
    assert text.read_text().splitlines()[0].startswith("# python -m benchmarks.gpu_check")
    assert json.loads(data.read_text())["buckets"]


def test_the_ramp_simulation_runs_the_engine_on_the_codec_lms_shape(capsys) -> None:
    """benchmarks/ramp_sim.py end to end, small: a row per (step, N, ramp) with its figures.
    A step far faster than a frame plays keeps every stream fed whatever the ramp."""
    from benchmarks import ramp_sim

    rows = ramp_sim.main(
        ["--step-ms", "5", "--streams", "2", "--ramps", "2,4", "2,3,5", "--seconds", "1"]
    )
    assert [(r["streams"], r["ramp"]) for r in rows] == [(2, [2, 4]), (2, [2, 3, 5])]
    assert all(r["requests"] > 0 and r["stall_free"] == 1.0 for r in rows)
    assert "stall-free" in capsys.readouterr().out
