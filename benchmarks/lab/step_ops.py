"""Operators a codec-LM talker step launches, counted on the CPU:

    python -m benchmarks.lab.step_ops [--rows 4] [--greedy] [--compiled]
    python -m benchmarks.lab.step_ops --compare    # eager against compiled, counts and CPU time

On an H200 (2026-12-04) a step at batch 64 was 9,479 small kernels, about 2.5 us each, and
their count, not the batch, set its time (docs/codec-lm.md). The count depends on the
model's structure, not its widths, so this builds the tiny model with CSM-1B's structure
(32 codebooks, a 16-layer backbone, a 4-layer depth decoder, 2051 codes) on the CPU,
profiles a few fixed-shape steps and prints the operators per step that compute (a view,
a reshape or a no-op cast launches no kernel on a GPU, and is left out), the most frequent
first. A change that removes kernels shows here without a GPU; what they cost shows in
`benchmarks/gpu_check.py`'s profile.

`--compiled` counts the step with `codec_lm.compile_step` (pipeline/backends/codec_lm/
compiled.py): each fused kernel inductor generated counts as one (on a GPU a Triton kernel
where the CPU has a C++ loop; the fusion is decided on the same graph, not identically),
plus the library operators the compiled code calls (matrix products, attention, top-k).
`--compare` prints both and the CPU time per step of each at a few batch sizes: a sanity
figure of this CPU, never a GPU's (run it under the bench lock).
"""

from __future__ import annotations

import argparse
import collections
import time
from pathlib import Path

from torch.profiler import ProfilerActivity, profile

from benchmarks.gpu_check import close_segments, corpus, load_sections, open_talking

ROOT = Path(__file__).resolve().parents[2]
CSM_1B_STRUCTURE = [
    "codec_lm.num_codebooks=32",
    "codec_lm.backbone_layers=16",
    "codec_lm.depth_layers=4",
    "codec_lm.codebook_size=2051",
    "codec_lm.codec_codebook_size=2048",
]
# operators that launch no kernel on a GPU: views, shape changes, casts to the same dtype
NO_KERNEL = {
    "aten::alias",
    "aten::as_strided",
    "aten::detach",
    "aten::expand",
    "aten::lift_fresh",
    "aten::permute",
    "aten::reshape",
    "aten::select",
    "aten::slice",
    "aten::split",
    "aten::split_with_sizes",
    "aten::narrow",
    "aten::chunk",
    "aten::squeeze",
    "aten::t",
    "aten::to",
    "aten::transpose",
    "aten::unflatten",
    "aten::unsqueeze",
    "aten::view",
    "aten::_unsafe_view",
    "aten::_reshape_alias",
    # what compiled code calls besides its kernels: allocations and views
    "aten::empty",
    "aten::empty_strided",
    "aten::_reinterpret_tensor",
    "inductor::_reinterpret_tensor",
}
# the fused loops inductor generates (named when its kernel profile is on): one kernel each
FUSED_PREFIXES = ("cpp_fused", "triton_")


def build(greedy: bool, *overrides: str):
    """The tiny model at CSM-1B's structure on the CPU, sampled or greedy (`overrides`:
    section.field=value, last)."""
    from pipeline.backends.codec_lm import CodecLMBackend

    sampling = (
        ["codec_lm.temperature=0", "codec_lm.top_k=0"]
        if greedy
        else [
            "codec_lm.temperature=0.9",
            "codec_lm.top_k=50",
        ]
    )
    settings = ["codec_lm.device=cpu", "codec_lm.overlap_steps=false", *CSM_1B_STRUCTURE]
    path = ROOT / "configs" / "codec-lm-tiny.yaml"
    sections = load_sections(path, [*settings, *sampling, *overrides])
    return CodecLMBackend(sections["codec_lm"])


def _kernel_like(event) -> bool:
    """An operator (or a fused kernel) that computes, not inside another one."""
    if event.name.startswith(FUSED_PREFIXES):
        return True
    parent = event.cpu_parent
    return (
        event.name.startswith("aten::")
        and event.name not in NO_KERNEL
        and (parent is None or not parent.name.startswith(("aten::", *FUSED_PREFIXES)))
    )


def count(backend, rows: int, steps: int = 3) -> tuple[float, collections.Counter]:
    """Computing operators per fixed-shape step of `rows` segments, and per name (a
    compiled step's fused kernels under the name `fused kernels`)."""
    import torch._inductor.config as inductor_config

    segments = open_talking(backend, sorted(corpus(), key=len)[:rows], rows)  # short prompts
    try:
        with inductor_config.patch({"cpp.enable_kernel_profile": True}):
            backend.step(segments)  # compiles here, with its kernels named, when compiled
            backend.step(segments)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(steps):
                    backend.step(segments)
    finally:
        close_segments(backend, segments)
    names = collections.Counter(
        "fused kernels" if e.name.startswith(FUSED_PREFIXES) else e.name
        for e in prof.events()
        if _kernel_like(e)
    )
    return sum(names.values()) / steps, names


def step_s(backend, rows: int, steps: int) -> float:
    """CPU seconds per step of `rows` segments (after two warm-up steps)."""
    segments = open_talking(backend, sorted(corpus(), key=len)[:rows], rows)
    try:
        for _ in range(2):
            backend.step(segments)
        started = time.perf_counter()
        for _ in range(steps):
            backend.step(segments)
        return (time.perf_counter() - started) / steps
    finally:
        close_segments(backend, segments)


def compare(rows_list: list[int], steps: int) -> dict[str, dict]:
    """Eager against compiled, sampled, at CSM-1B's structure: operators per step (at the
    first batch size) and CPU ms per step at each batch size, interleaved."""
    eager, compiled = build(False), build(False, "codec_lm.compile_step=true")
    out: dict[str, dict] = {"ops": {}, "cpu_ms": {"eager": {}, "compiled": {}}}
    for name, backend in (("eager", eager), ("compiled", compiled)):
        out["ops"][name] = round(count(backend, rows_list[0], steps=2)[0])
    print(
        f"CSM-1B structure, {rows_list[0]} rows, sampled: operators a step, eager "
        f"{out['ops']['eager']}, compiled {out['ops']['compiled']} "
        f"({out['ops']['compiled'] / out['ops']['eager'] - 1:+.0%})"
    )
    print(f"{'rows':>5} {'eager ms':>9} {'compiled ms':>12}  (this CPU, tiny widths)")
    for rows in rows_list:
        times = {name: [] for name in ("eager", "compiled")}
        for _ in range(2):  # the arms interleaved
            times["eager"].append(step_s(eager, rows, steps))
            times["compiled"].append(step_s(compiled, rows, steps))
        for name, got in times.items():
            out["cpu_ms"][name][rows] = round(min(got) * 1e3, 2)
        e, c = out["cpu_ms"]["eager"][rows], out["cpu_ms"]["compiled"][rows]
        print(f"{rows:5d} {e:9.2f} {c:12.2f}")
    return out


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=4, help="segments in the step")
    parser.add_argument("--greedy", action="store_true", help="argmax instead of sampling")
    parser.add_argument("--compiled", action="store_true", help="codec_lm.compile_step=true")
    parser.add_argument(
        "--compare", action="store_true", help="eager vs compiled: counts, CPU ms at 4, 16, 64"
    )
    args = parser.parse_args(argv)
    if args.compare:
        figures = compare([4, 16, 64], steps=5)
        return figures["ops"]["compiled"]
    extra = ["codec_lm.compile_step=true"] if args.compiled else []
    per_step, names = count(build(args.greedy, *extra), args.rows)
    mode = "greedy" if args.greedy else "sampled (T 0.9, top-k 50)"
    mode += ", compiled" if args.compiled else ""
    print(f"CSM-1B structure, {args.rows} rows, {mode}: {per_step:.0f} computing operators a step")
    steps = 3
    for name, n in names.most_common(12):
        print(f"  {n / steps:7.0f}  {name}")
    return per_step


if __name__ == "__main__":
    main()
