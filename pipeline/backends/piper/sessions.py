"""A Piper voice's ONNX Runtime sessions: its cut graphs (graph_split.py) loaded with the
`piper.ort_*` options, checked to fit together; and the handle that ends a running call."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import onnxruntime as ort

from pipeline.backend import Voice
from pipeline.backends.piper.errors import VoiceLoadError
from pipeline.backends.piper.graph_split import SplitGraphs, load_split
from pipeline.backends.piper.vocoder_trim import TRIM_START, TRIM_STOP, Trim, read_trim
from pipeline.backends.piper.voices import VoiceSpec
from pipeline.config import PiperConfig

logger = logging.getLogger("playhead.piper")


@dataclass(frozen=True)
class LoadedVoice:
    """A voice's sessions and what the backend reads of its graphs."""

    spec: VoiceSpec
    voice: Voice
    # with `flow`: prior, mask, count; else latent, count; then durations where known
    encoder: ort.InferenceSession
    flow: ort.InferenceSession | None  # prior, mask -> latent; None: the encoder is the talker
    vocoder: ort.InferenceSession
    latent_name: str  # the vocoder's input
    channels: int
    trim: Trim | None  # the vocoder graph's trim inputs (None: an untrimmed graph)
    # the encoder and flow again on `piper.alone_intra_op_threads` threads, for a
    # segment's first step when nothing else runs (None: that setting is 1, or no flow)
    alone_encoder: ort.InferenceSession | None = None
    alone_flow: ort.InferenceSession | None = None


class VocodeAbort:
    """Ends the `PiperBackend.vocode` call it was passed to, or a prepared segment's
    encoder (ONNX Runtime's terminate flag, which the running call checks between nodes);
    harmless once the call is over."""

    __slots__ = ("options",)

    def __init__(self) -> None:
        self.options = ort.RunOptions()

    def __call__(self) -> None:
        self.options.terminate = True


def load_voice(spec: VoiceSpec, piper: PiperConfig) -> LoadedVoice:
    """One voice's cut graphs (cached, cut again where the cache fails to load) as
    sessions, checked to fit together."""
    cache_dir = piper.cache_dir
    split = load_split(spec.model_path, cache_dir, spec.id)
    try:
        sessions = _voice_sessions(split, piper)
    except Exception as error:  # ORT raises its own RuntimeError subclasses
        if not split.cached:
            raise VoiceLoadError(
                f"voice {spec.id!r}: cannot load its cut graphs: {error}"
            ) from error
        logger.warning(
            "voice %s: cached cut graphs failed to load (%s); cutting again", spec.id, error
        )
        sessions = _voice_sessions(
            load_split(spec.model_path, cache_dir, spec.id, refresh=True), piper
        )
    encoder, flow, vocoder_session, alone = sessions
    talker_outputs = (flow or encoder).get_outputs()
    latent = talker_outputs[0].name
    channels = talker_outputs[0].shape[1]
    encoder_outputs = [o.name for o in encoder.get_outputs()]
    # the last output, frames per phoneme id, is there where the graph has it
    fits = (
        len(encoder_outputs) in (2, 3)
        if flow is None
        else (
            len(encoder_outputs) in (3, 4)
            and [i.name for i in flow.get_inputs()] == encoder_outputs[:2]
        )
    )
    vocoder_inputs = [i.name for i in vocoder_session.get_inputs()]
    trim = read_trim(vocoder_session.get_modelmeta().custom_metadata_map, vocoder_inputs)
    if (
        not fits
        or vocoder_inputs != [latent, *(() if trim is None else (TRIM_START, TRIM_STOP))]
        or not isinstance(channels, int)
    ):
        raise VoiceLoadError(f"voice {spec.id!r}: cut graphs do not fit together (cache at fault?)")
    voice = Voice(
        id=spec.id,
        name=spec.name,
        language=spec.language,
        sample_rate_hz=spec.sample_rate_hz,
        samples_per_frame=spec.samples_per_frame,
    )
    return LoadedVoice(
        spec, voice, encoder, flow, vocoder_session, latent, channels, trim, *alone
    )  # fmt: skip


_OPTIMIZATION_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


def _session(
    graph: Path | bytes, intra_op_threads: int, piper: PiperConfig, *, stop_spinning: bool = False
) -> ort.InferenceSession:
    """One graph's session: `intra_op_threads` threads, nodes run one after another (a
    single inter-op thread: each stage is one worker thread), the `piper.ort_*` options.
    `stop_spinning`: its pool's threads stop spinning when a run ends (they would take
    the cores of the calls that follow it)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = _OPTIMIZATION_LEVELS[piper.ort_graph_optimization]
    options.enable_cpu_mem_arena = piper.ort_cpu_arena
    if not piper.ort_spinning:  # idle pool threads sleep, not spin
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if stop_spinning:
        options.add_session_config_entry("session.force_spinning_stop", "1")
    options.log_severity_level = 3  # errors only
    source = graph if isinstance(graph, bytes) else str(graph)
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


_Session = ort.InferenceSession


def _voice_sessions(
    split: SplitGraphs, piper: PiperConfig
) -> tuple[_Session, _Session | None, _Session, tuple[_Session, _Session] | tuple[()]]:
    """(encoder, flow, vocoder, alone) sessions of one voice: the talker's two with
    `piper.talker_intra_op_threads`, the vocoder's with `piper.vocoder_intra_op_threads`;
    alone: the encoder and flow on `piper.alone_intra_op_threads` (none where that is 1
    or the voice has no flow of its own)."""
    threads = piper.talker_intra_op_threads
    alone_threads = piper.alone_intra_op_threads
    # built two at a time: ONNX Runtime builds a session mostly outside the GIL, and the
    # alone pair made a voice's load 0.27 -> 0.50 s one after another (0.29 s two at once)
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="piper-load") as pool:
        encoder = pool.submit(_session, split.encoder, threads, piper)
        flow = None if split.flow is None else pool.submit(_session, split.flow, threads, piper)
        vocoder = pool.submit(_session, split.vocoder, piper.vocoder_intra_op_threads, piper)
        wide = []
        if split.flow is not None and alone_threads > 1:
            wide = [
                pool.submit(_session, graph, alone_threads, piper, stop_spinning=True)
                for graph in (split.encoder, split.flow)
            ]
        alone: tuple[_Session, _Session] | tuple[()] = (
            (wide[0].result(), wide[1].result()) if wide else ()
        )
        return (
            encoder.result(),
            None if flow is None else flow.result(),
            vocoder.result(),
            alone,
        )
