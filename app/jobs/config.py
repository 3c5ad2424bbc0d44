"""The `jobs:` section of the settings: where jobs live and what they may take (docs/jobs.md)."""

from __future__ import annotations

from dataclasses import dataclass

from scheduling.validation import check_int, check_int_in, check_number_in, check_text

MIB = 1024 * 1024


@dataclass(frozen=True)
class JobsConfig:
    # The jobs' SQLite database and audio files; null: ~/.local/share/playhead/jobs.
    dir: str | None = None
    # Longest text of one job, in characters (an uploaded file: after decoding as UTF-8).
    max_text_chars: int = 2_000_000
    # Largest POST /v1/audio/jobs body (JSON or upload); larger: 413 before it is read.
    max_request_bytes: int = 16 * MIB
    # Jobs one API key may hold at once (every state; DELETE frees one).
    jobs_per_key: int = 100
    # The jobs' audio on disk, all together; past it new jobs get 507 and a rendering one
    # fails with a clear error.
    max_disk_gb: float = 20.0
    # Finished (done, failed) jobs and their audio are deleted this many days after they end.
    keep_days: float = 7.0
    # A job's text is rendered and made durable in segments of about this many characters
    # (whole sentences; a heading always starts one): a crash loses at most one.
    segment_chars: int = 600

    def __post_init__(self) -> None:
        check_text("dir", self.dir, optional=True)
        check_int("max_text_chars", self.max_text_chars, 1)
        check_int_in("max_request_bytes", self.max_request_bytes, (1024, 256 * MIB))
        check_int("jobs_per_key", self.jobs_per_key, 1)
        check_number_in("max_disk_gb", self.max_disk_gb, (0.001, 1e6), "GB")
        check_number_in("keep_days", self.keep_days, (0.0, 36500.0), "days")
        check_int_in("segment_chars", self.segment_chars, (50, 100_000))
