"""The kokoro backend's errors (each a ValueError or RuntimeError the app maps)."""

from __future__ import annotations

from scheduling.errors import ConfigError


class KokoroAssetError(ConfigError):
    """A model part, the vocabulary or a voices file is missing or damaged."""


class UnknownKokoroVoice(ValueError):
    """A voice id this backend does not serve."""


class UnreadableText(ValueError):
    """Text in which the voice's language finds nothing it can say."""
