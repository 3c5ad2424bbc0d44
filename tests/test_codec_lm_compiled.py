"""The compiled step (`codec_lm.compile_step`, pipeline/backends/codec_lm/compiled.py)
against the eager one on the tiny model, float32 CPU, sampled under a seed: the same codes
frame for frame, alone and batched across row buckets 4, 8 and 16 and key buckets 64 and
128, with joins, chunked prefill, leaves, steps sat out and a cancel.

Slow: inductor compiles the step's pieces (7 graphs); the steps themselves take seconds.
Compiling costs about the same per layer (dynamic shapes: the symbolic shape reasoning
grows with the operators traced), so the model here has one backbone layer and one depth
layer: 2 + 2 layers took 115 s on this project's shared 2-core CPU, 2 + 1 84 s, 1 + 1 58 s.
What a second layer would add (each layer's own cache rows) is the eager code's, which
tests/test_codec_lm_fixed.py checks against the reference model with two."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from codec_lm_support import tiny_settings

from benchmarks.gpu_check import Report
from benchmarks.gpu_step import compiled_backend, compiled_step_checks
from pipeline.backend import TalkRequest
from pipeline.backends.codec_lm import CodecLMBackend
from pipeline.backends.codec_lm.compiled import compiled_count

TEXTS = (
    "Hello there, how are you today?",
    "A longer sentence that keeps going for quite a while longer, and then some more words.",
    "Short one.",
    "The fourth voice joins late and leaves early.",
    "Number five.",
    "Six is here to push the batch past eight rows of the cache.",
    "Seven.",
    "Eight, and a few more words to make it last.",
    "Nine joins last of all.",
)
SAMPLED = ("codec_lm.temperature=0.9", "codec_lm.top_k=20", "codec_lm.seed=11")
# stream -> the step it joins at; stream 3 is cancelled before step 12
JOINS = {0: [0, 1], 2: [2], 3: [3, 4, 5], 5: [6, 7], 9: [8]}
CANCEL = {3: 12}


def _backend(cache_dir: Path, *overrides: str) -> CodecLMBackend:
    """The tiny model, its norms' weights made unlike 1 (a random build leaves them at 1,
    which would hide a norm's weight applied wrongly)."""
    settings = tiny_settings(
        cache_dir,
        "codec_lm.max_frames_per_segment=24",
        "codec_lm.backbone_layers=1",
        "codec_lm.depth_layers=1",
        *overrides,
    )
    backend = CodecLMBackend(settings.codec_lm)
    noise = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for module in backend.loaded.model.modules():
            if type(module).__name__.endswith("RMSNorm"):
                module.weight.copy_(1 + 0.5 * torch.randn(module.weight.shape, generator=noise))
    return backend


def _run(backend: CodecLMBackend, joins: dict[int, list[int]], cancel: dict[int, int]):
    """Each stream's frames: streams join at the steps `joins` names, stream 1 sits out
    every third step, `cancel` closes a stream before a step."""
    open_: dict[int, object] = {}
    got: dict[int, list[np.ndarray]] = {i: [] for i in range(len(TEXTS))}
    step_no = 0
    while step_no < 200 and (open_ or step_no <= max(joins)):
        for i in joins.get(step_no, []):
            open_[i] = backend.open_segment(TalkRequest(TEXTS[i], "speaker-0", 1.0, i, 0, 0))
        for i, at in cancel.items():
            if at == step_no and i in open_:
                backend.close_segment(open_.pop(i))
        chosen = [i for i in sorted(open_) if not (i == 1 and step_no % 3 == 2)]
        for i, step in zip(chosen, backend.step([open_[i] for i in chosen]), strict=True):
            got[i].append(step.frames)
            if step.done:
                backend.close_segment(open_.pop(i))
        step_no += 1
    assert not open_ and backend.live_segments == 0
    return {i: np.concatenate(frames) for i, frames in got.items() if frames}


@pytest.mark.slow
def test_the_compiled_step_equals_the_eager_step_frame_for_frame(tmp_path: Path) -> None:
    """Also runs gpu_check's section (benchmarks/gpu_step.py) on the pair at small sizes:
    its compiled backend shares the eager one's model, as on the GPU."""
    eager = _backend(tmp_path, *SAMPLED)
    before = compiled_count()
    compiled = compiled_backend(eager)
    assert compiled.stepper.compiled and not eager.stepper.compiled
    runs = []
    for joins, cancel in (({0: [1]}, {}), (JOINS, CANCEL)):  # alone, then nine streams
        want, got = _run(eager, joins, cancel), _run(compiled, joins, cancel)
        assert want.keys() == got.keys()
        for i in want:
            frames = eager.max_frames(TEXTS[i])
            assert 0 < len(want[i]) < frames if i in cancel else len(want[i]) == frames
            np.testing.assert_array_equal(got[i], want[i], err_msg=f"stream {i}")
        runs.append(got)
    assert compiled_count() > before  # the pieces did run compiled
    # not only the codes: every K and V the backbone wrote, within a few units in the last
    # place (inductor's fused loops may round differently from the eager operators, e.g.
    # a multiply-add contracted; measured here: at most 2.4e-7, about 1 ulp)
    caches = zip(
        [*compiled.stepper.cache.keys, *compiled.stepper.cache.values],
        [*eager.stepper.cache.keys, *eager.stepper.cache.values],
        strict=True,
    )
    for mine, theirs in caches:
        torch.testing.assert_close(mine, theirs, rtol=2e-6, atol=2e-6)
    decode = {shape[1:] for shape in compiled.launcher.shapes if shape[0] == "decode"}
    assert {rows for rows, _ in decode} == {4, 8, 16}
    assert {keys for _, keys in decode} == {64, 128}
    # sampled: the frames are not what greedy decoding makes
    greedy = _run(_backend(tmp_path), {0: [1]}, {})
    assert (greedy[1] != runs[0][1]).mean() > 0.5
    # gpu_check's section: step times of both, and the same frames at every batch
    report = Report()
    compiled_step_checks(report, eager, list(TEXTS), (1, 4, 8), 2, 4, compiled=compiled)
    figures = report.figures["compiled_step"]
    assert set(figures["step_ms"]) == {1, 4, 8}
    assert all(ms > 0 for row in figures["step_ms"].values() for ms in row.values())
    assert figures["compiled_equals_eager"] == {
        rows: {"streams_same": 1.0, "first_differing_frame": None} for rows in (1, 4, 8)
    }
