"""Typed configuration of the pipeline: the engine, its two stages, and the backends.

Frozen dataclasses that validate themselves through scheduling/validation.py (ConfigError
names the field), so that the engine can be built from plain Python in tests and
benchmarks, and app/settings.py can embed them in the YAML-backed settings. Their defaults
are the measured ones: configs/default.yaml writes out the same values (a test compares
them field by field).
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduling.errors import ConfigError
from scheduling.validation import (
    check_bool,
    check_choice,
    check_int,
    check_non_negative,
    check_optional_non_negative,
    check_positive,
    check_text,
)

ORT_OPTIMIZATION_LEVELS = ("disable", "basic", "extended", "all")


@dataclass(frozen=True)
class TalkerConfig:
    batch: int = 1  # most open segments stepped together in one talker step
    # a second lane (thread) for urgent streams (no audio yet, or under urgent_slack_s of it
    # ahead) while the first lane is busy, where the backend's steps may run side by side
    # (`capabilities.concurrent_talker_steps`)
    urgent_lane: bool = True
    high_water_s: float = 8.0  # a stream this many seconds of audio ahead gets no talker work
    # ... unless the talker would otherwise idle (work-conserving; scheduling/talker.py)
    run_ahead: bool = True
    # while the vocoder is busy (a chunk waiting, or every worker decoding while other
    # streams have work), a stream with this much audio talked but not yet vocoded sits
    # out: more would take the cores from the chunks waiting (0: no cap)
    busy_max_queued_s: float = 2.0
    # a segment opened while its stream has less than this much audio ahead (buffered in
    # the player plus talked, not yet vocoded), or none yet, is urgent (TalkRequest.urgent):
    # Piper then runs its flow in small first steps; otherwise over the whole segment at
    # once (up to piper.flow_max_chunk_frames), which costs less per frame (no flow context);
    # a stream whose player has less than this ahead as its chunk is planned has the chunk
    # cut short of its lookahead rather than wait for it (ChunkPlanner.next_chunk's urgent)
    # (a stream alone: alone.urgent_slack_s)
    urgent_slack_s: float = 1.0

    def __post_init__(self) -> None:
        check_int("batch", self.batch, 1)
        check_bool("urgent_lane", self.urgent_lane)
        check_positive("high_water_s", self.high_water_s)
        check_bool("run_ahead", self.run_ahead)
        check_non_negative("busy_max_queued_s", self.busy_max_queued_s)
        check_non_negative("urgent_slack_s", self.urgent_slack_s)


@dataclass(frozen=True)
class AloneConfig:
    """What the engine does for a stream alone: no other stream has work left (the one
    definition, pipeline/load.py). Each is measured against its removal
    (benchmarks/results/records/2026-12-03-voice-alone-ablation.md)."""

    # a vocoder worker that finds no stream ready decodes the lone stream's next chunk
    # beside the one in flight (more than one worker: Piper); chunks still leave in order
    work_ahead: bool = True
    # its last frames, its text all talked, are cut evenly over the workers
    even_tail: bool = True
    # its next text segment is prepared (backend.prepare_segment: Piper's phonemiser and
    # encoder, on a helper thread) while the talker steps the one before it
    prepare_next: bool = True
    # its next segment is urgent below this much audio ahead (talker.urgent_slack_s for
    # the others): the machine has nothing else to do, so a segment's whole flow and its
    # first chunk take tens of ms, and a lone request's next sentence runs its flow whole
    urgent_slack_s: float = 0.3

    def __post_init__(self) -> None:
        check_bool("work_ahead", self.work_ahead)
        check_bool("even_tail", self.even_tail)
        check_bool("prepare_next", self.prepare_next)
        check_non_negative("urgent_slack_s", self.urgent_slack_s)


@dataclass(frozen=True)
class TextConfig:
    """How a stream's text is cut into talker segments (pipeline/text.py, docs/text.md):
    the text front end, read by `segment_options`."""

    # a first sentence longer than this is cut at its first clause end, wherever it falls
    # (0: never; docs/text.md)
    first_fragment_words: int = 13
    max_segment_chars: int = 300  # sentences longer than this split at clause boundaries
    # no segment has more estimated phonemes than this (pipeline/text.py's proxy)
    max_segment_phonemes: int = 400
    # with first_fragment_words > 0: a stream's first segment is at most this long, even
    # one unbroken token, each next one twice the one before (0: no cap, no ramp)
    first_segment_chars: int = 0

    def __post_init__(self) -> None:
        check_int("first_fragment_words", self.first_fragment_words, 0)
        check_int("max_segment_chars", self.max_segment_chars, 20)
        check_int("max_segment_phonemes", self.max_segment_phonemes, 20)
        check_int("first_segment_chars", self.first_segment_chars, 0)


NORMALIZE_LANGUAGES = ("en",)  # languages with normalisation rules


@dataclass(frozen=True)
class NormalizeConfig:
    """The text normaliser (pipeline/normalize): numbers, dates, symbols... to words."""

    enabled: bool = True  # false: text goes to the phonemiser as written
    # languages whose rules run (a voice of another language only gets symbols dropped)
    languages: tuple[str, ...] = NORMALIZE_LANGUAGES

    def __post_init__(self) -> None:
        check_bool("enabled", self.enabled)
        if isinstance(self.languages, str) or not all(
            isinstance(code, str) for code in self.languages
        ):
            raise ConfigError(f"languages must be a list of language codes, got {self.languages!r}")
        unknown = [code for code in self.languages if code not in NORMALIZE_LANGUAGES]
        if unknown:
            raise ConfigError(
                f"languages: no normalisation rules for {', '.join(map(repr, unknown))} "
                f"(available: {', '.join(NORMALIZE_LANGUAGES)})"
            )
        object.__setattr__(self, "languages", tuple(self.languages))


@dataclass(frozen=True)
class VocoderConfig:
    # vocoder turns decoded side by side, each in its own thread, where the backend's vocode
    # calls may overlap (`capabilities.concurrent_vocode_calls`: Piper; the sim and codec LM
    # run one)
    workers: int = 2
    # while a stream's first audio is being made (its first talker step, its first chunk's
    # decode), a worker whose most urgent streams all have at least this much audio
    # buffered waits for it, leaving the core to it (more than one worker: Piper).
    # 0: never waits. 1 s, the measured default (docs/voice-tuning.md)
    yield_slack_s: float = 1.0

    def __post_init__(self) -> None:
        check_int("workers", self.workers, 1)
        check_non_negative("yield_slack_s", self.yield_slack_s)


@dataclass(frozen=True)
class EngineConfig:
    max_pending_audio_s: float = 10.0  # audio a client has not read yet; beyond it the stream parks
    capacity_window_s: float = 5.0  # moving-average window of the capacity estimate
    # start-up calibration: both stages run internal streams until the vocoder made this
    # many calls, before the engine reports ready (0: no calibration)
    calibration_calls: int = 12
    # a calibration ends after this long, whatever it measured (each backend's: a server of
    # Piper and Kokoro calibrates both, Piper in ~1.5 s, Kokoro's 12 decodes in ~5-8 s)
    calibration_max_s: float = 10.0
    # calibrate again after this long with no stream at all (0: never); a request that
    # arrives meanwhile ends that calibration at once
    recalibrate_idle_s: float = 60.0
    # a talker or vocoder call running longer fails the streams of that call and the stage
    # goes on in a fresh thread (0: wait for ever)
    call_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        check_positive("max_pending_audio_s", self.max_pending_audio_s)
        check_positive("capacity_window_s", self.capacity_window_s)
        check_int("calibration_calls", self.calibration_calls, 0)
        check_positive("calibration_max_s", self.calibration_max_s)
        check_non_negative("recalibrate_idle_s", self.recalibrate_idle_s)
        check_non_negative("call_timeout_s", self.call_timeout_s)


@dataclass(frozen=True)
class SimConfig:
    """The sim backend's cost model (docs/benchmarking.md): costs are set, not measured."""

    sample_rate_hz: int = 24000
    samples_per_frame: int = 1920  # 80 ms frames, like a 12.5 Hz codec
    talker_frames_per_step: int = 4  # frames each open segment gets per talker step
    talker_step_base_ms: float = 2.0  # fixed cost of one talker step
    talker_step_per_stream_ms: float = 0.5  # cost per segment in the step
    vocoder_base_ms: float = 20.0  # fixed cost of one vocoder call
    vocoder_per_frame_ms: float = 2.0  # cost per decoded frame (context included)
    batched: bool = True  # True: one call's base cost covers the whole batch
    # the sim backend's capabilities (pipeline/backend.py), off as for a codec LM; on, it
    # models Piper's: vocode calls side by side (vocoder.workers), next segments prepared
    concurrent_vocode_calls: bool = False
    prepares_segments: bool = False

    def __post_init__(self) -> None:
        for name in ("sample_rate_hz", "samples_per_frame", "talker_frames_per_step"):
            check_int(name, getattr(self, name), 1)
        for name in (
            "talker_step_base_ms",
            "talker_step_per_stream_ms",
            "vocoder_base_ms",
            "vocoder_per_frame_ms",
        ):
            check_non_negative(name, getattr(self, name))
        check_bool("batched", self.batched)
        check_bool("concurrent_vocode_calls", self.concurrent_vocode_calls)
        check_bool("prepares_segments", self.prepares_segments)


@dataclass(frozen=True)
class PiperConfig:
    model_path: str | None = None  # None: the bundled en_US-joe-medium voice
    voices_dir: str | None = None  # every <name>.onnx + <name>.onnx.json in it is served too
    cache_dir: str | None = None  # cut graphs are cached here; None: the user's cache dir
    output_gain: float = 0.8  # fixed gain (per-sentence peak normalisation cannot stream)
    noise_scale: float | None = None  # None: each voice's own; 0: deterministic output
    noise_w: float | None = None  # phoneme-duration noise; None: each voice's own
    # The talker runs the encoder once per segment, then the flow chunk by chunk: frames
    # of context each side of a chunk (trimmed), the first chunk's frames, the largest.
    flow_context_frames: int = 24
    flow_first_chunk_frames: int = 64
    flow_max_chunk_frames: int = 512
    # ONNX Runtime session options of every Piper graph (measured: docs/voice-tuning.md)
    ort_graph_optimization: str = "all"  # disable, basic, extended or all
    ort_cpu_arena: bool = True  # ORT's memory arena for intermediate tensors
    ort_spinning: bool = True  # with *_intra_op_threads > 1: idle pool threads spin (else sleep)
    # ONNX Runtime threads inside the talker's worker thread (its encoder and flow sessions)
    talker_intra_op_threads: int = 1
    # ONNX Runtime threads inside each vocoder worker thread (its vocoder session)
    vocoder_intra_op_threads: int = 1
    # a segment's first step (encoder and first flow chunk) when nothing else runs on the
    # machine (`TalkRequest.all_cores`: a stream alone) runs on sessions of this many
    # threads; 1: the talker's own sessions (docs/voice-tuning.md)
    alone_intra_op_threads: int = 2
    # The vocoder's stages after its first decode only a chunk's emitted frames and their
    # own reach, not the chunk's whole context (bit-identical audio; README)
    vocoder_trim: bool = True

    def __post_init__(self) -> None:
        for name in ("model_path", "voices_dir", "cache_dir"):
            check_text(name, getattr(self, name), optional=True)
        check_positive("output_gain", self.output_gain)
        check_optional_non_negative("noise_scale", self.noise_scale)
        check_optional_non_negative("noise_w", self.noise_w)
        check_int("flow_context_frames", self.flow_context_frames, 0)
        check_int("flow_first_chunk_frames", self.flow_first_chunk_frames, 1)
        check_int("flow_max_chunk_frames", self.flow_max_chunk_frames, 1)
        check_choice("ort_graph_optimization", self.ort_graph_optimization, ORT_OPTIMIZATION_LEVELS)
        check_bool("ort_cpu_arena", self.ort_cpu_arena)
        check_bool("ort_spinning", self.ort_spinning)
        check_int("talker_intra_op_threads", self.talker_intra_op_threads, 1)
        check_int("vocoder_intra_op_threads", self.vocoder_intra_op_threads, 1)
        check_int("alone_intra_op_threads", self.alone_intra_op_threads, 1)
        check_bool("vocoder_trim", self.vocoder_trim)
        if self.flow_max_chunk_frames < self.flow_first_chunk_frames:
            raise ConfigError(
                f"flow_max_chunk_frames ({self.flow_max_chunk_frames}) must be >= "
                f"flow_first_chunk_frames ({self.flow_first_chunk_frames})"
            )


CODEC_LM_DEVICES = ("auto", "cpu", "cuda")
CODEC_LM_DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True)
class GpuModelConfig:
    """The gpu_model backend (pipeline/backends/gpu_model.py): which GPU cost table it
    replays, and the codec-LM backend's shapes it replays them in."""

    # relative: the repository root; the default: the costs for the code as it is now
    cost_table: str = "configs/gpu-costs/h200-20261204-1453-backbone-prefill.yaml"
    speakers: int = 2
    sample_rate_hz: int = 24000
    samples_per_frame: int = 1920  # Mimi: 80 ms frames
    prompt_chars_per_token: float = 1.0  # 1: the byte tokenizer; ~4: CSM's own
    frames_per_char: float = 0.8
    min_frames_per_segment: int = 2
    max_frames_per_segment: int = 300
    max_prompt_tokens: int = 320
    prefill_chunk_tokens: int = 64
    prefill_rows: int = 8
    overlap_steps: bool = True

    def __post_init__(self) -> None:
        check_text("cost_table", self.cost_table)
        for name in (
            "speakers",
            "sample_rate_hz",
            "samples_per_frame",
            "min_frames_per_segment",
            "max_frames_per_segment",
            "max_prompt_tokens",
            "prefill_chunk_tokens",
            "prefill_rows",
        ):
            check_int(name, getattr(self, name), 1)
        check_positive("prompt_chars_per_token", self.prompt_chars_per_token)
        check_positive("frames_per_char", self.frames_per_char)
        check_bool("overlap_steps", self.overlap_steps)
        if self.max_frames_per_segment < self.min_frames_per_segment:
            raise ConfigError("max_frames_per_segment must be >= min_frames_per_segment")


@dataclass(frozen=True)
class CodecLMConfig:
    """The codec-LM backend (CSM + Mimi, pipeline/backends/codec_lm): where the model comes
    from, how it runs, how long a segment may get, and the sizes of a random-weight model."""

    model: str | None = None  # CSM checkpoint: a local directory or hub id; None: random weights
    cache_dir: str | None = None  # where a random model is saved; None: the user's cache dir
    save_random: bool = True  # save a random model and load it back like a checkpoint
    seed: int = 0  # seed of the random weights
    device: str = "auto"  # auto: cuda when available, else cpu
    dtype: str = "auto"  # auto: bfloat16 on cuda, float32 on cpu
    cpu_threads: int = 0  # torch intra-op threads (process-wide) on a cpu; 0: torch's default
    speakers: int = 1  # voices speaker-0 .. speaker-(n-1) (CSM speaker ids)
    temperature: float = 0.0  # 0: greedy (frames independent of the batch); > 0: sampling
    top_k: int = 0  # sampling: keep the k most likely codes (0: all)
    stop_on_end_frame: bool = True  # an all-zero frame ends a segment (CSM's end condition)
    frames_per_char: float = 1.0  # a segment gets at most this many frames per character
    min_frames_per_segment: int = 2  # ... but at least this many
    max_frames_per_segment: int = 400  # ... and never more (400 x 80 ms = 32 s)
    max_prompt_tokens: int = 512  # a longer tokenised segment fails its stream
    initial_slots: int = 8  # KV-cache slots at start without CUDA graphs (doubled when full)
    row_multiple: int = 4  # row buckets are this x 1, 2, 4 ... (CPU gemm tiles, see talker)
    # on cuda: the whole step (embeddings, backbone, depth decoder, sampling) and Mimi replay
    # as CUDA graphs, one per shape bucket, all captured at start-up (docs/codec-lm.md)
    cuda_graphs: bool = True
    max_rows: int = 256  # with CUDA graphs: the KV-cache slots (fixed) = the largest row bucket
    key_bucket_tokens: int = 128  # key lengths are bucketed to multiples of this
    prefill_chunk_tokens: int = 64  # a prompt is prefilled this many tokens per step
    prefill_rows: int = 4  # prompts prefilled per step (the others wait for the next)
    overlap_steps: bool = True  # collect step n's frames after launching step n+1 (no sync)
    # the step's hot pieces compiled by torch.compile (inductor) at start-up, fused kernels;
    # off until a GPU run shows it pays (docs/codec-lm.md, benchmarks/gpu_check.py)
    compile_step: bool = False
    # the cost table gpu_check measured on this GPU (pipeline/backends/gpu_costs.py): the
    # streams the loop sustains at 1x, read from it, are admission's capacity (null: measured
    # from the stages' calls while serving, which reads a batched loop low)
    cost_table: str | None = None
    mimi_dtype: str = "float32"  # Mimi's dtype: float32, bfloat16, float16 or model
    vocoder_max_batch: int = 64  # with CUDA graphs: Mimi graphs for K = 1, 2, 4 .. this (0: none)
    vocoder_max_frames: int = 32  # ... and 4, 8 .. this frames per chunk (beyond: eager)
    # sizes of a random-weight model (model: null); defaults: the published CSM-1B + Mimi
    num_codebooks: int = 32
    codebook_size: int = 2051  # CSM's codebook vocabulary (codec codes + 3 special ids)
    text_vocab_size: int = 128256
    backbone_hidden_size: int = 2048
    backbone_layers: int = 16
    backbone_heads: int = 32
    backbone_kv_heads: int = 8
    backbone_intermediate_size: int = 8192
    depth_hidden_size: int = 1024
    depth_layers: int = 4
    depth_heads: int = 8
    depth_kv_heads: int = 2
    depth_intermediate_size: int = 8192
    codec_hidden_size: int = 512
    codec_layers: int = 8
    codec_heads: int = 8
    codec_intermediate_size: int = 2048
    codec_filters: int = 64
    codec_codebook_size: int = 2048
    codec_codebook_dim: int = 256

    def __post_init__(self) -> None:
        if self.model is not None and not (isinstance(self.model, str) and self.model.strip()):
            raise ConfigError(f"model must be a path or hub id (or null), got {self.model!r}")
        if self.device not in CODEC_LM_DEVICES:
            raise ConfigError(
                f"device must be one of {', '.join(CODEC_LM_DEVICES)}, got {self.device!r}"
            )
        if self.dtype not in CODEC_LM_DTYPES:
            raise ConfigError(
                f"dtype must be one of {', '.join(CODEC_LM_DTYPES)}, got {self.dtype!r}"
            )
        if not isinstance(self.save_random, bool):
            raise ConfigError(f"save_random must be true or false, got {self.save_random!r}")
        check_bool("cuda_graphs", self.cuda_graphs)
        check_bool("overlap_steps", self.overlap_steps)
        check_bool("compile_step", self.compile_step)
        check_text("cost_table", self.cost_table, optional=True)
        if self.mimi_dtype not in (*CODEC_LM_DTYPES[1:], "model"):
            raise ConfigError(
                "mimi_dtype must be one of float32, bfloat16, float16, model, "
                f"got {self.mimi_dtype!r}"
            )
        if not isinstance(self.stop_on_end_frame, bool):
            raise ConfigError(
                f"stop_on_end_frame must be true or false, got {self.stop_on_end_frame!r}"
            )
        check_non_negative("temperature", self.temperature)
        check_positive("frames_per_char", self.frames_per_char)
        minimums = {
            "seed": 0,
            "cpu_threads": 0,
            "speakers": 1,
            "top_k": 0,
            "min_frames_per_segment": 1,
            "max_frames_per_segment": 1,
            "max_prompt_tokens": 2,
            "initial_slots": 1,
            "row_multiple": 1,
            "max_rows": 1,
            "key_bucket_tokens": 1,
            "prefill_chunk_tokens": 1,
            "prefill_rows": 1,
            "vocoder_max_batch": 0,
            "vocoder_max_frames": 1,
        }
        sizes = [f for f in self.__dataclass_fields__ if f.startswith(_SIZE_PREFIXES)]
        minimums.update({name: 1 for name in sizes})
        for name, minimum in minimums.items():
            value = getattr(self, name)
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= minimum):
                raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")
        if self.max_rows % self.row_multiple:
            raise ConfigError(
                f"max_rows ({self.max_rows}) must be a multiple of row_multiple "
                f"({self.row_multiple})"
            )
        if self.max_frames_per_segment < self.min_frames_per_segment:
            raise ConfigError(
                f"max_frames_per_segment ({self.max_frames_per_segment}) must be >= "
                f"min_frames_per_segment ({self.min_frames_per_segment})"
            )
        if self.codebook_size <= self.codec_codebook_size:
            raise ConfigError(
                f"codebook_size ({self.codebook_size}) must exceed codec_codebook_size "
                f"({self.codec_codebook_size}): CSM adds special ids after the codec's codes"
            )
        for heads, kv in (
            ("backbone_heads", "backbone_kv_heads"),
            ("depth_heads", "depth_kv_heads"),
        ):
            if getattr(self, heads) % getattr(self, kv):
                raise ConfigError(f"{heads} must be a multiple of {kv}")
        for hidden, heads in (
            ("backbone_hidden_size", "backbone_heads"),
            ("depth_hidden_size", "depth_heads"),
            ("codec_hidden_size", "codec_heads"),
        ):
            if getattr(self, hidden) % getattr(self, heads):
                raise ConfigError(f"{hidden} must be a multiple of {heads}")


_SIZE_PREFIXES = (
    "num_codebooks",
    "codebook_size",
    "text_vocab_size",
    "backbone_",
    "depth_",
    "codec_",
)
