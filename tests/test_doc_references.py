"""Every path, module and setting the README and docs/ name exists.

A newcomer follows what a doc names: a path (`app/ws/session.py`, `configs/sim.yaml`,
`benchmarks/results/gpu-check-*.txt`), a module (`pipeline.engine`, `python -m
benchmarks.voice`, `scheduling.admission.AdmissionPolicy`) or a setting
(`admission.queue_max_wait_s`, `piper.ort_*`). Each is checked against the repository and
the typed settings (app/settings.py), in prose and in code blocks alike:

- a path under one of the repository's top folders must be a file or folder (a `*` is a
  glob; a path cut short by a placeholder, `gpu-check-<time>.txt`, must begin a name);
- a dotted name under app, pipeline, scheduling, benchmarks or tests must be a module, and
  what follows the module a name it defines (a class's attribute one level further);
- a dotted name whose first part is a settings section must be a field of it (a `*` is a
  glob), or one that app/settings_moves.py still answers for (moved or removed).

The dated records under benchmarks/results/records/ are history: they may name what has
since been renamed or removed, so they are not checked here (their links are:
tests/test_docs.py).
"""

from __future__ import annotations

import ast
import dataclasses
import fnmatch
import functools
import importlib.util
import re
from pathlib import Path

import pytest

from app.settings import SECTIONS, section_defaults
from app.settings_moves import MOVED_FIELDS, REMOVED_FIELDS

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_TOP = ("app", "pipeline", "scheduling", "configs", "benchmarks", "tests", "docs", ".ci")
_PACKAGES = ("app", "pipeline", "scheduling", "benchmarks", "tests")
_FILE_SUFFIXES = {"md", "py", "yaml", "yml", "json", "txt", "png", "toml", "onnx", "wav", "sh"}
_BEFORE = r"(?<![\w./~$-])"  # not the middle of a longer path, a URL or a variable
_PATH = re.compile(_BEFORE + r"((?:" + "|".join(re.escape(t) for t in _TOP) + r")/[\w.*/-]*)")
_DOTTED = re.compile(_BEFORE + r"([A-Za-z_]\w*(?:\.(?:\*?\w+\*?|\*))+)")


def _path_problem(name: str, following: str, root: Path) -> str | None:
    path = name.rstrip(".,;:")
    if following[:1] in ("<", "{"):  # a placeholder goes on: the path begins a name
        parent, _, stem = path.rpartition("/")
        folder = root / parent
        found = folder.is_dir() and any(p.name.startswith(stem) for p in folder.iterdir())
        return None if found else f"{path}<...>: no name in {parent}/ begins {stem!r}"
    if "*" in path:
        return None if any(root.glob(path.rstrip("/"))) else f"{path}: matches nothing"
    if (root / path).exists() or _written_by_a_benchmark(path):
        return None
    return f"{path}: no such file or folder"


@functools.cache
def _benchmark_sources() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in ROOT.glob("benchmarks/**/*.py"))


def _written_by_a_benchmark(path: str) -> bool:
    """A run's output under benchmarks/results/ (not committed): a benchmark names it."""
    folder, _, name = path.rpartition("/")
    return folder == "benchmarks/results" and f'"{name}"' in _benchmark_sources()


@functools.cache
def _definitions(module_file: Path) -> dict[str, set[str]]:
    """A module's top-level names, each with the names its body defines (a class's)."""
    tree = ast.parse(module_file.read_text(encoding="utf-8"))
    names: dict[str, set[str]] = {}

    def targets(node: ast.AST) -> list[str]:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            return [node.name]
        if isinstance(node, ast.Assign):
            return [t.id for t in node.targets if isinstance(t, ast.Name)]
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            return [node.target.id]
        if isinstance(node, ast.Import | ast.ImportFrom):
            return [(a.asname or a.name).split(".")[0] for a in node.names]
        return []

    for node in tree.body:
        inner = {n for child in getattr(node, "body", []) for n in targets(child)}
        for name in targets(node):
            names[name] = inner if isinstance(node, ast.ClassDef) else set()
    return names


def _module_file(parts: list[str], root: Path) -> Path | None:
    base = root.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _module_problem(dotted: str, root: Path) -> str | None:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = _module_file(parts[:cut], root)
        if module is None:
            continue
        rest = parts[cut:]
        if not rest:
            return None
        defined = _definitions(module)
        if rest[0] not in defined:
            return f"{dotted}: {'.'.join(parts[:cut])} defines no {rest[0]}"
        if len(rest) > 1 and defined[rest[0]] and rest[1] not in defined[rest[0]]:
            return f"{dotted}: {rest[0]} has no {rest[1]}"
        return None
    return f"{dotted}: no such module"


def _fields(value: object) -> dict[str, object]:
    return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}  # type: ignore[arg-type]


def _setting_problem(dotted: str) -> str | None:
    section, *rest = dotted.split(".")
    if (section, rest[0]) in MOVED_FIELDS or (section, rest[0]) in REMOVED_FIELDS:
        return None  # an older config's name: the loader answers where it went
    fields: dict[str, object] = section_defaults(section)
    for depth, part in enumerate(rest):
        matches = [f for f in fields if fnmatch.fnmatchcase(f, part)]
        if not matches:
            where = ".".join([section, *rest[:depth]])
            return f"{dotted}: {where} has no field {part}"
        value = fields[matches[0]]
        if depth + 1 < len(rest):
            if not dataclasses.is_dataclass(value):
                return None  # `text.max_segment_chars.` and the like: what follows is prose
            fields = _fields(value)
    return None


@functools.cache
def _installed_module(dotted: str) -> bool:
    """Whether `dotted` is a module of an installed package, found without importing it."""
    first, *rest = dotted.split(".")
    try:
        spec = importlib.util.find_spec(first)  # a top-level name imports nothing
    except (ImportError, ValueError):
        return False
    if spec is None:
        return False
    for location in spec.submodule_search_locations or ():
        base = Path(location).joinpath(*rest[:-1])
        if (base / f"{rest[-1]}.py").is_file() or (base / rest[-1] / "__init__.py").is_file():
            return True
    return False


def problems(text: str, root: Path = ROOT) -> list[str]:
    """What `text` names that does not exist, in order of appearance."""
    found: list[str] = []
    for match in _PATH.finditer(text):
        problem = _path_problem(match.group(1), text[match.end() :], root)
        if problem:
            found.append(problem)
    for match in _DOTTED.finditer(text):
        dotted = match.group(1)
        following = text[match.end() : match.end() + 1]
        first, last = dotted.split(".")[0], dotted.split(".")[-1]
        if following == "/" or last in _FILE_SUFFIXES:
            continue  # a path or a file name, not a dotted name
        if first not in _PACKAGES and _installed_module(dotted):
            continue  # `python -m piper.http_server`, `wyoming.audio`: another package's
        problem = None
        if first in _PACKAGES and "*" not in dotted:
            problem = _module_problem(dotted, root)
        if first in SECTIONS and following != "(" and (problem or first not in _PACKAGES):
            # a call is code (`engine.submit(...)`), not a setting; `scheduling` is a package
            # and a section: either reading will do
            setting_problem = _setting_problem(dotted)
            problem = setting_problem if first not in _PACKAGES else setting_problem and problem
        if problem:
            found.append(problem)
    return found


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_module_and_setting_named_exists(path: Path) -> None:
    assert problems(path.read_text(encoding="utf-8")) == []


def test_the_checker_finds_a_planted_wrong_name() -> None:
    """Right names pass; one wrong path, module, attribute and setting each is reported."""
    right = (
        "See `app/streaming.py`, pipeline/backends/, configs/*.yaml and "
        "benchmarks/results/gpu-check-<time>.txt; `python -m benchmarks.voice`; "
        "`pipeline.engine`, `scheduling.admission`; `admission.queue_max_wait_s`, "
        "`piper.ort_*`, `talker.first_fragment_words` (moved), the text.md doc, "
        "[a link](../app/errors.py), `https://example.com/app/nothing.py`."
    )
    assert problems(right) == []
    wrong = (
        "app/websocket.py, configs/*.toml, benchmarks/results/nothing-<time>.txt, "
        "`pipeline.enginee`, `scheduling.admission.NoSuchPolicy`, "
        "`admission.queue_max_wait_ms`, `piper.nothing_*`."
    )
    assert problems(wrong) == [
        "app/websocket.py: no such file or folder",
        "configs/*.toml: matches nothing",
        "benchmarks/results/nothing-<...>: no name in benchmarks/results/ begins 'nothing-'",
        "pipeline.enginee: pipeline defines no enginee",
        "scheduling.admission.NoSuchPolicy: scheduling.admission defines no NoSuchPolicy",
        "admission.queue_max_wait_ms: admission has no field queue_max_wait_ms",
        "piper.nothing_*: piper has no field nothing_*",
    ]
