"""The talker step's hot pieces compiled (`codec_lm.compile_step`): torch.compile with
inductor, so that each piece runs as a few fused kernels instead of one per operator.

On an H200 (2026-12-04) a step at batch 64 was 9,479 kernels of about 2.5 us each, and
their number, not the batch, set its time (docs/codec-lm.md). Inductor fuses the operators
between matrix products: a norm with the residual add before it, the rotary embedding
(products, the half swap and the sum) into one kernel, the MLP's silu and product, the
sampling's scale, top-k mask, noise and argmax. The matrix products and the attention stay
the library's kernels.

What is compiled is three functions of `FixedStep` (fixed.py), not the whole step: the
backbone (its 16 layers, one graph), one pass of the depth decoder (its 4 layers and the
final norm, one graph reused by the 31 passes of a step) and a codebook's choice (the
head's product and the sampling). The whole step unrolled is one graph of thousands of
operators: on this project's CPU the tiny model's step took 123 s to compile, CSM-1B's
would be about ten times that; the pieces compile in seconds and each is reused many
times a step. Shapes are dynamic (rows, keys, the depth decoder's growing K and V), so one
compilation serves every bucket, and the CUDA graphs (graphs.py) capture the compiled
kernels as they capture eager ones: a bucket's two warm-up calls compile (first call) and
run the code, the capture then records the compiled kernels; nothing is compiled while
streams play.

The pieces run under `torch.no_grad` (an inference-mode tensor cannot pass through a
compiled graph's views), and compute the same operators as the eager path: on a float32
CPU the same codes frame for frame (tests/test_codec_lm_compiled.py). On a GPU in bfloat16
a fused kernel may round where the eager one does not; gpu_check counts the frames that
differ.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch
import torch._dynamo
import torch.fx.experimental._config as shape_config
from torch._dynamo.utils import counters

F = TypeVar("F", bound=Callable)

# graphs a compiled piece may keep (dynamo's default is 8): one per structure met (the
# backbone with and without gathering its slots, the first depth pass and the others,
# sampled and greedy heads) and a few shape specialisations besides
RECOMPILE_LIMIT = 32


def compile_piece(fn: F) -> F:
    """`fn` compiled with inductor, dynamic shapes, the whole body one graph (a piece that
    cannot be traced whole fails loudly rather than run half eagerly)."""
    limit = torch._dynamo.config.recompile_limit
    torch._dynamo.config.recompile_limit = max(limit, RECOMPILE_LIMIT)
    compiled = torch.compile(fn, dynamic=True, fullgraph=True)

    def run(*args, **kwargs):
        # no "duck" shapes: two sizes (or view offsets) equal when traced are not assumed
        # equal for ever, else every codebook's slice of the noise and of the head, at its
        # own offset, would compile a graph of its own
        with shape_config.patch(use_duck_shape=False):
            return compiled(*args, **kwargs)

    return run  # type: ignore[return-value]


def compiled_count() -> int:
    """Graphs dynamo has compiled in this process (every piece, every step object)."""
    return int(counters["stats"]["unique_graphs"])
