"""gpu_check's section on the compiled talker step (`codec_lm.compile_step`,
pipeline/backends/codec_lm/compiled.py): is it the same, and does it pay?

Beside the backend gpu_check loaded (eager step functions, CUDA graphs) it builds a second
one on the same model with `compile_step: true` (its own KV cache and graphs; Mimi eager:
only the talker is measured) and prints:

1. its start-up: compiling the pieces and capturing every bucket's graph, the graphs dynamo
   compiled, any bucket that failed to capture;
2. the step at batch 1, 64 and 256, eager and compiled, interleaved (A B A B, the faster
   of each arm's two runs), steps overlapped as when serving; target <= 20 ms at 64;
3. kernels per step at batch 64 (graph replay, under the profiler) and their summed time,
   eager against compiled;
4. frame for frame at batch 1, 64 and 256: the compiled step's first frames against the
   eager step's, stream by stream (on a CPU in float32 they are the same; on a GPU in
   bfloat16 a fused kernel may round differently, and a sampled stream that turns once
   stays turned: the share of streams the same, and the frame where the first differs).

`python -m benchmarks.gpu_check` runs it after the talker section; on a CPU with `--tiny`
it runs at small sizes (tests/test_gpu_check.py), compiling on the CPU. It imports nothing
from gpu_check (which imports it): its few helpers are its own.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from pipeline.backend import TalkRequest

STEP_TARGET_S = 0.020  # issue 52: a batch-64 step of at most 20 ms, sampling on


def _sync(backend: Any) -> None:
    if backend.loaded.device.type == "cuda":
        import torch

        torch.cuda.synchronize(backend.loaded.device)


def _open(backend: Any, text: str, tag: int) -> Any:
    return backend.open_segment(TalkRequest(text, backend.default_voice(), 1.0, tag, 0, 0))


def open_talking(backend: Any, texts: list[str], count: int) -> list:
    """`count` segments stepped until each has its first frame launched."""
    segments = [_open(backend, texts[i % len(texts)], i) for i in range(count)]
    while waiting := [s for s in segments if s.launched == 0]:
        backend.step(waiting)
    return segments


def close_segments(backend: Any, segments: list) -> None:
    for segment in segments:
        backend.close_segment(segment)
    backend.close()  # collects the step still in flight


def _first_frames(backend: Any, texts: list[str], tags: list[int], count: int) -> list[list]:
    """Each segment's first `count` frames (opened together, stepped together)."""
    segments = [_open(backend, texts[tag % len(texts)], tag) for tag in tags]
    got: list[list] = [[] for _ in segments]
    try:
        for _ in range(100 * len(segments) + 10 * count):  # bounded: prefill, then frames
            live = [i for i, s in enumerate(segments) if not s.done]
            if not live or all(len(g) >= count for g in got):
                break
            for i, step in zip(live, backend.step([segments[i] for i in live]), strict=True):
                got[i].extend(step.frames.tolist())
    finally:
        close_segments(backend, segments)
    return [g[:count] for g in got]


def compiled_backend(backend: Any) -> Any:
    """A second backend on the same loaded model, its step compiled, Mimi without graphs."""
    from pipeline.backends.codec_lm import CodecLMBackend

    config = dataclasses.replace(backend.config, compile_step=True, vocoder_max_batch=0)
    return CodecLMBackend(config, loaded=backend.loaded)


def _step_s(backend: Any, texts: list[str], batch: int, steps: int) -> float:
    """Seconds per step of `batch` talking segments (two steps warm, then `steps` timed)."""
    segments = open_talking(backend, texts, batch)
    try:
        usable = min(s.max_frames - s.launched for s in segments) - 3
        count = max(1, min(steps, usable))
        for _ in range(2):
            backend.step(segments)
        _sync(backend)
        started = time.perf_counter()
        for _ in range(count):
            backend.step(segments)
        _sync(backend)
        return (time.perf_counter() - started) / count
    finally:
        close_segments(backend, segments)


def _kernels(backend: Any, texts: list[str], batch: int, steps: int) -> tuple[float, float]:
    """CUDA kernels per step and their summed ms per step (0, 0 on a CPU)."""
    if backend.loaded.device.type != "cuda":
        return 0.0, 0.0
    import torch
    from torch.profiler import ProfilerActivity, profile

    segments = open_talking(backend, texts, batch)
    try:
        count = max(1, min(steps, min(s.max_frames - s.launched for s in segments) - 3))
        backend.step(segments)
        _sync(backend)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(count):
                backend.step(segments)
            _sync(backend)
    finally:
        close_segments(backend, segments)
    cuda = torch.autograd.DeviceType.CUDA
    kernels = [e for e in prof.events() if getattr(e, "device_type", None) == cuda]
    busy_ms = sum(e.time_range.elapsed_us() for e in kernels) / 1e3
    return len(kernels) / count, busy_ms / count


def _same_frames(eager: Any, compiled: Any, texts: list[str], rows: int, count: int) -> dict:
    """The first `count` frames of `rows` streams, compiled against eager, per stream."""
    tags = list(range(rows))
    want = _first_frames(eager, texts, tags, count)
    got = _first_frames(compiled, texts, tags, count)
    same = [a == b and len(a) == count for a, b in zip(want, got, strict=True)]
    first_diff = [
        next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
        for a, b in zip(want, got, strict=True)
    ]
    differing = [i for i in first_diff if i is not None]
    return {
        "streams_same": sum(same) / rows,
        "first_differing_frame": min(differing) if differing else None,
    }


def compiled_step_checks(
    report: Any,
    backend: Any,
    texts: list[str],
    batches,
    steps: int,
    check_steps: int,
    compiled: Any = None,
) -> None:
    """The section; `compiled`: a compiled backend already built (`compiled_backend`)."""
    from pipeline.backends.codec_lm.compiled import compiled_count

    report("\n== compiled step (codec_lm.compile_step): the same frames? faster? ==")
    graphs_before = compiled_count()
    started = time.perf_counter()
    compiled = compiled or compiled_backend(backend)
    startup_s = time.perf_counter() - started
    graphs = compiled.stepper.graphs
    figures: dict[str, Any] = {
        "startup_s": round(startup_s, 2),
        "dynamo_graphs": compiled_count() - graphs_before,
        "cuda_graphs": graphs.captured,
        "cuda_graph_failures": len(graphs.failed),
    }
    report(
        f"start-up (compile + capture): {startup_s:.1f} s; {figures['dynamo_graphs']} graphs "
        f"compiled, {graphs.captured} CUDA graphs captured, {len(graphs.failed)} failed"
    )
    for key, why in list(graphs.failed.items())[:3]:
        report(f"  no graph for {key}: {why[:200]}")
    long_texts = [t for t in texts if len(t) > 60] or texts
    capacity = min(backend.stepper.cache.capacity, compiled.stepper.cache.capacity)
    sizes = [b for b in batches if b <= capacity or backend.stepper.cache.grows]
    try:
        report(f"{'batch':>6} {'eager ms':>9} {'compiled ms':>12} {'change':>8}")
        step_ms: dict[int, dict[str, float]] = {}
        for batch in sizes:
            runs: dict[str, list[float]] = {"eager": [], "compiled": []}
            for _ in range(2):  # interleaved: A B A B
                runs["eager"].append(_step_s(backend, long_texts, batch, steps))
                runs["compiled"].append(_step_s(compiled, long_texts, batch, steps))
            e, c = min(runs["eager"]) * 1e3, min(runs["compiled"]) * 1e3
            step_ms[batch] = {"eager": round(e, 2), "compiled": round(c, 2)}
            report(f"{batch:6d} {e:9.1f} {c:12.1f} {c / e - 1:+8.0%}")
        figures["step_ms"] = step_ms
        if 64 in step_ms:
            got = step_ms[64]["compiled"]
            report.target(
                "compiled step at batch 64", f"{got:.1f} ms", "<= 20 ms", got <= STEP_TARGET_S * 1e3
            )
        batch = 64 if 64 in sizes else max(sizes)
        kernel_figures = {}
        for name, which in (("eager", backend), ("compiled", compiled)):
            kernels, busy_ms = _kernels(which, long_texts, batch, max(1, steps // 3))
            kernel_figures[name] = {"kernels": round(kernels, 1), "kernel_ms": round(busy_ms, 2)}
        figures["profile"] = {"batch": batch, **kernel_figures}
        report(
            f"kernels a step at batch {batch}: eager {kernel_figures['eager']['kernels']:.0f} "
            f"({kernel_figures['eager']['kernel_ms']:.2f} ms), compiled "
            f"{kernel_figures['compiled']['kernels']:.0f} "
            f"({kernel_figures['compiled']['kernel_ms']:.2f} ms)"
        )
        report(f"{'rows':>5} {'streams same':>13} {'first differing frame':>22}")
        same: dict[int, dict] = {}
        for rows in sizes:
            same[rows] = _same_frames(backend, compiled, long_texts, rows, check_steps)
            first = same[rows]["first_differing_frame"]
            report(
                f"{rows:5d} {same[rows]['streams_same']:13.0%} "
                f"{'none' if first is None else first:>22}"
            )
        figures["compiled_equals_eager"] = same
    finally:
        compiled.close()
        report.figures["compiled_step"] = figures
