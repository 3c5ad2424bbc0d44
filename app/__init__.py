"""Playhead: a streaming text-to-speech server that schedules the vocoder by playback deadline."""

__version__ = "0.1.0"
