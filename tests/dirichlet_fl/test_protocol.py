"""The error reason's ledger summary: formatted as one line, parsed back exactly."""

from __future__ import annotations

import math

from dirichlet_fl.protocol import error_reason, one_line, parse_error_reason


def test_a_ledger_summary_round_trips_through_the_reason() -> None:
    ledger = {"epsilon": 0.9538912, "delta": 1e-5, "steps": 7, "target-epsilon": 1.0, "sample-rate": 0.0167, "r": 0.31}
    reason = error_reason("client 2: training failed: RuntimeError: device lost", ledger)
    assert "\n" not in reason
    text, parsed = parse_error_reason(reason)
    assert text == "client 2: training failed: RuntimeError: device lost"
    assert parsed == ledger


def test_infinite_eps_is_written_as_null_and_read_back_as_inf() -> None:
    _, parsed = parse_error_reason(error_reason("x", {"epsilon": math.inf, "steps": 3}))
    assert parsed == {"epsilon": math.inf, "steps": 3.0}


def test_a_reason_without_a_summary_is_all_text() -> None:
    for reason in ("ActorDiedError: the actor died", "x ledger=not json", "x ledger=[1, 2]", ""):
        assert parse_error_reason(reason) == (reason, None)
    assert error_reason("two\nlines  here", None) == "two lines here"


def test_a_foreign_multi_line_reason_becomes_one_short_line() -> None:
    text, ledger = parse_error_reason("ActorDiedError: the actor died\n\tclass_name: ClientAppActor\n" + "x" * 1000)
    assert ledger is None and "\n" not in text and len(text) == 300
    assert text.startswith("ActorDiedError: the actor died class_name: ClientAppActor x")


def test_one_line_has_the_class_and_message_and_no_traceback() -> None:
    try:
        raise RuntimeError("CUDA error:\n  out of memory\n")
    except RuntimeError as error:
        assert one_line(error) == "RuntimeError: CUDA error: out of memory"
    assert one_line(KeyError()) == "KeyError"
