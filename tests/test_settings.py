"""Settings: YAML file < PLAYHEAD_ environment < --set; errors are one line naming source, field."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from app.encoding_config import EncodingConfig
from app.settings import (
    DEFAULT_CHUNKING,
    DEFAULT_SCHEDULING,
    OPENAI_MODEL_IDS,
    SECTIONS,
    ServerConfig,
    Settings,
    SettingsError,
    load_settings,
    section_defaults,
)
from configs import packaged_config
from pipeline.backends import BackendConfig
from pipeline.config import TalkerConfig
from scheduling import (
    AdmissionConfig,
    ChunkingConfig,
    SchedulingConfig,
    warn_if_first_chunk_too_short,
)

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def write(tmp_path: Path, text: str, name: str = "x.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def error_of(path: Path | None, overrides=(), environ=None, **kwargs) -> str:
    with pytest.raises(SettingsError) as info:
        load_settings(path, overrides, {} if environ is None else environ, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


# --- defaults and shipped configs --------------------------------------------------------


def test_no_file_gives_the_built_in_defaults():
    settings = load_settings(None, environ={})
    assert settings == Settings()
    assert settings.server == ServerConfig()
    assert settings.server.port == 8000
    assert settings.server.model_ids == ("playhead", "playhead-piper")
    assert settings.server.max_request_bytes == 65536
    assert settings.encoding == EncodingConfig()
    assert settings.backend == BackendConfig()
    assert settings.talker == TalkerConfig()
    assert settings.scheduling == DEFAULT_SCHEDULING
    assert settings.admission == AdmissionConfig()
    assert settings.chunking == DEFAULT_CHUNKING


def test_accepted_model_ids_are_ours_then_openai():
    server = ServerConfig(model_ids=["mine"])
    assert server.accepted_model_ids == ("mine", *OPENAI_MODEL_IDS)


@pytest.mark.parametrize("text", ["", "# only a comment\n", "talker:\n", "server: {}\n"])
def test_empty_file_or_empty_sections_load(tmp_path, text):
    assert load_settings(write(tmp_path, text), environ={}) == Settings()


def test_default_yaml_loads_as_piper_and_kokoro():
    settings = load_settings(CONFIGS / "default.yaml", environ={})
    assert settings.backend.kind == "multi" and settings.multi.kinds == ("piper", "kokoro")
    assert settings.scheduling == SchedulingConfig(
        policy="edf", active_stream_window=1, first_chunk_ms=100.0, safety_margin_ms=100.0
    )
    assert settings.chunking == ChunkingConfig(
        chunk_frames=64,
        ramp=(8, 16, 32),
        left_context_frames=8,
        right_context_frames=8,
    )
    assert settings.chunking == DEFAULT_CHUNKING
    assert settings.admission.enabled is True


def test_default_yaml_states_the_built_in_encoding_and_body_limit():
    settings = load_settings(CONFIGS / "default.yaml", environ={})
    assert settings.encoding == EncodingConfig()
    assert settings.server.max_request_bytes == ServerConfig().max_request_bytes


def test_default_yaml_writes_out_every_knob():
    data = yaml.safe_load((CONFIGS / "default.yaml").read_text())
    assert list(data) == list(SECTIONS)
    for section in SECTIONS:
        kind = Settings.model_fields[section].annotation
        assert set(data[section]) == {f.name for f in dataclasses.fields(kind)}, section


@pytest.mark.parametrize("section", SECTIONS)
def test_default_yaml_states_the_codes_defaults_field_by_field(section):
    # configs/default.yaml holds the measured defaults; the code's must be the same, so
    # that Python callers (tests, benchmarks, an engine built by hand) run what was measured
    loaded = getattr(load_settings(CONFIGS / "default.yaml", environ={}), section)
    for name, default in section_defaults(section).items():
        assert getattr(loaded, name) == default, f"{section}.{name}"
    assert loaded == getattr(Settings(), section)


def test_the_packaged_default_config_is_configs_default_yaml():
    packaged = packaged_config()
    assert packaged.read_text(encoding="utf-8") == (CONFIGS / "default.yaml").read_text()
    assert load_settings(packaged, environ={}) == Settings()


def test_sim_yaml_loads_with_80_ms_frames():
    settings = load_settings(CONFIGS / "sim.yaml", environ={})
    assert settings.backend.kind == "sim"
    sim = settings.sim
    assert sim.samples_per_frame / sim.sample_rate_hz == pytest.approx(0.080)
    assert (sim.talker_frames_per_step, sim.talker_step_base_ms) == (8, 1.0)
    assert sim.talker_step_per_stream_ms == 0.2 and settings.talker.batch == 16
    assert (sim.vocoder_base_ms, sim.vocoder_per_frame_ms, sim.batched) == (4.0, 9.0, True)
    assert settings.scheduling.policy == "edf"
    assert settings.scheduling.active_stream_window == 4
    assert settings.chunking.ramp == (6,) and settings.chunking.chunk_frames == 8
    assert (settings.chunking.left_context_frames, settings.chunking.right_context_frames) == (0, 0)


@pytest.mark.parametrize("name", ["default.yaml", "sim.yaml"])
def test_shipped_configs_do_not_start_edf_with_a_too_short_chunk(name):
    settings = load_settings(CONFIGS / name, environ={})
    assert not warn_if_first_chunk_too_short(settings.scheduling, settings.chunking)


def test_settings_are_frozen_and_reject_unknown_keys_without_the_loader():
    settings = Settings()
    with pytest.raises(ValidationError):
        settings.server = ServerConfig(port=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.server.port = 1  # type: ignore[misc]
    with pytest.raises(ValidationError, match="bogus"):
        Settings.model_validate({"talker": {"bogus": 1}})
    with pytest.raises(ValidationError, match="bogus"):
        Settings.model_validate({"scheduling": {"bogus": 1}})
    with pytest.raises(ValidationError, match="bogus"):
        Settings.model_validate({"bogus": {}})


def test_file_values_are_coerced_to_the_field_types(tmp_path):
    path = write(
        tmp_path,
        "server: {port: '8001'}\nchunking: {ramp: [4, 8]}\nengine:\n  capacity_window_s: 3\n",
    )
    settings = load_settings(path, environ={})
    assert settings.server.port == 8001
    assert settings.chunking.ramp == (4, 8)
    assert isinstance(settings.engine.capacity_window_s, float)


def test_a_partial_section_keeps_the_other_fields(tmp_path):
    settings = load_settings(write(tmp_path, "chunking: {chunk_frames: 32}\n"), environ={})
    assert settings.chunking == dataclasses.replace(DEFAULT_CHUNKING, chunk_frames=32)


# --- validation through the YAML path ----------------------------------------------------

SCHEDULING_RULES = [
    ("policy: rr", "scheduling.policy"),
    ("policy: edf\n  active_stream_window: 0", "scheduling.active_stream_window"),
    ("policy: edf\n  active_stream_window: -2", "scheduling.active_stream_window"),
    ("policy: fifo\n  active_stream_window: -1", "scheduling.active_stream_window"),
    ("first_chunk_ms: 0", "scheduling.first_chunk_ms"),
    ("first_chunk_ms: -10", "scheduling.first_chunk_ms"),
    ("first_chunk_ms: .nan", "scheduling.first_chunk_ms"),
    ("first_chunk_ms: .inf", "scheduling.first_chunk_ms"),
    ("safety_margin_ms: -1", "scheduling.safety_margin_ms"),
    ("safety_margin_ms: .nan", "scheduling.safety_margin_ms"),
    ("safety_margin_ms: .inf", "scheduling.safety_margin_ms"),
]


@pytest.mark.parametrize(("body", "field"), SCHEDULING_RULES)
def test_every_scheduling_rule_names_file_and_field(tmp_path, body, field):
    path = write(tmp_path, f"scheduling:\n  {body}\n")
    assert error_of(path).startswith(f"{path}: {field}: ")


def test_edf_without_window_message(tmp_path):
    path = write(tmp_path, "scheduling:\n  policy: edf\n  active_stream_window: 0\n")
    message = error_of(path)
    assert message.startswith(f"{path}: scheduling.active_stream_window: ")
    assert "active_stream_window > 0" in message


SECTION_RULES = [
    ("server", "port: 0", "server.port"),
    ("server", "port: 70000", "server.port"),
    ("server", "port: eighty", "server.port"),
    ("server", "default_sample_rate_hz: 7999", "server.default_sample_rate_hz"),
    ("server", "default_sample_rate_hz: 48001", "server.default_sample_rate_hz"),
    ("server", "max_input_chars: 0", "server.max_input_chars"),
    ("server", "log_level: loud", "server.log_level"),
    ("server", "api_key: ''", "server.api_key"),
    ("server", "model_ids: []", "server.model_ids"),
    ("server", "model_ids: [a, a]", "server.model_ids"),
    ("server", "host: ''", "server.host"),
    ("server", "max_request_bytes: 1023", "server.max_request_bytes"),
    ("server", "max_request_bytes: 16777217", "server.max_request_bytes"),
    ("server", "max_request_bytes: lots", "server.max_request_bytes"),
    ("server", "max_request_bytes: true", "server.max_request_bytes"),
    # a body limit that a valid input could exceed (6 bytes per \uXXXX-escaped character)
    ("server", "max_input_chars: 4096\n  max_request_bytes: 24575", "server.max_request_bytes"),
    ("encoding", "mp3_bitrate_bps: 7999", "encoding.mp3_bitrate_bps"),
    ("encoding", "mp3_bitrate_bps: 320001", "encoding.mp3_bitrate_bps"),
    ("encoding", "opus_bitrate_bps: 5999", "encoding.opus_bitrate_bps"),
    ("encoding", "opus_bitrate_bps: 256001", "encoding.opus_bitrate_bps"),
    ("encoding", "aac_bitrate_bps: 7999", "encoding.aac_bitrate_bps"),
    ("encoding", "aac_bitrate_bps: 512001", "encoding.aac_bitrate_bps"),
    ("encoding", "aac_bitrate_bps: 64k", "encoding.aac_bitrate_bps"),
    ("encoding", "mp3_bitrate_bps: 64000.5", "encoding.mp3_bitrate_bps"),
    ("encoding", "ogg_page_ms: 4", "encoding.ogg_page_ms"),
    ("encoding", "ogg_page_ms: 1001", "encoding.ogg_page_ms"),
    ("encoding", "ogg_page_ms: true", "encoding.ogg_page_ms"),
    ("encoding", "resample_quality: best", "encoding.resample_quality"),
    ("encoding", "resample_quality: 3", "encoding.resample_quality"),
    ("encoding", "inline_encode_max_s: -0.1", "encoding.inline_encode_max_s"),
    ("encoding", "inline_encode_max_s: 1.5", "encoding.inline_encode_max_s"),
    ("encoding", "inline_encode_max_s: .nan", "encoding.inline_encode_max_s"),
    ("encoding", "encoder_threads: 0", "encoding.encoder_threads"),
    ("vocoder", "workers: 0", "vocoder.workers"),
    ("backend", "kind: gpu", "backend.kind"),
    ("sim", "samples_per_frame: 0", "sim.samples_per_frame"),
    ("sim", "talker_frames_per_step: 0", "sim.talker_frames_per_step"),
    ("sim", "talker_step_base_ms: -1", "sim.talker_step_base_ms"),
    ("sim", "talker_step_per_stream_ms: .nan", "sim.talker_step_per_stream_ms"),
    ("talker", "batch: 0", "talker.batch"),
    ("piper", "noise_w: -1", "piper.noise_w"),
    ("server", "model_ids: ['']", "server.model_ids"),
    ("sim", "vocoder_base_ms: -1", "sim.vocoder_base_ms"),
    ("piper", "output_gain: 0", "piper.output_gain"),
    ("piper", "ort_graph_optimization: fast", "piper.ort_graph_optimization"),
    ("piper", "ort_cpu_arena: sometimes", "piper.ort_cpu_arena"),
    ("piper", "flow_context_frames: -1", "piper.flow_context_frames"),
    ("alone", "prepare_next: maybe", "alone.prepare_next"),
    ("alone", "urgent_slack_s: -1", "alone.urgent_slack_s"),
    ("piper", "vocoder_trim: maybe", "piper.vocoder_trim"),
    ("piper", "flow_first_chunk_frames: 600", "piper.flow_max_chunk_frames"),
    ("piper", "talker_intra_op_threads: 0", "piper.talker_intra_op_threads"),
    ("text", "max_segment_chars: 10", "text.max_segment_chars"),
    ("talker", "high_water_s: .nan", "talker.high_water_s"),
    ("piper", "vocoder_intra_op_threads: two", "piper.vocoder_intra_op_threads"),
    ("engine", "max_pending_audio_s: -1", "engine.max_pending_audio_s"),
    ("chunking", "chunk_frames: 0", "chunking.chunk_frames"),
    ("chunking", "chunk_frames: lots", "chunking.chunk_frames"),
    ("chunking", "ramp: [8, x]", "chunking.ramp[1]"),
    ("chunking", "ramp: [8, 0]", "chunking.ramp"),
    ("chunking", "ramp: 8", "chunking.ramp"),
    ("chunking", "chunk_frames: true", "chunking.chunk_frames"),
    ("server", "port: false", "server.port"),
    ("engine", "capacity_window_s: true", "engine.capacity_window_s"),
    ("admission", "capacity_headroom: 1.5", "admission.capacity_headroom"),
    ("admission", "queue_max_wait_s: -1", "admission.queue_max_wait_s"),
    ("admission", "max_streams: many", "admission.max_streams"),
    ("admission", "enabled: maybe", "admission.enabled"),
]


@pytest.mark.parametrize(("section", "body", "field"), SECTION_RULES)
def test_section_rules_name_file_and_field(tmp_path, section, body, field):
    path = write(tmp_path, f"{section}:\n  {body}\n")
    assert error_of(path).startswith(f"{path}: {field}: ")


def test_log_level_is_case_insensitive(tmp_path):
    path = write(tmp_path, "server: {log_level: DEBUG}\n")
    assert load_settings(path, environ={}).server.log_level == "debug"


def test_several_errors_stay_on_one_line(tmp_path):
    # one error per section (a section stops at its first bad field), every section told
    path = write(tmp_path, "server: {port: 0}\nscheduling: {first_chunk_ms: 0}\n")
    message = error_of(path)
    assert "server.port" in message and "scheduling.first_chunk_ms" in message


# --- file problems -----------------------------------------------------------------------


def test_missing_file(tmp_path):
    path = tmp_path / "nope.yaml"
    assert error_of(path) == f"{path}: no such file"


def test_yaml_syntax_error_names_line(tmp_path):
    path = write(tmp_path, "server:\n  port: 8000\n  host: [unclosed\n")
    message = error_of(path)
    assert message.startswith(f"{path}: invalid YAML at line ")


def test_duplicate_key_is_an_error(tmp_path):
    path = write(tmp_path, "server:\n  port: 8000\n  port: 8001\n")
    message = error_of(path)
    assert message.startswith(f"{path}: invalid YAML at line 3")
    assert "duplicate key 'port'" in message


@pytest.mark.parametrize("text", ["- server\n", "42\n", "just text\n"])
def test_top_level_must_be_a_mapping(tmp_path, text):
    path = write(tmp_path, text)
    assert error_of(path).startswith(f"{path}: the top level must be a mapping")


def test_section_must_be_a_mapping(tmp_path):
    path = write(tmp_path, "talker: 3\n")
    assert error_of(path).startswith(f"{path}: talker: expected a mapping")


def test_unknown_section_in_file(tmp_path):
    path = write(tmp_path, "sever:\n  port: 1\n")
    message = error_of(path)
    assert message.startswith(f"{path}: unknown section 'sever'")
    assert "server" in message


def test_encoding_and_body_limit_from_a_file(tmp_path):
    path = write(
        tmp_path,
        "server: {max_input_chars: 100, max_request_bytes: 2048}\n"
        "encoding: {mp3_bitrate_bps: 128000, ogg_page_ms: 1000, resample_quality: VHQ,\n"
        "           inline_encode_max_s: 0}\n",
    )
    settings = load_settings(path, environ={})
    assert settings.server.max_request_bytes == 2048
    assert settings.encoding == EncodingConfig(
        mp3_bitrate_bps=128000, ogg_page_ms=1000, resample_quality="VHQ", inline_encode_max_s=0
    )


def test_resample_quality_error_lists_the_choices(tmp_path):
    path = write(tmp_path, "encoding: {resample_quality: hq}\n")
    message = error_of(path)
    assert message.startswith(f"{path}: encoding.resample_quality: ")
    assert "QQ, LQ, MQ, HQ, VHQ" in message and "'hq'" in message


@pytest.mark.parametrize(
    "section", ["server", "encoding", "talker", "scheduling", "chunking", "admission"]
)
def test_unknown_field_in_file(tmp_path, section):
    path = write(tmp_path, f"{section}:\n  bogus_ms: 1\n")
    assert error_of(path).startswith(f"{path}: {section}.bogus_ms: unknown field")


# an older config's fields that moved: the error says where each is now
MOVED = [
    ("talker.first_fragment_words", "6", "text.first_fragment_words"),
    ("talker.max_segment_chars", "300", "text.max_segment_chars"),
    ("talker.max_segment_phonemes", "400", "text.max_segment_phonemes"),
    ("talker.first_segment_chars", "80", "text.first_segment_chars"),
    ("talker.intra_op_threads", "2", "piper.talker_intra_op_threads"),
    ("vocoder.intra_op_threads", "2", "piper.vocoder_intra_op_threads"),
    ("vocoder.work_ahead_streams", "1", "alone.work_ahead (true or false)"),
    ("talker.prepare_ahead_streams", "1", "alone.prepare_next (true or false)"),
    ("talker.alone_urgent_slack_s", "0.5", "alone.urgent_slack_s"),
    ("chunking.even_tail", "false", "alone.even_tail"),
]


@pytest.mark.parametrize(("old", "value", "new"), MOVED)
def test_a_moved_field_names_its_new_place_in_file_environment_and_set(tmp_path, old, value, new):
    section, field = old.split(".")
    path = write(tmp_path, f"{section}:\n  {field}: {value}\n")
    assert error_of(path) == f"{path}: {old} moved to {new}"
    variable = f"PLAYHEAD_{section.upper()}__{field.upper()}"
    assert error_of(None, environ={variable: value}) == f"{variable}: {old} moved to {new}"
    assert error_of(None, [f"{old}={value}"]) == f"--set: {old} moved to {new}"
    # and at its new place it loads (a count that became a switch: as true)
    new_section, new_field = new.split(" ")[0].split(".")
    loaded = "true" if new.endswith("(true or false)") else value
    settings = load_settings(None, [f"{new_section}.{new_field}={loaded}"], environ={})
    assert getattr(getattr(settings, new_section), new_field) == yaml.safe_load(loaded)


@pytest.mark.parametrize(
    ("old", "instead"),
    [
        ("chunking.initial_chunk_frames", "chunking.ramp"),
        ("piper.solo_threads", "solo sessions"),
        ("chunking.solo_chunk_frames", "neutral"),
        ("chunking.solo_slack_s", "neutral"),
        ("engine.initial_capacity_audio_s_per_s", "calibration"),
    ],
)
def test_a_removed_field_says_so(tmp_path, old, instead):
    section, field = old.split(".")
    path = write(tmp_path, f"{section}:\n  {field}: 1\n")
    message = error_of(path)
    assert message.startswith(f"{path}: {old} was removed: ")
    assert instead in message


# --- environment and --set ---------------------------------------------------------------


def test_precedence_file_then_environment_then_set(tmp_path):
    path = write(
        tmp_path,
        "server: {port: 8001, host: 0.0.0.0}\nscheduling: {policy: edf, active_stream_window: 4}\n",
    )
    env = {"PLAYHEAD_SERVER__PORT": "8002", "PLAYHEAD_SCHEDULING__ACTIVE_STREAM_WINDOW": "2"}
    assert load_settings(path, environ={}).server.port == 8001
    from_env = load_settings(path, environ=env)
    assert from_env.server.port == 8002
    assert from_env.server.host == "0.0.0.0"  # the file's other fields stay
    assert from_env.scheduling.active_stream_window == 2
    assert from_env.scheduling.policy == "edf"
    from_set = load_settings(path, ["server.port=8003"], env)
    assert from_set.server.port == 8003
    assert from_set.scheduling.active_stream_window == 2
    last = load_settings(path, ["server.port=8003", "server.port=8004"], env)
    assert last.server.port == 8004


def test_options_win_over_set():
    settings = load_settings(
        None, ["server.port=8003"], {}, options=[("--port", "server.port", 9000)]
    )
    assert settings.server.port == 9000


def test_environment_policy_override(tmp_path):
    path = write(tmp_path, "scheduling: {policy: edf, active_stream_window: 4}\n")
    settings = load_settings(path, environ={"PLAYHEAD_SCHEDULING__POLICY": "fifo"})
    assert settings.scheduling.policy == "fifo"


def test_override_values_are_read_as_yaml():
    settings = load_settings(
        None,
        [
            "chunking.ramp=[8,16,32]",
            "admission.enabled=false",
            "scheduling.first_chunk_ms=80",
            "server.api_key=null",
            "server.model_ids=[a, b]",
            "piper.model_path=/voices/x.onnx",
        ],
        {"PLAYHEAD_SERVER__API_KEY": "secret"},
    )
    assert settings.chunking.ramp == (8, 16, 32)
    assert settings.admission.enabled is False
    assert settings.scheduling.first_chunk_ms == 80.0
    assert settings.server.api_key is None
    assert settings.server.model_ids == ("a", "b")
    assert settings.piper.model_path == "/voices/x.onnx"


def test_encoding_and_body_limit_from_set_and_environment():
    settings = load_settings(
        None,
        [
            "encoding.opus_bitrate_bps=24000",
            "encoding.ogg_page_ms=60",
            "server.max_request_bytes=100000",
        ],
        {
            "PLAYHEAD_ENCODING__RESAMPLE_QUALITY": "MQ",
            "PLAYHEAD_ENCODING__AAC_BITRATE_BPS": "96000",
        },
    )
    assert settings.encoding == EncodingConfig(
        opus_bitrate_bps=24000, ogg_page_ms=60, aac_bitrate_bps=96000, resample_quality="MQ"
    )
    assert settings.server.max_request_bytes == 100000


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        ("encoding.mp3_bitrate_bps=1000000", "--set: encoding.mp3_bitrate_bps: "),
        ("encoding.ogg_page_ms=0", "--set: encoding.ogg_page_ms: "),
        ("encoding.resample_quality=", "--set: encoding.resample_quality: "),
        ("encoding.inline_encode_max_s=true", "--set: encoding.inline_encode_max_s: "),
        ("encoding.bitrate=64000", "--set: encoding.bitrate: unknown field"),
        ("server.max_request_bytes=100", "--set: server.max_request_bytes: "),
    ],
)
def test_bad_encoding_and_body_limit_set_items(item, expected):
    assert error_of(None, [item]).startswith(expected)


def test_text_fields_take_the_override_verbatim():
    settings = load_settings(None, ["server.host=::1"], {"PLAYHEAD_SERVER__API_KEY": "123456"})
    assert settings.server.host == "::1"
    assert settings.server.api_key == "123456"
    assert load_settings(None, ["server.api_key="], {}).server.api_key is None


def test_variables_without_a_field_form_are_ignored():
    env = {"PLAYHEAD_CONFIG": "/nowhere.yaml", "PLAYHEAD": "x", "OTHER__THING": "y"}
    assert load_settings(None, environ=env) == Settings()


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("PLAYHEAD_SEVER__PORT", "PLAYHEAD_SEVER__PORT: unknown section 'sever'"),
        ("PLAYHEAD_SERVER__PROT", "PLAYHEAD_SERVER__PROT: server.prot: unknown field"),
        (
            "PLAYHEAD_CHUNKING__RAMP__X",
            "PLAYHEAD_CHUNKING__RAMP__X: chunking.ramp__x: unknown field",
        ),
    ],
)
def test_unknown_environment_section_or_field(name, expected):
    assert error_of(None, environ={name: "1"}).startswith(expected)


def test_bad_environment_value_names_the_variable():
    message = error_of(None, environ={"PLAYHEAD_SERVER__PORT": "0"})
    assert message.startswith("PLAYHEAD_SERVER__PORT: server.port: ")


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        ("server.port", "--set: expected section.field=value, got 'server.port'"),
        ("port=1", "--set: expected section.field=value, got 'port=1'"),
        ("sever.port=1", "--set: unknown section 'sever'"),
        ("server.prot=1", "--set: server.prot: unknown field"),
        ("scheduling.policy=rr", "--set: scheduling.policy: "),
        ("chunking.ramp=[8, 0]", "--set: chunking."),
        ("server.port=[1", "--set: server.port: "),
    ],
)
def test_bad_set_items(item, expected):
    assert error_of(None, [item]).startswith(expected)


def test_errors_blame_the_layer_that_set_the_field(tmp_path):
    path = write(tmp_path, "scheduling: {policy: edf, active_stream_window: 4}\n")
    message = error_of(path, ["scheduling.active_stream_window=0"])
    assert message.startswith("--set: scheduling.active_stream_window: ")
    message = error_of(path, environ={"PLAYHEAD_SCHEDULING__ACTIVE_STREAM_WINDOW": "0"})
    assert message.startswith("PLAYHEAD_SCHEDULING__ACTIVE_STREAM_WINDOW: scheduling.")
    message = error_of(None, options=[("--port", "server.port", 0)])
    assert message.startswith("--port: server.port: ")
