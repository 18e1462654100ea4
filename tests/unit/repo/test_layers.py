"""Dependencies point one way, package by package, with no exemptions.

The layers, lowest first:

1. **The core**: ``iotwatch`` without its app packages -- the contract, settings, errors,
   stats, logs, the clients, Spark's session and jars, the dead-letter reader, replication
   lag, the kit every command is built from (``iotwatch.cli``) and the generators of the
   reference pages. It imports no stage and nothing of the app layer.
2. **The stages**, in this order: devices, gateway, models, streaming, evaluation, alerts,
   responder, dashboards (``iotwatch.devices`` from ``devices/``, and so on: each stage's
   folder sits at the repository's top level and installs under ``iotwatch``). A stage imports
   the core and the stages before it in this order, never one after it. The evaluation
   (``evaluation/``, with ``iotwatch evaluate`` and ``iotwatch score-csv``) runs the streaming
   job's logic over simulated devices, so it sits above streaming and devices, while the
   detectors it measures (``models/``) sit below streaming, which runs them.
3. **The app layer**: the frame that registers every command (``iotwatch.app``,
   ``iotwatch.__main__``), ``iotwatch demo`` (``iotwatch.demo``), ``iotwatch chaos``
   (``iotwatch.chaos``), the embedded stack (``iotwatch.stack``), provisioning
   (``iotwatch.provision``) and ``iotwatch.benchmarks``. It may import anything below it; nothing below
   imports it.

A package is a stage, an app package, or a child of ``iotwatch`` (``iotwatch.contract``,
``iotwatch.settings``, ...); no packages import each other in a cycle, and no modules do either.
Imports are read from the source (function-level ones too, since they run when the function
does); those under ``if TYPE_CHECKING:`` are for annotations only and never run.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping, Set
from pathlib import Path

from tests.conftest import REPO_ROOT
from tests.support.layout import FOLDERS, module_name

ROOT = REPO_ROOT
CORE = "iotwatch"
#: The stages, lowest first: name -> the modules it is made of (a module belongs to the
#: longest prefix that names it).
STAGES: dict[str, tuple[str, ...]] = {
    "devices": ("iotwatch.devices",),
    "gateway": ("iotwatch.gateway",),
    "models": ("iotwatch.models",),
    "streaming": ("iotwatch.streaming",),
    "evaluation": ("iotwatch.evaluation",),
    "alerts": ("iotwatch.alerts",),
    "responder": ("iotwatch.responder",),
    "dashboards": ("iotwatch.dashboards",),
}
#: The app layer's packages, above every stage.
APP = ("iotwatch.app", "iotwatch.__main__", "iotwatch.demo", "iotwatch.chaos", "iotwatch.stack", "iotwatch.provision")
APP_PACKAGES = (*APP, "iotwatch.benchmarks")
#: The installed packages with a top-level folder of their own: the core and every stage.
TOP_LEVEL = {CORE, "iotwatch.benchmarks", *(prefix for prefixes in STAGES.values() for prefix in prefixes)}

#: Prefix -> (package, layer): the core is layer 0, the stages 1.. in order, the app layer last.
_PREFIXES: dict[str, tuple[str, int]] = {
    **{prefix: (stage, layer) for layer, (stage, prefixes) in enumerate(STAGES.items(), 1) for prefix in prefixes},
    **{package: (package, len(STAGES) + 1) for package in APP_PACKAGES},
}


def package_of(module: str) -> tuple[str, int]:
    """The package ``module`` belongs to and that package's layer."""
    for prefix in sorted(_PREFIXES, key=len, reverse=True):
        if module == prefix or module.startswith(prefix + "."):
            return _PREFIXES[prefix]
    if module.split(".")[0] == CORE:
        return ".".join(module.split(".")[:2]), 0
    raise AssertionError(f"{module} is in no layer: add its package to STAGES or APP_PACKAGES")


def _modules() -> dict[str, Path]:
    modules = {}
    for folder in FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            modules[module_name(path)] = path
    return modules


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node except the bodies of ``if TYPE_CHECKING:``."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (n for child in node.orelse for n in [child, *_runtime_nodes(child)])
            continue
        yield node
        yield from _runtime_nodes(node)


def _imports(name: str, path: Path, modules: Mapping[str, Path]) -> set[str]:
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


def _package_graph(graph: Mapping[str, Set[str]]) -> dict[str, set[str]]:
    packages: dict[str, set[str]] = {package_of(m)[0]: set() for m in graph}
    for module, targets in graph.items():
        packages[package_of(module)[0]] |= {package_of(t)[0] for t in targets} - {package_of(module)[0]}
    return packages


def _cycles(graph: Mapping[str, Set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm)."""
    cycles: list[list[str]] = []
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()

    def visit(node: str) -> None:
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
    return cycles


def test_every_package_has_its_layer() -> None:
    found = {FOLDERS.get(path.parent.name, path.parent.name) for path in ROOT.glob("*/__init__.py")} - {"tests"}
    assert found == TOP_LEVEL, f"top-level packages without a layer: {sorted(found - TOP_LEVEL)}"
    assert package_of("iotwatch.cli") == ("iotwatch.cli", 0)
    assert package_of("iotwatch.evaluation.simulated") == ("evaluation", 5)
    assert package_of("iotwatch.models.kernels.cad_ose") == ("models", 3)
    assert package_of("iotwatch.stack.process") == ("iotwatch.stack", len(STAGES) + 1)
    graph = _graph()
    assert len([m for m in graph if package_of(m)[1] == 0]) > 10  # (the walk found the core)
    for module in graph:
        package_of(module)  # every module is in a layer


def test_no_package_imports_one_above_it() -> None:
    graph = _graph()
    wrong = []
    for module, targets in sorted(graph.items()):
        package, layer = package_of(module)
        for target in sorted(targets):
            other, other_layer = package_of(target)
            stages_apart = other != package and 0 < layer == other_layer <= len(STAGES)
            if other_layer > layer or stages_apart:
                wrong.append(f"{package} (layer {layer}) -> {other} (layer {other_layer}): {module} -> {target}")
    assert not wrong, "packages import a package above them:\n" + "\n".join(wrong)


def test_no_packages_import_each_other() -> None:
    packages = _package_graph(_graph())
    assert "iotwatch.cli" in packages["gateway"]  # (the walk maps modules to packages)
    cycles = _cycles(packages)
    assert not cycles, "packages that import each other (through the others listed):\n" + "\n".join(
        ", ".join(c) for c in cycles
    )


def test_no_modules_import_each_other() -> None:
    graph = _graph()
    assert "iotwatch.streaming.job" in graph["iotwatch.streaming.cli"]  # (the walk sees function-level imports)
    cycles = _cycles(graph)
    assert not cycles, "modules that import each other (through the others listed):\n" + "\n".join(
        ", ".join(c) for c in cycles
    )
