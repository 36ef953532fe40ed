"""Package boundaries, checked on the source: the engine never imports Qt or the app; its core and model layers
never import the serving, remote, experiment or benchmark layers, and the model layer never imports the core; widgets
and the remote client see only torch-free engine modules; the chat and model domain needs neither Qt nor torch; no
import circles (type-only imports counted); no private names of other objects."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
QT = ("PySide6", "PyQt5", "PyQt6", "shiboken6", "pyqtgraph")
FIRST_PARTY = ("app", "engine", "widgets", "resources")
# what widgets may know of the engine: plain data, no tensors
WIDGETS_MAY_IMPORT_FROM_ENGINE = (
    {
        "engine.types",
        "engine.errors",
        "engine.core.config",
        "engine.core.metrics",
        "engine.load.estimate",
        "engine.load.load_options",
        "engine.remote.metrics",
    }
    | {"engine.domain"}
    | {f"engine.domain.{p.stem}" for p in (ROOT / "engine" / "domain").glob("*.py") if p.stem != "__init__"}
)
# (engine/domain: the chat and model domain, Qt-free and torch-free, shared by the window, the widgets and the CLI)
# modules a process without torch can import: the remote client, the widgets' engine types
TORCH_FREE = sorted(
    WIDGETS_MAY_IMPORT_FROM_ENGINE
    | {"engine", "engine.handle", "engine.credentials", "engine.paths"}
    | {f"engine.remote.{p.stem}" for p in (ROOT / "engine" / "remote").glob("*.py") if p.stem != "__init__"}
)
LOWER_LAYERS = ("engine.core", "engine.model")
UPPER_LAYERS = ("engine.serve", "engine.remote", "engine.experiments", "engine.bench")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def sources(*packages: str) -> list[Path]:
    return sorted(p for package in packages for p in (ROOT / package).rglob("*.py"))


def imports_of(path: Path, top_level_only: bool = False) -> list[str]:
    """Absolute imports; with top_level_only, those a module names at its top level, its TYPE_CHECKING imports
    included (a circle held only by type hints is still two modules that must be read together), not those in
    functions."""
    tree = ast.parse(path.read_text(), str(path))
    names: list[str] = []

    def visit(node: ast.AST) -> Iterator[ast.AST]:
        for child in ast.iter_child_nodes(node):
            if top_level_only and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            yield child
            yield from visit(child)

    for node in visit(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
            # `from engine.model import kernels` imports the module engine.model.kernels
            names.extend(
                f"{node.module}.{a.name}"
                for a in node.names
                if (ROOT / node.module.replace(".", "/") / f"{a.name}.py").exists()
            )
    return names


@pytest.mark.parametrize("path", sources("engine"), ids=lambda p: str(p.relative_to(ROOT)))
def test_engine_imports_no_qt_and_no_app(path: Path) -> None:
    for name in imports_of(path):
        top = name.split(".")[0]
        assert top not in QT, f"{path.name} imports {name}: the engine must run headless"
        assert top not in ("app", "widgets"), f"{path.name} imports {name}: the engine must not depend on the app"


@pytest.mark.parametrize("path", sources("engine/core", "engine/model"), ids=lambda p: str(p.relative_to(ROOT)))
def test_core_and_model_never_import_the_layers_above(path: Path) -> None:
    for name in imports_of(path):
        assert not name.startswith(UPPER_LAYERS), f"{module_name(path)} imports {name}, a layer built on it"


@pytest.mark.parametrize("path", sources("engine/model"), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_model_layer_reads_a_step_plan_not_the_schedulers_requests(path: Path) -> None:
    """engine/model runs a plain StepPlan the engine builds (engine.core.step_planner); it never reads the
    scheduler's mutable requests or chunks, nor anything else of engine.core, which is built on it."""
    for name in imports_of(path):
        assert not name.startswith("engine.core"), f"{module_name(path)} imports {name}, a layer built on it"


@pytest.mark.parametrize("path", sources("widgets"), ids=lambda p: str(p.relative_to(ROOT)))
def test_widgets_use_only_engine_data_types(path: Path) -> None:
    for name in imports_of(path):
        if name.split(".")[0] == "engine":
            assert name in WIDGETS_MAY_IMPORT_FROM_ENGINE, f"{path.name} reaches into {name}"
        assert name.split(".")[0] != "app", f"{path.name} imports {name}: widgets must not depend on the app"


@pytest.mark.parametrize("path", sources("engine/domain"), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_domain_imports_no_qt_no_app_no_widgets_and_only_torch_free_engine_modules(path: Path) -> None:
    for name in imports_of(path):
        top = name.split(".")[0]
        assert top not in (*QT, "app", "widgets"), f"{module_name(path)} imports {name}: the domain is the floor below"
        if top == "engine":
            assert name in TORCH_FREE, f"{module_name(path)} imports {name}, which is not torch-free"


@pytest.mark.parametrize("path", sources("engine/remote"), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_remote_client_imports_only_torch_free_engine_modules(path: Path) -> None:
    for name in imports_of(path):
        if name.split(".")[0] == "engine":
            assert name in TORCH_FREE, f"{module_name(path)} imports {name}, which is not torch-free"


def test_torch_free_modules_load_without_torch() -> None:
    """A remote client, or a widget showing engine data or a chat, must not pay for (or need) torch."""
    domain = [module_name(p) for p in sources("engine/domain")]
    code = (
        "import importlib, sys\n"
        f"for name in {TORCH_FREE + domain!r}: importlib.import_module(name)\n"
        "heavy = [m for m in ('torch', 'transformers', 'PySide6') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"importing {TORCH_FREE} loaded {done.stdout.strip()}"


def test_the_engine_package_exports_lazily() -> None:
    code = (
        "import sys, engine; engine.SamplingParams; print('torch' in sys.modules); "
        "engine.Engine; print('torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"]


def _module_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in sources(*FIRST_PARTY)}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        graph[name] = {i for i in imports_of(path, top_level_only=True) if i in modules and i != name}
    return graph


def test_no_import_circles() -> None:
    graph = _module_graph()
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                circles.append([*stack[stack.index(target) :], target])
            elif target not in state:
                visit(target)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert not circles, "import circles: " + "; ".join(" -> ".join(c) for c in circles)


def _private_names_defined() -> set[str]:
    """Attributes and methods first-party classes define with a leading underscore, and modules' private
    functions and constants."""
    names: set[str] = set()
    for path in sources(*FIRST_PARTY):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name.startswith("_"):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                names.update(t.id for t in node.targets if isinstance(t, ast.Name) and t.id.startswith("_"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for item in ast.walk(node):
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name.startswith("_"):
                        names.add(item.name)
                    elif (
                        isinstance(item, ast.Attribute)
                        and isinstance(item.value, ast.Name)
                        and item.value.id == "self"
                        and item.attr.startswith("_")
                        and isinstance(item.ctx, ast.Store)
                    ):
                        names.add(item.attr)
    return {n for n in names if not (n.startswith("__") and n.endswith("__"))}


@pytest.mark.parametrize("package", ["engine", "app", "widgets"])
def test_no_private_names_of_other_objects(package: str) -> None:
    """obj._name where obj is not self or cls: a class reaching into another's internals."""
    private = _private_names_defined()
    found = []
    for path in sources(package):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in private:
                owner = node.value
                if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                    continue
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "private names used from outside their class:\n" + "\n".join(found)
