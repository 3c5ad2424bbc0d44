"""Decode only what a chunk emits past the decoder's first upsampling stage.

A vocoder chunk is decoded with frames of context on each side (the decoder is not
causal), and the context's audio is thrown away. The context is needed where the
decoder looks far: its first stage (the input conv, the first upsampling layer and its
residual blocks, at 8 samples per frame for Piper's voices) reaches about 10 frames
each way. The later, wider stages (three quarters of the decoder's arithmetic) reach
about one frame. So the vocoder graph gets a Slice on the second upsampling layer's
input, driven by two inputs (`trim_start`, `trim_stop`, in samples of that tensor along
its time axis): the first stage still runs over the whole chunk with its context, the
rest only over the emitted frames plus `margin_frames`, the later stages' own reach.
Every emitted sample is then computed from exactly the values the untrimmed graph uses
(bit-identical output, tested).

`add_trim` finds the cut by structure, computes the reach of everything after it from
the graph (conv kernels, dilations, pads, strides) and records the cut's samples per
frame and the margin in the model's metadata. A graph it does not recognise (fewer than
two upsampling layers, an op after the cut that mixes time steps in another way) is
left as it was: that voice decodes untrimmed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import onnx
from onnx import helper

TRIM_START = "trim_start"
TRIM_STOP = "trim_stop"
RATE_KEY = "playhead.trim_samples_per_frame"
MARGIN_KEY = "playhead.trim_margin_frames"
_TRIM_AXIS = "playhead_trim_axis"
# ops after the cut that keep each time step where it is (their reach is that of their
# inputs); anything else there and the graph is not trimmed
_POINTWISE_OPS = frozenset(
    {"LeakyRelu", "Relu", "Tanh", "Add", "Sub", "Mul", "Div", "Identity", "Cast", "Unsqueeze"}
)


@dataclass(frozen=True)
class Trim:
    samples_per_frame: int  # of the sliced tensor, per latent frame
    margin_frames: int  # frames kept beyond the emitted ones on each side


def _attributes(node: onnx.NodeProto) -> dict[str, object]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _kernel(node: onnx.NodeProto, weights: dict[str, onnx.TensorProto]) -> int | None:
    kernel = _attributes(node).get("kernel_shape")
    if isinstance(kernel, list) and len(kernel) == 1:
        return int(kernel[0])
    weight = weights.get(node.input[1]) if len(node.input) > 1 else None
    return int(weight.dims[2]) if weight is not None and len(weight.dims) == 3 else None


def _conv_reach(
    node: onnx.NodeProto, weights: dict[str, onnx.TensorProto]
) -> tuple[float, int] | None:
    """(reach in input samples, output samples per input sample) of a 1-D conv node,
    or None for a form not handled (unknown kernel, strided conv, asymmetric transposed
    padding...)."""
    kernel = _kernel(node, weights)
    if kernel is None:
        return None
    attributes = _attributes(node)
    strides = attributes.get("strides", [1])
    dilations = attributes.get("dilations", [1])
    pads = attributes.get("pads", [0, 0])
    if not (isinstance(strides, list) and isinstance(dilations, list) and isinstance(pads, list)):
        return None
    if len(strides) != 1 or len(dilations) != 1 or len(pads) != 2 or "auto_pad" in attributes:
        return None
    stride, dilation, pad = int(strides[0]), int(dilations[0]), int(pads[0])
    span = (kernel - 1) * dilation
    if node.op_type == "Conv":
        if stride != 1:
            return None
        return float(max(pad, span - pad)), 1
    # ConvTranspose: out[j] reads in[i] for j + pad - i * stride in [0, span]
    if dilation != 1 or pads[1] != pad:
        return None
    return max(span - pad, pad) / stride, stride


def add_trim(vocoder: onnx.ModelProto) -> Trim | None:
    """Insert the trim Slice into `vocoder` (in place) and record it in its metadata;
    None (graph unchanged) when the graph's shape is not the one handled."""
    graph = vocoder.graph
    nodes = list(graph.node)
    weights = {t.name: t for t in graph.initializer}
    upsampling = [n for n in nodes if n.op_type == "ConvTranspose"]
    if len(upsampling) < 2 or len(graph.input) != 1:
        return None
    latent = graph.input[0].name
    cut = upsampling[1].input[0]

    # samples per frame of every tensor from the latent to the cut
    rate: dict[str, int] = {latent: 1}
    for node in nodes:
        known = [rate[name] for name in node.input if name in rate]
        if not known:
            continue
        if node is upsampling[1]:
            break
        step = 1
        if node.op_type in ("Conv", "ConvTranspose"):
            conv = _conv_reach(node, weights)
            if conv is None:
                return None
            step = conv[1]
        for output in node.output:
            rate[output] = known[0] * step
    producers = [index for index, node in enumerate(nodes) if cut in node.output]
    if cut not in rate or len(producers) != 1:
        return None
    cut_rate = rate[cut]
    after_cut = producers[0] + 1  # the Slice goes here, before every reader of the cut

    # the reach after the cut, in samples of the cut tensor
    reach: dict[str, tuple[float, int]] = {cut: (0.0, 1)}  # (reach, rate relative to the cut)
    for node in nodes[after_cut:]:
        tracked = [reach[name] for name in node.input if name in reach]
        if not tracked:
            continue
        if node.op_type in ("Conv", "ConvTranspose"):
            conv = _conv_reach(node, weights)
            if conv is None or len(tracked) != 1:
                return None
            (before, relative) = tracked[0]
            out = (before + conv[0] / relative, relative * conv[1])
        elif node.op_type in _POINTWISE_OPS:
            relatives = {relative for _, relative in tracked}
            if len(relatives) != 1:
                return None
            out = (max(before for before, _ in tracked), relatives.pop())
        else:
            return None
        for output in node.output:
            reach[output] = out
    outputs = [o.name for o in graph.output]
    if len(outputs) != 1 or outputs[0] not in reach:
        return None
    margin_frames = math.ceil(reach[outputs[0]][0] / cut_rate)

    trimmed = f"{cut}_trimmed"
    for node in nodes:
        for index, name in enumerate(node.input):
            if name == cut:
                node.input[index] = trimmed
    graph.input.extend(
        [
            helper.make_tensor_value_info(TRIM_START, onnx.TensorProto.INT64, [1]),
            helper.make_tensor_value_info(TRIM_STOP, onnx.TensorProto.INT64, [1]),
        ]
    )
    graph.initializer.append(helper.make_tensor(_TRIM_AXIS, onnx.TensorProto.INT64, [1], [2]))
    graph.node.insert(
        after_cut,
        helper.make_node(
            "Slice", [cut, TRIM_START, TRIM_STOP, _TRIM_AXIS], [trimmed], name="playhead_trim"
        ),
    )
    trim = Trim(cut_rate, margin_frames)
    helper.set_model_props(
        vocoder,
        {
            **{p.key: p.value for p in vocoder.metadata_props},
            RATE_KEY: str(trim.samples_per_frame),
            MARGIN_KEY: str(trim.margin_frames),
        },
    )
    return trim


def read_trim(metadata: dict[str, str], input_names: list[str]) -> Trim | None:
    """The trim recorded in a vocoder session's metadata, or None for an untrimmed graph."""
    if input_names[1:] != [TRIM_START, TRIM_STOP]:
        return None
    try:
        trim = Trim(int(metadata[RATE_KEY]), int(metadata[MARGIN_KEY]))
    except (KeyError, ValueError):
        return None
    return trim if trim.samples_per_frame > 0 and trim.margin_frames >= 0 else None


def trim_range(
    frames: int, emits: list[tuple[int, int]], trim: Trim, enabled: bool
) -> tuple[int, int]:
    """The frames [first, last) of a call's `frames` that the trimmed stages decode: the
    union of each item's (emit offset, emit count) widened by the margin, or all of them
    when trimming is off."""
    if not enabled:
        return 0, frames
    first = min(offset for offset, _ in emits) - trim.margin_frames
    last = max(offset + count for offset, count in emits) + trim.margin_frames
    return max(0, first), min(frames, last)
