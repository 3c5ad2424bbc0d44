"""Validation of the scheduling/ config dataclasses: ConfigError names the field."""

from __future__ import annotations

import dataclasses
import logging
import math

import numpy as np
import pytest

import scheduling
from scheduling import (
    AdmissionConfig,
    ChunkingConfig,
    ConfigError,
    SchedulingConfig,
    warn_if_first_chunk_too_short,
)

REQUIRED = {
    "ConfigError",
    "SchedulingConfig",
    "PlaybackScheduler",
    "ChunkingConfig",
    "ChunkPlanner",
    "Chunk",
    "AdmissionConfig",
    "Admission",
    "Decision",
}


def test_public_names():
    assert set(scheduling.__all__) >= REQUIRED
    for name in scheduling.__all__:
        assert hasattr(scheduling, name)
    assert issubclass(ConfigError, ValueError)


def test_defaults_are_valid():
    config = SchedulingConfig()
    assert (config.first_chunk_ms, config.safety_margin_ms) == (100.0, 50.0)
    AdmissionConfig()
    ChunkingConfig(chunk_frames=1)


def test_configs_are_frozen():
    for config in (SchedulingConfig(), ChunkingConfig(4), AdmissionConfig()):
        field = dataclasses.fields(config)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(config, field, None)


# --- SchedulingConfig ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"policy": "lifo"}, "policy"),
        ({"policy": "EDF"}, "policy"),
        ({"policy": None}, "policy"),
        ({"policy": "fifo", "active_stream_window": -1}, "active_stream_window"),
        ({"policy": "fifo", "active_stream_window": 1.5}, "active_stream_window"),
        ({"policy": "fifo", "active_stream_window": True}, "active_stream_window"),
        ({"policy": "fifo", "active_stream_window": "4"}, "active_stream_window"),
        ({"policy": "edf", "active_stream_window": -2}, "active_stream_window"),
        ({"first_chunk_ms": 0}, "first_chunk_ms"),
        ({"first_chunk_ms": -5.0}, "first_chunk_ms"),
        ({"first_chunk_ms": math.nan}, "first_chunk_ms"),
        ({"first_chunk_ms": math.inf}, "first_chunk_ms"),
        ({"first_chunk_ms": "100"}, "first_chunk_ms"),
        ({"safety_margin_ms": -0.1}, "safety_margin_ms"),
        ({"safety_margin_ms": math.nan}, "safety_margin_ms"),
        ({"safety_margin_ms": math.inf}, "safety_margin_ms"),
        ({"safety_margin_ms": None}, "safety_margin_ms"),
    ],
)
def test_scheduling_config_rejects(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        SchedulingConfig(**kwargs)


def test_edf_requires_a_window():
    with pytest.raises(ConfigError, match="edf requires active_stream_window > 0"):
        SchedulingConfig(policy="edf", active_stream_window=0)


def test_scheduling_config_accepts_edges():
    assert SchedulingConfig(policy="fifo", active_stream_window=0).active_stream_window == 0
    assert SchedulingConfig(policy="edf", active_stream_window=1, safety_margin_ms=0)
    assert SchedulingConfig(first_chunk_ms=1e-3, active_stream_window=np.int64(3))


# --- ChunkingConfig -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"chunk_frames": 0}, "chunk_frames"),
        ({"chunk_frames": -3}, "chunk_frames"),
        ({"chunk_frames": 2.5}, "chunk_frames"),
        ({"chunk_frames": True}, "chunk_frames"),
        ({"chunk_frames": None}, "chunk_frames"),
        ({"chunk_frames": 4, "ramp": [0]}, r"ramp\[0\]"),
        ({"chunk_frames": 4, "ramp": (2, -1)}, r"ramp\[1\]"),
        ({"chunk_frames": 4, "ramp": [2, 1.5]}, r"ramp\[1\]"),
        ({"chunk_frames": 4, "ramp": "24"}, "ramp"),
        ({"chunk_frames": 4, "ramp": 3}, "ramp"),
        ({"chunk_frames": 4, "ramp": None}, "ramp"),
        ({"chunk_frames": 4, "left_context_frames": -1}, "left_context_frames"),
        ({"chunk_frames": 4, "left_context_frames": 0.5}, "left_context_frames"),
        ({"chunk_frames": 4, "right_context_frames": -1}, "right_context_frames"),
        ({"chunk_frames": 4, "right_context_frames": False}, "right_context_frames"),
    ],
)
def test_chunking_config_rejects(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        ChunkingConfig(**kwargs)


def test_chunking_config_stores_ramp_as_plain_int_tuple():
    config = ChunkingConfig(chunk_frames=8, ramp=[np.int64(2), 4])
    assert config.ramp == (2, 4)
    assert all(type(size) is int for size in config.ramp)
    assert ChunkingConfig(chunk_frames=8, ramp=(1,)).ramp == (1,)
    hash(config)  # frozen and hashable, list input notwithstanding


# --- AdmissionConfig ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_streams": -1}, "max_streams"),
        ({"max_streams": 2.0}, "max_streams"),
        ({"max_streams": True}, "max_streams"),
        ({"capacity_headroom": 0.0}, "capacity_headroom"),
        ({"capacity_headroom": -0.5}, "capacity_headroom"),
        ({"capacity_headroom": 1.01}, "capacity_headroom"),
        ({"capacity_headroom": math.nan}, "capacity_headroom"),
        ({"capacity_headroom": math.inf}, "capacity_headroom"),
        ({"capacity_headroom": True}, "capacity_headroom"),
        ({"enabled": 1}, "enabled"),
        ({"enabled": "yes"}, "enabled"),
        ({"queue_max_wait_s": -0.5}, "queue_max_wait_s"),
        ({"queue_max_wait_s": math.nan}, "queue_max_wait_s"),
        ({"start_cost": -1.0}, "start_cost"),
    ],
)
def test_admission_config_rejects(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        AdmissionConfig(**kwargs)


def test_admission_config_accepts_edges():
    assert AdmissionConfig(max_streams=0, capacity_headroom=1.0, enabled=False)
    assert AdmissionConfig(capacity_headroom=1e-6, queue_max_wait_s=0.0, start_cost=0.0)


# --- the first-chunk warning --------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "chunking", "warns"),
    [
        ("edf", ChunkingConfig(chunk_frames=3), True),
        ("edf", ChunkingConfig(chunk_frames=4), False),
        ("edf", ChunkingConfig(chunk_frames=3, ramp=(1, 2)), False),  # a ramp is deliberate
        ("fifo", ChunkingConfig(chunk_frames=2), False),
    ],
)
def test_first_chunk_warning(policy, chunking, warns, caplog):
    window = 0 if policy == "fifo" else 2
    scheduling_config = SchedulingConfig(policy=policy, active_stream_window=window)
    with caplog.at_level(logging.WARNING, logger="scheduling"):
        assert warn_if_first_chunk_too_short(scheduling_config, chunking) is warns
    warned = [r for r in caplog.records if "first buffer is too short" in r.getMessage()]
    assert len(warned) == (1 if warns else 0)


def test_first_chunk_warning_goes_to_the_given_logger(caplog):
    logger = logging.getLogger("playhead.test.engine")
    with caplog.at_level(logging.WARNING, logger="playhead.test.engine"):
        warn_if_first_chunk_too_short(SchedulingConfig(), ChunkingConfig(chunk_frames=1), logger)
    assert [r.name for r in caplog.records] == ["playhead.test.engine"]
