"""The GPU cost table: its loader, its validation and its fill rules."""

from __future__ import annotations

import copy

import pytest

from pipeline.backends.gpu_costs import GpuCostTable, load_cost_table, table_from_dict
from scheduling.errors import ConfigError

SHIPPED = "configs/gpu-costs/h200-20261204-1453.yaml"
CURRENT = "configs/gpu-costs/h200-20261204-1453-backbone-prefill.yaml"


def _table() -> dict:
    return {
        "name": "t",
        "source": "test",
        "talker": {
            "decode_ms": [
                {"rows": 4, "keys": 128, "ms": 10.0},
                {"rows": 64, "keys": 128, "ms": 16.0},
            ],
            "prefill_ms": [{"tokens": 64, "ms": 5.0}],
            "prefill_ms_per_token": 0.5,
            "host_ms_per_step": 1.0,
            "host_ms_per_segment": 0.25,
        },
        "mimi": {
            "turn_ms": [
                {"chunks": 1, "frames": 16, "ms": 2.0},
                {"chunks": 4, "frames": 16, "ms": 5.0},
            ]
        },
    }


def test_measured_cells_are_read_back_exactly() -> None:
    table = table_from_dict(_table())
    assert table.decode(1, 128) == 10.0  # a batch of 1 runs the 4-row bucket
    assert table.decode(64, 128) == 16.0
    assert table.prefill(64) == 5.0
    assert table.mimi(4, 16) == 5.0
    assert table.host(4) == 2.0


def test_fill_rules() -> None:
    table = table_from_dict(_table())
    # rows: the bucket (17 -> 32), linear between the measured 4 and 64
    assert table.decode(17, 128) == pytest.approx(10.0 + 6.0 * (32 - 4) / 60)
    # past the last measured rows: the line through the last two
    assert table.decode(128, 128) == pytest.approx(16.0 + 6.0 * 64 / 60)
    # keys add nothing: the nearest measured key bucket's rows
    assert table.decode(64, 600) == 16.0
    # prefill: below the first measured count its value; past it, the per-token rule
    assert table.prefill(10) == 5.0
    assert table.prefill(74) == pytest.approx(5.0 + 0.5 * 10)
    assert table.prefill(0) == 0.0
    # Mimi: linear in total frames (K x frames bucket); 2 chunks of 9 frames = 2 x 12
    assert table.mimi(2, 9) == pytest.approx(2.0 + 3.0 * (24 - 16) / 48)
    # past the largest batch: turns of the largest
    big = GpuCostTable(**{**table.__dict__, "mimi_max_batch": 4})
    assert big.mimi(5, 16) == pytest.approx(5.0 + 2.0)


def test_grid_marks_measured_and_estimated_cells() -> None:
    table = table_from_dict(_table())
    grid = table.grid()
    assert grid["decode_ms"]["64x128"] == {"ms": 16.0, "measured": True}
    assert grid["decode_ms"]["32x128"]["measured"] is False
    assert grid["prefill_ms"]["64"]["measured"] is True
    estimated = table_from_dict({**_table(), "estimated": ["prefill_ms"]})
    assert estimated.grid()["prefill_ms"]["64"]["measured"] is False


def test_round_trip() -> None:
    table = table_from_dict(_table())
    assert table_from_dict(table.to_dict()) == table


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["talker"]["decode_ms"].append({"rows": 4, "keys": 128, "ms": 1}), "twice"),
        (lambda d: d["talker"]["decode_ms"][0].update(ms=-1), "must be a number >= 0"),
        (lambda d: d["talker"]["decode_ms"][0].update(rows=0), "integers >= 1"),
        (lambda d: d["talker"].update(decode_ms=[]), "non-empty list"),
        (lambda d: d["talker"].update(speed=1), "unknown field"),
        (lambda d: d["talker"].pop("host_ms_per_step"), "host_ms_per_step missing"),
        (lambda d: d.pop("mimi"), "section 'mimi' missing"),
        (lambda d: d.update(estimated=["nope"]), "estimated lists"),
        (lambda d: d["talker"].update(prefill_makes_frames="yes"), "must be a bool"),
    ],
)
def test_bad_tables_name_the_field(edit, message: str) -> None:
    data = copy.deepcopy(_table())
    edit(data)
    with pytest.raises(ConfigError, match=message):
        table_from_dict(data)


def test_shipped_tables_hold_the_1453_run() -> None:
    measured = load_cost_table(SHIPPED)
    assert measured.decode(1, 256) == 23.9
    assert measured.decode(64, 256) == 26.6
    assert measured.decode(256, 256) == 34.5
    assert measured.prefill(64) == 25.3 and measured.prefill_makes_frames
    assert measured.mimi(64, 16) == 15.8
    current = load_cost_table(CURRENT)
    assert current.decode_ms == measured.decode_ms
    assert current.mimi_turn_ms == measured.mimi_turn_ms
    assert not current.prefill_makes_frames and current.estimated == ("prefill_ms",)


def test_a_missing_file_is_a_config_error(tmp_path) -> None:
    with pytest.raises(ConfigError, match="cost table"):
        load_cost_table(tmp_path / "none.yaml")
