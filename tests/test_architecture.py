"""The layering rule of docs/architecture.md, read off every module's imports.

    privacy        imports nothing else of the project
    dirichlet_fl   the foundation: privacy only
    client, strategies, server
                   the foundation and privacy (never each other, never the roof)
    sims           experiments: anything below the roof
    cli            the roof: anything; nobody imports it

Every import counts, including ones inside functions and under TYPE_CHECKING, and no package may
import itself in a circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("privacy", "dirichlet_fl", "client", "strategies", "server", "sims", "cli")
ALLOWED = {
    "privacy": set(),
    "dirichlet_fl": {"privacy"},
    "client": {"privacy", "dirichlet_fl"},
    "strategies": {"privacy", "dirichlet_fl"},
    "server": {"privacy", "dirichlet_fl", "strategies"},
    "sims": {"privacy", "dirichlet_fl", "client", "strategies", "server"},
    "cli": {"privacy", "dirichlet_fl", "client", "strategies", "server", "sims"},
}


def project_imports(path: Path) -> set[str]:
    """Top-level project modules that the file at `path` imports, anywhere in it."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def modules() -> dict[str, set[str]]:
    """Every project module and the project modules it imports."""
    names = {module_name(path): path for package in PACKAGES for path in (ROOT / package).rglob("*.py")}
    return {name: {imp for imp in project_imports(path) if imp in names} for name, path in names.items()}


@pytest.mark.parametrize("package", PACKAGES)
def test_a_package_imports_only_the_layers_below_it(package: str) -> None:
    graph = modules()
    violations = sorted(
        f"{module} imports {imported}"
        for module, imports in graph.items()
        if module.split(".")[0] == package
        for imported in imports
        if imported.split(".")[0] not in ALLOWED[package] | {package}
    )
    assert not violations, violations


def test_no_module_imports_itself_in_a_circle() -> None:
    graph = modules()
    done: set[str] = set()

    def visit(module: str, stack: list[str]) -> None:
        if module in stack:
            raise AssertionError(" -> ".join([*stack[stack.index(module):], module]))
        if module in done:
            return
        for imported in sorted(graph[module]):
            visit(imported, [*stack, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])


def test_the_rule_catches_an_upward_import(tmp_path: Path) -> None:
    source = tmp_path / "upward.py"
    source.write_text("def f():\n    from cli.main import main\n")
    assert "cli.main" in project_imports(source)
