"""Cutting a Piper voice into encoder + flow + vocoder graphs: the cut, the cache, and
exactness."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from pipeline.backend import TalkRequest, VocodeItem
from pipeline.backends.piper import (
    GraphSplitError,
    PiperBackend,
    bundled_model_path,
    default_cache_dir,
    load_split,
    synthesize_whole,
)
from pipeline.backends.piper.graph_split import (
    FRAME_COUNT_NAME,
    LATENT_NAME,
    MASK_NAME,
    PRIOR_NAME,
    SPLIT_VERSION,
    file_sha256,
    find_cut,
)
from pipeline.backends.piper.reference import whole_model_session
from pipeline.backends.piper.vocoder_trim import TRIM_START, TRIM_STOP, Trim, add_trim
from pipeline.config import PiperConfig

OUTPUT_GAIN = 0.8


def test_default_cache_dir_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / "playhead"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_cache_dir() == Path.home() / ".cache" / "playhead"


def test_a_graph_without_a_decoder_fails_naming_the_voice() -> None:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["input"], ["output"])],
        "not-vits",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 4])],
    )
    with pytest.raises(GraphSplitError, match="'xx_XX-toy-low'"):
        find_cut(helper.make_model(graph), "xx_XX-toy-low")


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("piper-cache")


@pytest.fixture(scope="module")
def backend(cache_dir: Path) -> PiperBackend:
    """Noise scales 0: the talker is deterministic."""
    return PiperBackend(
        PiperConfig(cache_dir=str(cache_dir), output_gain=OUTPUT_GAIN), noise_scale=0.0, noise_w=0.0
    )


@pytest.fixture(scope="module")
def whole_session() -> ort.InferenceSession:
    return whole_model_session(bundled_model_path())


@pytest.mark.slow
def test_cut_graphs_declare_the_latent_and_are_cached(cache_dir: Path) -> None:
    split = load_split(bundled_model_path(), cache_dir, "en_US-joe-medium")
    assert not split.cached
    paths = (split.encoder, split.flow, split.vocoder)
    assert all(isinstance(p, Path) for p in paths)
    encoder, flow, vocoder = (ort.InferenceSession(str(p)) for p in paths)
    assert [i.name for i in encoder.get_inputs()] == ["input", "input_lengths", "scales"]
    assert [(o.name, o.shape) for o in encoder.get_outputs()] == [
        (PRIOR_NAME, ["batch_size", 192, "frames"]),
        (MASK_NAME, ["batch_size", 1, "frames"]),
        (FRAME_COUNT_NAME, ["batch_size"]),
        ("/Ceil_output_0", ["batch_size", 1, "phonemes"]),  # frames per phoneme id
    ]
    assert [(i.name, i.shape) for i in flow.get_inputs()] == [
        (PRIOR_NAME, ["batch_size", 192, "frames"]),
        (MASK_NAME, ["batch_size", 1, "frames"]),
    ]
    assert [(o.name, o.shape) for o in flow.get_outputs()] == [
        (LATENT_NAME, ["batch_size", 192, "frames"])
    ]
    assert [(i.name, i.shape) for i in vocoder.get_inputs()] == [
        (LATENT_NAME, ["batch_size", 192, "frames"]),
        (TRIM_START, [1]),
        (TRIM_STOP, [1]),
    ]
    assert [o.name for o in vocoder.get_outputs()] == ["output"]
    for path in paths:
        onnx.checker.check_model(str(path))

    stamps = [os.stat(p).st_mtime_ns for p in paths]
    again = load_split(bundled_model_path(), cache_dir, "en_US-joe-medium")
    assert again.cached
    assert (again.encoder, again.flow, again.vocoder) == paths
    assert [os.stat(p).st_mtime_ns for p in paths] == stamps
    assert sorted(p.name for p in split.encoder.parent.iterdir()) == sorted(
        p.name for p in paths
    ), "no temporary files left behind"


@pytest.mark.slow
def test_cutting_removes_this_models_entries_of_other_versions(tmp_path: Path) -> None:
    folder = tmp_path / "piper-split"
    folder.mkdir()
    sha = file_sha256(bundled_model_path())
    stale = [folder / f"{sha}.v{SPLIT_VERSION - 1}.{part}.onnx" for part in ("encoder", "vocoder")]
    other_model = folder / f"{'0' * 64}.v{SPLIT_VERSION - 1}.encoder.onnx"
    for path in (*stale, other_model):
        path.write_bytes(b"an older cut")
    split = load_split(bundled_model_path(), tmp_path, "en_US-joe-medium")
    assert not split.cached
    assert not any(path.exists() for path in stale)
    assert other_model.exists(), "another model's entry is not this cut's to remove"
    assert isinstance(split.encoder, Path) and split.encoder.exists()


@pytest.mark.slow
def test_a_corrupt_cache_entry_is_cut_again(tmp_path: Path) -> None:
    split = load_split(bundled_model_path(), tmp_path, "en_US-joe-medium")
    assert isinstance(split.flow, Path)
    split.flow.write_bytes(b"not an onnx graph")
    backend = PiperBackend(PiperConfig(cache_dir=str(tmp_path)))
    assert backend.default_voice() == "en_US-joe-medium"
    onnx.checker.check_model(str(split.flow))


@pytest.mark.slow
def test_an_unwritable_cache_keeps_the_graphs_in_memory(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    split = load_split(bundled_model_path(), blocker, "en_US-joe-medium")
    assert all(isinstance(p, bytes) for p in (split.encoder, split.flow, split.vocoder))
    vocoder = ort.InferenceSession(split.vocoder)
    assert [i.name for i in vocoder.get_inputs()] == [LATENT_NAME, TRIM_START, TRIM_STOP]


@pytest.mark.slow
def test_a_voice_without_the_flow_names_keeps_its_talker_whole(tmp_path: Path) -> None:
    """Another export (renamed tensors): the talker is one graph, run whole per segment."""
    model = onnx.load(str(bundled_model_path()))
    renames = {PRIOR_NAME: "z_p", MASK_NAME: "y_mask"}
    for node in model.graph.node:
        node.input[:] = [renames.get(n, n) for n in node.input]
        node.output[:] = [renames.get(n, n) for n in node.output]
    (tmp_path / "en_US-renamed-medium.onnx").write_bytes(model.SerializeToString())
    config = Path(f"{bundled_model_path()}.json").read_text(encoding="utf-8")
    (tmp_path / "en_US-renamed-medium.onnx.json").write_text(config, encoding="utf-8")
    split = load_split(tmp_path / "en_US-renamed-medium.onnx", tmp_path, "en_US-renamed-medium")
    assert split.flow is None
    talker = ort.InferenceSession(str(split.encoder))
    assert [o.name for o in talker.get_outputs()] == [
        LATENT_NAME,
        FRAME_COUNT_NAME,
        "/Ceil_output_0",
    ]
    model_path = tmp_path / "en_US-renamed-medium.onnx"
    backend = PiperBackend(
        PiperConfig(model_path=str(model_path), cache_dir=str(tmp_path)),
        noise_scale=0.0,
        noise_w=0.0,
    )
    voice = backend.default_voice()
    segment = backend.open_segment(TalkRequest("Hello there, friend.", voice, 1.0, 0, 0, 0))
    (step,) = backend.step([segment])
    assert step.done and step.frames.shape[0] > 50  # the whole segment in one step
    assert load_split(tmp_path / "en_US-renamed-medium.onnx", tmp_path, "x").flow is None


@pytest.mark.slow
def test_the_cut_is_found_by_structure_when_names_differ() -> None:
    model = onnx.load(str(bundled_model_path()), load_external_data=False)
    renames = {LATENT_NAME: "z_masked", FRAME_COUNT_NAME: "y_lengths"}
    for node in model.graph.node:
        node.input[:] = [renames.get(n, n) for n in node.input]
        node.output[:] = [renames.get(n, n) for n in node.output]
    for info in model.graph.value_info:
        info.name = renames.get(info.name, info.name)
    cut = find_cut(model, "renamed")
    assert (cut.latent, cut.frame_count, cut.channels) == ("z_masked", "y_lengths", 192)


@pytest.mark.slow
@pytest.mark.parametrize(
    "text",
    [
        "Hello there. This sentence checks that the two halves reproduce the whole voice.",
        "How quickly can a streaming server speak, if it never stalls?",
    ],
)
def test_talker_then_vocoder_reproduces_the_whole_model(
    backend: PiperBackend, whole_session: ort.InferenceSession, text: str
) -> None:
    voice = backend.default_voice()
    ids = backend.phoneme_ids(voice, text)
    noise_scale, length_scale, noise_w = backend.scales(voice)
    assert (noise_scale, noise_w) == (0.0, 0.0)
    whole = synthesize_whole(
        whole_session, ids, noise_scale=noise_scale, length_scale=length_scale, noise_w=noise_w
    )

    latent = backend.talk_ids(voice, ids, (noise_scale, length_scale, noise_w))
    (pcm,) = backend.vocode([VocodeItem(voice, latent, 0, latent.shape[0])])

    assert latent.shape[1] == 192 and latent.dtype == np.float32
    assert pcm.shape == whole.shape == (latent.shape[0] * 256,)
    expected = np.clip(whole * OUTPUT_GAIN, -1.0, 1.0)
    assert float(np.max(np.abs(pcm - expected))) < 1e-6


def _conv(name: str, source: str, target: str, kernel: int, **attributes: object):
    """A 2-channel 1-D Conv (or ConvTranspose, with `strides`) and its weight."""
    weight = helper.make_tensor(f"{name}.w", TensorProto.FLOAT, [2, 2, kernel], [0.1] * 4 * kernel)
    op = "ConvTranspose" if "strides" in attributes else "Conv"
    node = helper.make_node(op, [source, weight.name], [target], name=name, **attributes)
    return node, weight


def _decoder(after_second_upsampling: str) -> onnx.ModelProto:
    """A toy decoder: conv, two upsampling layers, then one op on the audio."""
    parts = [
        _conv("pre", "latent", "a", 3, pads=[1, 1]),
        _conv("up0", "a", "b", 4, pads=[1, 1], strides=[2]),
        _conv("up1", "b", "c", 4, pads=[1, 1], strides=[2]),
    ]
    nodes = [node for node, _ in parts]
    nodes.append(helper.make_node(after_second_upsampling, ["c"], ["output"], name="last"))
    graph = helper.make_graph(
        nodes,
        "toy-decoder",
        [helper.make_tensor_value_info("latent", TensorProto.FLOAT, [1, 2, "frames"])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["d0", "d1", "d2"])],
        [weight for _, weight in parts],
    )
    return helper.make_model(graph)


def test_the_trim_reach_is_computed_from_the_graph() -> None:
    model = _decoder("Tanh")
    trim = add_trim(model)
    # the cut is up1's input (2 samples per frame); the reach after it: up1 (kernel 4,
    # stride 2, pad 1: 1 input sample), then Tanh (none): 1 sample, 1 frame rounded up
    assert trim == Trim(samples_per_frame=2, margin_frames=1)
    onnx.checker.check_model(model)
    assert [i.name for i in model.graph.input] == ["latent", TRIM_START, TRIM_STOP]
    props = {p.key: p.value for p in model.metadata_props}
    assert props["playhead.trim_samples_per_frame"] == "2"


def test_a_cut_read_before_the_second_upsampling_layer_is_trimmed_before_its_readers() -> None:
    """The cut tensor also feeds a branch whose node comes before the second upsampling
    layer in the graph's order: the Slice goes right after the cut's producer, and the
    emitted samples are those of the untrimmed graph."""
    parts = [
        _conv("pre", "latent", "a", 3, pads=[1, 1]),
        _conv("up0", "a", "b", 4, pads=[1, 1], strides=[2]),
        _conv("up1", "b", "c", 4, pads=[1, 1], strides=[2]),
        _conv("up1b", "b_relu", "d", 4, pads=[1, 1], strides=[2]),
    ]
    nodes = [parts[0][0], parts[1][0], helper.make_node("Relu", ["b"], ["b_relu"])]
    nodes += [parts[2][0], parts[3][0], helper.make_node("Add", ["c", "d"], ["output"])]
    graph = helper.make_graph(
        nodes,
        "toy-branch",
        [helper.make_tensor_value_info("latent", TensorProto.FLOAT, [1, 2, "frames"])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 2, "samples"])],
        [weight for _, weight in parts],
    )
    model = helper.make_model(graph)
    untrimmed = ort.InferenceSession(model.SerializeToString())
    trim = add_trim(model)
    assert trim is not None
    onnx.checker.check_model(model)
    trimmed = ort.InferenceSession(model.SerializeToString())
    latent = np.random.default_rng(0).standard_normal((1, 2, 20)).astype(np.float32)
    (whole,) = untrimmed.run(None, {"latent": latent})
    first, last = 6 - trim.margin_frames, 10 + trim.margin_frames  # emit frames [6, 10)
    rate = trim.samples_per_frame
    feed = {
        "latent": latent,
        TRIM_START: np.array([first * rate]),
        TRIM_STOP: np.array([last * rate]),
    }
    (part,) = trimmed.run(None, feed)
    per_frame = whole.shape[2] // 20
    emitted = slice((6 - first) * per_frame, (10 - first) * per_frame)
    assert np.array_equal(part[:, :, emitted], whole[:, :, 6 * per_frame : 10 * per_frame])


def test_a_decoder_it_does_not_recognise_is_left_untrimmed() -> None:
    """An op after the cut that moves samples in time (here a transpose of the axes):
    no trim, the graph as it was."""
    model = _decoder("Transpose")
    before = model.SerializeToString()
    assert add_trim(model) is None
    assert model.SerializeToString() == before


@pytest.mark.slow
def test_trimmed_decoding_is_bit_identical_to_the_whole_chunk(
    backend: PiperBackend, cache_dir: Path
) -> None:
    """The bundled voice's vocoder is trimmed after its first stage (8 samples per frame,
    a reach of 2 frames, both computed from the graph); every chunk shape the planner
    makes (ramp, steady, solo, at a segment's start, middle and end, two items of
    different offsets in one call) decodes to exactly the untrimmed graph's audio. The
    margin matters: without it the audio changes."""
    voice = backend.default_voice()
    loaded = backend._voices[voice]
    assert loaded.trim == Trim(samples_per_frame=8, margin_frames=2)
    whole = PiperBackend(
        PiperConfig(cache_dir=str(cache_dir), output_gain=OUTPUT_GAIN, vocoder_trim=False),
        noise_scale=0.0,
        noise_w=0.0,
    )
    text = "A sentence long enough to be decoded in several chunks, with context on each side."
    latent = backend.talk_ids(voice, backend.phoneme_ids(voice, text), backend.scales(voice))
    frames = latent.shape[0]
    assert frames > 200
    # (first frame given, emit offset, emit count, frames given)
    shapes = [
        (0, 0, 8, 16),  # the first ramp chunk: no left context
        (0, 8, 16, 32),
        (16, 8, 32, 48),
        (100, 8, 64, 80),  # steady
        (40, 8, 128, 144),  # solo
        (frames - 40, 8, 32, 40),  # the segment's tail: no right context
    ]
    items = [VocodeItem(voice, latent[a : a + n], off, count) for a, off, count, n in shapes]
    batch = [VocodeItem(voice, latent[50:130], 8, 64), VocodeItem(voice, latent[0:80], 0, 72)]
    for call in [*([item] for item in items), batch]:
        trimmed, untrimmed = backend.vocode(call), whole.vocode(call)
        for got, expected in zip(trimmed, untrimmed, strict=True):
            assert got.shape == expected.shape
            assert np.array_equal(got, expected)

    # the steady chunk again, its later stages cut to the emitted frames with no margin
    steady = items[3]
    frames_in = np.asarray(steady.frames, dtype=np.float32).T[np.newaxis]
    start, stop = steady.emit_offset_frames, steady.emit_offset_frames + steady.emit_frames
    (no_margin,) = loaded.vocoder.run(
        None,
        {
            loaded.latent_name: frames_in,
            TRIM_START: np.array([start * 8], np.int64),
            TRIM_STOP: np.array([stop * 8], np.int64),
        },
    )
    got = np.clip(no_margin.reshape(-1) * OUTPUT_GAIN, -1.0, 1.0)
    (expected,) = whole.vocode([steady])
    assert got.shape == expected.shape
    assert not np.array_equal(got, expected)
