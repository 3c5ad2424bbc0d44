"""PiperBackend on the real bundled voice: protocol, chunked decoding, voices_dir, speed, ASR."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from conftest import EngineFactory, read_all

from pipeline.backend import (
    Backend,
    BackendCapabilities,
    TalkRequest,
    TalkStep,
    VocodeItem,
    backend_capabilities,
)
from pipeline.backends.piper import PiperBackend, UnknownPiperVoice, bundled_model_path
from pipeline.backends.piper.backend import FLOW_GROWTH, PiperSegment
from pipeline.backends.piper.prepared import PREPARED_MAX
from pipeline.config import AloneConfig, PiperConfig, TalkerConfig, VocoderConfig
from pipeline.vocoder_core import VocodePlan
from scheduling import Chunk, ChunkingConfig, ChunkPlanner
from tests.asr import transcribe, word_error_rate

pytestmark = pytest.mark.slow

VOICE = "en_US-joe-medium"
SAMPLES_PER_FRAME = 256
TEXT = "The weather is nice today, and the sun is shining over the quiet harbour."


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("piper-cache")


@pytest.fixture(scope="module")
def backend(cache_dir: Path) -> PiperBackend:
    """Noise scales 0: deterministic output."""
    return PiperBackend(PiperConfig(cache_dir=str(cache_dir)), noise_scale=0.0, noise_w=0.0)


def talk_steps(
    backend: PiperBackend, text: str, *, voice: str = VOICE, speed: float = 1.0
) -> list[np.ndarray]:
    """Each talker step's frames, up to the step that says done."""
    request = TalkRequest(text, voice, speed, stream_tag=0, segment_index=0, first_frame_index=0)
    segment = backend.open_segment(request)
    steps = []
    try:
        while True:
            (step,) = backend.step([segment])
            steps.append(step.frames)
            if step.done:
                return steps
            assert len(steps) < 100, "a segment ends"
    finally:
        backend.close_segment(segment)


def talk(backend: PiperBackend, text: str, *, voice: str = VOICE, speed: float = 1.0) -> np.ndarray:
    return np.concatenate(talk_steps(backend, text, voice=voice, speed=speed))


def decode_whole(backend: PiperBackend, frames: np.ndarray, voice: str = VOICE) -> np.ndarray:
    (pcm,) = backend.vocode([VocodeItem(voice, frames, 0, frames.shape[0])])
    return pcm


def snr_db(reference: np.ndarray, test: np.ndarray) -> float:
    noise = float(np.sum((reference - test) ** 2))
    return 10.0 * np.log10(float(np.sum(reference**2)) / max(noise, 1e-30))


def plan_chunks(total_frames: int, chunking: ChunkingConfig) -> list[Chunk]:
    """The planner's chunks for one whole segment that is also the stream's last."""
    planner, chunks = ChunkPlanner(chunking), []
    while not chunks or not chunks[-1].final:
        chunk = planner.next_chunk("s", total_frames, segment_done=True, stream_done=True)
        assert chunk is not None
        planner.commit("s", chunk)
        chunks.append(chunk)
    return chunks


def chunk_items(frames: np.ndarray, chunking: ChunkingConfig) -> list[VocodeItem]:
    return [
        VocodeItem(
            VOICE, frames[c.context_start : c.context_stop], c.start - c.context_start, c.frames
        )
        for c in plan_chunks(frames.shape[0], chunking)
    ]


DEFAULT_CHUNKING = ChunkingConfig(
    chunk_frames=64, ramp=(8, 16, 32), left_context_frames=8, right_context_frames=8
)


def test_it_is_a_backend_serving_the_bundled_voice(backend: PiperBackend) -> None:
    assert isinstance(backend, Backend)
    assert backend.name == "piper"
    # it claims every capability, each with its own operation
    assert backend_capabilities(backend) == BackendCapabilities(
        concurrent_talker_steps=True,
        concurrent_vocode_calls=True,
        prepares_segments=True,
        aborts_vocode=True,
    )
    assert backend.default_voice() == VOICE
    (voice,) = backend.voices()
    assert (voice.id, voice.language, voice.sample_rate_hz, voice.samples_per_frame) == (
        VOICE,
        "en_US",
        22050,
        SAMPLES_PER_FRAME,
    )
    assert (backend.sample_rate_hz, backend.samples_per_frame) == (22050, SAMPLES_PER_FRAME)


def test_talk_yields_frames_first_float32_latents(backend: PiperBackend) -> None:
    frames = talk(backend, TEXT)
    assert frames.dtype == np.float32 and frames.ndim == 2 and frames.shape[1] == 192
    assert frames.flags.c_contiguous
    assert 2.0 < frames.shape[0] * SAMPLES_PER_FRAME / 22050 < 8.0  # a sentence of speech
    assert talk(backend, "  ...  ").shape[0] == 0  # nothing to say: no frames


def test_steps_run_the_flow_in_growing_chunks_close_to_the_whole_flow(
    backend: PiperBackend, cache_dir: Path
) -> None:
    """The encoder runs once over the sentence, the flow chunk by chunk with context: the
    chunks join into the whole flow's latent (within float noise of a few context
    frames' reach), and without context they would not."""
    text = "Before you leave the house this morning, please switch off the oven and lock the gate."
    voice = backend.default_voice()
    whole = backend.talk_ids(voice, backend.phoneme_ids(voice, text), backend.scales(voice))
    steps = talk_steps(backend, text)
    sizes = [len(frames) for frames in steps]
    config = PiperConfig()
    assert sizes[0] == config.flow_first_chunk_frames
    assert sizes[1:-1] == [
        min(config.flow_first_chunk_frames * FLOW_GROWTH**i, config.flow_max_chunk_frames)
        for i in range(1, len(sizes) - 1)
    ]
    assert len(steps) >= 3 and sum(sizes) == whole.shape[0]
    chunked = np.concatenate(steps)
    assert chunked.flags.c_contiguous and chunked.dtype == np.float32
    assert snr_db(whole, chunked) >= 60.0
    bare = PiperBackend(
        PiperConfig(cache_dir=str(cache_dir), flow_context_frames=0), noise_scale=0.0, noise_w=0.0
    )
    assert snr_db(whole, talk(bare, text)) < 40.0  # the context is what joins the chunks


def test_a_segment_that_is_not_urgent_runs_the_whole_flow_in_one_step(
    backend: PiperBackend,
) -> None:
    """`TalkRequest.urgent` False (its stream has audio enough ahead): the flow runs once
    over the whole segment, no chunks and so no context: the whole flow's latent exactly."""
    text = "Before you leave the house this morning, please switch off the oven and lock the gate."
    voice = backend.default_voice()
    whole = backend.talk_ids(voice, backend.phoneme_ids(voice, text), backend.scales(voice))
    assert whole.shape[0] <= PiperConfig().flow_max_chunk_frames
    request = TalkRequest(text, voice, 1.0, 0, 1, 0, urgent=False)
    segment = backend.open_segment(request)
    try:
        (step,) = backend.step([segment])
    finally:
        backend.close_segment(segment)
    assert step.done
    assert np.array_equal(step.frames, whole)


def test_a_closed_segment_frees_its_encoder_output(backend: PiperBackend) -> None:
    request = TalkRequest(TEXT, VOICE, 1.0, stream_tag=0, segment_index=0, first_frame_index=0)
    segment = backend.open_segment(request)
    (first,) = backend.step([segment])
    assert not first.done and segment.prior is not None
    backend.close_segment(segment)  # a cancel mid-segment
    assert segment.prior is None and segment.phoneme_ids == []


def test_vocode_trims_context_and_batches_equal_lengths(backend: PiperBackend) -> None:
    frames = talk(backend, TEXT)
    window = frames[40:80]
    items = [
        VocodeItem(VOICE, window, 4, 32),
        VocodeItem(VOICE, frames[100:140], 4, 32),
        VocodeItem(VOICE, frames[:10], 0, 6),
        VocodeItem(VOICE, window, 0, 0),
    ]
    batched = backend.vocode(items)
    one_by_one = [backend.vocode([item])[0] for item in items]
    assert [p.shape[0] for p in batched] == [32 * 256, 32 * 256, 6 * 256, 0]
    for together, alone in zip(batched, one_by_one, strict=True):
        assert together.dtype == np.float32
        np.testing.assert_allclose(together, alone, atol=1e-6)
    full = decode_whole(backend, window)
    np.testing.assert_array_equal(batched[0], full[4 * 256 : 36 * 256])
    assert float(np.max(np.abs(batched[0]))) <= 1.0


def test_vocode_rejects_a_range_outside_the_frames(backend: PiperBackend) -> None:
    frames = talk(backend, "Short.")
    with pytest.raises(ValueError, match="exceeds"):
        backend.vocode([VocodeItem(VOICE, frames[:8], 4, 5)])
    with pytest.raises(UnknownPiperVoice, match="en_US-joe-medium"):
        backend.vocode([VocodeItem("nobody", frames[:8], 0, 8)])


def test_chunked_decoding_at_default_context_is_40_db_from_a_whole_decode(
    backend: PiperBackend,
) -> None:
    no_context = ChunkingConfig(chunk_frames=64, ramp=(8, 16, 32))
    for text in (TEXT, "Please open the window before you leave the room, and lock the door."):
        frames = talk(backend, text)
        whole = decode_whole(backend, frames)
        chunked = np.concatenate(backend.vocode(chunk_items(frames, DEFAULT_CHUNKING)))
        assert chunked.shape == whole.shape
        assert snr_db(whole, chunked) >= 40.0  # every seam: benchmarks/seams.py
        # without context the seams are audible: this test can tell the difference
        bare = np.concatenate(backend.vocode(chunk_items(frames, no_context)))
        assert snr_db(whole, bare) < 20.0


@pytest.mark.parametrize("speed", [0.25, 0.5, 2.0, 4.0])
def test_speed_divides_the_frames_exactly(backend: PiperBackend, speed: float) -> None:
    # speed divides the length scale, and the graph's duration rounding is rewritten
    # (durations.py) so that the whole segment scales to within a frame of the asked length
    normal = talk(backend, TEXT, speed=1.0).shape[0]
    frames = talk(backend, TEXT, speed=speed).shape[0]
    assert abs(frames - normal / speed) <= 1.0


def test_a_fast_speed_keeps_every_phoneme(backend: PiperBackend) -> None:
    """At 2x every phoneme still gets a frame: only the pads between them may vanish."""
    import onnx
    import onnxruntime as ort

    from pipeline.backends.piper.durations import make_length_scale_exact
    from pipeline.backends.piper.voices import bundled_model_path

    model = onnx.load(str(bundled_model_path()))
    assert make_length_scale_exact(model, VOICE)
    durations = "/Ceil_output_0"
    model.graph.output.append(
        onnx.helper.make_tensor_value_info(durations, onnx.TensorProto.FLOAT, None)
    )
    session = ort.InferenceSession(model.SerializeToString())
    ids = np.array([[1, 0, 20, 0, 35, 0, 41, 0, 59, 0, 27, 0, 2]], dtype=np.int64)
    for speed in (1.0, 2.0, 4.0):
        scales = np.array([0.0, 1.0 / speed, 0.0], dtype=np.float32)
        feeds = {"input": ids, "input_lengths": np.array([ids.shape[1]]), "scales": scales}
        per_id = session.run([durations], feeds)[0].reshape(-1)
        assert (per_id[ids[0] != 0] >= 1).all(), (speed, per_id)
    with pytest.raises(ValueError, match="speed"):
        talk(backend, TEXT, speed=0.0)


def test_voices_dir_adds_a_voice_that_speaks(
    backend: PiperBackend, cache_dir: Path, tmp_path: Path
) -> None:
    source = bundled_model_path()
    shutil.copyfile(source, tmp_path / "en_US-copy-medium.onnx")
    shutil.copyfile(f"{source}.json", tmp_path / "en_US-copy-medium.onnx.json")
    (tmp_path / "orphan.onnx").write_bytes(b"")  # no config beside it: ignored
    both = PiperBackend(
        PiperConfig(voices_dir=str(tmp_path), cache_dir=str(cache_dir)),
        noise_scale=0.0,
        noise_w=0.0,
    )
    assert [v.id for v in both.voices()] == [VOICE, "en_US-copy-medium"]
    assert both.default_voice() == VOICE
    copy_frames = talk(both, "Good morning.", voice="en_US-copy-medium")
    copy_pcm = decode_whole(both, copy_frames, voice="en_US-copy-medium")
    assert copy_pcm.shape[0] > 0.3 * 22050 and float(np.sqrt(np.mean(copy_pcm**2))) > 0.01
    np.testing.assert_array_equal(copy_pcm, decode_whole(backend, talk(backend, "Good morning.")))


def test_speech_is_intelligible_to_an_asr(backend: PiperBackend) -> None:
    sentences = [
        "Please open the window before you leave the room.",
        "My brother bought a new car last week.",
        "We will meet at the station in the morning.",
        "The children played in the garden until it was dark.",
    ]
    errors = words = 0.0
    for sentence in sentences:
        heard = transcribe(decode_whole(backend, talk(backend, sentence)), 22050)
        count = len(sentence.split())
        errors += word_error_rate(sentence, heard) * count
        words += count
    assert errors / words <= 0.35


def test_piper_sets_each_stages_onnx_runtime_threads(cache_dir: Path) -> None:
    """piper.talker_intra_op_threads sizes the encoder and flow sessions,
    piper.vocoder_intra_op_threads the vocoder's; the speech is the same (up to rounding)."""
    threaded = PiperBackend(
        PiperConfig(
            cache_dir=str(cache_dir), talker_intra_op_threads=2, vocoder_intra_op_threads=3
        ),
        noise_scale=0.0,
        noise_w=0.0,
    )
    loaded = threaded._voices[VOICE]
    assert loaded.flow is not None
    assert loaded.encoder.get_session_options().intra_op_num_threads == 2
    assert loaded.flow.get_session_options().intra_op_num_threads == 2
    assert loaded.vocoder.get_session_options().intra_op_num_threads == 3
    plain = PiperBackend(PiperConfig(cache_dir=str(cache_dir)), noise_scale=0.0, noise_w=0.0)
    assert plain._voices[VOICE].vocoder.get_session_options().intra_op_num_threads == 1
    frames = talk(threaded, "Threads change the speed, not the speech.")
    np.testing.assert_allclose(
        frames, talk(plain, "Threads change the speed, not the speech."), atol=1e-4
    )


def test_a_segment_with_every_core_runs_its_first_step_on_the_wider_sessions(
    backend: PiperBackend, cache_dir: Path
) -> None:
    """`TalkRequest.all_cores` (nothing else runs): the segment's first step (encoder
    and first flow chunk) runs on the sessions of `piper.alone_intra_op_threads` (2),
    its next steps on the talker's own (1 thread); the frames are the same up to
    rounding. With the setting at 1 there are no such sessions."""
    loaded = backend._voices[VOICE]
    assert loaded.alone_encoder is not None and loaded.alone_flow is not None
    assert loaded.alone_encoder.get_session_options().intra_op_num_threads == 2
    assert loaded.alone_flow.get_session_options().intra_op_num_threads == 2
    assert loaded.flow is not None
    runs: list[str] = []
    sessions = {
        "alone_encoder": loaded.alone_encoder,
        "alone_flow": loaded.alone_flow,
        "encoder": loaded.encoder,
        "flow": loaded.flow,
    }
    for name, session in sessions.items():

        def counted(*args: object, _run=session.run, _name=name) -> object:
            runs.append(_name)
            return _run(*args)

        session.run = counted  # type: ignore[method-assign]
    text = "Before you leave the house this morning, please switch off the oven and lock the gate."
    try:
        steps = {}
        for all_cores in (True, False):
            runs.clear()
            request = TalkRequest(text, VOICE, 1.0, 0, 0, 0, all_cores=all_cores)
            segment = backend.open_segment(request)
            frames = []
            while True:
                (step,) = backend.step([segment])
                frames.append(step.frames)
                if step.done:
                    break
            steps[all_cores] = (list(runs), np.concatenate(frames))
    finally:
        for session in sessions.values():
            del session.run
    wide_runs, wide_frames = steps[True]
    plain_runs, plain_frames = steps[False]
    assert len(wide_runs) == len(plain_runs) >= 3
    assert wide_runs[:2] == ["alone_encoder", "alone_flow"]
    assert set(wide_runs[2:]) == {"flow"}
    assert plain_runs[0] == "encoder" and set(plain_runs[1:]) == {"flow"}
    np.testing.assert_allclose(wide_frames, plain_frames, atol=1e-4)
    narrow = PiperBackend(
        PiperConfig(cache_dir=str(cache_dir), alone_intra_op_threads=1),
        noise_scale=0.0,
        noise_w=0.0,
    )
    assert narrow._voices[VOICE].alone_encoder is None


def test_talker_and_vocoder_threads_run_at_once(backend: PiperBackend) -> None:
    texts = ["One small step.", "Two roads diverged in a wood.", "Three blind mice."]
    frames = talk(backend, TEXT)
    items = [VocodeItem(VOICE, frames[s : s + 24], 4, 16) for s in range(0, 200, 20)]
    expected_frames = [talk(backend, t) for t in texts]
    expected_pcm = backend.vocode(items)
    with ThreadPoolExecutor(max_workers=2) as pool:  # one thread per stage, like the engine
        talked = pool.submit(lambda: [talk(backend, t) for t in texts])
        vocoded = pool.submit(lambda: [backend.vocode([item])[0] for item in items])
        for got, want in zip(talked.result(), expected_frames, strict=True):
            np.testing.assert_array_equal(got, want)
        for got, want in zip(vocoded.result(), expected_pcm, strict=True):
            np.testing.assert_array_equal(got, want)


ENGINE_TEXT = (
    "The weather is nice today, and the sun is shining over the quiet harbour. "
    "Boats drift past the old pier while gulls circle above the fishing nets. "
    "By the evening the wind turns, and the first lights come on along the shore."
)


async def test_a_lone_stream_decoded_two_chunks_at_once_is_bit_identical(
    make_engine: EngineFactory, backend: PiperBackend
) -> None:
    """Two vocoder workers decode a lone stream's consecutive chunks at once; its PCM is
    complete, in order and the same, sample for sample, as its chunks decoded one at a
    time. (Where the chunks are cut may depend on timing: an urgent stream's chunk does
    not wait for its lookahead. So the reference decodes the very chunks the engine cut.)
    Every segment urgent (its flow in chunks): the frames do not depend on when each
    segment was opened."""
    engine = await make_engine(
        backend,
        window=1,
        chunking=ChunkingConfig(
            chunk_frames=64, ramp=(8, 16, 32), left_context_frames=8, right_context_frames=8
        ),
        vocoder=VocoderConfig(workers=2),
        alone=AloneConfig(work_ahead=True, even_tail=False, urgent_slack_s=1e9),
        talker=TalkerConfig(high_water_s=3600.0, urgent_slack_s=1e9),
    )
    core, ahead = engine.book.vocoder, 0
    schedule = core.schedule
    items: list[VocodeItem] = []  # every chunk's decode, in the order they were cut
    chunks: list[Chunk] = []

    def watched(now_s: float) -> VocodePlan | None:
        nonlocal ahead
        plan = schedule(now_s)
        for record, chunk in plan.batch if plan is not None else ():
            ahead += len(record.in_flight) > 1  # taken beside a chunk of it in flight
            chunks.append(chunk)
        items.extend(plan.items if plan is not None else ())
        return plan

    core.schedule = watched  # type: ignore[method-assign]
    stream = engine.submit(ENGINE_TEXT, voice=VOICE)
    pcm = await read_all(stream)
    assert engine.traces(stream.id) == [] and len(engine.book) == 0
    assert ahead > 0 and len(items) > 2
    # the chunks tile every segment, each frame once, in order (a segment may end with an
    # empty chunk, which needs no decode and is not listed)
    for before, chunk in zip([None, *chunks], chunks, strict=False):
        if before is None:
            assert (chunk.segment, chunk.start) == (0, 0)
        elif chunk.segment == before.segment:
            assert chunk.start == before.stop and not before.segment_end
        else:
            assert (chunk.segment, chunk.start) == (before.segment + 1, 0)
    assert not any(chunk.final for chunk in chunks[:-1])
    one_at_a_time = np.concatenate([backend.vocode([item])[0] for item in items])
    assert pcm.size == one_at_a_time.size > 0
    assert np.array_equal(pcm, one_at_a_time)


def test_an_aborted_vocode_call_raises_and_the_session_goes_on(backend: PiperBackend) -> None:
    frames = talk(backend, TEXT)[:40]
    item = VocodeItem(VOICE, frames, 0, len(frames))
    abort = backend.vocode_abort()
    abort()
    with pytest.raises(Exception, match=r"(?i)terminate"):
        backend.vocode([item], abort=abort)
    (pcm,) = backend.vocode([item], abort=backend.vocode_abort())  # not aborted
    assert np.array_equal(pcm, decode_whole(backend, frames))


class _UrgencyRecordingPiper(PiperBackend):
    """Records, per segment in opening order, whether it was urgent and how many frames
    its first talker step made."""

    def __init__(self, cache_dir: Path) -> None:
        super().__init__(PiperConfig(cache_dir=str(cache_dir)), noise_scale=0.0, noise_w=0.0)
        self.opened: list[list[object]] = []  # [urgent, first step's frames]
        self._entries: dict[int, list[object]] = {}

    def open_segment(self, request: TalkRequest) -> PiperSegment:
        segment = super().open_segment(request)
        self._entries[id(segment)] = entry = [request.urgent, None]
        self.opened.append(entry)
        return segment

    def step(self, segments: Sequence[PiperSegment]) -> list[TalkStep]:
        steps = super().step(segments)
        for segment, step in zip(segments, steps, strict=True):
            entry = self._entries[id(segment)]
            if entry[1] is None:
                entry[1] = len(step.frames)
        return steps


async def _lone_stream(
    make_engine: EngineFactory, backend: PiperBackend, text: str, urgent_slack_s: float
) -> np.ndarray:
    """`urgent_slack_s` for the stream alone too (alone.urgent_slack_s)."""
    talker = TalkerConfig(high_water_s=3600.0, urgent_slack_s=urgent_slack_s)
    alone = AloneConfig(urgent_slack_s=urgent_slack_s)
    engine = await make_engine(backend, window=1, talker=talker, alone=alone)
    return await read_all(engine.submit(text, voice=VOICE))


async def test_a_lone_streams_later_segments_run_their_flow_whole(
    make_engine: EngineFactory, cache_dir: Path
) -> None:
    """Through the engine at talker.urgent_slack_s 1 s (a lone stream's too): the first segment
    (no audio yet) is urgent and makes a small first flow step; a segment opened once the
    stream has seconds of audio ahead makes all its frames in one step. The audio is as
    long as with every segment urgent, and sounds the same (the flow's chunks are within
    float noise of the whole flow)."""
    recording = _UrgencyRecordingPiper(cache_dir)
    text = ENGINE_TEXT + " " + ENGINE_TEXT  # six sentences, the first cut at its comma
    pcm = await _lone_stream(make_engine, recording, text, TalkerConfig().urgent_slack_s)
    first_chunk = PiperConfig().flow_first_chunk_frames
    opened = recording.opened
    assert len(opened) >= 6 and opened[0] == [True, first_chunk]
    later = [frames for urgent, frames in opened[1:] if not urgent]
    assert later and all(isinstance(f, int) and f > first_chunk for f in later), opened
    recording.opened.clear()
    chunked = await _lone_stream(make_engine, recording, text, 1e9)
    assert all(urgent for urgent, _ in recording.opened)
    assert pcm.size == chunked.size
    assert snr_db(chunked, pcm) >= 40.0


# prepare_segment: a segment's phonemiser and encoder run ahead on a helper thread

SENTENCES = (
    "The ferry leaves the north pier at seven every morning.",
    "Tickets are sold on board, and dogs travel free.",
    "On windy days the crossing takes a little longer than usual.",
    "Please keep your bags away from the doors.",
    "The cafe on the upper deck opens after the first stop.",
    "We hope you enjoy the journey across the bay.",
)


def _request(text: str) -> TalkRequest:
    return TalkRequest(text, VOICE, 1.0, stream_tag=0, segment_index=1, first_frame_index=0)


def _prepare(backend: PiperBackend, text: str) -> None:
    """Prepare `text` and wait until the helper thread has done it (a prepare that has not
    started when its segment is opened is not waited for: the talker does the work)."""
    done = backend.prepare_segment(_request(text))
    assert done is not None, "a new text starts new work"
    done.result(timeout=60)  # the timeout only guards against a hang


def test_a_prepared_segment_is_taken_once_and_gives_the_same_frames(
    backend: PiperBackend,
) -> None:
    """open_segment takes the prepared phonemes and encoding of the same text, voice and
    speed (the talker then only runs the flow): the frames are the same, sample for
    sample, as without it; a second open of that text, or another text, does the work
    itself."""
    text, other = SENTENCES[:2]
    plain = talk(backend, text)
    used = backend.prepared_used
    _prepare(backend, text)
    assert np.array_equal(talk(backend, text), plain)
    assert backend.prepared_used == used + 1
    assert np.array_equal(talk(backend, text), plain)  # taken once: nothing left
    _prepare(backend, other)
    backend.prepare_segment(TalkRequest(text, VOICE, 2.0, 0, 1, 0))  # another speed
    assert np.array_equal(talk(backend, text), plain)
    assert backend.prepared_used == used + 1
    assert np.array_equal(talk(backend, other), talk(backend, other))
    assert backend.prepared_used == used + 2
    backend.drop_prepared()


def test_dropped_prepares_are_not_used_and_the_talker_does_the_work(
    backend: PiperBackend,
) -> None:
    """drop_prepared: work not started never runs and a running encoder ends early (its
    terminate flag); open_segment then phonemises and encodes itself, the same frames."""
    plain = {text: talk(backend, text) for text in SENTENCES}
    used = backend.prepared_used
    for text in SENTENCES[:3]:
        backend.prepare_segment(_request(text))
    backend.drop_prepared()
    for text in SENTENCES[:3]:
        assert np.array_equal(talk(backend, text), plain[text])
    assert backend.prepared_used == used


def test_only_the_latest_prepared_segments_are_kept(backend: PiperBackend) -> None:
    """At most PREPARED_MAX prepared segments wait to be opened (a stream that ends
    before opening its prepared segment leaves nothing behind for long): the oldest go."""
    assert len(SENTENCES) == PREPARED_MAX + 2
    plain = {text: talk(backend, text) for text in SENTENCES}
    used = backend.prepared_used
    for text in SENTENCES:
        _prepare(backend, text)
    for text in SENTENCES[:2]:  # dropped
        assert np.array_equal(talk(backend, text), plain[text])
    assert backend.prepared_used == used
    for text in SENTENCES[2:]:
        assert np.array_equal(talk(backend, text), plain[text])
    assert backend.prepared_used == used + PREPARED_MAX


async def _prepared_stream(
    make_engine: EngineFactory, backend: PiperBackend, prepare_next: bool
) -> np.ndarray:
    engine = await make_engine(
        backend,
        window=1,
        talker=TalkerConfig(high_water_s=3600.0, urgent_slack_s=1e9),
        alone=AloneConfig(urgent_slack_s=1e9, prepare_next=prepare_next),
    )
    calls, used = backend.prepare_calls, backend.prepared_used
    pcm = await read_all(engine.submit(ENGINE_TEXT, voice=VOICE))
    # a lone stream of four segments (the first sentence cut at its comma): each of the
    # last three is prepared while the one before it is talked. Whether the helper thread
    # had started one when the talker opened it depends on the OS (one it had not, the
    # talker does itself): that it is then taken is the backend tests' matter.
    assert engine.book.talker.prepares == (3 if prepare_next else 0)
    assert backend.prepare_calls - calls == engine.book.talker.prepares
    assert backend.prepared_used - used <= engine.book.talker.prepares
    return pcm


async def test_a_lone_streams_next_segments_are_prepared_and_sound_the_same(
    make_engine: EngineFactory, backend: PiperBackend
) -> None:
    """alone.prepare_next: while a lone stream's talker steps one segment,
    its next one is phonemised and encoded on the backend's helper thread, and the talker
    takes that work when it opens it. The audio is the same as without it."""
    prepared = await _prepared_stream(make_engine, backend, True)
    plain = await _prepared_stream(make_engine, backend, False)
    assert prepared.size == plain.size > 0
    assert snr_db(plain, prepared) >= 60.0


async def test_no_segment_is_prepared_while_more_streams_have_work(
    make_engine: EngineFactory, backend: PiperBackend
) -> None:
    """Two streams submitted together: neither is alone, so nothing is prepared (a
    helper thread would take CPU from the stage threads)."""
    engine = await make_engine(backend, window=1)
    streams = [engine.submit(ENGINE_TEXT, voice=VOICE) for _ in range(2)]
    for stream in streams:
        assert (await read_all(stream)).size > 0
    assert engine.book.talker.prepares == 0


async def test_a_second_stream_drops_what_is_prepared_for_the_first(
    make_engine: EngineFactory, backend: PiperBackend
) -> None:
    """A lone stream has its next segment prepared; once a second stream has work, the
    talker has the backend drop it (a low-priority helper could wait long for a busy
    core while a talker lane waits for it). Both streams still get all their audio."""
    engine = await make_engine(backend, window=1)
    first = engine.submit(ENGINE_TEXT, voice=VOICE)
    while engine.book.talker.prepares == 0:
        await asyncio.sleep(0.001)
    second = engine.submit(ENGINE_TEXT, voice=VOICE)
    pcms = [await read_all(first), await read_all(second)]
    assert engine.talker.prepare_drops >= 1
    assert pcms[0].size == pcms[1].size > 0
