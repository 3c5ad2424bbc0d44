"""A backend's voices grouped by the backend that speaks them, for their costs
(scheduling/voice_cost.py): a MultiBackend's parts each a group, any other backend one."""

from __future__ import annotations

from pipeline.backend import Backend
from scheduling.voice_cost import VoiceCosts


def voice_costs_of(backend: Backend) -> tuple[VoiceCosts, dict[str, str]]:
    """Every voice's group (its backend's name; a MultiBackend's part's, numbered when
    two parts share a name), the default voice's the reference; and each group's
    calibration voice (its backend's default). A voice two parts serve is the first
    part's (as the MultiBackend routes it)."""
    parts = getattr(backend, "parts", None) or (backend,)
    names = [part.name for part in parts]
    groups: dict[str, str] = {}
    defaults: dict[str, str] = {}
    for index, part in enumerate(parts):
        group = part.name if names.count(part.name) == 1 else f"{part.name}-{index}"
        defaults[group] = part.default_voice()
        for voice in part.voices():
            groups.setdefault(voice.id, group)
    return VoiceCosts(groups, groups[backend.default_voice()]), defaults
