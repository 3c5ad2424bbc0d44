"""CodecLMBackend: CSM's backbone + depth decoder as the talker, Mimi as the vocoder.

The talker's state per segment is a CodecSegment (a KV-cache slot, a position, the last
frame). A segment's prompt is CSM's: bos + "[speaker]text" + eos. It ends at CSM's end
condition (an all-zero frame, not emitted) or after `max_frames` frames:
min(max_frames_per_segment, max(min_frames_per_segment, ceil(frames_per_char x chars /
speed))); random-weight models never end by themselves, so the bound is what ends them.
CSM has no speed control: `speed` only scales that bound.

Frames are int64 [frames, codebooks]; PCM is float32 at 24 kHz, 1920 samples per frame.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import numpy as np

from pipeline.backend import TalkRequest, TalkStep, VocodeItem, Voice
from pipeline.backends.codec_lm.loading import LoadedModel, load_model
from pipeline.backends.codec_lm.talker import CodecSegment, CsmStepper
from pipeline.backends.codec_lm.vocoder import MimiVocoder
from pipeline.config import CodecLMConfig

logger = logging.getLogger("playhead.codec_lm")

VOICE_PREFIX = "speaker-"


class CodecLMBackend:
    """A CSM checkpoint (or a random-weight one) served step by step; see the module doc."""

    name = "codec_lm"

    def __init__(self, config: CodecLMConfig | None = None, loaded: LoadedModel | None = None):
        self.config = config or CodecLMConfig()
        self.loaded = loaded or load_model(self.config)
        model = self.loaded.model
        codec = model.codec_model
        codec_config = codec.config
        self.sample_rate_hz = int(codec_config.sampling_rate)
        frame_rate = float(codec_config.frame_rate)
        self.samples_per_frame = round(self.sample_rate_hz / frame_rate)
        self.num_codebooks = int(model.config.num_codebooks)
        tokenizer = self.loaded.tokenizer
        self._bos = tokenizer.bos_token_id
        self._eos = tokenizer.eos_token_id
        self._tokenizer = tokenizer
        self.stepper = CsmStepper(
            model,
            max_tokens=self.config.max_prompt_tokens + self.config.max_frames_per_segment,
            slots=self.config.initial_slots,
            row_multiple=self.config.row_multiple,
            codec_codebook_size=int(codec_config.codebook_size),
            temperature=self.config.temperature,
            top_k=self.config.top_k,
        )
        self.vocoder = MimiVocoder(
            codec, num_codebooks=self.num_codebooks, samples_per_frame=self.samples_per_frame
        )
        self._voices = [
            Voice(
                id=f"{VOICE_PREFIX}{n}",
                name=f"CSM speaker {n}",
                language="en",
                sample_rate_hz=self.sample_rate_hz,
                samples_per_frame=self.samples_per_frame,
            )
            for n in range(self.config.speakers)
        ]
        logger.info(
            "codec_lm: %s on %s (%s), %d codebooks, %d Hz",
            self.loaded.source,
            self.loaded.device,
            str(self.loaded.dtype).removeprefix("torch."),
            self.num_codebooks,
            self.sample_rate_hz,
        )

    # voices

    def voices(self) -> list[Voice]:
        return list(self._voices)

    def default_voice(self) -> str:
        return self._voices[0].id

    def _speaker(self, voice: str) -> int:
        for n, v in enumerate(self._voices):
            if voice in (v.id, v.name):
                return n
        raise ValueError(f"unknown codec_lm voice {voice!r}")

    # talker

    @property
    def live_segments(self) -> int:
        """Segments holding a KV-cache slot (opened and not yet closed)."""
        return self.stepper.cache.live

    def max_frames(self, text: str, speed: float = 1.0) -> int:
        cfg = self.config
        wanted = math.ceil(cfg.frames_per_char * len(text) / max(speed, 1e-6) - 1e-9)
        return min(cfg.max_frames_per_segment, max(cfg.min_frames_per_segment, wanted))

    def prompt(self, text: str, speaker: int) -> list[int]:
        ids = self._tokenizer(f"[{speaker}]{text}", add_special_tokens=False)["input_ids"]
        ids = ([self._bos] if self._bos is not None else []) + list(ids)
        if self._eos is not None:
            ids.append(self._eos)
        if len(ids) > self.config.max_prompt_tokens:
            raise ValueError(
                f"segment is {len(ids)} tokens, more than max_prompt_tokens "
                f"({self.config.max_prompt_tokens})"
            )
        return ids

    def open_segment(self, request: TalkRequest) -> CodecSegment:
        prompt = self.prompt(request.text, self._speaker(request.voice))
        return self.stepper.open(prompt, self.max_frames(request.text, request.speed))

    def step(self, segments: Sequence[CodecSegment]) -> list[TalkStep]:
        segments = list(segments)
        if not segments:
            return []
        frames = self.stepper.step(segments).numpy()
        steps = []
        for seg, frame in zip(segments, frames, strict=True):
            ended = self.config.stop_on_end_frame and not frame.any()
            seg.done = ended or seg.frames_done >= seg.max_frames
            emitted = frame[None, :] if not ended else np.empty((0, frame.size), np.int64)
            steps.append(TalkStep(frames=emitted, done=seg.done))
        return steps

    def close_segment(self, segment: CodecSegment) -> None:
        self.stepper.close(segment)

    # vocoder

    def vocode(self, items: Sequence[VocodeItem]) -> list[np.ndarray]:
        for item in items:
            self._speaker(item.voice)
            frames = item.frames
            if frames.ndim != 2 or frames.shape[1] != self.num_codebooks:
                raise ValueError(
                    f"codec_lm frames must be [frames, {self.num_codebooks}], got {frames.shape}"
                )
            stop = item.emit_offset_frames + item.emit_frames
            if not 0 <= item.emit_offset_frames <= stop <= len(frames):
                raise ValueError(
                    f"emit range {item.emit_offset_frames}+{item.emit_frames} "
                    f"outside {len(frames)} frames"
                )
        # only the frames up to the last emitted one: the decoder is causal
        chunks = [
            np.asarray(item.frames[: item.emit_offset_frames + item.emit_frames], dtype=np.int64)
            for item in items
        ]
        pcm = self.vocoder.decode_batch(chunks)
        spf = self.samples_per_frame
        return [
            audio[item.emit_offset_frames * spf :] for audio, item in zip(pcm, items, strict=True)
        ]

    def close(self) -> None:
        return None
