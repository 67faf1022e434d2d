"""Every bad input, across the run config (through `dirichlet-fl check`, the pre-flight of scripts/run.sh)
and every `dirichlet-fl` subcommand: exit code 2 and one line on stderr that names the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.main import main

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
    ("batch-size=700", "batch-size"),  # larger than every shard (359..671 examples)
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
]


def check_argv(tmp_path: Path, text: str) -> list[str]:
    return ["check", "--num-clients", "3", "--run-config", f"results-dir='{tmp_path}/results' seed=0", "--run-config", text]


def folder_with(tmp_path: Path, **files: str) -> Path:
    folder = tmp_path / "run"
    folder.mkdir()
    for name, text in files.items():
        (folder / name.replace("_", ".")).write_text(text)
    return folder


def other_cases(tmp_path: Path) -> list[tuple[list[str], str]]:
    """Cases that need a file or folder made for them, and every other subcommand's bad values."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    corrupt = folder_with(tmp_path, config_json="{\n", summary_json="{}", model_pt="")
    base = ["check", "--num-clients", "3", "--run-config"]
    out = ["--out", str(tmp_path / "bench")]
    calibrate = ["calibrate", "--epsilon", "1", "--sample-rate", "0.01", "--steps", "100"]
    return [
        (base + [f"results-dir='{blocker}/sub'"], "results-dir"),
        (base + [f"dataset='mnist-idx' data-root='{tmp_path}/none'"], "data-root"),
        (base + [f"resume-from='{tmp_path}/none'"], "resume-from"),
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
