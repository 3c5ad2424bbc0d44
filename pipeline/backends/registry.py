"""The backend registry: every kind of backend, the configuration class of its YAML section,
and how to build it.

One `BackendEntry` per kind. `backend.kind` in the settings names an entry; the entry's
`kind` is also the name of the top-level YAML section its `config` class reads (`piper:`),
which app/settings.py adds to the settings for every entry registered when it is first
imported. `build_backend` looks the kind up and calls the entry's factory, which is where
the heavy imports (ONNX Runtime, torch) happen: registering a backend imports nothing but
its configuration class.

The built-in backends are registered in pipeline/backends/__init__.py; another one is a
`register(BackendEntry(...))` call made before the settings are loaded (tests register
theirs at run time and build them through `build_backend`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scheduling.errors import ConfigError

if TYPE_CHECKING:
    from pipeline.backend import Backend
    from pipeline.config import TalkerConfig, VocoderConfig

# a YAML section name that PLAYHEAD_<SECTION>__<FIELD> can spell: lower case, single "_"
_KIND = re.compile(r"[a-z][a-z0-9]*(_[a-z0-9]+)*")


@dataclass(frozen=True)
class BackendContext:
    """The engine's sections a backend may read to size itself (no built-in backend reads
    them: Piper's ONNX Runtime threads are its own section's), and the other backends'
    sections (kind -> config), for a backend made of others (multi)."""

    talker: TalkerConfig
    vocoder: VocoderConfig
    sections: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True)
class BackendEntry:
    """One kind of backend."""

    kind: str  # the value of backend.kind, and the name of its config's YAML section
    # a frozen dataclass whose fields are the section's settings, each with a default; it
    # validates itself (ConfigError naming the field) and imports no model runtime
    config: type
    # builds a ready backend from its section and the engine's (imports the heavy parts)
    factory: Callable[[Any, BackendContext], Backend]
    # why it cannot be built on this machine (a missing extra), asked without importing
    # it; None: nothing to ask
    unavailable: Callable[[], str | None] | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.kind, str) and _KIND.fullmatch(self.kind)):
            raise ValueError(
                f"a backend kind is lower case letters and digits joined by single "
                f"underscores, got {self.kind!r}"
            )
        if not (isinstance(self.config, type) and dataclasses.is_dataclass(self.config)):
            raise TypeError(f"backend {self.kind}: config must be a dataclass class")
        if not callable(self.factory):
            raise TypeError(f"backend {self.kind}: factory must be callable")


_ENTRIES: dict[str, BackendEntry] = {}


def register(entry: BackendEntry) -> BackendEntry:
    """Add a kind of backend; a kind registered twice is an error."""
    if entry.kind in _ENTRIES:
        raise ValueError(f"backend kind {entry.kind!r} is already registered")
    _ENTRIES[entry.kind] = entry
    return entry


def unregister(kind: str) -> None:
    """Remove a kind (tests that registered one); an unknown kind is an error."""
    if _ENTRIES.pop(kind, None) is None:
        raise KeyError(f"backend kind {kind!r} is not registered")


@dataclass(frozen=True)
class BackendConfig:
    """The `backend` section: which registered kind serves (here, beside the registry it
    checks, so that pipeline/config.py, whose classes the backends import, imports no
    backend)."""

    # a registered kind (pipeline/backends/__init__.py: piper, the real voice; sim; codec_lm)
    kind: str = "multi"  # configs/default.yaml: piper and kokoro (multi.kinds)

    def __post_init__(self) -> None:
        backend_entry(self.kind)  # ConfigError listing the registered kinds


def backend_entries() -> tuple[BackendEntry, ...]:
    """Every registered kind, in the order registered."""
    return tuple(_ENTRIES.values())


def backend_kinds() -> tuple[str, ...]:
    return tuple(_ENTRIES)


def backend_entry(kind: object) -> BackendEntry:
    """The entry of `kind`; ConfigError listing the registered kinds otherwise."""
    entry = _ENTRIES.get(kind) if isinstance(kind, str) else None
    if entry is None:
        raise ConfigError(f"kind must be one of {', '.join(_ENTRIES)}, got {kind!r}")
    return entry
