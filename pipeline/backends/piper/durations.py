"""Make a Piper voice's length scale exact: `speed` then scales the duration as asked.

Piper's graph rounds each phoneme's duration up to whole frames *after* the length scale:
`ceil(w * length_scale)`. Rounding up adds about half a frame per phoneme whatever the
scale, so the added time is a small share of a slow utterance and a large share of a fast
one: speed 4.0 came out at about half the duration instead of a quarter, 0.25 at 3.2x
instead of 4x.

The rewrite rounds where the speed-1 voice rounds, then scales: the utterance gets
`round(L * sum(c))` frames, `c = ceil(w)` being the speed-1 durations. Every phoneme keeps
at least one frame (a dropped phoneme is a lost sound: at speed 2 exact scaling alone
dropped the one-frame ones), the pads between phonemes excepted; the frames left are
shared out in proportion to what each phoneme has above one frame, turned into whole
frames by rounding their running sum so that the error never accumulates. The total is
then within half a frame of L times the speed-1 length (unless the speed is so high that
one frame a phoneme is already more). At length scale 1 the durations are exactly the
original ones.

    w = Exp(logw) * mask;  d = Ceil(w * L)                                   (Piper)
    c = Ceil(w);  f = Min(c, 1) * (input != pad);  a = c - f
    e = a * max(round(L * sum(c)) - sum(f), 0) / sum(a)
    r = Round(CumSum(e));  d = f + r - [0, r[:-1]]                             (here)
"""

from __future__ import annotations

import logging

import numpy as np
import onnx
from onnx import helper, numpy_helper

logger = logging.getLogger("playhead.piper")

_PREFIX = "/playhead_exact_durations"
PAD_ID = 0  # Piper's "_", interleaved between phonemes: it may shrink to no frame at all


def make_length_scale_exact(model: onnx.ModelProto, voice_id: str, pad_id: int = PAD_ID) -> bool:
    """Rewrite the duration rounding in place. False (the graph left as it is, with a
    warning) when the graph does not have Piper's `Ceil(Mul(w, length_scale))` shape."""
    graph = model.graph
    producers = {out: node for node in graph.node for out in node.output}
    found = _find(graph, producers)
    if found is None:
        logger.warning(
            "voice %s: no Ceil(durations * length_scale) in its graph; speed is approximate",
            voice_id,
        )
        return False
    ceil, durations, length_scale = found
    out = ceil.output[0]

    def name(part: str) -> str:
        return f"{_PREFIX}/{part}"

    graph.initializer.extend(
        [
            numpy_helper.from_array(np.array(-1, dtype=np.int64), name("axis")),
            numpy_helper.from_array(np.array([-1], dtype=np.int64), name("axes")),
            numpy_helper.from_array(np.array([0], dtype=np.int64), name("zero")),
            numpy_helper.from_array(np.array([1], dtype=np.int64), name("one")),
            numpy_helper.from_array(np.array([-1], dtype=np.int64), name("minus_one")),
            numpy_helper.from_array(np.array([2], dtype=np.int64), name("time_axis")),
            numpy_helper.from_array(np.array(0.0, dtype=np.float32), name("nought")),
            numpy_helper.from_array(np.array(1.0, dtype=np.float32), name("unit")),
            numpy_helper.from_array(np.array(1e-6, dtype=np.float32), name("tiny")),
            numpy_helper.from_array(np.array(pad_id, dtype=np.int64), name("pad_id")),
        ]
    )

    def node(op: str, inputs: list[str], output: str, **attrs: object) -> onnx.NodeProto:
        return helper.make_node(op, inputs, [output], name=name(output), **attrs)

    nodes = [
        node("Ceil", [durations], name("speed1")),  # Piper's own whole frames at speed 1
        # every phoneme keeps one frame; the rest of the asked total is shared out in
        # proportion to what each has above one frame
        node("Equal", ["input", name("pad_id")], name("is_pad")),
        node("Not", [name("is_pad")], name("is_phoneme")),
        node("Cast", [name("is_phoneme")], name("phoneme"), to=onnx.TensorProto.FLOAT),
        node("Unsqueeze", [name("phoneme"), name("one")], name("phoneme_mask")),
        node("Min", [name("speed1"), name("unit")], name("at_most_one")),
        node("Mul", [name("at_most_one"), name("phoneme_mask")], name("floor")),
        node("Sub", [name("speed1"), name("floor")], name("above")),
        node("ReduceSum", [name("speed1"), name("axes")], name("speed1_total"), keepdims=1),
        node("Mul", [name("speed1_total"), length_scale], name("asked_total")),
        node("Round", [name("asked_total")], name("asked_frames")),
        node("ReduceSum", [name("floor"), name("axes")], name("floor_total"), keepdims=1),
        node("Sub", [name("asked_frames"), name("floor_total")], name("left")),
        node("Max", [name("left"), name("nought")], name("left_pos")),
        node("ReduceSum", [name("above"), name("axes")], name("above_total"), keepdims=1),
        node("Max", [name("above_total"), name("tiny")], name("above_safe")),
        node("Div", [name("left_pos"), name("above_safe")], name("share")),
        node("Mul", [name("above"), name("share")], name("scaled")),
        # whole frames by rounding the running sum: the error never accumulates
        node("CumSum", [name("scaled"), name("axis")], name("ends")),
        node("Round", [name("ends")], name("frame_ends")),
        node(
            "Slice",
            [name("frame_ends"), name("zero"), name("minus_one"), name("time_axis")],
            name("earlier"),
        ),
        node(
            "Slice",
            [name("frame_ends"), name("zero"), name("one"), name("time_axis")],
            name("first"),
        ),
        node("Mul", [name("first"), name("nought")], name("start")),
        node("Concat", [name("start"), name("earlier")], name("starts"), axis=2),
        node("Sub", [name("frame_ends"), name("starts")], name("extra")),
        helper.make_node("Add", [name("floor"), name("extra")], [out], name=name("durations")),
    ]
    position = list(graph.node).index(ceil)
    graph.node.remove(ceil)
    for offset, node in enumerate(nodes):
        graph.node.insert(position + offset, node)
    return True


def _find(
    graph: onnx.GraphProto, producers: dict[str, onnx.NodeProto]
) -> tuple[onnx.NodeProto, str, str] | None:
    """(the Ceil node, the speed-1 durations, the length scale) of Piper's duration rounding.

    The length scale is the operand of the Ceil's Mul that comes from the `scales` input
    (a Gather of it); the other operand is the speed-1 durations."""
    for node in graph.node:
        if node.op_type != "Ceil":
            continue
        mul = producers.get(node.input[0])
        if mul is None or mul.op_type != "Mul":
            continue
        for scale_index in (0, 1):
            source = producers.get(mul.input[scale_index])
            if source is not None and source.op_type == "Gather" and source.input[0] == "scales":
                return node, mul.input[1 - scale_index], mul.input[scale_index]
    return None
