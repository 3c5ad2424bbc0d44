"""Playhead's shipped settings files, installed with the package.

- default.yaml: the measured default deployment (the bundled Piper voice on the CPU); it
  writes out every knob with the code's own default, and `playhead serve` without
  `--config` (or PLAYHEAD_CONFIG) runs it from any working directory;
- sim.yaml: the sim backend with set costs, for benchmarks and the simulator.

They are package data: read them through `packaged_config`, not through a path relative to
the working directory.
"""

from __future__ import annotations

from importlib import resources
from importlib.resources.abc import Traversable

DEFAULT_CONFIG_NAME = "default.yaml"
SIM_CONFIG_NAME = "sim.yaml"


def packaged_config(name: str = DEFAULT_CONFIG_NAME) -> Traversable:
    """A shipped settings file (readable with `.read_text()`), wherever the package is."""
    config = resources.files(__name__).joinpath(name)
    if not config.is_file():
        raise FileNotFoundError(f"no packaged config {name!r}")
    return config
