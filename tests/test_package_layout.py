"""The package's shape (docs/design.md, "Layers of the package"), read from the source without
importing it: no import circle, MPI only in ``runtime/``, and inside ``runtime/`` the transport below
the rank's set-up, both below the roles."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "ebsp_mpi"


def modules() -> dict[str, Path]:
    """Every module of the package by its dotted name."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name: str, path: Path, known) -> set[str]:
    """The package's modules that `name` imports anywhere in it (inside functions and behind
    ``TYPE_CHECKING`` too: a circle there still ties the two modules together)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found.update(f"{module}.{a.name}" if f"{module}.{a.name}" in known else module for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m in known and m != name}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def circles(graph) -> list[list[str]]:
    """The strongly connected parts of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while not part or part[-1] != v:
                part.append(stack.pop())
                on_stack.discard(part[-1])
            if len(part) > 1:
                found.append(sorted(part))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_itself_through_others(graph):
    assert circles(graph) == []


def test_a_circle_is_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("layer", ["nn", "data", "sync", "trace", "plan"])
def test_the_pure_layers_never_import_mpi(layer):
    for path in (PACKAGE / layer).rglob("*.py"):
        assert "mpi4py" not in path.read_text(), path


# what each folder of runtime/ may import of runtime/: the transport nothing above it, a rank's set-up
# the transport, the roles both but not each other
BELOW = {"transport": {"transport"}, "rank": {"transport", "rank"}, "servers": {"transport", "rank", "servers"},
         "worker": {"transport", "rank", "worker"}}


@pytest.mark.parametrize("folder", sorted(BELOW))
def test_runtime_folders_import_downward(graph, folder):
    prefix = f"ebsp_mpi.runtime.{folder}"
    for name, deps in graph.items():
        if name.startswith(prefix):
            above = {d for d in deps if d.startswith("ebsp_mpi.runtime.")
                     and d.split(".")[2] not in BELOW[folder]}
            assert not above, f"{name} imports {sorted(above)}"
