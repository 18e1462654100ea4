"""Dependencies point one way: the core imports no stage, and no modules import each other.

The core (``iotwatch``: contract, settings, clients, stack) is what every stage shares;
the stages (devices, gateway, streaming, models, alerts, responder, dashboards) build on
it; the app shell (``iotwatch.app``, ``iotwatch.demo``, ``iotwatch.chaos``) sits on top and may import
anything. Imports are read from the source (function-level ones too, since they run when
the function does); those under ``if TYPE_CHECKING:`` are for annotations only and never run.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORE = "iotwatch"
STAGES = ("devices", "gateway", "streaming", "models", "alerts", "responder", "dashboards")
APP_SHELL = ("iotwatch.app", "iotwatch.demo", "iotwatch.chaos", "iotwatch.__main__")


def _modules() -> dict[str, Path]:
    modules = {}
    for package in (CORE, *STAGES):
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            modules[name.removesuffix(".__init__")] = path
    return modules


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node except the bodies of ``if TYPE_CHECKING:``."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (n for child in node.orelse for n in [child, *_runtime_nodes(child)])
            continue
        yield node
        yield from _runtime_nodes(node)


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of the project that ``name`` imports when it runs."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def test_the_core_imports_no_stage() -> None:
    graph = _graph()
    core = [m for m in graph if m.split(".")[0] == CORE and not m.startswith(APP_SHELL)]
    assert len(core) > 10  # (the walk found the core)
    wrong = sorted(f"{m} -> {t}" for m in core for t in graph[m] if t.split(".")[0] != CORE)
    assert not wrong, "core modules import stages:\n" + "\n".join(wrong)


def test_no_modules_import_each_other() -> None:
    graph = _graph()
    assert "streaming.job" in graph["streaming.cli"]  # (the walk sees function-level imports)
    cycles, index, low, stack, on_stack = [], {}, {}, [], set()

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    assert not cycles, "modules that import each other (through the others listed):\n" + "\n".join(
        ", ".join(c) for c in cycles
    )
