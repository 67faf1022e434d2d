"""`dirichlet-fl calibrate`: the report, the JSON keys, and exit code 2 with one line for bad input."""

from __future__ import annotations

import json

import pytest

from cli.main import main
from privacy.accounting.analysis import epsilon


def test_json_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", "--epsilon", "1", "--delta", "1e-5", "--sample-rate", "0.005", "--steps", "20000",
                 "--alpha", "3", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {"r_star", "epsilon", "order", "floor"} <= set(report)
    assert round(report["r_star"], 4) == 0.2349 and report["order"] == 12
    assert report["epsilon"] <= 1.0
    assert epsilon(report["r_star"], 3.0, 0.005, 20000, 1e-5).epsilon == report["epsilon"]
    assert report["floor"] == pytest.approx(0.6754, abs=1e-4)


def test_text_report_states_delta_rate_steps_and_coverage(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", "--epsilon", "2", "--sample-rate", "0.005", "--steps", "20000"]) == 0
    out = capsys.readouterr().out
    assert "r* = 0.403462 " in out  # 0.40346295... rounded down, never up
    for fragment in ("delta=1e-05", "sample rate q=0.005", "T=20000", "inputs only", "labels public", "kappa"):
        assert fragment in out


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--epsilon", "0", "--sample-rate", "0.01", "--steps", "10"], "epsilon=0.0 is out of range"),
        (["--epsilon", "1", "--delta", "1", "--sample-rate", "0.01", "--steps", "10"], "delta=1.0"),
        (["--epsilon", "1", "--sample-rate", "1.2", "--steps", "10"], "sample_rate=1.2"),
        (["--epsilon", "1", "--sample-rate", "0.01", "--steps", "0"], "steps=0"),
        (["--epsilon", "1", "--sample-rate", "0.01", "--steps", "10", "--alpha", "0"], "alpha=0.0"),
        (["--epsilon", "0.5", "--sample-rate", "0.005", "--steps", "20000"], "smallest reachable epsilon"),
        (["--epsilon", "x", "--sample-rate", "0.01", "--steps", "10"], "invalid float value"),
    ],
)
def test_invalid_input_exits_2_with_one_line(arguments, message, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        raise SystemExit(main(["calibrate", *arguments]))
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err
