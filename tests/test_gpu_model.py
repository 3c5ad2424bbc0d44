"""The gpu_model backend replays a cost table: each step and Mimi turn costs what the table
says for its shape, frames come as codec_lm's do (prefill chunks, one call late when
overlapped), and the Engine runs on it in real and virtual time."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from benchmarks import gpu_model
from benchmarks.gpu_check import ROOT, load_sections
from pipeline.backend import TalkRequest, VocodeItem
from pipeline.backends import build_backend
from pipeline.backends.gpu_costs import table_from_dict
from pipeline.backends.gpu_model import GpuModelBackend, GpuModelConfig
from pipeline.backends.sim import decode_sim_signal


def _table(prefill_makes_frames: bool = False):
    return table_from_dict(
        {
            "name": "t",
            "source": "test",
            "talker": {
                "decode_ms": [
                    {"rows": 4, "keys": 128, "ms": 20.0},
                    {"rows": 64, "keys": 128, "ms": 32.0},
                ],
                "prefill_ms": [{"tokens": 64, "ms": 8.0}],
                "prefill_ms_per_token": 0.1,
                "prefill_makes_frames": prefill_makes_frames,
                "host_ms_per_step": 1.0,
                "host_ms_per_segment": 0.5,
            },
            "mimi": {
                "turn_ms": [
                    {"chunks": 1, "frames": 16, "ms": 2.0},
                    {"chunks": 64, "frames": 16, "ms": 20.0},
                ]
            },
        }
    )


class _Clock:
    """A clock that the backend's sleeps move on."""

    def __init__(self) -> None:
        self.now_s = 0.0
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now_s += seconds

    def __call__(self) -> float:
        return self.now_s


def _backend(overlap: bool, table=None, **kw):
    clock = _Clock()
    config = GpuModelConfig(overlap_steps=overlap, **kw)
    return GpuModelBackend(config, table or _table(), sleep=clock.sleep, clock=clock), clock


def _open(backend, text: str, tag: int):
    return backend.open_segment(TalkRequest(text, backend.default_voice(), 1.0, tag, 0, 0))


def test_a_step_costs_the_tables_decode_and_prefill() -> None:
    backend, clock = _backend(overlap=False)
    text = "x" * 100  # 105 prompt tokens (byte tokenizer): 64 then 41
    seg = _open(backend, text, 0)
    assert seg.prompt_tokens == 105 and seg.max_frames == 80
    backend.step([seg])  # 64 tokens of prefill, no frame
    assert clock.slept[-1] == pytest.approx((1.0 + 0.5 + 8.0) / 1e3)
    out = backend.step([seg])  # the last 41 tokens, then the first frame in the decode
    assert len(out[0].frames) == 1
    assert clock.slept[-1] == pytest.approx((1.5 + 8.0 + 20.0) / 1e3)
    out = backend.step([seg])  # decode only
    assert clock.slept[-1] == pytest.approx((1.5 + 20.0) / 1e3)
    # 20 segments: the row bucket of the highest slot (32 rows), interpolated
    others = [_open(backend, "y" * 10, t) for t in range(1, 20)]
    for s in others:  # each prompt in one chunk: its first frame in that step
        backend.step([s])
    backend.step([seg, *others])
    expected = 1.0 + 0.5 * 20 + 20.0 + 12.0 * (32 - 4) / 60
    assert clock.slept[-1] == pytest.approx(expected / 1e3)


def test_prefill_rows_bound_the_prompts_a_step_prefills() -> None:
    backend, clock = _backend(overlap=False, prefill_rows=2)
    segs = [_open(backend, "z" * 30, t) for t in range(3)]  # 35 tokens each
    out = backend.step(segs)  # two prompts prefilled (70 tokens), the third waits
    assert [len(o.frames) for o in out] == [1, 1, 0]
    assert clock.slept[-1] == pytest.approx((1.0 + 1.5 + 8.0 + 0.6 + 20.0) / 1e3)


def test_prefill_making_frames_skips_the_decode_for_prompts_alone() -> None:
    backend, clock = _backend(overlap=False, table=_table(prefill_makes_frames=True))
    seg = _open(backend, "z" * 30, 0)
    out = backend.step([seg])
    assert len(out[0].frames) == 1
    assert clock.slept[-1] == pytest.approx((1.5 + 8.0) / 1e3)


def test_overlapped_frames_come_one_call_late_and_every_frame_once() -> None:
    backend, clock = _backend(overlap=True)
    seg = _open(backend, "w" * 4, 7)  # 9 tokens, ceil(0.8 x 4) = 4 frames
    got, calls = [], 0
    while not seg.done:
        (out,) = backend.step([seg])
        got.extend(map(tuple, out.frames))
        calls += 1
    assert got == [(7, i) for i in range(4)]
    assert calls == 5  # four launches, and one more call for the last frame in flight
    # the first call only launches: it costs the host's time, not the GPU's
    assert clock.slept[0] == pytest.approx(1.5 / 1e3)
    # later calls wait for the previous launch: steps back to back on the GPU
    assert sum(clock.slept) == pytest.approx((1.5 + 28.0 + 3 * 20.0) / 1e3)
    backend.close_segment(seg)
    assert backend.open_segments == 0


def test_a_mimi_turn_costs_the_tables_turn() -> None:
    backend, clock = _backend(overlap=True)
    items = [
        VocodeItem(backend.default_voice(), np.array([[3, i] for i in range(10)]), 4, 6)
        for _ in range(5)
    ]
    pcm = backend.vocode(items)  # 5 chunks -> the K = 8 bucket, 10 frames -> 12
    assert clock.slept[-1] == pytest.approx((2.0 + 18.0 * (8 * 12 - 16) / (1024 - 16)) / 1e3)
    assert decode_sim_signal(pcm[0], backend.samples_per_frame) == [(3, i) for i in range(4, 10)]
    with pytest.raises(ValueError, match="emit range"):
        backend.vocode([VocodeItem(backend.default_voice(), np.zeros((2, 2), np.int64), 1, 5)])


def test_bad_input_is_refused() -> None:
    backend, _ = _backend(overlap=True)
    with pytest.raises(ValueError, match="unknown gpu_model voice"):
        backend.open_segment(TalkRequest("hi", "nobody", 1.0, 0, 0, 0))
    with pytest.raises(ValueError, match="max_prompt_tokens"):
        _open(backend, "x" * 400, 0)


def test_the_registry_builds_it_from_its_section() -> None:
    backend = build_backend("gpu_model", GpuModelConfig(prompt_chars_per_token=4.0))
    assert backend.table.name == "h200-20261204-1453-backbone-prefill"
    assert backend.prompt_tokens("a" * 300) == 75 + 5


@pytest.mark.parametrize("mode", ["virtual_time", "real_time"])
def test_the_engine_on_the_model_plays_every_stream(mode: str) -> None:
    """Two looping clients through the Engine: every stream played without a stall, the
    steps at the table's cost for their shape (exact on the virtual clock)."""
    table = _table()
    sections = load_sections(gpu_model.DESIGN, ["engine.calibration_calls=0"])
    row = gpu_model.run_point(mode, table, sections, 2, 1.5)
    assert row["requests"] >= 2 and row["stall_free"] == 1.0
    steps = row["talker_steps"]
    if mode == "virtual_time":  # overlapped decode steps of the 4-row bucket: 20 ms each
        assert steps["ms_p50"] == pytest.approx(20.0, abs=0.5)
    assert math.isfinite(row["ttfa_p50_s"])


def test_the_streams_its_loop_sustains_come_from_the_table() -> None:
    """The most rows whose step with a full prefill fits in a frame (80 ms): 8 here
    (bucket 8: 20.8 + a 512-token prefill 52.8 + host 1 + 0.5 x 8 = 78.6 ms; bucket 16
    needs 22.4 ms)."""
    backend, _ = _backend(overlap=True)
    assert backend.sustained_streams() == 8.0


def test_the_engine_reads_its_capacity_from_a_batched_backend() -> None:
    from pipeline.engine import Engine
    from scheduling import AdmissionConfig

    sections = load_sections(gpu_model.DESIGN, ["engine.calibration_calls=0"])
    backend, _ = _backend(overlap=True)
    engine = Engine(
        backend,
        scheduling=sections["scheduling"],
        chunking=sections["chunking"],
        admission=AdmissionConfig(),
        engine=sections["engine"],
        talker=sections["talker"],
        text=sections["text"],
    )
    assert engine.capacity(0.0) == 8.0


def test_admission_holds_a_batched_loop_at_what_it_sustains_under_overload() -> None:
    """16 clients against a loop that sustains 8 streams: admission refuses (429s), the
    streams it admits all play without a stall; under what it sustains, none is refused
    (virtual time)."""
    from scheduling import AdmissionConfig

    sections = load_sections(gpu_model.DESIGN, ["engine.calibration_calls=0"])
    admission = AdmissionConfig(
        enabled=True, max_streams=0, capacity_headroom=1.0, start_cost=0.0, queue_max_wait_s=0.2
    )
    row = gpu_model.run_point("virtual_time", _table(), sections, 16, 4.0, admission=admission)
    assert row["rejected"] > 0
    assert row["requests"] > 0 and row["stall_free"] == 1.0
    # a step of 40-42 ms whatever the batch sustains 66 streams (the host's 0.5 ms a
    # segment binds); its calls at light load produce 80 / 40 audio s per s a stream:
    # read as capacity, with a start counting 1 more and 0.9 of it used, admission
    # would refuse the second of 16 clients arriving together
    slow = dataclasses.replace(
        _table(),
        decode_ms={(4, 128): 40.0, (64, 128): 42.0},
        prefill_ms={64: 1.0},
        prefill_ms_per_token=0.001,
    )
    assert GpuModelBackend(table=slow).sustained_streams() == 66.0
    admission = dataclasses.replace(admission, capacity_headroom=0.9, start_cost=1.0)
    row = gpu_model.run_point("virtual_time", slow, sections, 16, 4.0, admission=admission)
    assert row["rejected"] == 0 and row["stall_free"] == 1.0


def test_the_served_model_config_runs_the_gpu_configs_engine() -> None:
    """configs/gpu-h200.yaml serves the gpu_model backend with codec-lm-1b-random.yaml's
    engine settings and shapes, through the settings loader."""
    from app.settings import load_settings

    model = load_settings(ROOT / "configs" / "gpu-h200.yaml", [], environ={})
    gpu = load_settings(ROOT / "configs" / "codec-lm-1b-random.yaml", [], environ={})
    assert model.backend.kind == "gpu_model"
    for section in ("talker", "text", "scheduling", "chunking", "admission"):
        assert getattr(model, section) == getattr(gpu, section), section
    shapes = model.backend_config()
    for name in (
        "frames_per_char",
        "min_frames_per_segment",
        "max_frames_per_segment",
        "max_prompt_tokens",
        "prefill_chunk_tokens",
        "prefill_rows",
        "overlap_steps",
    ):
        assert getattr(shapes, name) == getattr(gpu.codec_lm, name), name
