"""Operators a codec-LM talker step launches, counted on the CPU:

    python -m benchmarks.lab.step_ops [--rows 4] [--greedy]

On an H200 (2026-12-04) a step at batch 64 was 9,479 small kernels, about 2.5 us each, and
their count, not the batch, set its time (docs/codec-lm.md). The count depends on the
model's structure, not its widths, so this builds the tiny model with CSM-1B's structure
(32 codebooks, a 16-layer backbone, a 4-layer depth decoder, 2051 codes) on the CPU,
profiles a few fixed-shape steps and prints the operators per step that compute (a view,
a reshape or a no-op cast launches no kernel on a GPU, and is left out), the most frequent
first. A change that removes kernels shows here without a GPU; what they cost shows in
`benchmarks/gpu_check.py`'s profile.
"""

from __future__ import annotations

import argparse
import collections
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
}


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


def count(backend, rows: int, steps: int = 3) -> tuple[float, collections.Counter]:
    """Computing operators per fixed-shape step of `rows` segments, and per name."""
    segments = open_talking(backend, sorted(corpus(), key=len)[:rows], rows)  # short prompts
    try:
        backend.step(segments)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                backend.step(segments)
    finally:
        close_segments(backend, segments)
    top_level = [
        e
        for e in prof.events()
        if e.name.startswith("aten::")
        and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))
    ]
    names = collections.Counter(e.name for e in top_level if e.name not in NO_KERNEL)
    return sum(names.values()) / steps, names


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=4, help="segments in the step")
    parser.add_argument("--greedy", action="store_true", help="argmax instead of sampling")
    args = parser.parse_args(argv)
    per_step, names = count(build(args.greedy), args.rows)
    mode = "greedy" if args.greedy else "sampled (T 0.9, top-k 50)"
    print(f"CSM-1B structure, {args.rows} rows, {mode}: {per_step:.0f} computing operators a step")
    steps = 3
    for name, n in names.most_common(12):
        print(f"  {n / steps:7.0f}  {name}")
    return per_step


if __name__ == "__main__":
    main()
