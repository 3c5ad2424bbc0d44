"""The fixed-shape step (pipeline/backends/codec_lm/fixed.py, launches.py) against the
reference step (talker.py's CsmStepper) on the tiny model, float32 CPU: frame for frame,
greedy and sampled under a seed, alone and batched across row and key buckets, with joins,
leaves, steps sat out and a cancel; chunked prefill against a whole prefill; frames handed
back a step late (overlap) against at once. On a CPU the step functions run eagerly: the
very functions a GPU captures as CUDA graphs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from codec_lm_support import tiny_settings

from pipeline.backend import TalkRequest
from pipeline.backends.codec_lm import CodecLMBackend
from pipeline.backends.codec_lm.sampling import segment_seed
from pipeline.backends.codec_lm.talker import CsmStepper

# prompts of 16 to 95 tokens: several prefill chunks, keys past the 64-token bucket
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


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.getbasetemp() / "codec-lm-cache"


def _backend(cache_dir: Path, *overrides: str) -> CodecLMBackend:
    """The tiny model with its norms' weights made unlike 1 (a random build leaves them
    at 1), so that the fixed step's own RMSNorm is checked against transformers' module."""
    short = "codec_lm.max_frames_per_segment=16"
    backend = CodecLMBackend(tiny_settings(cache_dir, short, *overrides).codec_lm)
    noise = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for module in backend.loaded.model.modules():
            if type(module).__name__.endswith("RMSNorm"):
                shape = module.weight.shape
                module.weight.copy_(1 + 0.5 * torch.randn(shape, generator=noise))
    return backend


SAMPLED = ("codec_lm.temperature=0.9", "codec_lm.top_k=20", "codec_lm.seed=7")


def _request(index: int) -> TalkRequest:
    return TalkRequest(TEXTS[index], "speaker-0", 1.0, index, 0, 0)


def _reference(backend: CodecLMBackend, index: int) -> np.ndarray:
    """The reference step, the stream alone: all its max_frames frames."""
    cfg = backend.config
    stepper = CsmStepper(
        backend.loaded.model,
        max_tokens=backend.stepper.max_tokens,
        slots=4,
        row_multiple=cfg.row_multiple,
        codec_codebook_size=64,
        temperature=cfg.temperature,
        top_k=cfg.top_k,
    )
    request = _request(index)
    segment = stepper.open(
        backend.prompt(request.text, 0), backend.max_frames(request.text, request.speed)
    )
    segment.seed = segment_seed(cfg.seed, request.stream_tag, request.segment_index)
    frames = [stepper.step([segment])[0].numpy() for _ in range(segment.max_frames)]
    return np.stack(frames)


def _run(backend: CodecLMBackend, joins: dict[int, list[int]], cancel: dict[int, int]):
    """Streams opened before the steps `joins` names, stream 1 sitting out every third step
    and stream 0 every fifth, `cancel` closing a stream before a step: each one's frames."""
    open_: dict[int, object] = {}
    got: dict[int, list[np.ndarray]] = {i: [] for i in range(len(TEXTS))}
    step_no = 0
    while step_no < 400 and (open_ or step_no <= max(joins)):
        for i in joins.get(step_no, []):
            open_[i] = backend.open_segment(_request(i))
        for i, at in cancel.items():
            if at == step_no and i in open_:
                backend.close_segment(open_.pop(i))
        chosen = [i for i in sorted(open_) if not (i == 1 and step_no % 3 == 2)]
        chosen = [i for i in chosen if not (i == 0 and step_no % 5 == 4)]
        for i, step in zip(chosen, backend.step([open_[i] for i in chosen]), strict=True):
            got[i].append(step.frames)
            if step.done:
                backend.close_segment(open_.pop(i))
        step_no += 1
    assert not open_ and backend.live_segments == 0
    return {i: np.concatenate(frames) for i, frames in got.items() if frames}


JOINS = {0: [0, 1], 2: [2], 3: [3, 4, 5], 5: [6, 7], 9: [8]}
CANCEL = {3: 12}


def _check_against_reference(backend: CodecLMBackend) -> None:
    reference = {i: _reference(backend, i) for i in range(len(TEXTS))}
    for i in (1, 8):  # alone through the fixed path
        (alone,) = _run(backend, {0: [i]}, {}).values()
        np.testing.assert_array_equal(alone, reference[i])
    batched = _run(backend, JOINS, CANCEL)
    for i, frames in batched.items():
        if i in CANCEL:
            assert 0 < len(frames) < len(reference[i])
            frames_ref = reference[i][: len(frames)]
        else:
            frames_ref = reference[i]
        np.testing.assert_array_equal(frames, frames_ref, err_msg=f"stream {i}")


def test_greedy_fixed_step_equals_the_reference_alone_and_batched(cache_dir: Path) -> None:
    backend = _backend(cache_dir)
    _check_against_reference(backend)
    # the run crossed row buckets (9 streams: slot 8 in a 16-row step) and key buckets
    decode = {shape[1:] for shape in backend.launcher.shapes if shape[0] == "decode"}
    assert {rows for rows, _ in decode} == {4, 8, 16}
    assert {keys for _, keys in decode} == {64, 128}


def test_sampled_fixed_step_equals_the_reference_under_a_seed(cache_dir: Path) -> None:
    backend = _backend(cache_dir, *SAMPLED)
    _check_against_reference(backend)
    greedy = _reference(_backend(cache_dir), 0)
    sampled = _reference(backend, 0)
    assert (greedy != sampled).mean() > 0.5  # sampling is on
    reseeded = _reference(_backend(cache_dir, *SAMPLED[:2], "codec_lm.seed=8"), 0)
    assert (reseeded != sampled).mean() > 0.5  # and follows the seed


def test_overlapped_steps_hand_back_the_same_frames_a_step_late(cache_dir: Path) -> None:
    plain = _backend(cache_dir, *SAMPLED)
    overlapped = _backend(cache_dir, *SAMPLED, "codec_lm.overlap_steps=true")
    a, b = _run(plain, JOINS, CANCEL), _run(overlapped, JOINS, CANCEL)
    assert a.keys() == b.keys()
    for i in a:
        if i in CANCEL:  # cancelled at the same step: the overlapped one got a frame less
            assert len(b[i]) == len(a[i]) - 1
            np.testing.assert_array_equal(a[i][: len(b[i])], b[i])
        else:
            np.testing.assert_array_equal(a[i], b[i], err_msg=f"stream {i}")
    # alone: one more step than frames, the first step (its prompt in one chunk) empty
    segment = overlapped.open_segment(_request(2))
    steps = []
    while not (steps and steps[-1].done):
        steps.extend(overlapped.step([segment]))
    overlapped.close_segment(segment)
    assert steps[0].frames.shape == (0, 8)
    assert [len(s.frames) for s in steps[1:]] == [1] * segment.max_frames
    assert [s.done for s in steps] == [False] * segment.max_frames + [True]


def test_chunked_prefill_equals_a_whole_prefill(cache_dir: Path) -> None:
    whole = _backend(cache_dir, "codec_lm.prefill_chunk_tokens=128", "codec_lm.prefill_rows=8")
    chunked = _backend(cache_dir, "codec_lm.prefill_chunk_tokens=8", "codec_lm.prefill_rows=1")
    a, b = _run(whole, JOINS, CANCEL), _run(chunked, JOINS, CANCEL)
    for i in a:
        if i not in CANCEL:
            np.testing.assert_array_equal(a[i], b[i], err_msg=f"stream {i}")


def test_a_step_bounds_its_prefill_work(cache_dir: Path) -> None:
    """Nine prompts arriving at once: each step prefills at most prefill_rows chunks of
    prefill_chunk_tokens tokens; the streams already talking get their frame every step."""
    backend = _backend(cache_dir, "codec_lm.prefill_chunk_tokens=16", "codec_lm.prefill_rows=2")
    talking = backend.open_segment(_request(2))
    while talking.launched == 0:
        backend.step([talking])
    segments = [backend.open_segment(_request(i)) for i in range(len(TEXTS)) if i != 2]
    before = sum(s.prefilled for s in segments)
    for _ in range(3):
        prefilled = sum(s.prefilled for s in segments)
        (first, *_) = backend.step([talking, *segments])
        assert len(first.frames) == 1  # never held up by the arrivals
        assert sum(s.prefilled for s in segments) - prefilled <= 2 * 16
    assert sum(s.prefilled for s in segments) > before
    for segment in [talking, *segments]:
        backend.close_segment(segment)
    assert backend.live_segments == 0


def test_a_step_runs_the_depth_decoder_once_whatever_prompts_arrive(
    cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The depth decoder (a pass per codebook: most of a step's kernels) runs once per step:
    prompts ending their prefill get their first frame in the talking streams' pass. On an
    H200 a prefill that made its own frames cost a second pass, doubling the step (52 ms
    against 27) in over half the steps while streams arrived."""
    backend = _backend(cache_dir, "codec_lm.prefill_chunk_tokens=16", "codec_lm.prefill_rows=2")
    stepper = backend.stepper
    passes: list[int] = []
    frame = stepper._frame

    def counted(*args, **kwargs):
        passes.append(len(args[0]))  # the rows it makes frames for
        return frame(*args, **kwargs)

    monkeypatch.setattr(stepper, "_frame", counted)
    talking = backend.open_segment(_request(1))  # a long prompt: talks all along
    while talking.launched == 0:
        backend.step([talking])
    arrivals = [backend.open_segment(_request(i)) for i in (0, 3, 4, 6)]
    first_frames, steps = 0, 0
    while any(s.launched == 0 for s in arrivals):
        passes.clear()
        launched = [s.launched for s in arrivals]
        live = [s for s in [talking, *arrivals] if not s.done]
        backend.step(live)
        first_frames += sum(
            1 for s, n in zip(arrivals, launched, strict=True) if n == 0 < s.launched
        )
        assert len(passes) == 1, passes
        steps += 1
    assert first_frames == len(arrivals) and not talking.done and steps > 2
    for segment in [talking, *arrivals]:
        backend.close_segment(segment)


def test_sampling_adds_a_handful_of_operators_per_codebook_to_a_step() -> None:
    """A step's time on a GPU is its count of small kernels (9,479 at batch 64 on an H200,
    about a fifth of them drawing the noise codebook by codebook). Counted on the CPU at
    CSM-1B's structure (benchmarks/lab/step_ops.py): sampling on top of greedy costs a few
    operators per codebook (its top-k, mask and argmax), its noise drawn once a frame."""
    from benchmarks.lab.step_ops import build, count

    backend = build(False, "codec_lm.backbone_layers=2")  # the depth decoder's 31 x 4
    sampled, names = count(backend, rows=4, steps=1)
    backend.stepper.temperature = 0.0  # the same model and buffers, greedy (argmax)
    greedy, _ = count(backend, rows=4, steps=1)
    assert greedy > 1000  # 32 codebooks: 31 depth-decoder passes of 4 layers
    assert sampled - greedy <= 10 * 32, names.most_common(8)
