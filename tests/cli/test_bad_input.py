"""Every bad input, across the run config (through `dirichlet-fl check`, the pre-flight of scripts/run.sh)
and every `dirichlet-fl` subcommand: exit code 2 and one line on stderr that names the key."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from flwr.app import Context, RecordDict

from cli.main import main
from dirichlet_fl.config import RunConfig
from dirichlet_fl.data.split import federated_split
from dirichlet_fl.models.run_model import initial_model

RUN_CONFIG = [  # (--run-config text, the key the message must name)
    ("target-epsilon=-1", "target-epsilon"),
    ("target-epsilon=", "target-epsilon"),
    ("target-epsilon=0", "target-epsilon"),
    ("target-epsilon=0.01", "target-epsilon"),  # below every client's floor
    ("targt-epsilon=2", "targt-epsilon"),  # unknown key, with the close match
    ("foo=1", "foo"),
    ("delta=1.5", "delta"),
    ("delta=0", "delta"),
    ("fraction-train=0", "fraction-train"),
    ("fraction-evaluate=1.5", "fraction-evaluate"),
    ("num-server-rounds=0", "num-server-rounds"),
    ("num-server-rounds=2.5", "num-server-rounds"),
    ("batch-size=700", "batch-size"),  # larger than every shard (359..671 examples): nobody could train
    ("batch-size=0", "batch-size"),
    ("partitioner='nope'", "partitioner"),
    ("partitioner=iid", "partitioner"),  # an unquoted string: flwr rejects it without naming it
    ("partitioner='natural'", "site-file"),
    ("mechanism='gauss'", "mechanism"),
    ("optimizer='rmsprop'", "optimizer"),
    ("learning-rate=-0.1", "learning-rate"),
    ("local-steps=-1", "local-steps"),
    ("local-epochs=0", "local-epochs"),
    ("client-epsilons='1,2'", "client-epsilons"),  # 2 entries for 3 clients
    ("client-epsilons='1,x,3'", "client-epsilons"),
    ("client-epsilons='1,0.01,3'", "client-epsilons[1]"),  # one client's eps below its floor
    ("run-name='../../x'", "run-name"),
    ("run-name='a/b'", "run-name"),
    ("device='cuda'", "device"),
    ("device='tpu'", "device"),
    ("dataset='nope'", "dataset"),
    ("augment='maybe'", "augment"),
    ("beta=-1", "beta"),
    ("alpha=0", "alpha"),
    ("max-grad-norm=0", "max-grad-norm"),
    ("max-idle-rounds=0", "max-idle-rounds"),
    ("audit=maybe", "audit"),
    ("keep-updates=maybe", "keep-updates"),
    ("calibration-rounds=-1", "calibration-rounds"),
    ("client-dp='adaptive'", "client-clipped-count-stddev"),  # z = 1 needs sigma_b > 0.5; 3 clients / 20
    ("client-dp='adaptive' client-clipped-count-stddev=0.3", "client-clipped-count-stddev"),
    # issue 24 item 13, the config cases
    ("seed=1 seed=2", "seed is given twice"),  # flwr would raise a traceback (one string) or keep one silently
    ("model='nope'", "model='nope' is invalid: choose one of cnn"),
    ("mechanism='dpsgd' allow-batch-norm=true", "set allow-batch-norm=false"),  # nobody could train
    ("delta=0.999", "delta=0.999 is out of range: it must lie in (0, 0.1)"),
    ("delta=0.05", "below 1/n"),  # under the cap, but no client of 359..671 examples gets a meaningful delta
    ("local-steps=1e9", "local-steps=1000000000 is out of range: at most 1,000,000"),
    ("local-epochs=1e6", "local-epochs=1e+06 gives client"),  # local-epochs / q steps a round, over the cap
    ("seed=-1", "seed=-1 is out of range: it must be an integer in [0, 2**32)"),
    ("seed=18446744073709551616", "seed=18446744073709551616 is out of range"),  # 2**64
    # issue 32: the server strategy and its parameters
    ("strategy='fedsgd'", "strategy='fedsgd' is invalid: choose one of fedavg, fedavgm, fedprox, fedadam"),
    ("strategy='fedadam' server-beta-2=1.5", "server-beta-2=1.5 is out of range: it must lie in [0, 1)"),
    ("strategy='fedavgm' server-learning-rate=-1", "server-learning-rate=-1.0 is out of range"),
    ("proximal-mu=0.1", "proximal-mu=0.1 has no effect with strategy='fedavg': it is read only by fedprox"),
]


def check_argv(tmp_path: Path, text: str) -> list[str]:
    return ["check", "--num-clients", "3", "--run-config", f"results-dir='{tmp_path}/results'", "--run-config", text]


def folder_with(tmp_path: Path, **files: str) -> Path:
    folder = tmp_path / "run"
    folder.mkdir()
    for name, text in files.items():
        (folder / name.replace("_", ".")).write_text(text)
    return folder


def finished_run(folder: Path, summary: str) -> Path:
    """A run folder as the server writes it (3 clients, an untrained model), with `summary` as summary.json."""
    config = RunConfig()
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"run_config": config.to_run_config(), "num_clients": 3}))
    torch.save(initial_model(config, federated_split(config.split_spec(3)).data).state_dict(), folder / "model.pt")
    (folder / "summary.json").write_text(summary)
    return folder


def other_cases(tmp_path: Path) -> list[tuple[list[str], str]]:
    """Cases that need a file or folder made for them, and every other subcommand's bad values."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    corrupt = folder_with(tmp_path, config_json="{\n", summary_json="{}", model_pt="")
    torch.save({"round": 1}, corrupt / "checkpoint.pt")  # resumable as far as the checkpoint goes
    nan_summary = finished_run(tmp_path / "nan", '{"status": "completed", "final_accuracy": NaN}')
    base = ["check", "--num-clients", "3", "--run-config"]
    out = ["--out", str(tmp_path / "bench")]
    calibrate = ["calibrate", "--epsilon", "1", "--sample-rate", "0.01", "--steps", "100"]
    return [
        (base + [f"results-dir='{blocker}/sub'"], "results-dir"),
        (base + [f"dataset='mnist-idx' data-root='{tmp_path}/none'"], "data-root"),
        (base + [f"resume-from='{tmp_path}/none'"], "resume-from"),
        (base + [f"resume-from='{corrupt}'"], f"{corrupt}/config.json is corrupt"),
        (base + ["seed=1", "--run-config", "seed=2"], "seed is given twice"),  # across two --run-config
        (base + [f"partitioner='natural' site-file='{tmp_path}/sites.csv'"], "site-file="),  # not data-root
        (["audit", str(nan_summary)], "summary.json is corrupt"),
        (calibrate + ["--max-order", "1e8"], "--max-order=100000000 is out of range: at most 8192"),
        (["check", "--federation-config", "num-supernodes=0"], "num-supernodes"),
        (["check", "--run-config", "target-epsilon 2"], "target-epsilon"),
        (["calibrate", "--epsilon", "-1", "--sample-rate", "0.01", "--steps", "100"], "epsilon"),
        (["calibrate", "--epsilon", "abc", "--sample-rate", "0.01", "--steps", "100"], "--epsilon"),
        (["calibrate", "--epsilon", "1", "--sample-rate", "1.5", "--steps", "100"], "sample_rate"),
        (["calibrate", "--epsilon", "1", "--sample-rate", "0.01", "--steps", "0"], "steps"),
        (calibrate + ["--max-order", "1"], "max_order"),
        (calibrate + ["--delta", "2"], "delta"),
        (calibrate + ["--alpha", "0"], "alpha"),
        (["calibrate", "--epsilon", "1"], "--sample-rate"),
        (["partition", "--num-clients", "0"], "num_clients"),
        (["partition", "--partitioner", "dirichlet", "--beta", "-1"], "beta"),
        (["partition", "--dataset", "nope"], "dataset"),
        (["partition", "--partitioner", "nope"], "--partitioner"),
        (["audit", str(tmp_path / "none")], str(tmp_path / "none")),
        (["audit", str(corrupt)], "config.json"),
        (["audit-experiment", "--epsilon", "-1"], "--epsilon"),
        (["audit-experiment", "--sample-rate", "2"], "--sample-rate"),
        (["audit-experiment", "--steps", "0"], "--steps"),
        (["audit-experiment", "--candidates", "0"], "--candidates"),
        (["audit-experiment", "--mechanisms", "foo"], "--mechanisms"),
        (["audit-experiment", "--seeds", "0"], "--seeds"),
        (["audit-experiment", "--optimizer", "rmsprop"], "--optimizer"),
        (["audit-experiment", "--rate", "dirichlet=-1"], "--rate dirichlet"),
        (["audit-experiment", "--references", "1"], "--references"),
        (["audit-experiment", "--margin", "2"], "--margin"),
        (["audit", str(tmp_path / "none"), "--view", "weights"], "--view"),
        (["bench", "steps", "--batch-size", "0"] + out, "--batch-size"),
        (["bench", "steps", "--device", "tpu"] + out, "--device"),
        (["bench", "accountant", "--repeats", "0"] + out, "--repeats"),
        (["bench", "accountant", "--groups", "paper,everything"] + out, "--groups"),
        (["bench", "simulation", "--clients", "0"] + out, "--clients"),
        (["bench", "accuracy", "--num-clients", "0"] + out, "--num-clients"),
    ]


def exit_code_and_stderr(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as stop:
        code = int(stop.code or 0)
    return code, capsys.readouterr().err


def assert_one_line_naming(code: int, err: str, key: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert key in lines[0], lines[0]


@pytest.mark.parametrize(("text", "key"), RUN_CONFIG, ids=[text for text, _ in RUN_CONFIG])
def test_a_bad_run_config_value_stops_before_anything_starts(
    text: str, key: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = exit_code_and_stderr(check_argv(tmp_path, text), capsys)
    assert_one_line_naming(code, err, key)
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").iterdir())  # no run folder


def test_every_other_bad_input_exits_2_naming_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cases = other_cases(tmp_path)
    assert len(RUN_CONFIG) + len(cases) >= 40
    for argv, key in cases:
        code, err = exit_code_and_stderr(argv, capsys)
        assert_one_line_naming(code, err, key)


def test_a_good_config_passes_the_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = exit_code_and_stderr(check_argv(tmp_path, "target-epsilon=2 partitioner='iid'"), capsys)
    assert code == 0, err
    assert not any((tmp_path / "results").iterdir())  # writable, and still empty


def test_many_small_clients_pass_the_check_and_those_below_batch_size_sit_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """README's many-clients example in small (it was refused: a shard <= batch-size stopped the pre-flight
    while the server lets such clients sit out): the check now applies the server's rule."""
    argv = ["check", "--num-clients", "100", "--run-config",
            f"results-dir='{tmp_path}/results' fraction-train=0.1 local-steps=20 batch-size=6"]
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "hold <= batch-size examples and sit out" in out


def test_the_server_app_refuses_a_bad_key_in_one_line_before_it_starts(tmp_path: Path) -> None:
    """Plain `flwr run` skips the pre-flight: the ServerApp's own config read names the key, writes nothing."""
    from server.server_app import BAD_INPUT, STATUS_LINE
    from server.server_app import main as server_main

    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("flwr")
    logger.addHandler(handler)
    try:
        run_config = {"num-server-rounds": 0, "results-dir": str(tmp_path / "results")}
        context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config)
        server_main(None, context)  # type: ignore[arg-type]  # refused before the grid is touched
    finally:
        logger.removeHandler(handler)
    assert lines == [f"{STATUS_LINE} {BAD_INPUT} (num-server-rounds=0 is out of range: it must be an integer >= 1)"]
    assert not (tmp_path / "results").exists()


def pilot_cases(tmp_path: Path) -> list[tuple[list[str], str]]:
    """`dirichlet-fl pilot`'s own flags (issue 24 item 13): a bad --timeout, a --workdir that is a file, lies
    under a file, or cannot be written (/sys refuses a new folder to every user, root included)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    pilot = ["pilot", "--sites", "1", "--rounds", "1"]
    return [
        ([*pilot, "--workdir", str(tmp_path / "w"), "--timeout", "-5"], "--timeout"),
        ([*pilot, "--workdir", str(tmp_path / "w"), "--timeout", "nan"], "--timeout"),
        ([*pilot, "--workdir", str(tmp_path / "w"), "--timeout", "0"], "--timeout"),
        ([*pilot, "--workdir", str(blocker)], "--workdir"),
        ([*pilot, "--workdir", str(blocker / "w")], "--workdir"),
        ([*pilot, "--workdir", "/sys/dirichlet-fl-pilot-test/w"], "--workdir"),
    ]


def test_bad_pilot_flags_exit_2_naming_the_flag_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv, key in pilot_cases(tmp_path):
        code, err = exit_code_and_stderr(argv, capsys)
        assert_one_line_naming(code, err, key)
        assert "give" in err or "choose" in err, err  # the line says the fix
    assert not (tmp_path / "w").exists(), "nothing written, nothing started"
    assert not Path("/sys/dirichlet-fl-pilot-test").exists()


def test_run_sh_lets_a_users_results_dir_replace_its_default(tmp_path: Path) -> None:
    """Issue 29 item 7: `scripts/run.sh --run-config "results-dir=..."` is the user's choice, not "given twice";
    a bad value next to it still stops the pre-flight (exit 2, naming the key) before any SuperLink starts."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(tmp_path)}
    argv = ["bash", str(root / "scripts" / "run.sh"), "--run-config",
            f"results-dir='{tmp_path}/mine' num-server-rounds=0"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, check=False)
    assert done.returncode == 2, done.stderr
    assert "dirichlet-fl check: error: num-server-rounds=0 is out of range" in done.stderr, done.stderr
    assert "given twice" not in done.stderr
