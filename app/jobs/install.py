"""Installs jobs into an app: the routes and the runner.

`install(app, state)` adds the routes and the runner (a Service of the AppState: opened
with the app, closed before the engine stops).
"""

from __future__ import annotations

import os
from pathlib import Path

from fastapi import FastAPI

from app.jobs.config import JobsConfig
from app.jobs.metrics import JobMetrics
from app.jobs.routes import jobs_router
from app.jobs.runner import JobRunner
from app.state import AppState

__all__ = ["install", "jobs_dir"]


def jobs_dir(config: JobsConfig) -> Path:
    """`jobs.dir`, or `$XDG_DATA_HOME/playhead/jobs` (~/.local/share/playhead/jobs)."""
    if config.dir is not None:
        return Path(config.dir).expanduser()
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home) / "playhead" / "jobs"


def install(app: FastAPI, state: AppState) -> JobRunner:
    config: JobsConfig = state.settings.jobs  # type: ignore[attr-defined]
    runner = JobRunner(
        config,
        jobs_dir(config),
        engine=lambda: state.ready_engine,
        wait_loaded=state.wait_loaded,
        normalize=state.settings.normalize,
        # the replicas of a cluster on one host share jobs.dir: leases say who renders what
        shared=state.settings.cluster.replicas > 0,
        metrics=JobMetrics(state.metrics.registry),
    )
    state.services.append(runner)
    app.include_router(jobs_router)
    return runner
