"""Cut a Piper (VITS) ONNX graph into talker graphs and a vocoder graph, cached on disk.

The talker is text encoder + duration predictor + flow; where the flow's input is found
it is cut in two, so that the encoder runs once over a whole sentence and the flow in
chunks (pipeline/backends/piper/backend.py):

encoder = text encoder + duration predictor (+ the flow when it is not cut off):
          input, input_lengths, scales -> prior latent z_p [batch, channels, frames]
                                              (means + noise, expanded to frames),
                                             frame mask [batch, 1, frames],
                                             frame count [batch],
                                             durations [batch, 1, phoneme ids]
          (uncut: latent [batch, channels, frames], frame count [batch], durations)
          The durations are each phoneme id's whole frames (what the frame count sums):
          where each character is heard (pipeline/backends/piper/timing.py). A graph
          whose durations are not found has no such output (no timings: the engine
          spreads the characters evenly).
flow    = the flow, reversed: z_p, frame mask -> latent [batch, channels, frames] (z, masked)
vocoder = HiFi-GAN decoder: latent -> output [batch, 1, 1, samples], with a trim after
          its first stage where the graph allows (`trim_start`, `trim_stop`:
          pipeline/backends/piper/vocoder_trim.py)

The decoder's cut is found by name first (`/Mul_7_output_0`, `/Cast_output_0` in Piper's
exports), else by structure: the latent is the data input of the decoder's first conv
(the Conv that feeds the graph's first ConvTranspose), the frame count is the Cast after
Ceil -> ReduceSum (-> Clip) of the durations, the durations that ReduceSum's input. The
flow's cut is found by name (`/Add_output_0` feeding a node of `/flow/`, the mask
`/Cast_2_output_0`, as in Piper's exports); a voice without them keeps its talker whole
(one graph, run whole per segment).
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx import helper

from pipeline.backends.piper.durations import make_length_scale_exact
from pipeline.backends.piper.errors import GraphSplitError
from pipeline.backends.piper.vocoder_trim import add_trim

logger = logging.getLogger("playhead.piper")

SPLIT_VERSION = 5  # bump when the cut changes: old cache entries are then ignored
TALKER_INPUTS = ("input", "input_lengths", "scales")
AUDIO_OUTPUT = "output"
LATENT_NAME = "/Mul_7_output_0"
FRAME_COUNT_NAME = "/Cast_output_0"
PRIOR_NAME = "/Add_output_0"  # z_p: the flow's input
MASK_NAME = "/Cast_2_output_0"  # the frame mask, float [batch, 1, frames]
FLOW_PREFIX = "/flow/"
_PASS_THROUGH_OPS = frozenset({"LeakyRelu", "Relu", "Identity"})


@dataclass(frozen=True)
class CutPoints:
    latent: str  # [batch, channels, frames] float32: the decoder's input
    frame_count: str  # [batch] int64: frames per batch item
    channels: int
    prior: str | None = None  # [batch, channels, frames] float32: the flow's input (z_p)
    mask: str | None = None  # [batch, 1, frames] float32: the frame mask
    durations: str | None = None  # [batch, 1, phoneme ids] float32: frames per phoneme id


@dataclass(frozen=True)
class SplitGraphs:
    """The graphs, as cache files (or serialized bytes when the cache is not writable)."""

    # outputs: prior, mask, frame count (with flow), else latent, count; then durations
    # where the graph has them
    encoder: Path | bytes
    flow: Path | bytes | None  # inputs: prior, mask; output: latent (None: not cut off)
    vocoder: Path | bytes  # inputs: latent (and the trim's, where added); output: audio
    cached: bool  # True: found in the cache, not cut now


def default_cache_dir() -> Path:
    """`playhead` under XDG_CACHE_HOME (or ~/.cache)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "playhead"


def file_sha256(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def find_cut(model: onnx.ModelProto, voice_id: str) -> CutPoints:
    graph = model.graph
    producers = {out: node for node in graph.node for out in node.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    initializers = {init.name: init for init in graph.initializer}

    latent = _latent_by_name(consumers) or _latent_by_structure(graph.node, producers)
    if latent is None:
        raise GraphSplitError(
            f"voice {voice_id!r}: cannot find the decoder's input in its ONNX graph "
            "(no conv feeding a ConvTranspose): not a Piper/VITS voice this backend can split"
        )
    conv = next(n for n in consumers[latent] if n.op_type == "Conv")
    weight = initializers.get(conv.input[1])
    if weight is None or len(weight.dims) != 3:
        raise GraphSplitError(f"voice {voice_id!r}: the decoder's first conv has no 1-D weight")
    frame_count = _frame_count(producers, consumers, voice_id)
    channels = int(weight.dims[1])
    prior, mask = _flow_input(producers, consumers)
    durations = _durations(producers, frame_count)
    return CutPoints(latent, frame_count, channels, prior, mask, durations)


def _durations(producers: dict[str, onnx.NodeProto], frame_count: str) -> str | None:
    """The per-phoneme-id frames that the frame count sums (Cast <- Clip/Max <-
    ReduceSum <- durations), or None when the graph is not of that shape."""
    node = producers.get(frame_count)
    for _ in range(4):
        if node is None:
            return None
        if node.op_type == "ReduceSum":
            return node.input[0]
        if node.op_type not in ("Cast", "Clip", "Max"):
            return None
        node = producers.get(node.input[0])
    return None


def _flow_input(
    producers: dict[str, onnx.NodeProto], consumers: dict[str, list[onnx.NodeProto]]
) -> tuple[str | None, str | None]:
    """(prior, mask) when Piper's names mark the flow's input, else (None, None)."""
    prior_read = [n.name.startswith(FLOW_PREFIX) for n in consumers.get(PRIOR_NAME, ())]
    mask_read = [n.name.startswith(FLOW_PREFIX) for n in consumers.get(MASK_NAME, ())]
    if (
        PRIOR_NAME in producers
        and MASK_NAME in producers
        and prior_read
        and all(prior_read)
        and any(mask_read)
    ):
        return PRIOR_NAME, MASK_NAME
    return None, None


def _latent_by_name(consumers: dict[str, list[onnx.NodeProto]]) -> str | None:
    if any(n.op_type == "Conv" for n in consumers.get(LATENT_NAME, ())):
        return LATENT_NAME
    return None


def _latent_by_structure(
    nodes: Iterable[onnx.NodeProto], producers: dict[str, onnx.NodeProto]
) -> str | None:
    first_up = next((n for n in nodes if n.op_type == "ConvTranspose"), None)
    if first_up is None:
        return None
    node = producers.get(first_up.input[0])
    while node is not None and node.op_type in _PASS_THROUGH_OPS:
        node = producers.get(node.input[0])
    if node is None or node.op_type != "Conv":
        return None
    return node.input[0]


def _frame_count(
    producers: dict[str, onnx.NodeProto],
    consumers: dict[str, list[onnx.NodeProto]],
    voice_id: str,
) -> str:
    if FRAME_COUNT_NAME in producers and producers[FRAME_COUNT_NAME].op_type == "Cast":
        return FRAME_COUNT_NAME
    for node in producers.values():
        if node.op_type != "Ceil":
            continue
        for reduce in consumers.get(node.output[0], ()):
            if reduce.op_type != "ReduceSum":
                continue
            current = reduce
            for _ in range(3):
                nxt = consumers.get(current.output[0], ())
                cast = next((n for n in nxt if n.op_type == "Cast"), None)
                if cast is not None:
                    return cast.output[0]
                clip = next((n for n in nxt if n.op_type in ("Clip", "Max")), None)
                if clip is None:
                    break
                current = clip
    raise GraphSplitError(
        f"voice {voice_id!r}: cannot find the frame count (Ceil -> ReduceSum -> Cast)"
    )


def split_model(
    model: onnx.ModelProto, voice_id: str
) -> tuple[onnx.ModelProto, onnx.ModelProto | None, onnx.ModelProto, CutPoints]:
    """(encoder, flow or None, vocoder, cut); every graph passes onnx.checker. Mutates
    `model`'s value_info."""
    cut = find_cut(model, voice_id)
    graph_inputs = {i.name for i in model.graph.input}
    missing = [name for name in TALKER_INPUTS if name not in graph_inputs]
    if missing or AUDIO_OUTPUT not in {o.name for o in model.graph.output}:
        raise GraphSplitError(
            f"voice {voice_id!r}: expected inputs {TALKER_INPUTS} and output {AUDIO_OUTPUT!r}"
        )
    latent_info = helper.make_tensor_value_info(
        cut.latent, onnx.TensorProto.FLOAT, ["batch_size", cut.channels, "frames"]
    )
    count_info = helper.make_tensor_value_info(
        cut.frame_count, onnx.TensorProto.INT64, ["batch_size"]
    )
    infos = [latent_info, count_info]
    if cut.durations is not None:
        infos.append(
            helper.make_tensor_value_info(
                cut.durations, onnx.TensorProto.FLOAT, ["batch_size", 1, "phonemes"]
            )
        )
    timing = [] if cut.durations is None else [cut.durations]
    if cut.prior is not None and cut.mask is not None:
        infos += [
            helper.make_tensor_value_info(
                cut.prior, onnx.TensorProto.FLOAT, ["batch_size", cut.channels, "frames"]
            ),
            helper.make_tensor_value_info(
                cut.mask, onnx.TensorProto.FLOAT, ["batch_size", 1, "frames"]
            ),
        ]
    declared = {info.name for info in infos}
    kept = [v for v in model.graph.value_info if v.name not in declared]
    del model.graph.value_info[:]
    model.graph.value_info.extend([*kept, *infos])

    extractor = onnx.utils.Extractor(model)
    vocoder = extractor.extract_model([cut.latent], [AUDIO_OUTPUT])
    if add_trim(vocoder) is None:
        logger.info("voice %s: the vocoder graph is not trimmed (structure not handled)", voice_id)
    _check(vocoder, voice_id, "vocoder")
    flow = None
    if cut.prior is not None and cut.mask is not None:
        encoder = extractor.extract_model(
            list(TALKER_INPUTS), [cut.prior, cut.mask, cut.frame_count, *timing]
        )
        flow = extractor.extract_model([cut.prior, cut.mask], [cut.latent])
        try:
            _check(encoder, voice_id, "encoder")
            _check(flow, voice_id, "flow")
        except GraphSplitError as error:  # the names lied: keep the talker whole
            logger.info("voice %s: the flow is not cut off (%s)", voice_id, error)
            flow = None
            cut = CutPoints(cut.latent, cut.frame_count, cut.channels, durations=cut.durations)
    if flow is None:
        encoder = extractor.extract_model(
            list(TALKER_INPUTS), [cut.latent, cut.frame_count, *timing]
        )
        _check(encoder, voice_id, "talker")
    return encoder, flow, vocoder, cut


def _check(part: onnx.ModelProto, voice_id: str, what: str) -> None:
    _require_closed(part, voice_id, what)
    try:
        onnx.checker.check_model(part)
    except onnx.checker.ValidationError as error:
        raise GraphSplitError(
            f"voice {voice_id!r}: the {what} graph is invalid: {error}"
        ) from error


def _require_closed(part: onnx.ModelProto, voice_id: str, what: str) -> None:
    """Every tensor a node reads is an input, an initializer or another node's output."""
    known = {i.name for i in part.graph.input} | {i.name for i in part.graph.initializer}
    known |= {out for node in part.graph.node for out in node.output}
    known.add("")  # optional inputs left empty
    dangling = sorted({n for node in part.graph.node for n in node.input} - known)
    if dangling:
        raise GraphSplitError(
            f"voice {voice_id!r}: the {what} graph also depends on {', '.join(dangling)} "
            "(e.g. a speaker id): this voice cannot be split"
        )


def load_split(
    model_path: str | Path, cache_dir: str | Path | None, voice_id: str, *, refresh: bool = False
) -> SplitGraphs:
    """The voice's encoder, flow and vocoder graphs, cut once and cached by the model's
    sha256 (no flow file: the voice's flow is not cut off).

    `refresh` cuts again even when the cache has an entry (e.g. one that failed to load).
    """
    model_path = Path(model_path)
    folder = (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / "piper-split"
    sha = file_sha256(model_path)
    key = f"{sha}.v{SPLIT_VERSION}"
    encoder_path = folder / f"{key}.encoder.onnx"
    flow_path = folder / f"{key}.flow.onnx"
    vocoder_path = folder / f"{key}.vocoder.onnx"
    if not refresh and encoder_path.is_file() and vocoder_path.is_file():
        logger.debug("voice %s: reusing cut graphs %s", voice_id, folder / key)
        flow = flow_path if flow_path.is_file() else None
        return SplitGraphs(encoder_path, flow, vocoder_path, cached=True)
    try:
        model = onnx.load(str(model_path))
    except Exception as error:
        raise GraphSplitError(f"voice {voice_id!r}: cannot load {model_path}: {error}") from error
    make_length_scale_exact(model, voice_id)  # speed scales durations as asked
    encoder, flow, vocoder, _ = split_model(model, voice_id)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        _write_atomically(vocoder, vocoder_path)
        if flow is not None:
            _write_atomically(flow, flow_path)
        else:
            flow_path.unlink(missing_ok=True)
        _write_atomically(encoder, encoder_path)  # last: its presence marks a complete entry
        _remove_other_versions(folder, sha)
    except OSError as error:
        logger.warning(
            "voice %s: cannot cache the cut graphs in %s (%s); keeping them in memory",
            voice_id,
            folder,
            error,
        )
        return SplitGraphs(
            encoder.SerializeToString(),
            None if flow is None else flow.SerializeToString(),
            vocoder.SerializeToString(),
            cached=False,
        )
    logger.info("voice %s: cut graphs written to %s", voice_id, folder / key)
    return SplitGraphs(encoder_path, flow_path if flow is not None else None, vocoder_path, False)


def _remove_other_versions(folder: Path, sha: str) -> None:
    """Delete this model's cut graphs of other split versions (about the model's size
    each); other models' entries are left alone."""
    current = f"{sha}.v{SPLIT_VERSION}."
    for path in folder.glob(f"{sha}.v*.onnx"):
        if not path.name.startswith(current):
            path.unlink(missing_ok=True)
            logger.info("removed %s (another split version)", path.name)


def _write_atomically(model: onnx.ModelProto, path: Path) -> None:
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(model.SerializeToString())
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
