"""Cut Kokoro-82M's ONNX graph (kokoro-onnx's export, int8) into a talker and a vocoder.

The whole graph: tokens [1, n], style [1, 256], speed [1] -> audio [samples]. Inside it
(names as exported):

talker  = ALBERT text encoder + duration, F0 and energy predictors, durations rounded and
          the text features expanded to frames:
          tokens, style, speed -> features [1, 512, frames]  (`/encoder/MatMul_1_output_0`)
                                  f0 [1, 2 x frames]          (`/encoder/Reshape_output_0`)
                                  energy [1, 2 x frames]      (`/encoder/Reshape_1_output_0`)
                                  durations [1, n]            (`/encoder/Clip_output_0`)
vocoder = the iSTFTNet decoder: features, f0, energy, style -> audio [frames x 600]

The decoder's harmonic source integrates F0 over the whole input (a CumSum of each
harmonic's phase increments). The vocoder gets one more input, `phase_offset` [1, 1, 9]
(cycles, added after that CumSum), so that a window that starts later in a segment
continues the phase the whole decode has there (the talker computes it: `phase_cycles`).
With offset 0 on a whole segment the vocoder reproduces the whole graph exactly (tested).

The decoder is not local in time, though: every AdaIN layer normalises over the whole
input (instance norm), so a frame's audio depends on all frames decoded with it. A window
with context does not equal the whole decode (docs/kokoro.md has the figures): the
backend decodes whole talker pieces.
"""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnx.utils
from onnx import TensorProto, helper

from pipeline.backends.kokoro.errors import KokoroAssetError

logger = logging.getLogger("playhead.kokoro")

SPLIT_VERSION = 1  # bump when the cut changes: old cache entries are then ignored
TALKER_INPUTS = ("tokens", "style", "speed")
FEATURES = "/encoder/MatMul_1_output_0"
F0 = "/encoder/Reshape_output_0"
ENERGY = "/encoder/Reshape_1_output_0"
DURATIONS = "/encoder/Clip_output_0"
PHASE_CUMSUM = "/decoder/decoder/generator/m_source/l_sin_gen/CumSum_output_0"
PHASE_OFFSET = "phase_offset"
STYLE = "style"
AUDIO = "audio"
HARMONICS = 9  # the sine source's harmonics: f0 x 1 .. 9
FEATURE_CHANNELS = 512


@dataclass(frozen=True)
class SplitGraphs:
    talker: Path | bytes
    vocoder: Path | bytes
    cached: bool


def phase_cycles(f0_hz: np.ndarray, sample_rate_hz: int) -> np.ndarray:
    """The sine source's phase, in cycles (mod 1), before each F0 step: [steps, 9].

    The graph's source takes ((f0 x harmonic / rate) mod 1) per F0 step and sums it
    (CumSum); the phase before step i is the sum over the steps before it. Computed in
    float64 and wrapped, so a late window gets its offset without float32's drift."""
    harmonics = np.arange(1, HARMONICS + 1, dtype=np.float64)
    increments = np.mod(
        f0_hz.astype(np.float32).astype(np.float64)[:, None] * harmonics / sample_rate_hz, 1.0
    )
    before = np.concatenate([np.zeros((1, HARMONICS)), np.cumsum(increments, axis=0)[:-1]])
    return np.mod(before, 1.0).astype(np.float32)


def _topological(graph: onnx.GraphProto) -> None:
    known = {i.name for i in graph.input} | {i.name for i in graph.initializer} | {""}
    ordered: list[onnx.NodeProto] = []
    rest = list(graph.node)
    while rest:
        waiting = []
        for node in rest:
            if all(name in known for name in node.input):
                ordered.append(node)
                known.update(node.output)
            else:
                waiting.append(node)
        if len(waiting) == len(rest):
            raise KokoroAssetError("the Kokoro vocoder graph has a cycle after the cut")
        rest = waiting
    del graph.node[:]
    graph.node.extend(ordered)


def split_model(model: onnx.ModelProto) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    produced = {out for node in model.graph.node for out in node.output}
    missing = [n for n in (FEATURES, F0, ENERGY, DURATIONS, PHASE_CUMSUM) if n not in produced]
    if missing or [i.name for i in model.graph.input] != list(TALKER_INPUTS):
        raise KokoroAssetError(
            f"not kokoro-onnx's Kokoro-82M export (missing {missing or 'its inputs'}): "
            "this backend cannot split it"
        )
    extractor = onnx.utils.Extractor(model)
    talker = extractor.extract_model(list(TALKER_INPUTS), [FEATURES, F0, ENERGY, DURATIONS])
    vocoder = extractor.extract_model([FEATURES, F0, ENERGY, STYLE], [AUDIO])
    graph = vocoder.graph
    shifted = PHASE_CUMSUM + "_playhead_offset"
    for node in graph.node:
        for index, name in enumerate(node.input):
            if name == PHASE_CUMSUM:
                node.input[index] = shifted
    graph.node.append(
        helper.make_node("Add", [PHASE_CUMSUM, PHASE_OFFSET], [shifted], name="playhead_phase")
    )
    graph.input.append(
        helper.make_tensor_value_info(PHASE_OFFSET, TensorProto.FLOAT, [1, 1, HARMONICS])
    )
    _topological(graph)
    return talker, vocoder


def load_split(model_path: Path, model_sha256: str, cache_dir: Path) -> SplitGraphs:
    """The cut graphs, from the cache when there (keyed by the model's SHA-256 and
    SPLIT_VERSION), else cut now and cached (in memory when the cache is not writable)."""
    folder = cache_dir / "split"
    stem = f"{model_sha256[:16]}-v{SPLIT_VERSION}"
    talker_path, vocoder_path = folder / f"{stem}-talker.onnx", folder / f"{stem}-vocoder.onnx"
    if talker_path.exists() and vocoder_path.exists():
        return SplitGraphs(talker_path, vocoder_path, cached=True)
    talker, vocoder = split_model(onnx.load(str(model_path)))
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for part, path in ((talker, talker_path), (vocoder, vocoder_path)):
            _write_atomically(part, path)
    except OSError as error:
        logger.warning("kokoro: cannot cache the cut graphs in %s (%s)", folder, error)
        return SplitGraphs(talker.SerializeToString(), vocoder.SerializeToString(), False)
    return SplitGraphs(talker_path, vocoder_path, cached=False)


def _write_atomically(model: onnx.ModelProto, path: Path) -> None:
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(model.SerializeToString())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
