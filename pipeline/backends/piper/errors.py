"""Errors raised by the Piper backend.

PiperError
 ├── VoiceLoadError   a voice's files are missing, unreadable or unsupported
 │    └── GraphSplitError   its ONNX graph cannot be cut into talker and vocoder
 └── UnknownPiperVoice     talk/vocode named a voice this backend does not serve
"""

from __future__ import annotations


class PiperError(Exception):
    """Base of the Piper backend's errors."""


class VoiceLoadError(PiperError):
    """A voice cannot be loaded; the message names the voice."""


class GraphSplitError(VoiceLoadError):
    """The voice's graph has no recognisable talker/vocoder cut; the message names the voice."""


class UnknownPiperVoice(PiperError, KeyError):
    """A request named a voice id this backend does not serve."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""
