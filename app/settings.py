"""Typed settings: a YAML file, then PLAYHEAD_<SECTION>__<FIELD> variables, then --set.

Every section is optional; a knob set nowhere keeps its default (the dataclass's own, except
`chunking`, whose `chunk_frames` has none: it defaults to the Piper chunking of
configs/default.yaml). Later layers replace single fields, not whole sections. Values from
the environment and from `--set` are read as YAML scalars or flow collections
(`ramp=[8,16,32]`, `enabled=false`, `api_key=null`), except that a field typed `str` takes
the text as it is (only an empty value or `null`/`~` means None), so `api_key=123456` stays
a string.

Every problem raises SettingsError with one line naming the source (the file, the
variable, `--set` or the flag) and the dotted field. A field that moved to another section
(`MOVED_FIELDS`) or was removed (`REMOVED_FIELDS`) is named as such, with its new place or
what replaced it, rather than as an unknown field.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from app.cluster.config import ClusterConfig
from app.encoding_config import EncodingConfig
from app.jobs.config import JobsConfig
from app.settings_moves import MOVED_FIELDS, REMOVED_FIELDS
from app.ws.config import WebSocketConfig
from app.wyoming.config import WyomingConfig
from pipeline.backends import BackendConfig, backend_entries, backend_entry
from pipeline.config import (
    AloneConfig,
    EngineConfig,
    NormalizeConfig,
    TalkerConfig,
    TextConfig,
    VocoderConfig,
)
from scheduling import AdmissionConfig, ChunkingConfig, ConfigError, SchedulingConfig
from scheduling.validation import (
    check_bool,
    check_choice,
    check_int,
    check_int_in,
    check_names,
    check_number_in,
    check_text,
)

ENV_PREFIX = "PLAYHEAD_"
OPENAI_MODEL_IDS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")
# A JSON body can spell each input character as a 6-byte \uXXXX escape.
JSON_BYTES_PER_CHAR = 6
MAX_REQUEST_BYTES_LIMIT = 16 * 1024 * 1024  # a request body is held in memory while parsed

# The Piper chunking of configs/default.yaml (frames of 256 / 22050 Hz = 11.6 ms).
DEFAULT_CHUNKING = ChunkingConfig(
    chunk_frames=64,
    ramp=(8, 16, 32),
    left_context_frames=8,
    right_context_frames=8,
)
# The Piper scheduling of configs/default.yaml: a safety margin above the ramp's first
# chunk (93 ms), so that a player that has just started is protected at once and its
# second chunk is never passed over for newcomers' first chunks (docs/admission.md).
DEFAULT_SCHEDULING = SchedulingConfig(safety_margin_ms=100.0)


class SettingsError(ValueError):
    """The settings are invalid; the message is one line naming the source and the field."""


LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
# Routes that `server.public_routes` may open without the API key: /metrics, /openapi.json,
# and the page at / (with its /static/ files).
PUBLIC_ROUTES = ("metrics", "openapi", "page")


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    # When set, every request needs `Authorization: Bearer <api_key>`.
    api_key: str | None = None
    default_sample_rate_hz: int = 24000
    max_input_chars: int = 4096
    # Larger request bodies get a 413 before they are read (Content-Length) or once the
    # limit is passed (chunked).
    max_request_bytes: int = 65536
    log_level: str = "info"  # one of LOG_LEVELS, any case
    # Playhead's own model ids; OPENAI_MODEL_IDS are accepted on top of these.
    model_ids: tuple[str, ...] = ("playhead", "playhead-piper")
    # Serve the OpenAPI schema at /openapi.json (no /docs or /redoc pages: their assets
    # would come from a CDN).
    openapi: bool = False
    # With an api_key set, these stay open without it (besides /health and /ready, always
    # open): any of PUBLIC_ROUTES.
    public_routes: tuple[str, ...] = ()
    # Origins allowed to call the API from a browser (CORS); empty: no CORS headers at all.
    cors_origins: tuple[str, ...] = ()
    # On SIGTERM: refuse new requests (503), let streams in flight finish for this long,
    # then cancel the rest.
    shutdown_grace_s: float = 10.0
    # Once the model is loaded, move every object alive then (the imported libraries, the
    # model, the app) out of the garbage collector's reach (gc.freeze), until shutdown: a
    # full collection, which pauses the event loop and so every stream, then walks only
    # the objects made since (the streams') instead of the whole startup heap too.
    freeze_heap_after_load: bool = True

    def __post_init__(self) -> None:
        check_text("host", self.host)
        check_int_in("port", self.port, (1, 65535))
        check_text("api_key", self.api_key, optional=True)
        check_int_in("default_sample_rate_hz", self.default_sample_rate_hz, (8000, 48000), "Hz")
        check_int("max_input_chars", self.max_input_chars, 1)
        check_int_in("max_request_bytes", self.max_request_bytes, (1024, MAX_REQUEST_BYTES_LIMIT))
        level = self.log_level.lower() if isinstance(self.log_level, str) else self.log_level
        check_choice("log_level", level, LOG_LEVELS)
        object.__setattr__(self, "log_level", level)
        object.__setattr__(self, "model_ids", check_names("model_ids", self.model_ids))
        check_bool("openapi", self.openapi)
        public = self.public_routes
        public = tuple(public) if isinstance(public, list | tuple) else None
        if public is None or not all(name in PUBLIC_ROUTES for name in public):
            raise ConfigError(
                f"public_routes must be a list of {', '.join(PUBLIC_ROUTES)}, "
                f"got {self.public_routes!r}"
            )
        object.__setattr__(self, "public_routes", public)
        origins = self.cors_origins
        origins = tuple(origins) if isinstance(origins, list | tuple) else None
        if origins is None or not all(
            isinstance(o, str) and (o == "*" or re.fullmatch(r"https?://[^/\s]+", o))
            for o in origins
        ):
            raise ConfigError(
                'cors_origins must be a list of origins like https://example.com (or "*"), '
                f"got {self.cors_origins!r}"
            )
        object.__setattr__(self, "cors_origins", origins)
        check_number_in("shutdown_grace_s", self.shutdown_grace_s, (0.0, 3600.0))
        check_bool("freeze_heap_after_load", self.freeze_heap_after_load)
        needed = JSON_BYTES_PER_CHAR * self.max_input_chars
        if self.max_request_bytes < needed:
            raise ConfigError(
                f"max_request_bytes ({self.max_request_bytes}) must be at least "
                f"{JSON_BYTES_PER_CHAR} x max_input_chars = {needed}: a JSON body may spell "
                "each character as a \\uXXXX escape"
            )

    @property
    def accepted_model_ids(self) -> tuple[str, ...]:
        """Every model id the API accepts: Playhead's own, then OpenAI's."""
        own = self.model_ids
        return own + tuple(m for m in OPENAI_MODEL_IDS if m not in own)


class _SettingsBase(BaseModel):
    """What every Settings has beyond its sections."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    def backend_config(self) -> Any:
        """The section of the backend that serves (`backend.kind`): what `build_backend`
        reads."""
        return getattr(self, self.backend.kind)  # type: ignore[attr-defined]

    def backend_sections(self) -> dict[str, Any]:
        """Every registered backend kind's section (kind -> config): what a backend made
        of others (multi) builds its parts from."""
        fields = type(self).model_fields
        return {e.kind: getattr(self, e.kind) for e in backend_entries() if e.kind in fields}


def _section(cls: type, factory: Any = None) -> Any:
    return (cls, Field(default_factory=factory or cls))


def _backend_sections() -> dict[str, Any]:
    """A section per registered backend kind (pipeline/backends/registry.py), named after
    it and read by its configuration class."""
    return {entry.kind: _section(entry.config) for entry in backend_entries()}


_CORE_SECTIONS: dict[str, Any] = {
    "talker": _section(TalkerConfig),
    "text": _section(TextConfig),
    "normalize": _section(NormalizeConfig),
    "vocoder": _section(VocoderConfig),
    "alone": _section(AloneConfig),
    "engine": _section(EngineConfig),
    "scheduling": _section(SchedulingConfig, lambda: DEFAULT_SCHEDULING),
    "chunking": _section(ChunkingConfig, lambda: DEFAULT_CHUNKING),
    "admission": _section(AdmissionConfig),
    "websocket": _section(WebSocketConfig),
    "wyoming": _section(WyomingConfig),
    "cluster": _section(ClusterConfig),
    "jobs": _section(JobsConfig),
}
_FRONT_SECTIONS: dict[str, Any] = {
    "server": _section(ServerConfig),
    "encoding": _section(EncodingConfig),
    "backend": _section(BackendConfig),
}


def _settings_model() -> type[_SettingsBase]:
    backends = _backend_sections()
    clash = sorted(set(backends) & (set(_FRONT_SECTIONS) | set(_CORE_SECTIONS)))
    if clash:
        raise RuntimeError(f"backend kinds {clash} would replace sections of the same names")
    # in this order: the backends' sections right after `backend` (as in configs/)
    return create_model(  # type: ignore[no-any-return, call-overload]
        "Settings",
        __base__=_SettingsBase,
        __module__=__name__,
        __doc__="Every section of the settings: the server's, the engine's, and one per "
        "registered backend kind (its name, its configuration class).",
        **_FRONT_SECTIONS,
        **backends,
        **_CORE_SECTIONS,
    )


# the backends registered when this module is first imported have a section each
Settings = _settings_model()


SECTIONS: tuple[str, ...] = tuple(Settings.model_fields)


def _section_type(section: str) -> type:
    return Settings.model_fields[section].annotation  # type: ignore[return-value]


@functools.cache  # read-only: the sections' types never change
def _field_types(section: str) -> dict[str, Any]:
    cls = _section_type(section)
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def section_defaults(section: str) -> dict[str, Any]:
    """The code's default of every field of `section`, by name."""
    value = Settings.model_fields[section].get_default(call_default_factory=True)
    return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}


def _is_text_type(tp: Any) -> bool:
    if tp is str:
        return True
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return set(typing.get_args(tp)) == {str, type(None)}
    return False


_NULL_WORDS = ("", "~", "null", "Null", "NULL")


def _parse_value(raw: str, field_type: Any) -> Any:
    """Read an override's text: as YAML, or verbatim for a text field."""
    if _is_text_type(field_type):
        return None if raw.strip() in _NULL_WORDS else raw
    try:
        return yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        return raw  # not YAML: let the field's validation say what it expects


class _UniqueKeyLoader(yaml.SafeLoader):
    """A safe loader that refuses a key given twice in one mapping (PyYAML keeps the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)  # type: ignore[no-untyped-call]
            try:
                duplicate = key in seen
            except TypeError:
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _one_line(text: str) -> str:
    return " ".join(text.split())


class _Layers:
    """The explicitly set fields, each with the source that set it last."""

    def __init__(self) -> None:
        self.values: dict[str, dict[str, Any]] = {}
        self.origins: dict[tuple[str, str], str] = {}
        self.section_origins: dict[str, str] = {}

    def check_section(self, source: str, section: object) -> str:
        if not isinstance(section, str) or section not in SECTIONS:
            raise SettingsError(
                f"{source}: unknown section {section!r} (known: {', '.join(SECTIONS)})"
            )
        return section

    def check_field(self, source: str, section: str, field: object) -> str:
        known = _field_types(section)
        if isinstance(field, str) and field not in known:
            if (moved := MOVED_FIELDS.get((section, field))) is not None:
                raise SettingsError(f"{source}: {section}.{field} moved to {moved}")
            if (removed := REMOVED_FIELDS.get((section, field))) is not None:
                raise SettingsError(f"{source}: {section}.{field} was removed: {removed}")
        if not isinstance(field, str) or field not in known:
            raise SettingsError(
                f"{source}: {section}.{field}: unknown field (known: {', '.join(known)})"
            )
        return field

    def set(self, source: str, section: str, field: str, value: Any) -> None:
        if isinstance(value, bool) and _field_types(section)[field] in (int, float):
            # pydantic would read true as 1; the dataclasses refuse bools for numbers too
            raise SettingsError(f"{source}: {section}.{field}: expected a number, got {value!r}")
        self.values.setdefault(section, {})[field] = value
        self.origins[(section, field)] = source
        self.section_origins[section] = source

    def add_file(self, label: str, data: object) -> None:
        if data is None:
            return
        if not isinstance(data, dict):
            raise SettingsError(
                f"{label}: the top level must be a mapping of sections, got {type(data).__name__}"
            )
        for section, body in data.items():
            section = self.check_section(label, section)
            if body is None:
                continue
            if not isinstance(body, dict):
                raise SettingsError(
                    f"{label}: {section}: expected a mapping of fields, got {type(body).__name__}"
                )
            for field, value in body.items():
                self.set(label, section, self.check_field(label, section, field), value)

    def add_environ(self, environ: Mapping[str, str]) -> None:
        for name in sorted(environ):
            if not name.startswith(ENV_PREFIX) or "__" not in name[len(ENV_PREFIX) :]:
                continue  # e.g. PLAYHEAD_CONFIG: not a field override
            section_text, field_text = name[len(ENV_PREFIX) :].lower().split("__", 1)
            section = self.check_section(name, section_text)
            field = self.check_field(name, section, field_text)
            self.set(
                name, section, field, _parse_value(environ[name], _field_types(section)[field])
            )

    def add_override(self, source: str, item: str) -> None:
        key, sep, raw = item.partition("=")
        section_text, dot, field_text = key.strip().partition(".")
        if not sep or not dot:
            raise SettingsError(f"{source}: expected section.field=value, got {item!r}")
        section = self.check_section(source, section_text)
        field = self.check_field(source, section, field_text)
        self.set(source, section, field, _parse_value(raw, _field_types(section)[field]))

    def add_option(self, source: str, dotted: str, value: Any) -> None:
        section_text, _, field_text = dotted.partition(".")
        section = self.check_section(source, section_text)
        self.set(source, section, self.check_field(source, section, field_text), value)

    def merged(self) -> dict[str, dict[str, Any]]:
        return {
            section: {**section_defaults(section), **fields}
            for section, fields in self.values.items()
        }


def _read_yaml(path: Path | Traversable, label: str) -> object:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SettingsError(f"{label}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingsError(f"{label}: cannot read: {_one_line(str(exc))}") from None
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SettingsError(
            f"{label}: invalid YAML{where}: {_one_line(str(exc.problem))}"
        ) from None
    except yaml.YAMLError as exc:
        raise SettingsError(f"{label}: invalid YAML: {_one_line(str(exc))}") from None


def _field_named_in(section: str, message: str) -> str | None:
    """The section's field a ConfigError message names first (its messages name the field)."""
    found = []
    for name in _field_types(section):
        match = re.search(rf"\b{re.escape(name)}\b", message)
        if match:
            found.append((match.start(), name))
    return min(found)[1] if found else None


def _describe(exc: ValidationError, layers: _Layers, fallback: str) -> str:
    problems = []
    for error in exc.errors(include_url=False):
        loc = error["loc"]
        section = str(loc[0]) if loc else ""
        field = str(loc[1]) if len(loc) > 1 else None
        cause = (error.get("ctx") or {}).get("error")
        if error["type"] == "value_error" and isinstance(cause, ValueError):
            message = str(cause)
            if field is None and section in SECTIONS:
                field = _field_named_in(section, message)
        else:
            message = error["msg"]
            value = error.get("input")
            if value is None or isinstance(value, str | int | float | bool):
                message += f" (got {value!r})"
        source = (
            layers.origins.get((section, field or ""))
            or layers.section_origins.get(section)
            or fallback
        )
        dotted = section + (f".{field}" if field else "")
        dotted += "".join(f"[{part}]" for part in loc[2:])
        problems.append(f"{source}: {dotted}: {_one_line(message)}")
    return "; ".join(problems)


def load_settings(
    path: str | Path | Traversable | None,
    overrides: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
    *,
    options: Sequence[tuple[str, str, Any]] = (),
) -> Settings:
    """Read the settings: `path` (None: built-in defaults), then the environment, then overrides.

    `path` is a file, or a packaged one (`configs.packaged_config()`).
    `overrides` are `section.field=value` texts (the command line's `--set`). `options` are
    typed values applied last, each `(label, "section.field", value)`, for flags such as
    `("--port", "server.port", 9000)`; the label names them in errors. `environ` defaults to
    os.environ.
    """
    if isinstance(overrides, str):
        overrides = (overrides,)
    layers = _Layers()
    fallback = "defaults"
    if path is not None:
        fallback = str(path)
        source = Path(path) if isinstance(path, str) else path
        layers.add_file(fallback, _read_yaml(source, fallback))
    layers.add_environ(os.environ if environ is None else environ)
    for item in overrides:
        layers.add_override("--set", item)
    for label, dotted, value in options:
        layers.add_option(label, dotted, value)
    try:
        settings = Settings.model_validate(layers.merged())
    except ValidationError as exc:
        raise SettingsError(_describe(exc, layers, fallback)) from None
    kind = settings.backend.kind
    source = layers.origins.get(("backend", "kind"), fallback)
    if kind not in SECTIONS:
        raise SettingsError(
            f"{source}: backend.kind {kind}: registered after the settings were defined, so "
            "it has no section (register it before app.settings is imported)"
        )
    entry = backend_entry(kind)
    if entry.unavailable is not None and (missing := entry.unavailable()) is not None:
        raise SettingsError(f"{source}: backend.kind {kind}: {missing}")
    return settings
