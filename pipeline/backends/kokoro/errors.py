"""The kokoro backend's errors (both ValueErrors: a bad asset or config, a bad voice id)."""

from __future__ import annotations

from scheduling.errors import ConfigError


class KokoroAssetError(ConfigError):
    """A model part, the vocabulary or a voices file is missing or damaged."""


class UnknownKokoroVoice(ValueError):
    """A voice id this backend does not serve."""
