"""The kokoro backend: assets, the talker/vocoder cut against the whole graph (every shipped
voice), timings from the predicted durations, a voices file's English voice."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from pipeline.backend import TalkRequest, VocodeItem
from pipeline.backends.kokoro import assets
from pipeline.backends.kokoro.assets import (
    SAMPLES_PER_FRAME,
    KokoroAssetError,
    read_voices_file,
    voice_language,
)
from pipeline.backends.kokoro.backend import FRAME_COLUMNS, KokoroBackend
from pipeline.backends.kokoro.config import KokoroConfig
from pipeline.backends.kokoro.errors import UnknownKokoroVoice
from scheduling.errors import ConfigError

SHIPPED = ("jf_alpha", "jf_gongitsune", "jf_nezumi", "jf_tebukuro", "jm_kumo")


@pytest.fixture(scope="module")
def backend() -> KokoroBackend:
    loaded = KokoroBackend()
    yield loaded
    loaded.close()


@pytest.fixture(scope="module")
def whole_graph(backend: KokoroBackend) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(
        str(backend.model_path), options, providers=["CPUExecutionProvider"]
    )


def _talk(backend: KokoroBackend, text: str, voice: str = "jf_alpha", speed: float = 1.0):
    segment = backend.open_segment(TalkRequest(text, voice, speed, 0, 0, 0))
    (step,) = backend.step([segment])
    backend.close_segment(segment)
    return segment, step


def test_config_rejects_more_phonemes_than_the_model_reads() -> None:
    with pytest.raises(ConfigError, match="max_phonemes_per_call"):
        KokoroConfig(max_phonemes_per_call=511)
    with pytest.raises(ConfigError, match="talker_intra_op_threads"):
        KokoroConfig(talker_intra_op_threads=0)


def test_model_is_joined_from_its_parts_and_checked(tmp_path: Path) -> None:
    path, sha = assets.assemble_model(tmp_path)
    assert path.stat().st_size > 90_000_000
    path.write_bytes(b"damaged")  # a damaged copy is joined again, not served
    again, _ = assets.assemble_model(tmp_path)
    assert again == path and assets._sha256(path) == sha


def test_parts_that_do_not_match_the_checksum_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(assets, "MODEL_PARTS", 3)  # a missing part: another SHA-256
    with pytest.raises(KokoroAssetError, match="SHA-256"):
        assets.assemble_model(tmp_path)
    assert not list(tmp_path.iterdir())  # no partial file left behind


def test_voices_file_of_the_wrong_shape_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "voices.npz"
    np.savez(bad, af_bad=np.zeros((510, 3), np.float32))
    with pytest.raises(KokoroAssetError, match="af_bad"):
        read_voices_file(bad)
    (tmp_path / "junk.bin").write_bytes(b"not an archive")
    with pytest.raises(KokoroAssetError, match="cannot read"):
        read_voices_file(tmp_path / "junk.bin")


def test_voice_languages_come_from_the_name() -> None:
    assert voice_language("jf_alpha") == "ja"
    assert voice_language("af_heart") == "en-US"
    assert voice_language("bm_lewis") == "en-GB"
    assert voice_language("custom") is None


@pytest.mark.slow
def test_shipped_voices_are_served_with_their_language(backend: KokoroBackend) -> None:
    voices = {v.id: v for v in backend.voices()}
    assert set(SHIPPED) <= set(voices)
    assert {voices[v].language for v in SHIPPED} == {"ja"}
    assert voices["jf_alpha"].samples_per_frame == SAMPLES_PER_FRAME
    with pytest.raises(UnknownKokoroVoice, match="jf_alpha"):
        backend.open_segment(TalkRequest("こんにちは", "af_nobody", 1.0, 0, 0, 0))


@pytest.mark.slow
@pytest.mark.parametrize("voice", SHIPPED)
def test_split_equals_the_whole_graph(
    backend: KokoroBackend, whole_graph: ort.InferenceSession, voice: str
) -> None:
    _, step = _talk(backend, "今日はいい天気ですね。", voice, speed=1.1)
    assert step.done and step.frames.shape[1] == FRAME_COLUMNS
    frames = step.frames.shape[0]
    (pcm,) = backend.vocode([VocodeItem(voice, step.frames, 0, frames)])
    (piece,) = backend.tokenize(voice, "今日はいい天気ですね。").pieces
    ids = list(piece.ids)
    (whole,) = whole_graph.run(
        None,
        {
            "tokens": np.array([[0, *ids, 0]], np.int64),
            "style": backend.style(voice, len(ids)),
            "speed": np.array([1.1], np.float32),
        },
    )
    whole = whole.reshape(-1)
    assert pcm.shape == whole.shape == (frames * SAMPLES_PER_FRAME,)
    assert np.max(np.abs(pcm - np.clip(whole, -1, 1))) < 1e-5
    assert np.sqrt(np.mean(whole**2)) > 0.01  # speech, not silence


@pytest.mark.slow
def test_vocoder_trims_an_items_context(backend: KokoroBackend) -> None:
    _, step = _talk(backend, "こんにちは。")
    frames = step.frames.shape[0]
    (whole,) = backend.vocode([VocodeItem("jf_alpha", step.frames, 0, frames)])
    (middle,) = backend.vocode([VocodeItem("jf_alpha", step.frames, 10, 20)])
    np.testing.assert_array_equal(middle, whole[10 * SAMPLES_PER_FRAME : 30 * SAMPLES_PER_FRAME])
    with pytest.raises(ValueError, match="emit range"):
        backend.vocode([VocodeItem("jf_alpha", step.frames, frames - 2, 5)])


@pytest.mark.slow
def test_timings_follow_the_predicted_durations(backend: KokoroBackend) -> None:
    text = "今日は2026年12月5日です。"
    _, step = _talk(backend, text)
    timing = step.timing
    assert timing is not None and len(timing.start_frames) == len(text)
    starts, ends = np.array(timing.start_frames), np.array(timing.end_frames)
    assert np.all(np.diff(starts) >= 0) and np.all(ends >= starts)
    assert starts[0] > 0  # the leading pad token's frames come before the first word
    assert ends[-1] <= step.frames.shape[0]
    # the number's four characters share 二千二十六's frames: longer than one kana's
    number = slice(text.index("2026"), text.index("年"))
    assert ends[number][-1] - starts[number][0] > ends[0] - starts[0]
    # a faster reading puts the same characters earlier
    _, fast = _talk(backend, text, speed=1.5)
    assert fast.timing is not None and fast.timing.end_frames[-2] < ends[-2]


@pytest.mark.slow
def test_a_voices_file_adds_english_voices(tmp_path: Path) -> None:
    shipped = assets.shipped_voices()
    path = tmp_path / "voices.npz"
    np.savez(path, af_plumbing=shipped["jf_alpha"][:, None, :])  # kokoro-onnx's layout
    english = KokoroBackend(KokoroConfig(voices_path=str(path)))
    try:
        voices = {v.id: v.language for v in english.voices()}
        assert voices["af_plumbing"] == "en-US" and voices["jf_alpha"] == "ja"
        text = "Hello world, this is a test."
        assert "wˈɜːld" in english.tokenize("af_plumbing", text).phonemes  # espeak-ng's IPA
        _, step = _talk(english, text, "af_plumbing")
        (pcm,) = english.vocode([VocodeItem("af_plumbing", step.frames, 0, step.frames.shape[0])])
        assert pcm.size > SAMPLES_PER_FRAME * 20 and np.sqrt(np.mean(pcm**2)) > 0.01
    finally:
        english.close()


@pytest.mark.slow
def test_windows_with_context_are_cut_from_the_whole_piece(backend: KokoroBackend) -> None:
    # The decoder normalises over its whole input: a window is cut from the whole piece's
    # decode (pieces.py), so chunks of any size and context join into the whole audio.
    _, step = _talk(backend, "今日はいい天気ですね。")
    frames = step.frames
    count = frames.shape[0]
    whole = backend._decode(frames, None)  # the piece decoded whole, once, outside the store
    decodes, misses = backend._pieces.decodes, backend._pieces.misses
    chunks = []
    for start in range(0, count, 16):
        stop = min(count, start + 16)
        left, right = max(0, start - 8), min(count, stop + 8)
        (pcm,) = backend.vocode(
            [VocodeItem("jf_alpha", frames[left:right], start - left, stop - start)]
        )
        chunks.append(pcm)
    np.testing.assert_array_equal(np.concatenate(chunks), np.clip(whole, -1, 1))
    assert backend._pieces.decodes == decodes + 1  # one decode of the piece for every chunk
    assert backend._pieces.misses == misses
    # its last frame is out: the piece left the store; a window of it now decodes alone
    (again,) = backend.vocode([VocodeItem("jf_alpha", frames[:16], 0, 16)])
    assert backend._pieces.misses == misses + 1 and again.shape == (16 * SAMPLES_PER_FRAME,)
