"""MultiBackend: several backends behind one, routed by voice (fakes: two sim backends, one
of them under another voice id and frame size)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from pipeline.backend import BackendCapabilities, TalkRequest, VocodeItem, Voice
from pipeline.backends.multi import MultiBackend, MultiConfig
from pipeline.backends.sim import VOICE_ID, SimBackend
from pipeline.config import SimConfig
from scheduling.errors import ConfigError


class RenamedSim(SimBackend):
    """A sim backend whose one voice is called `voice_id` (a second kind of backend)."""

    def __init__(self, voice_id: str, config: SimConfig) -> None:
        super().__init__(config)
        self._renamed = voice_id
        self.capabilities = BackendCapabilities(concurrent_vocode_calls=True)

    def voices(self) -> list[Voice]:
        return [replace(v, id=self._renamed, language="ja") for v in super().voices()]

    def default_voice(self) -> str:
        return self._renamed

    def open_segment(self, request: TalkRequest):
        assert request.voice == self._renamed, request.voice
        return super().open_segment(replace(request, voice=VOICE_ID))

    def vocode(self, items, abort=None):
        for item in items:
            assert item.voice == self._renamed, item.voice
        return super().vocode([item._replace(voice=VOICE_ID) for item in items], abort)


@pytest.fixture
def multi() -> MultiBackend:
    english = SimBackend(SimConfig(vocoder_base_ms=0, vocoder_per_frame_ms=0))
    japanese = RenamedSim("ja-sim", SimConfig(samples_per_frame=960, vocoder_per_frame_ms=0))
    backend = MultiBackend([english, japanese])
    yield backend
    backend.close()


def test_config_names_other_kinds_each_once() -> None:
    assert MultiConfig().kinds == ("piper", "kokoro")
    for kinds in ([], ["piper", "piper"], ["multi"]):
        with pytest.raises(ConfigError, match="kinds"):
            MultiConfig(kinds=kinds)


def test_voices_of_every_part_with_their_languages(multi: MultiBackend) -> None:
    voices = {v.id: v for v in multi.voices()}
    assert set(voices) == {VOICE_ID, "ja-sim"}
    assert voices["ja-sim"].language == "ja" and voices["ja-sim"].samples_per_frame == 960
    assert multi.default_voice() == VOICE_ID
    assert multi.samples_per_frame == voices[VOICE_ID].samples_per_frame
    with pytest.raises(KeyError, match="ja-sim"):
        multi.open_segment(TalkRequest("hi", "nobody", 1.0, 0, 0, 0))
    with pytest.raises(ConfigError, match="default_voice"):
        MultiBackend(multi.parts, "nobody")


def test_capabilities_are_the_parts_common_ones(multi: MultiBackend) -> None:
    flags = multi.capabilities
    assert not flags.concurrent_vocode_calls  # the plain sim has none
    assert not flags.aborts_vocode and not flags.prepares_segments


def test_a_mixed_step_and_turn_go_each_to_its_voices_backend(multi: MultiBackend) -> None:
    english = multi.open_segment(TalkRequest("Hello there.", VOICE_ID, 1.0, 1, 0, 0))
    japanese = multi.open_segment(TalkRequest("こんにちは。", "ja-sim", 1.0, 2, 0, 0))
    steps = multi.step([japanese, english, japanese])
    assert len(steps) == 3
    # the sim's frames encode (stream tag, frame index): each came from its own segment
    assert steps[0].frames[0, 0] == 2 and steps[1].frames[0, 0] == 1
    items = [
        VocodeItem("ja-sim", steps[0].frames, 0, len(steps[0].frames)),
        VocodeItem(VOICE_ID, steps[1].frames, 0, len(steps[1].frames)),
    ]
    pcm = multi.vocode(items)
    assert pcm[0].shape == (len(steps[0].frames) * 960,)
    assert pcm[1].shape == (len(steps[1].frames) * multi.samples_per_frame,)
    assert np.any(pcm[0]) and np.any(pcm[1])
    multi.close_segment(english)
    multi.close_segment(japanese)


def test_a_voice_two_parts_serve_is_the_first_ones() -> None:
    first, second = SimBackend(SimConfig()), SimBackend(SimConfig(samples_per_frame=960))
    multi = MultiBackend([first, second])
    assert [v.id for v in multi.voices()] == [VOICE_ID]
    assert multi.part_of(VOICE_ID) is first
