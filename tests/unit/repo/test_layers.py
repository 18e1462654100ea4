"""Dependencies point one way, on three floors, with no exemptions.

The floors, lowest first:

1. **The core** (``iotwatch/``): what every stage shares -- the contract, the clients, settings,
   errors, logs, stats, the command kit (``iotwatch.cli``) and the Spark and JVM plumbing
   (``iotwatch.jvm``). It imports no stage and nothing of the application.
2. **The stages**, in this order: devices, gateway, models, streaming, evaluation, alerts,
   responder, dashboards (``iotwatch.devices`` from ``devices/``, and so on: each stage's
   folder sits at the repository's top level and installs under ``iotwatch``). A stage imports
   the core and the stages before it in this order, never one after it. The evaluation runs
   the streaming job's logic over simulated devices, so it sits above streaming and devices,
   while the detectors it measures (``models/``) sit below streaming, which runs them.
3. **The application** (``application/``, installed as ``iotwatch.application``): the root
   command group, demo, chaos, bench, the embedded stack, provisioning, setup and the
   generators of the reference pages. It may import anything below it; nothing below imports it.
   Its scenarios (demo, chaos, the benches) run the pipeline through the run harness
   (``iotwatch.application.harness``) and import none of one another.

An edge is anything that loads a module when the code runs: an import at module level or in a
function (those under ``if TYPE_CHECKING:`` are for annotations only and never run), and a
string literal that names a module of the project (``"iotwatch.streaming.cli:stream"`` in a
lazy command registry, ``"iotwatch.dashboards."`` as the prefix of an f-string). No packages
import each other in a cycle, and no modules do either. Outside tests, the only code that
imports a module by a computed name is the command kit's lazy group, whose names are literal.
"""

from __future__ import annotations

import ast
import re
import subprocess
from collections.abc import Iterator, Mapping, Set
from pathlib import Path

from tests.conftest import REPO_ROOT
from tests.support.layout import FOLDERS, module_name

ROOT = REPO_ROOT
CORE = "iotwatch"
APPLICATION = "iotwatch.application"
#: The stages, lowest first.
STAGES = ("devices", "gateway", "models", "streaming", "evaluation", "alerts", "responder", "dashboards")
#: The application's floor, above every stage.
TOP = len(STAGES) + 1
#: The installed packages with a top-level folder of their own.
TOP_LEVEL = {CORE, APPLICATION, *(f"{CORE}.{stage}" for stage in STAGES)}
#: The application's packages (its root modules belong to ``iotwatch.application`` itself).
APPLICATION_PACKAGES = {f"{APPLICATION}.{init.parent.name}" for init in (ROOT / "application").glob("*/__init__.py")}
#: The application's scenarios over the run harness: none imports another.
SCENARIOS = tuple(f"{APPLICATION}.{name}" for name in ("demo", "chaos", "bench"))
#: A string that is a module name, with an optional ``:attribute`` (a lazy registry's entry).
_NAMED = re.compile(r"(iotwatch(?:\.\w+)+)(?::\w+)?")
#: The one module that imports by a computed name (``importlib.import_module``), and why.
DYNAMIC_IMPORTS = {"iotwatch.cli": "LazyGroup: the literal names of a lazy command registry"}


def package_of(module: str) -> tuple[str, int]:
    """The package ``module`` belongs to and its floor: 0 the core (a child of ``iotwatch``),
    1.. the stages in order, :data:`TOP` the application (its root modules, or one of its
    packages)."""
    parts = module.split(".")
    if module == CORE:
        return CORE, 0
    if parts[0] != CORE:
        raise AssertionError(f"{module} is in no layer: the project installs under {CORE}")
    if parts[1] in STAGES:
        return f"{CORE}.{parts[1]}", STAGES.index(parts[1]) + 1
    if module == APPLICATION or module.startswith(APPLICATION + "."):
        below = ".".join(parts[:3])
        return below if below in APPLICATION_PACKAGES else APPLICATION, TOP
    return ".".join(parts[:2]), 0


def modules_under(root: Path, folders: Mapping[str, str]) -> dict[str, Path]:
    """Module name -> source file, for every ``.py`` under ``root/<folder>`` (installed as ``folders[folder]``)."""
    found = {}
    for folder, package in folders.items():
        for path in sorted((root / folder).rglob("*.py")):
            rest = path.relative_to(root / folder).with_suffix("").parts
            found[".".join([package, *rest]).removesuffix(".__init__")] = path
    return found


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node except the bodies of ``if TYPE_CHECKING:``."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (n for child in node.orelse for n in [child, *_runtime_nodes(child)])
            continue
        yield node
        yield from _runtime_nodes(node)


def _named(node: ast.AST, modules: Mapping[str, Path]) -> list[str]:
    """The modules a string names: a module with an attribute (``"iotwatch.streaming.cli:stream"``),
    a module that is no package (``"iotwatch.streaming.worker_daemon"``; a package's name alone is
    more often a logger's or a header's), or an f-string's literal package prefix
    (``f"iotwatch.dashboards.{name}"`` names every module of that package)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        match = _NAMED.fullmatch(node.value)
        if match and (
            ":" in node.value or (match.group(1) in modules and modules[match.group(1)].name != "__init__.py")
        ):
            return [match.group(1)]
        return []
    if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
        prefix = str(node.values[0].value)
        if _NAMED.fullmatch(prefix.rstrip(".")) and prefix.endswith("."):
            return [m for m in modules if m.startswith(prefix)]
    return []


def imports_of(name: str, path: Path, modules: Mapping[str, Path]) -> set[str]:
    """The project's modules that ``name`` loads when it runs: by import or by naming them."""
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
            # ``from package import module`` loads the module (as ``import package.module`` does);
            # ``from module import name`` loads the module
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            targets = _named(node, modules)
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def module_graph(modules: Mapping[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules it loads."""
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def package_graph(graph: Mapping[str, Set[str]]) -> dict[str, set[str]]:
    """Package -> the packages its modules load."""
    packages: dict[str, set[str]] = {package_of(m)[0]: set() for m in graph}
    for module, targets in graph.items():
        packages[package_of(module)[0]] |= {package_of(t)[0] for t in targets} - {package_of(module)[0]}
    return packages


def upward_edges(graph: Mapping[str, Set[str]]) -> list[str]:
    """Each edge from a floor to one above it, or between two stages against their order."""
    wrong = []
    for module, targets in sorted(graph.items()):
        package, layer = package_of(module)
        for target in sorted(targets):
            other, other_layer = package_of(target)
            if other_layer > layer:
                wrong.append(f"{package} (layer {layer}) -> {other} (layer {other_layer}): {module} -> {target}")
    return wrong


def scenario_crossings(graph: Mapping[str, Set[str]]) -> list[str]:
    """Each edge from one scenario's package into another's (what both use belongs to the harness)."""

    def scenario(module: str) -> str | None:
        return next((s for s in SCENARIOS if module == s or module.startswith(s + ".")), None)

    return [
        f"{module} -> {target}"
        for module, targets in sorted(graph.items())
        for target in sorted(targets)
        if scenario(module) and scenario(target) and scenario(module) != scenario(target)
    ]


def cycles(graph: Mapping[str, Set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm)."""
    found: list[list[str]] = []
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
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


MODULES = modules_under(ROOT, FOLDERS)
GRAPH = module_graph(MODULES)


def test_every_package_has_its_floor() -> None:
    found = {FOLDERS.get(path.parent.name, path.parent.name) for path in ROOT.glob("*/__init__.py")} - {"tests"}
    assert found == TOP_LEVEL, f"top-level packages without a floor: {sorted(found ^ TOP_LEVEL)}"
    assert package_of("iotwatch.cli") == ("iotwatch.cli", 0)
    assert package_of("iotwatch.jvm.spark") == ("iotwatch.jvm", 0)
    assert package_of("iotwatch.evaluation.simulated") == ("iotwatch.evaluation", 5)
    assert package_of("iotwatch.models.kernels.cad_ose") == ("iotwatch.models", 3)
    assert package_of("iotwatch.application.stack.process") == ("iotwatch.application.stack", TOP)
    assert package_of("iotwatch.application.cli") == ("iotwatch.application", TOP)
    assert module_name(ROOT / "application" / "stack" / "process.py") == "iotwatch.application.stack.process"
    assert len([m for m in GRAPH if package_of(m)[1] == 0]) > 10  # (the walk found the core)


def test_the_graph_counts_function_level_imports_and_named_modules() -> None:
    assert "iotwatch.streaming.job" in GRAPH["iotwatch.streaming.cli"]  # an import inside a function
    assert "iotwatch.streaming.cli" in GRAPH["iotwatch.application.cli"]  # a lazy command's literal name
    assert "iotwatch.models.cad_ose" in GRAPH["iotwatch.models.members"]  # the catalogue's classes


def test_no_floor_imports_one_above_it() -> None:
    wrong = upward_edges(GRAPH)
    assert not wrong, "packages import a package above them:\n" + "\n".join(wrong)


def test_no_scenario_imports_another() -> None:
    assert "iotwatch.application.harness.probe" in GRAPH["iotwatch.application.chaos.runner"]
    wrong = scenario_crossings(GRAPH)
    assert not wrong, "scenarios that import another's modules (move what they share to the harness):\n" + "\n".join(
        wrong
    )


def test_no_packages_import_each_other() -> None:
    packages = package_graph(GRAPH)
    assert "iotwatch.cli" in packages["iotwatch.gateway"]  # (the walk maps modules to packages)
    found = cycles(packages)
    assert not found, "packages that import each other (through the others listed):\n" + "\n".join(
        ", ".join(c) for c in found
    )


def test_no_modules_import_each_other() -> None:
    found = cycles(GRAPH)
    assert not found, "modules that import each other (through the others listed):\n" + "\n".join(
        ", ".join(c) for c in found
    )


def test_only_the_lazy_command_group_imports_by_a_computed_name() -> None:
    """``importlib.import_module`` and ``__import__`` hide an edge from this test unless their
    argument is a literal the test reads; the product keeps them to the lazy command group."""
    dynamic = set()
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            called = node.func if isinstance(node, ast.Call) else None
            if isinstance(called, ast.Attribute | ast.Name) and ast.unparse(called).endswith(
                ("import_module", "__import__")
            ):
                dynamic.add(name)
    assert dynamic == set(DYNAMIC_IMPORTS), f"modules importing by a computed name: {sorted(dynamic)}"


def test_the_checks_fail_on_a_planted_counter_example(tmp_path: Path) -> None:
    """A tiny tree whose one cycle runs through a registry's string and an import inside a
    function, a core module that imports a stage and the application, and a scenario that
    imports another's module (beside one that imports the harness)."""
    plant = tmp_path / "plant"
    plant.mkdir()
    (plant / "__init__.py").write_text("")
    (plant / "catalog.py").write_text('KINDS = {"one": "iotwatch.models.one:One"}\n')
    (plant / "one.py").write_text("def make():\n    from iotwatch.models.catalog import KINDS\n    return KINDS\n")
    (tmp_path / "settings.py").write_text(
        "def late():\n    import iotwatch.models.one\n    return 'iotwatch.application.cli:main'\n"
    )
    (tmp_path / "cli.py").write_text("")
    (tmp_path / "chaos_runner.py").write_text("def run():\n    from iotwatch.application.demo.runner import wait\n")
    (tmp_path / "demo_runner.py").write_text("from iotwatch.application.harness import probe\n")
    (tmp_path / "probe.py").write_text("")
    modules = modules_under(tmp_path, {"plant": "iotwatch.models"})
    modules |= {"iotwatch.settings": tmp_path / "settings.py", "iotwatch.application.cli": tmp_path / "cli.py"}
    modules |= {
        "iotwatch.application.chaos.runner": tmp_path / "chaos_runner.py",
        "iotwatch.application.demo.runner": tmp_path / "demo_runner.py",
        "iotwatch.application.harness.probe": tmp_path / "probe.py",
    }
    graph = module_graph(modules)
    assert scenario_crossings(graph) == ["iotwatch.application.chaos.runner -> iotwatch.application.demo.runner"]
    assert cycles(graph) == [["iotwatch.models.catalog", "iotwatch.models.one"]]
    assert [edge.split(": ")[1] for edge in upward_edges(graph)] == [
        "iotwatch.settings -> iotwatch.application.cli",
        "iotwatch.settings -> iotwatch.models.one",
    ]


def test_the_graph_reads_every_tracked_product_module() -> None:
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    product = {ROOT / name for name in tracked.stdout.split() if name.split("/")[0] in FOLDERS}
    assert product and product <= set(MODULES.values())
