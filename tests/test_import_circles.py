"""No import circle in app/, pipeline/, scheduling/, configs/ or benchmarks/.

A module imports another if any `import` or `from ... import` names it, wherever the
statement stands: at the top, inside a function (a deferred import is still a dependency,
only a later one), in a try block. Only an import under `if TYPE_CHECKING:` does not count:
it never runs. `from package import name` depends on package.name where that is a module,
else on the package (its __init__). Circles are the strongly connected components of that
graph with more than one module."""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("app", "pipeline", "scheduling", "configs", "benchmarks")


def _modules(root: Path, packages: tuple[str, ...]) -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package's __init__)."""
    found: dict[str, tuple[Path, bool]] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement that can run (those under `if TYPE_CHECKING:` cannot)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _type_checking(node):
            for other in node.orelse:
                yield from _imports(ast.Module(body=[other], type_ignores=[]))
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        yield from _imports(node)


def import_graph(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    """Each module of `packages` under `root` -> the modules of those packages it imports."""
    modules = _modules(root, packages)
    graph: dict[str, set[str]] = {}
    for name, (path, is_package) in modules.items():
        targets: set[str] = set()
        for node in _imports(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names if alias.name in modules)
                continue
            if node.level:  # relative: from . import x, from ..a import b
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            for alias in node.names:
                if f"{source}.{alias.name}" in modules:
                    targets.add(f"{source}.{alias.name}")
                elif source in modules:
                    targets.add(source)
        targets.discard(name)
        graph[name] = targets
    return graph


def circles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def _describe(graph: Mapping[str, set[str]], circle: list[str]) -> str:
    members = set(circle)
    return "; ".join(f"{m} -> {', '.join(sorted(graph[m] & members))}" for m in circle)


def test_no_import_circle() -> None:
    graph = import_graph(ROOT, PACKAGES)
    assert len(graph) > 100  # the packages were found
    assert graph["app.state"] >= {"app.errors", "pipeline"}  # the top of a module counts
    found = circles(graph)
    assert not found, "import circles: " + " | ".join(_describe(graph, c) for c in found)


def _package(root: Path, files: Mapping[str, str]) -> None:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_a_planted_circle_is_found_through_a_function_and_a_relative_import(
    tmp_path: Path,
) -> None:
    _package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg.b import thing\n",
            "pkg/b.py": "def thing():\n    from . import c\n    return c\n",
            "pkg/c.py": "import pkg.a\n",
            "pkg/d.py": "from pkg import a\n",  # imports into the circle, is not in it
        },
    )
    graph = import_graph(tmp_path, ("pkg",))
    assert circles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]


def test_a_type_only_import_is_not_a_circle(tmp_path: Path) -> None:
    _package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg.b import thing\n",
            "pkg/b.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from pkg.a import other\n"
                "else:\n    import json\n"
                "def thing(): ...\n"
            ),
        },
    )
    graph = import_graph(tmp_path, ("pkg",))
    assert graph["pkg.b"] == set()
    assert circles(graph) == []
    (tmp_path / "pkg/b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    pass\nelse:\n    import pkg.a\n"
    )
    assert circles(import_graph(tmp_path, ("pkg",))) == [["pkg.a", "pkg.b"]]
