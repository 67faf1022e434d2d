"""The site executor (cli/deployment/site_executor.py): a forked child runs the app bundle's code, not the
executor's, draws fresh randomness, reports its task's exit code; bad arguments are refused in one line."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from cli.deployment import site_executor
from cli.deployment.federation import Federation, SuperNodeHandle
from cli.deployment.processes import DeploymentError, read_log
from cli.deployment.site_executor import (
    CHECKOUT,
    TASK_POLL_ENV,
    TASK_POLL_S,
    ForkingExecutor,
    checkout_package,
    forget_checkout_modules,
    preload,
    reseed_global_generators,
    site_executor_argv,
    write_executor_secret,
)
from cli.main import main


def _write_package(root: Path, name: str) -> Path:
    package = root / name
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(f"WHERE = {str(root)!r}\n")
    return package


def test_checkout_packages_are_the_roots_own_not_its_virtual_environment(tmp_path: Path) -> None:
    _write_package(tmp_path, "app_pkg")
    (tmp_path / "single.py").write_text("")
    venv_module = tmp_path / ".venv" / "lib" / "site-packages" / "numpy" / "__init__.py"
    venv_module.parent.mkdir(parents=True)
    venv_module.write_text("")
    assert checkout_package(str(tmp_path / "app_pkg" / "__init__.py"), tmp_path)
    assert checkout_package(str(tmp_path / "single.py"), tmp_path)
    assert not checkout_package(str(venv_module), tmp_path)
    assert not checkout_package(str(tmp_path.parent / "elsewhere.py"), tmp_path)
    assert not checkout_package(None, tmp_path)
    assert checkout_package(site_executor.__file__)
    assert not checkout_package(np.__file__)


def test_forgetting_the_checkout_makes_the_next_import_load_the_bundles_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    executor_copy, bundle_copy = tmp_path / "checkout", tmp_path / "bundle"
    _write_package(executor_copy, "shared_pkg_x")
    _write_package(bundle_copy, "shared_pkg_x")
    monkeypatch.syspath_prepend(str(executor_copy))
    import shared_pkg_x  # type: ignore[import-not-found]

    assert shared_pkg_x.WHERE == str(executor_copy)
    monkeypatch.syspath_prepend(str(bundle_copy))  # as Flower's loader puts the bundle first
    dropped = forget_checkout_modules(executor_copy)
    assert dropped == ["shared_pkg_x"] and "shared_pkg_x" not in sys.modules and "json" in sys.modules
    import shared_pkg_x as again  # type: ignore[import-not-found]

    assert again.WHERE == str(bundle_copy)
    del sys.modules["shared_pkg_x"]


def _forked_draws(reseed: bool) -> tuple[list[float], list[float]]:
    """torch's and numpy's first global draw in two children forked from this process."""
    draws = []
    for _ in range(2):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            os.close(read)
            if reseed:
                reseed_global_generators()
            os.write(write, json.dumps([torch.rand(1).item(), float(np.random.rand())]).encode())
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as handle:
            draws.append(json.loads(handle.read()))
        os.waitpid(pid, 0)
    return draws[0], draws[1]


def test_a_forked_child_reseeds_the_global_generators_it_inherits() -> None:
    torch.manual_seed(7)
    np.random.seed(7)
    first, second = _forked_draws(reseed=False)
    assert first == second, "without reseeding, two forked children replay the parent's state"
    first, second = _forked_draws(reseed=True)
    assert first[0] != second[0] and first[1] != second[1]


def test_a_task_child_runs_without_the_checkouts_modules_and_reports_its_exit_code(tmp_path: Path) -> None:
    seen = tmp_path / "seen.json"

    def fake_run_clientapp(**kwargs: object) -> None:
        modules = [name for name, module in sys.modules.items() if checkout_package(getattr(module, "__file__", None))]
        seen.write_text(json.dumps({"checkout_modules": modules, "token": kwargs["token"],
                                    "insecure": kwargs["insecure"], "certificates": kwargs["certificates"]}))
        raise SystemExit(3)  # Flower's run_clientapp ends with flwr_exit(code)

    assert "cli.deployment.site_executor" in sys.modules
    executor = ForkingExecutor(fake_run_clientapp)
    spec = SimpleNamespace(runtime_api_address="127.0.0.1:1", token="t0k", insecure=True, root_certificates_path=None,
                           parent_pid=os.getpid(), runtime_dependency_install=False)
    executor.launch(spec)
    (pid,) = executor.children
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 3
    report = json.loads(seen.read_text())
    assert report == {"checkout_modules": [], "token": "t0k", "insecure": True, "certificates": None}
    assert "cli.deployment.site_executor" in sys.modules, "only the child forgets"


def test_a_failed_fork_is_a_failed_launch_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    from flwr.supercore.superexec.executor.types import LaunchResultStatus

    def no_fork() -> int:
        raise OSError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", no_fork)
    executor = ForkingExecutor()
    result = executor.launch(SimpleNamespace())  # type: ignore[arg-type]
    assert result.status == LaunchResultStatus.FAILED and "fork failed" in str(result.message)
    assert executor.children == set()


def test_reconcile_reaps_children_that_ended() -> None:
    executor = ForkingExecutor()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os._exit(0)
    executor.children.add(pid)
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # it has ended, not yet reaped
    executor.reconcile()
    assert executor.children == set()


def test_the_tests_never_import_flowers_clientapp_runtime() -> None:
    """client/site.py takes a process that imported it for a SuperNode's ClientApp (site policy then applies):
    a test that imported it would change every later test in its worker."""
    assert "flwr.supernode.runtime.run_clientapp" not in sys.modules


def test_preload_imports_what_is_installed_and_skips_what_is_not() -> None:
    assert preload(("json", "no_such_module_here", "torch")) == ["json", "torch"]
    assert not any(checkout_package(str(CHECKOUT / name.split(".")[0] / "__init__.py"))
                   for name in site_executor.PRELOAD), "PRELOAD must hold no module of the app"


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--runtime-api-address", "127.0.0.1:9094", "--poll-interval", "0"], "--poll-interval='0.0'"),
        (["--runtime-api-address", "127.0.0.1:9094", "--poll-interval", "nan"], "--poll-interval='nan'"),
        (["--runtime-api-address", "localhost"], "--runtime-api-address='localhost'"),
        (["--runtime-api-address", "127.0.0.1:70000"], "--runtime-api-address='127.0.0.1:70000'"),
        (["--runtime-api-address", "127.0.0.1:9094", "--parent-pid", "0"], "--parent-pid=0"),
        (["--runtime-api-address", "127.0.0.1:9094", "--superexec-auth-secret-file", "MISSING"],
         "--superexec-auth-secret-file="),
        (["--runtime-api-address", "127.0.0.1:9094", "--superexec-auth-secret-file", "EMPTY"],
         "--superexec-auth-secret-file="),
    ],
)
def test_bad_arguments_are_refused_in_one_line_before_anything_is_imported(
    argv: list[str], named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "EMPTY").write_bytes(b"")
    argv = [str(tmp_path / arg) if arg in ("MISSING", "EMPTY") else arg for arg in argv]
    assert main(["site-executor", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dirichlet-fl site-executor: error: ") and named in err and "\n" not in err


def test_the_poll_comes_from_the_flag_else_flowers_variable_else_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    from cli.site_executor import poll_interval

    monkeypatch.delenv(TASK_POLL_ENV, raising=False)
    assert poll_interval(SimpleNamespace(poll_interval=None)) == TASK_POLL_S
    monkeypatch.setenv(TASK_POLL_ENV, "2.5")
    assert poll_interval(SimpleNamespace(poll_interval=None)) == 2.5
    assert poll_interval(SimpleNamespace(poll_interval=0.5)) == 0.5
    monkeypatch.setenv(TASK_POLL_ENV, "soon")
    assert poll_interval(SimpleNamespace(poll_interval=None)) == (
        f"{TASK_POLL_ENV}='soon' is out of range: it must be a number of seconds in [0.01, 60]")


def test_fork_mode_starts_each_supernode_with_process_isolation_and_a_private_secret(tmp_path: Path) -> None:
    federation = Federation(tmp_path / "fed", [])
    federation.port = 9093  # as if started: the SuperNodes' command line names the SuperLink's address
    secret = write_executor_secret(tmp_path / "node")
    first = secret.read_bytes()
    assert write_executor_secret(tmp_path / "node") == secret and secret.read_bytes() != first, "fresh each start"
    assert secret.stat().st_mode & 0o777 == 0o600 and secret.stat().st_size == 32
    keys = SimpleNamespace(private_key=tmp_path / "key")
    (tmp_path / "key").write_text("k")
    (tmp_path / "ca").write_text("c")
    argv = federation.supernode_argv(keys, tmp_path / "ca", 9094, "", None, secret)  # type: ignore[arg-type]
    assert argv[argv.index("--isolation") + 1] == "process"
    assert argv[argv.index("--superexec-auth-secret-file") + 1] == str(secret)
    plain = federation.supernode_argv(keys, tmp_path / "ca", 9094, "")  # type: ignore[arg-type]
    assert "--isolation" not in plain and "--superexec-auth-secret-file" not in plain
    executor = site_executor_argv(9094, secret, 4242)
    assert executor[1:] == ["site-executor", "--runtime-api-address", "127.0.0.1:9094", "--superexec-auth-secret-file",
                            str(secret), "--parent-pid", "4242"]
    with pytest.raises(DeploymentError, match="clientapp_executor='thread'"):
        Federation(tmp_path / "fed2", [], clientapp_executor="thread")


def port_probe(taken: str) -> list[str]:
    """Stands in for a SuperNode started with ``--port``: it cannot bind its Runtime API where ``taken`` holds
    (a port, or ``any``), and connects anywhere else."""
    script = ("import sys; port = sys.argv[sys.argv.index('--port') + 1]; "
              f"print('[Errno 98] address already in use' if {taken!r} in (port, 'any') else 'SuperNode ID: 7')")
    return [sys.executable, "-c", script, "--port", "1"]


@pytest.mark.parametrize("taken", ["1", "any"])
def test_a_supernode_whose_port_was_taken_starts_again_on_another(tmp_path: Path, taken: str) -> None:
    federation = Federation(tmp_path / "fed", [], clientapp_executor="subprocess")
    process = federation._spawn("supernode-0", port_probe(taken), tmp_path / "node", tmp_path / "home")
    keys = SimpleNamespace(public_key=tmp_path / "key.pub")
    node = SuperNodeHandle(0, keys, {}, 1, tmp_path / "ca", process)  # type: ignore[arg-type]
    try:
        if taken == "1":
            federation.await_nodes([node])
            assert node.port != 1 and "SuperNode ID: 7" in read_log(node.process.log_path)
        else:  # three new ports, then the error names the cause
            with pytest.raises(DeploymentError, match="supernode-0 exited before connecting: .*address already in use"):
                federation.await_nodes([node])
    finally:
        federation.stop()
