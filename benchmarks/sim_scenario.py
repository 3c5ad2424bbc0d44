"""The simulator's scenarios and results (benchmarks/simulate.py runs them): what a run is
asked (`Scenario`: arrivals, replicas, router, settings and the sim backend's costs, the
defaults of `make sim`), the texts it speaks with the audio the sim backend makes of them,
and what it answers (`SimResult`, one table row)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.player import (
    StreamRecord,
    Summary,
    stall_ratio_bound,
)
from benchmarks.sim_replica import EngineSetup
from pipeline.backends.sim import expected_frames, vocoder_cost_s
from pipeline.config import EngineConfig, SimConfig, TalkerConfig, TextConfig
from scheduling import AdmissionConfig, ChunkingConfig, SchedulingConfig

ROUTERS = ("random", "least-loaded", "slack")
# In virtual time the stages cost exactly what the capacity model reads: the whole reading
# may be committed (configs/sim.yaml does the same; the voice keeps a margin).
VIRTUAL_HEADROOM = 1.0
RESULTS_DIR = Path(__file__).with_name("results")

# A replica: K = 16 chunks of 640 ms per batched call of 4 + 128 * 1.22 = 160 ms, so C = 64
# streams; the base cost is small, so that a window costs little throughput and policies
# compare at equal capacity (unbounded batches: 65.6). The first chunk (320 ms) covers a
# full turn. The talker is configs/sim.yaml's: 16 segments a step, 8 frames each, for
# 1 + 0.2 ms per segment (never the bottleneck).
DEFAULT_SIM = SimConfig(
    talker_frames_per_step=8,
    talker_step_base_ms=1.0,
    talker_step_per_stream_ms=0.2,
    vocoder_base_ms=4.0,
    vocoder_per_frame_ms=1.21875,
)
# busy_max_queued_s 0: the simulated stages do not share cores, so no talker pacing
DEFAULT_TALKER = TalkerConfig(batch=16, busy_max_queued_s=0)
DEFAULT_TEXT = TextConfig(first_fragment_words=6, first_segment_chars=80)
DEFAULT_CHUNKING = ChunkingConfig(chunk_frames=8, ramp=(4,))
DEFAULT_WINDOW = 16


@dataclass(frozen=True)
class Scenario:
    label: str
    streams: int  # measured requests
    clients: int = 0  # closed loop: concurrent clients over all replicas (0: Poisson)
    rate_per_s: float = 0.0  # Poisson arrivals per second (with clients = 0)
    replicas: int = 1
    router: str = "least-loaded"
    scheduling: SchedulingConfig = field(
        default_factory=lambda: SchedulingConfig(policy="edf", active_stream_window=DEFAULT_WINDOW)
    )
    chunking: ChunkingConfig = DEFAULT_CHUNKING
    admission: AdmissionConfig = field(default_factory=lambda: AdmissionConfig(enabled=False))
    sim: SimConfig = DEFAULT_SIM
    talker: TalkerConfig = DEFAULT_TALKER
    text: TextConfig = DEFAULT_TEXT
    engine: EngineConfig = field(default_factory=EngineConfig)
    warmup_s: float = 20.0  # requests before this (virtual) time are not measured
    report_interval_s: float = 0.5  # slack router: how often replicas report
    give_up_after_s: float = 60.0  # a closed-loop client rejected this long takes a new text
    after_playback: bool = True  # closed loop: next request when played (else at last byte)
    hangup_share: float = 0.0  # share of accepted streams whose client leaves mid-stream
    seed: int = 0

    def __post_init__(self) -> None:
        if self.router not in ROUTERS:
            raise ValueError(f"router must be one of {', '.join(ROUTERS)}, got {self.router!r}")
        if (self.clients > 0) == (self.rate_per_s > 0):
            raise ValueError("give clients (closed loop) or rate_per_s (Poisson), not both")
        if self.streams < 1 or self.replicas < 1:
            raise ValueError("streams and replicas must be >= 1")
        if not 0.0 <= self.hangup_share <= 1.0:
            raise ValueError(f"hangup_share must be in [0, 1], got {self.hangup_share!r}")

    @property
    def setup(self) -> EngineSetup:
        return EngineSetup(
            scheduling=self.scheduling,
            chunking=self.chunking,
            admission=self.admission,
            talker=self.talker,
            sim=self.sim,
            engine=self.engine,
            text=self.text,
        )


def replica_capacity(
    window: int = DEFAULT_WINDOW,
    chunking: ChunkingConfig = DEFAULT_CHUNKING,
    sim: SimConfig = DEFAULT_SIM,
) -> float:
    """Audio seconds per second of back-to-back vocoder turns of `window` steady chunks."""
    new = chunking.chunk_frames
    decoded = new + chunking.left_context_frames + chunking.right_context_frames
    batch = max(1, window)
    frame_s = sim.samples_per_frame / sim.sample_rate_hz
    return batch * new * frame_s / vocoder_cost_s(sim, batch * decoded, batch)


@dataclass(frozen=True)
class SimText:
    text: str
    chars: int
    audio_s: float  # what the sim backend makes of it


def prepare_texts(texts: Sequence[str], options: TextConfig, sim: SimConfig) -> list[SimText]:
    frame_s = sim.samples_per_frame / sim.sample_rate_hz
    return [SimText(t, len(t), expected_frames(t, options=options) * frame_s) for t in texts]


def mean_audio_s(texts: Sequence[SimText]) -> float:
    return sum(t.audio_s for t in texts) / len(texts)


@dataclass(frozen=True)
class SimResult:
    scenario: Scenario
    summary: Summary
    capacity_audio_s_per_s: float  # C over all replicas (cost model)
    load_streams: float  # N (closed loop) or offered audio s per s (Poisson)
    virtual_s: float
    wall_s: float
    events: int
    hangups: int = 0  # measured streams whose client left mid-stream
    talker_steps: int = 0
    vocoder_turns: int = 0
    records: tuple[StreamRecord, ...] = ()

    def row(self) -> dict[str, object]:
        s = self.summary
        sc = self.scenario
        return {
            "label": sc.label,
            "policy": sc.scheduling.policy,
            "window": sc.scheduling.active_stream_window,
            "admission": sc.admission.enabled,
            "arrival": "closed" if sc.clients else "poisson",
            "replicas": sc.replicas,
            "router": sc.router,
            "streams": self.load_streams,
            "requests": sc.streams,
            "capacity_audio_s_per_s": self.capacity_audio_s_per_s,
            "streams_per_capacity": self.load_streams / self.capacity_audio_s_per_s,
            "stall_ratio": s.stall_ratio,
            "stall_ratio_bound": stall_ratio_bound(self.load_streams, self.capacity_audio_s_per_s),
            "stall_free_share": s.stall_free_share,
            "listening_mean": s.listening_mean,
            "stall_ratio_bound_listening": stall_ratio_bound(
                s.listening_mean, self.capacity_audio_s_per_s
            ),
            "interruptions": s.interruptions,
            "stalls_per_stream": s.stalls_per_stream,
            "ttfa_p50_ms": s.ttfa_p50_ms,
            "ttfa_p95_ms": s.ttfa_p95_ms,
            "ttfa_p99_ms": s.ttfa_p99_ms,
            "rejected": s.rejected,
            "streams_ok": s.streams_ok,
            "hangups": self.hangups,
            "xrt": s.xrt,
            "goodput_streams_per_s": s.goodput_streams_per_s,
            "rtf_p50": s.rtf_p50,
            "virtual_s": self.virtual_s,
            "sim_wall_s": self.wall_s,
            "events": self.events,
            "talker_steps": self.talker_steps,
            "vocoder_turns": self.vocoder_turns,
        }
