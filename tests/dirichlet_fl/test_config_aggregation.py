"""The secure-aggregation and client-dp run-config keys: one clear line per bad value."""

from __future__ import annotations

import pytest

from dirichlet_fl.config import RunConfig


@pytest.mark.parametrize(("key", "value", "message"), [
    ("secure-aggregation", "secagg", "secure-aggregation='secagg' is invalid: choose one of none, secaggplus"),
    ("secagg-num-shares", 2.0, "secagg-num-shares=2.0 is invalid: a count must be > 2"),
    ("secagg-num-shares", 3.5, "give a fraction in (0, 1] or a whole count >= 2"),
    ("secagg-reconstruction-threshold", 5.0, "must be below secagg-num-shares=5.0"),
    ("secagg-quantization-range", 2**32, "it must be below 2**32"),
    ("client-dp", "local", "client-dp='local' is invalid: choose one of none, central, adaptive"),
    ("client-clip-target-quantile", 1.0, "client-clip-target-quantile=1.0 is out of range: it must lie in (0, 1)"),
    ("client-clip-learning-rate", 0.0, "client-clip-learning-rate=0.0 is out of range"),
    ("client-clipped-count-stddev", -1.0, "client-clipped-count-stddev=-1.0 is out of range: it must be >= 0"),
    ("client-clipped-count-stddev", 0.4, "client-noise-multiplier=1 needs client-clipped-count-stddev > 0.5 (got 0.4)"),
    ("client-noise-multiplier", -1.0, "client-noise-multiplier=-1.0 is out of range"),
    ("client-clipping-norm", 0.0, "client-clipping-norm=0.0 is out of range"),
])
def test_bad_aggregation_values_name_the_key_and_the_range(key: str, value: object, message: str) -> None:
    overrides = {key: value}
    if key == "secagg-reconstruction-threshold":
        overrides["secagg-num-shares"] = 5.0
    if key.startswith("client-clipped"):
        overrides["client-dp"] = "adaptive"
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("*", r"\*")):
        RunConfig.from_run_config(overrides)


def test_the_defaults_are_off_and_valid() -> None:
    config = RunConfig.from_run_config({})
    assert (config.secagg.mode, config.client_level.mode) == ("none", "none")
    RunConfig.from_run_config({"secure-aggregation": "secaggplus", "client-dp": "central", "secagg-num-shares": 5,
                               "secagg-reconstruction-threshold": 3})
