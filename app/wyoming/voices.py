"""What `describe` answers (the voices, as one TTS program) and how a request's
`voice` (name, language, speaker) picks one of them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from wyoming.info import Attribution, Info, TtsProgram, TtsVoice

from app import __version__
from app.client_json import quote
from app.wyoming.protocol import EventError
from pipeline import Backend, Engine, UnknownVoice, Voice
from pipeline.normalize import language_code

PROGRAM_NAME = "playhead"
PLAYHEAD = Attribution(name="Playhead", url="")
# Where a backend's voices come from, by backend name (others: Playhead's own).
VOICE_ATTRIBUTION = {"piper": Attribution(name="rhasspy", url="https://github.com/rhasspy/piper")}


def build_info(backend: Backend) -> Info:
    """One TTS program with every voice of the backend (the default voice first), text
    streaming advertised: Home Assistant then streams a reply's text as it is written."""
    default_id = backend.default_voice()
    voices = sorted(backend.voices(), key=lambda v: v.id != default_id)
    attribution = VOICE_ATTRIBUTION.get(backend.name, PLAYHEAD)
    return Info(
        tts=[
            TtsProgram(
                name=PROGRAM_NAME,
                attribution=PLAYHEAD,
                installed=True,
                description="Playhead streaming text-to-speech",
                version=__version__,
                voices=[
                    TtsVoice(
                        name=voice.id,
                        attribution=attribution,
                        installed=True,
                        description=voice.name if voice.name != voice.id else None,
                        version=None,
                        languages=[voice.language],
                    )
                    for voice in voices
                ],
                supports_synthesize_streaming=True,
            )
        ]
    )


@dataclass(frozen=True, slots=True)
class VoiceRequest:
    """A request's `voice` object (wyoming.tts.SynthesizeVoice), every field optional."""

    name: str | None = None
    language: str | None = None
    speaker: str | None = None

    @staticmethod
    def parse(data: dict[str, Any]) -> VoiceRequest:
        voice = data.get("voice")
        if voice is None:
            return VoiceRequest()
        if not isinstance(voice, dict):
            raise EventError(
                "The 'voice' must be an object (name, language, speaker).", "invalid_value"
            )
        fields = {}
        for key in ("name", "language", "speaker"):
            value = voice.get(key)
            if value is not None and not isinstance(value, str):
                raise EventError(f"The voice's '{key}' must be a string.", "invalid_value")
            fields[key] = value or None
        return VoiceRequest(**fields)


def _same_language(a: str, b: str) -> bool:
    return a.replace("-", "_").casefold() == b.replace("-", "_").casefold()


def select_voice(engine: Engine, request: VoiceRequest) -> Voice:
    """The voice by name (an id, or a voice's display name), else the default voice of
    the language (a voice of that exact language, else of its main language: "en" or
    "en-GB" finds "en_US"), else the default voice. A speaker is refused: Playhead's
    voices have one speaker each (a multi-speaker model's speakers are voices)."""
    backend = engine.backend
    if request.name is not None:
        try:
            voice = engine.resolve_voice(request.name)
        except UnknownVoice as exc:
            raise EventError(
                f"Unknown voice {quote(request.name)}. Available voices: "
                f"{', '.join(exc.available)}.",
                "voice_not_found",
            ) from None
    elif request.language is not None:
        voice = _voice_for_language(engine, request.language)
    else:
        voice = engine.resolve_voice(backend.default_voice())
    if request.speaker is not None and request.speaker not in (voice.id, voice.name):
        raise EventError(
            f"The voice {quote(voice.id)} has no speaker {quote(request.speaker)}: each "
            "Playhead voice has one speaker (leave the speaker out).",
            "speaker_not_found",
        )
    return voice


def _voice_for_language(engine: Engine, language: str) -> Voice:
    backend = engine.backend
    default = engine.resolve_voice(backend.default_voice())
    voices = [default, *(v for v in backend.voices() if v.id != default.id)]
    for match in (
        lambda v: _same_language(v.language, language),
        lambda v: language_code(v.language) == language_code(language),
    ):
        found = next((v for v in voices if match(v)), None)
        if found is not None:
            return found
    languages = sorted({v.language for v in voices})
    raise EventError(
        f"No voice speaks the language {quote(language)}. Languages: {', '.join(languages)}.",
        "language_not_supported",
    )
