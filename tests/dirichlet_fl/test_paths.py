"""The staged app: every package of the checkout, none of its environments, outputs, data or tests."""

from __future__ import annotations

from pathlib import Path

from dirichlet_fl.paths import APP_DIR, stage_app


def test_a_staged_app_keeps_every_package_and_drops_the_roots_data_results_and_tests(tmp_path: Path) -> None:
    app = tmp_path / "app"
    for folder in ("dirichlet_fl/data", "dirichlet_fl/data/__pycache__", "data", "results", "tests", ".venv"):
        (app / folder).mkdir(parents=True)
    for file in ("pyproject.toml", "dirichlet_fl/__init__.py", "dirichlet_fl/data/loaders.py", "data/x.npz",
                 "results/summary.json", "tests/test_x.py", "dirichlet_fl/data/__pycache__/loaders.cpython-311.pyc"):
        (app / file).write_text("x")
    staged = stage_app(app, tmp_path / "staged")
    kept = sorted(str(path.relative_to(staged)) for path in staged.rglob("*"))
    assert kept == ["dirichlet_fl", "dirichlet_fl/__init__.py", "dirichlet_fl/data", "dirichlet_fl/data/loaders.py",
                    "pyproject.toml"]


def test_the_checkout_stages_every_python_package_it_holds(tmp_path: Path) -> None:
    staged = stage_app(APP_DIR, tmp_path / "staged")
    packages = {path.parent.relative_to(APP_DIR) for path in APP_DIR.glob("*/**/__init__.py")
                if path.parts[len(APP_DIR.parts)] not in ("tests", ".venv", "data", "results")}
    assert packages and all((staged / package / "__init__.py").is_file() for package in packages), packages
