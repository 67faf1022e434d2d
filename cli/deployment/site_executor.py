"""A site's SuperExec that forks each ClientApp from a warm process: Flower's process-per-message, without
the per-message start-up.

Flower 1.42's SuperNode starts a fresh ``flwr-clientapp`` process for every message (``--isolation
subprocess``), and each one spends about 3 CPU s importing Python, Flower, torch (with ``torch._dynamo``,
which torch's optimizers import at their first step) and scipy before its app runs a single step. With
``--isolation process`` the SuperNode instead waits for a SuperExec that the site runs itself; this is
one. It asks the SuperNode's Runtime API for a ClientApp task every ``poll_s`` seconds, as Flower's
SuperExec does; at the first task it imports those libraries once (PRELOAD: the site's own installed
environment, never the app); and it runs each task in a child forked for it: Flower's own
``run_clientapp`` with the task's token, so the FAB is installed, verified and loaded from the bundle, and
the reply pushed, exactly as in a fresh process. A task's child is forked at the poll after the one that
acquired it: Flower 1.42's SuperNode creates a task before it has pulled the message's objects, and a
child that asks for them too early waits Flower's 1 s pull back-off (``PULL_INITIAL_BACKOFF``). The child
exits when its task ends; nothing it does reaches the parent or the next task.

What a child must not inherit, it does not (docs/consortium.md, "The site's executor"):
- the app's code: the parent imports none of it, and the child drops every module loaded from this
  checkout (the executor's own) before Flower loads the app, so the app always runs the signed bundle's
  copy;
- random state: the child reseeds torch's and numpy's global generators from the OS (Python's ``random``
  reseeds itself at fork); the privacy noise draws from the OS CSPRNG in any case (privacy/csprng.py);
- threads and devices: the parent starts no thread of its own (its parent-exit check is in its loop, not a
  monitor thread) and runs no torch operation, so torch's thread pools and CUDA first start in a child;
  only numpy's BLAS may start its pool at import, and it survives a fork as it does under
  multiprocessing's fork start method.

With ``auth_secret`` (``--superexec-auth-secret-file`` on both sides) the SuperNode hands tasks only to a
SuperExec that signs its requests with the secret, so another process on the site's machine cannot take
them.
"""

from __future__ import annotations

import importlib
import os
import secrets
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from cli.deployment.processes import LOOPBACK, executable, pid_alive
from dirichlet_fl.files import write_atomically

if TYPE_CHECKING:  # Flower is imported when the executor serves, not when the command registers
    from flwr.supercore.constant import TaskType
    from flwr.supercore.superexec.executor.types import ExecutionSpec, LaunchResult

PRELOAD = (
    "numpy",
    "scipy.optimize",
    "scipy.special",
    "torch",
    "torch.nn",
    "torch.optim",
    "torch._dynamo",
    "flwr.app",
    "flwr.clientapp",
    "flwr.supernode.runtime.run_clientapp",
)
"""Imported once by the parent: what every ClientApp of this project imports and is slow to import. Only
third-party packages of the site's environment; the app's own modules come from the bundle in each child."""
CHECKOUT = Path(__file__).resolve().parents[2]
"""The source tree the executor runs from: a child forgets every module loaded from it."""
TASK_POLL_S = 0.2
"""Seconds between a SuperExec's task polls unless TASK_POLL_ENV says otherwise, here and in every process of the
pilot: a message waits at most this long for its ClientApp (Flower's default 1 s), for about 5 small loopback
requests a second per SuperExec."""
TASK_POLL_ENV = "FLWR_SUPEREXEC_TASK_POLL_INTERVAL"
"""Flower's variable for a SuperExec's task poll (0.01-60 s); this executor reads it too."""
CLIENTAPP_EXECUTORS = ("fork", "subprocess")
"""How a site runs a ClientApp task: forked from its warm site executor (this module), or Flower's fresh process."""
SECRET_BYTES = 32
"""Bytes of the secret a SuperNode and its site executor share (random, 0600, fresh at every start)."""
SECRET_FILE = "superexec-auth.secret"


def write_executor_secret(folder: Path) -> Path:
    """A fresh random secret for one SuperNode and its site executor in ``folder``, readable by its owner only."""
    folder.mkdir(parents=True, exist_ok=True)
    write_atomically(path := folder / SECRET_FILE, secrets.token_bytes(SECRET_BYTES), mode=0o600)
    return path


def site_executor_argv(port: int, secret: Path, supernode_pid: int) -> list[str]:
    """`dirichlet-fl site-executor` for the SuperNode whose Runtime API is on ``port``: it signs its task
    requests with ``secret``, polls as TASK_POLL_ENV says (like every process here) and exits when the
    SuperNode (``supernode_pid``) does."""
    return [
        executable("dirichlet-fl"), "site-executor",
        "--runtime-api-address", f"{LOOPBACK}:{port}",
        "--superexec-auth-secret-file", str(secret),
        "--parent-pid", str(supernode_pid),
    ]  # fmt: skip


def preload(modules: Iterable[str] = PRELOAD) -> list[str]:
    """Import ``modules`` (those installed); return the names imported."""
    loaded = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError:
            continue
        loaded.append(name)
    return loaded


def checkout_package(path: str | None, root: Path = CHECKOUT) -> bool:
    """Whether a module file belongs to one of ``root``'s own top-level packages or modules (a virtual
    environment inside ``root`` does not count: its packages are the site's installed ones)."""
    if not path:
        return False
    resolved = Path(path).resolve()
    if not resolved.is_relative_to(root):
        return False
    top = root / resolved.relative_to(root).parts[0]
    return top.suffix == ".py" or (top / "__init__.py").is_file()


def forget_checkout_modules(root: Path = CHECKOUT) -> list[str]:
    """Drop from ``sys.modules`` every module of ``root``'s own packages; return their names.

    Flower's loader reuses a module already in ``sys.modules``, so without this a child would run the
    executor's copy of a package the app bundle also ships, not the bundle's.
    """
    dropped = [name for name, module in list(sys.modules.items())
               if checkout_package(getattr(module, "__file__", None), root)]
    for name in dropped:
        del sys.modules[name]
    return dropped


def reseed_global_generators() -> None:
    """Give torch's and numpy's global generators fresh OS entropy (a fork copies their state)."""
    if (torch := sys.modules.get("torch")) is not None:
        torch.seed()
    if (numpy := sys.modules.get("numpy")) is not None:
        numpy.random.seed()


class ForkingExecutor:
    """Flower's Executor interface (flwr.supercore.superexec.executor.types) for ClientApp tasks: each launch
    forks a child that runs the task; ``reconcile`` reaps the children that ended."""

    def __init__(self, run_task: Callable[..., None] | None = None) -> None:
        """``run_task`` takes Flower's ``run_clientapp`` keywords (default: that function, imported in the child)."""
        self.children: set[int] = set()
        self.run_task = run_task

    def get_eligible_capacity(
        self, supported_task_types: set[TaskType], *, insecure: bool = False, root_certificates_path: str | None = None
    ) -> tuple[set[TaskType], set[str]]:
        """Only ClientApp tasks, with no capacity limit (as Flower's subprocess executor)."""
        from flwr.supercore.constant import TaskType

        return supported_task_types & {TaskType.CLIENT_APP}, set()

    def wait_for_capacity(self, *args: object, **kwargs: object) -> None:
        """No capacity gate."""

    def launch(self, spec: ExecutionSpec) -> LaunchResult:
        """Fork a child that runs ``spec``'s task; the parent returns at once."""
        from flwr.supercore.superexec.executor.types import LaunchResult

        try:
            pid = os.fork()
        except OSError as error:
            return LaunchResult.failed(f"fork failed: {error}")
        if pid == 0:  # the child never returns into the parent's loop
            code = 1
            try:
                code = _run_task(spec, self.run_task)
            finally:
                os._exit(code)
        self.children.add(pid)
        return LaunchResult.accepted()

    def reconcile(self) -> None:
        """Reap the children that have exited."""
        for pid in list(self.children):
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done:
                self.children.discard(pid)

    def close(self) -> None:
        """Reap what has ended; a running task keeps its SuperNode-side heartbeat and ends on its own."""
        self.reconcile()


def _run_task(spec: ExecutionSpec, run_task: Callable[..., None] | None) -> int:
    """In a forked child: forget the checkout's modules, reseed, run the ClientApp; return its exit code."""
    try:
        forget_checkout_modules()
        reseed_global_generators()
        if run_task is None:
            from flwr.supernode.runtime.run_clientapp import run_clientapp

            run_task = run_clientapp
        root = spec.root_certificates_path
        run_task(
            runtime_api_address=spec.runtime_api_address,
            token=spec.token,
            insecure=spec.insecure,
            certificates=Path(root).read_bytes() if root else None,
            parent_pid=spec.parent_pid,
            runtime_dependency_install=spec.runtime_dependency_install,
        )
    except SystemExit as done:  # run_clientapp ends with flwr_exit
        return done.code if isinstance(done.code, int) else 1
    except BaseException:  # noqa: BLE001 - reported here, in the site executor's log
        import traceback

        traceback.print_exc()
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return 0


def serve(
    runtime_api_address: str,
    *,
    auth_secret: bytes | None = None,
    poll_s: float = TASK_POLL_S,
    parent_pid: int | None = None,
) -> None:
    """Ask the SuperNode at ``runtime_api_address`` for ClientApp tasks and fork one child per task, until
    ``parent_pid`` (the SuperNode) is gone or SIGTERM arrives. PRELOAD is imported once, when the first task
    arrives, before its child is forked."""
    from flwr.proto.runtime_pb2 import AcquireTaskRequest
    from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor, SuperExecAuthHttpInterceptor
    from flwr.supercore.retry import make_simple_http_retry_invoker
    from flwr.supercore.runtime import RuntimeHttpClient
    from flwr.supercore.superexec.executor.types import LaunchResultStatus
    from flwr.supercore.superexec.plugin import AutoExecPlugin

    interceptors: list = [RuntimeVersionHttpInterceptor(component_name="SuperExec")]
    if auth_secret:
        interceptors.append(SuperExecAuthHttpInterceptor(
            master_secret=auth_secret, protected_methods=frozenset({"/flwr.proto.Runtime/AcquireTask"})))
    client = RuntimeHttpClient.from_server_address(
        server_address=runtime_api_address, insecure=True, root_certificates=None,
        interceptors=interceptors, retry_invoker=make_simple_http_retry_invoker(),
    )  # fmt: skip
    executor, warm = ForkingExecutor(), None  # warm: the modules preloaded, once the first task came
    pending = None  # a task acquired at the last poll, started at this one
    plugin = AutoExecPlugin(runtime_api_address=runtime_api_address, insecure=True, root_certificates_path=None,
                            runtime_dependency_install=False, executor=executor)
    types, _ = executor.get_eligible_capacity(set(plugin.supported_task_types))
    request = AcquireTaskRequest(supported_task_types=types, agentapp_fab_hashes=[])
    try:
        while parent_pid is None or pid_alive(parent_pid):
            executor.reconcile()
            if pending is not None:  # acquired one poll ago: by now the SuperNode holds its message
                launched = plugin.launch_task(token=pending.token, task=pending.task)
                if launched.status != LaunchResultStatus.ACCEPTED:  # the task then expires at the SuperNode
                    print(f"site executor: task {pending.task.task_id} not started: {launched.message}", flush=True)
                pending = None
            reply = client.AcquireTask(request)
            if reply.HasField("task") and reply.token:
                pending = reply
                if warm is None:  # at the first task: a site that never gets one never pays for the imports
                    warm = preload()
                    print(f"site executor: preloaded {', '.join(warm)}", flush=True)
            time.sleep(poll_s)
    finally:
        client.close()
        executor.close()
