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


def mechanism_name_comparisons(path: Path, names: set[str]) -> list[str]:
    """Comparisons in the file at `path` of something named like a mechanism with a mechanism's name (a literal,
    or a literal in a tuple, list or set): `mechanism == "none"`, `"dirichlet" in study.mechanisms`, ..."""
    source = path.read_text()
    found = []
    for node in ast.walk(ast.parse(source, filename=str(path))):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        literals = {leaf.value for operand in operands for leaf in ast.walk(operand)
                    if isinstance(leaf, ast.Constant) and isinstance(operand, (ast.Constant, ast.Tuple, ast.List,
                                                                                ast.Set))}
        subjects = [ast.get_source_segment(source, operand) or "" for operand in operands]
        if literals & names and any("mechanism" in subject.lower() for subject in subjects):
            found.append(f"{path.name}:{node.lineno}: {ast.get_source_segment(source, node)}")
    return found


def test_no_module_compares_a_mechanism_name() -> None:
    """Issue 30: what a mechanism is (private, floored, per-example, ...) is asked of its class (privacy/registry.py),
    never learnt by comparing its name, so that a new mechanism is one class and one line in MECHANISMS."""
    from privacy.registry import MECHANISMS

    allowed = {ROOT / "privacy" / "registry.py"}
    paths = [path for folder in (*PACKAGES, "scripts") for path in (ROOT / folder).rglob("*.py") if path not in allowed]
    found = [f"{path.parent.name}/{hit}" for path in paths for hit in mechanism_name_comparisons(path, set(MECHANISMS))]
    assert not found, "ask the mechanism class instead (privacy/mechanisms.py):\n" + "\n".join(found)


def test_the_comparison_rule_catches_a_name_comparison(tmp_path: Path) -> None:
    source = tmp_path / "compares.py"
    source.write_text('def f(c, study):\n    return c.mechanism == "none" or "dirichlet" in study.mechanisms\n')
    assert len(mechanism_name_comparisons(source, {"none", "dirichlet"})) == 2
    source.write_text('def f(config):\n    return config.secagg.mode == "none" or config.partitioner == "dirichlet"\n')
    assert mechanism_name_comparisons(source, {"none", "dirichlet"}) == []


MAX_MODULES = 13
"""Modules (__init__.py included) in one package directory: more means the package holds several concerns."""
MAX_LINES = 500
"""Lines of one library module: a longer one holds more than one concept (issue 30)."""


def test_no_package_holds_more_than_thirteen_modules() -> None:
    crowded = {
        str(folder.relative_to(ROOT)): count
        for package in PACKAGES
        for folder in [ROOT / package, *(ROOT / package).rglob("*/")]
        if folder.is_dir() and (count := len(list(folder.glob("*.py")))) > MAX_MODULES
    }
    assert not crowded, crowded


def test_no_library_module_is_longer_than_five_hundred_lines() -> None:
    long = {
        str(path.relative_to(ROOT)): lines
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if (lines := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not long, long
