"""The whole, uncut voice graph: the reference the talker + vocoder split must reproduce."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort


def whole_model_session(model_path: str | Path, intra_op_threads: int = 1) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])


def synthesize_whole(
    model: str | Path | ort.InferenceSession,
    phoneme_ids: Sequence[int],
    *,
    noise_scale: float,
    length_scale: float,
    noise_w: float,
) -> np.ndarray:
    """Raw float32 audio of the original graph (no gain, no normalisation), 1-D."""
    session = model if isinstance(model, ort.InferenceSession) else whole_model_session(model)
    ids = np.asarray(phoneme_ids, dtype=np.int64)[np.newaxis, :]
    (audio,) = session.run(
        ["output"],
        {
            "input": ids,
            "input_lengths": np.array([ids.shape[1]], dtype=np.int64),
            "scales": np.array([noise_scale, length_scale, noise_w], dtype=np.float32),
        },
    )
    return np.asarray(audio, dtype=np.float32).reshape(-1)
