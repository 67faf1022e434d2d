"""SecAgg+ and client-level DP in the strategy: Flower's real protocol code (secaggplus_mod on each
client, SecAggPlusWorkflow on the server) run in-process through the app's bridges (client/secagg_plus.py,
strategies/secagg_plus.py, strategies/client_dp.py) on sims.bench.secagg.InProcessGrid, with clients that return
known updates."""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.common import bytes_to_ndarray
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage

from client.secagg_plus import aggregation_mod
from dirichlet_fl.config import RunConfig
from dirichlet_fl.protocol import BUDGET_EXHAUSTED
from privacy.accounting.client_level import ClientLevelRound
from sims.bench.secagg import InProcessGrid
from sims.bench.secagg import secure_round as run_secure_round
from strategies.build import build_strategy
from strategies.client_dp import ClientLevelDp
from strategies.private import PrivateStrategy

SHAPES = {"conv.weight": (8, 1, 3, 3), "fc.weight": (10, 200), "fc.bias": (10,)}
EXAMPLES = [37, 120, 64, 9, 88]


def updates_for(partition: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(partition)
    return {name: rng.normal(0.0, 0.05, shape).astype(np.float32) for name, shape in SHAPES.items()}


def fake_client_app(refuse: set[int] = frozenset()) -> ClientApp:  # type: ignore[assignment]
    """Our aggregation_mod around a handler that returns global + a known update per partition."""
    app = ClientApp(mods=[aggregation_mod])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        partition = int(context.node_config["partition-id"])
        if partition in refuse:
            return Message(Error(BUDGET_EXHAUSTED, f"client {partition}: budget spent"), reply_to=msg)
        incoming = msg.content.array_records["arrays"]
        new = {k: Array(incoming[k].numpy() + updates_for(partition)[k]) for k in incoming.keys()}
        metrics = {"num-examples": EXAMPLES[partition], "partition-id": partition, "train-loss": 0.5,
                   "epsilon": 0.25 * partition, "can-continue": 1}
        return Message(RecordDict({"arrays": ArrayRecord(new), "metrics": MetricRecord(metrics)}), reply_to=msg)

    return app


def secure_round(grid: InProcessGrid, **overrides) -> tuple[PrivateStrategy, ArrayRecord, ArrayRecord | None]:
    """One round under SecAgg+ (max weight 200) with `overrides`: run-config keys written as keywords."""
    keys = {name.replace("_", "-"): value for name, value in overrides.items()}
    config = RunConfig.from_run_config({"secure-aggregation": "secaggplus", "secagg-max-weight": 200.0} | keys)
    rng = np.random.default_rng(99)
    arrays = ArrayRecord({k: Array(rng.normal(0, 1, s).astype(np.float32)) for k, s in SHAPES.items()})
    strategy, new = run_secure_round(config, grid, arrays)
    return strategy, arrays, new


def client_dp(strategy: PrivateStrategy) -> ClientLevelDp:
    """The client-level DP wrapper inside the private one (client-dp is on)."""
    assert isinstance(strategy.strategy, ClientLevelDp)
    return strategy.strategy


def weighted_mean_update(partitions: list[int]) -> dict[str, np.ndarray]:
    total = sum(EXAMPLES[p] for p in partitions)
    return {k: sum(EXAMPLES[p] * updates_for(p)[k].astype(np.float64) for p in partitions) / total for k in SHAPES}


def quantization_tolerance(config: RunConfig, partitions: list[int]) -> float:
    """Worst case per entry: each client's weighted value is rounded to a step of 2c/Q, and the weighted
    sum is divided by the total weight (in units of max-weight); plus float32 rounding of the result."""
    step = 2 * config.secagg.clipping_range / config.secagg.quantization_range
    total_ratio = sum(EXAMPLES[p] for p in partitions) / config.secagg.max_weight
    return len(partitions) * step / total_ratio + 1e-6


def assert_aggregate(new: ArrayRecord, old: ArrayRecord, partitions: list[int], tolerance: float) -> None:
    expected = weighted_mean_update(partitions)
    for key in SHAPES:
        got = new[key].numpy().astype(np.float64) - old[key].numpy()
        assert np.max(np.abs(got - expected[key])) <= tolerance, key


def test_reconstructed_sum_equals_fedavg_within_quantization_and_each_masked_vector_is_noise() -> None:
    grid = InProcessGrid(fake_client_app(), 5)
    strategy, old, new = secure_round(grid)
    assert new is not None
    assert_aggregate(new, old, list(range(5)), quantization_tolerance(strategy.config, list(range(5))))
    record = strategy.current
    assert record is not None and sorted(record.trained) == [0, 1, 2, 3, 4] and not record.failed
    assert all("num-examples" not in m and "train-loss" not in m for m in record.trained.values())
    assert record.trained[3]["epsilon"] == 0.75  # the ledger's metrics reach the server in the clear
    masked = [r for stage, r in grid.replies if stage == Stage.COLLECT_MASKED_VECTORS]
    assert len(masked) == 5
    for reply in masked:
        assert not reply.content.array_records["fitres.parameters"]  # no clear-text update travels
        assert reply.content.metric_records["fitres.num_examples"]["num_examples"] == 0
        partition = int(reply.content.config_records["fitres.metrics"]["partition-id"])
        vectors = [bytes_to_ndarray(b) for b in reply.content.config_records[RECORD_KEY_CONFIGS][Key.MASKED_PARAMETERS]]
        masked_flat = np.concatenate([v.ravel() for v in vectors[1:]]).astype(np.float64)  # [0]: the weight
        plain_flat = np.concatenate([updates_for(partition)[k].ravel() for k in SHAPES]).astype(np.float64)
        correlation = np.corrcoef(masked_flat, plain_flat)[0, 1]
        assert abs(correlation) < 5 / math.sqrt(plain_flat.size)  # 5 standard errors of independent vectors


def test_a_client_dropped_after_sharing_its_keys_is_unmasked_away() -> None:
    grid = InProcessGrid(fake_client_app(), 5, drop={Stage.COLLECT_MASKED_VECTORS: {102}})
    strategy, old, new = secure_round(grid)
    assert new is not None
    survivors = [0, 1, 3, 4]
    assert_aggregate(new, old, survivors, quantization_tolerance(strategy.config, survivors))
    record = strategy.current
    assert record is not None and sorted(record.trained) == survivors
    assert "dropped out of SecAgg+ at stage 'collect_masked_vectors'" in record.failed[2]


def test_too_many_dropouts_leave_the_model_unchanged_with_a_clear_record() -> None:
    drop = {Stage.COLLECT_MASKED_VECTORS: {101, 102, 103, 104}}
    grid = InProcessGrid(fake_client_app(), 5, drop=drop)
    strategy, _, new = secure_round(grid, secagg_reconstruction_threshold=3.0, secagg_num_shares=5.0)
    assert new is None
    record = strategy.current
    assert record is not None and sorted(record.trained) == [0] and sorted(record.failed) == [1, 2, 3, 4]


def test_a_refusal_under_secagg_keeps_its_code_and_the_round_goes_on() -> None:
    grid = InProcessGrid(fake_client_app(refuse={1}), 4)
    strategy, old, new = secure_round(grid)
    assert new is not None
    record = strategy.current
    assert record is not None and record.refused == {1: "client 1: budget spent"}
    assert sorted(record.trained) == [0, 2, 3]
    assert_aggregate(new, old, [0, 2, 3], quantization_tolerance(strategy.config, [0, 2, 3]))
    assert 1 in strategy.exhausted


def test_client_dp_under_secagg_noises_the_sum_and_accounts_the_survivors() -> None:
    grid = InProcessGrid(fake_client_app(), 4, drop={Stage.COLLECT_MASKED_VECTORS: {103}})
    strategy, old, new = secure_round(grid, client_dp="central", client_clipping_norm=0.1,
                                      client_noise_multiplier=0.0)
    assert new is not None
    mean = np.concatenate([(new[k].numpy().astype(np.float64) - old[k].numpy()).ravel() for k in SHAPES])
    assert np.linalg.norm(mean) <= 0.1 + 1e-4  # a mean of updates clipped to 0.1 (no noise: multiplier 0)
    record = strategy.current
    assert record is not None and record.client_level["epsilon"] == math.inf and record.client_level["rounds"] == 1

    grid = InProcessGrid(fake_client_app(), 4, drop={Stage.COLLECT_MASKED_VECTORS: {103}})
    strategy, _, _ = secure_round(grid, client_dp="central", client_noise_multiplier=2.0)
    assert client_dp(strategy).client_level.rounds == [ClientLevelRound(4, 4, 2.0 * math.sqrt(3 / 4))]


def test_secagg_never_sends_a_single_update() -> None:
    strategy = build_strategy(RunConfig.from_run_config({"secure-aggregation": "secaggplus", "fraction-evaluate": 0.0}))
    strategy.partition_of = {100: 0, 101: 1}
    arrays = ArrayRecord({"w": Array(np.zeros(2, np.float32))})
    assert len(list(strategy.configure_train(1, arrays, ConfigRecord(), grid=None))) == 2  # type: ignore[arg-type]
    strategy.exhausted = {1}
    assert list(strategy.configure_train(2, arrays, ConfigRecord(), grid=None)) == []  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs at least 2 clients per round, but round 1 samples 1"):
        strategy.configure_train(1, arrays, ConfigRecord(), grid=None)  # type: ignore[arg-type]


def test_the_client_level_ledger_survives_a_checkpoint() -> None:
    grid = InProcessGrid(fake_client_app(), 3)
    strategy, _, _ = secure_round(grid, client_dp="central", client_noise_multiplier=3.0)
    state = strategy.state_dict()
    resumed = build_strategy(strategy.config)
    resumed.load_state_dict(state)
    before, after = client_dp(strategy).client_level, client_dp(resumed).client_level
    assert after.rounds == before.rounds == [ClientLevelRound(3, 3, 3.0)]
    assert after.epsilon() == before.epsilon() > 0


UPDATE_NORMS = {p: float(np.sqrt(sum(np.sum(u.astype(np.float64) ** 2) for u in updates_for(p).values())))
                for p in range(4)}


@pytest.mark.parametrize("secure_aggregation", ["secaggplus", "none"])
@pytest.mark.parametrize(("clipping_norm", "unclipped"), [(0.01, 0.0), (100.0, 1.0)])
def test_adaptive_clipping_moves_c_from_the_clients_bits(secure_aggregation: str, clipping_norm: float,
                                                         unclipped: float) -> None:
    """Every update clipped -> C grows by exp(0.2 * 0.5); none clipped -> it shrinks by as much. Under SecAgg+
    the bits travel inside the masked sum (the aggregate keeps only the model's arrays); in the clear
    Flower's adaptiveclipping_mod reports them. Count noise ~0 here so the fraction is exact."""
    grid = InProcessGrid(fake_client_app(), 4)
    strategy, old, new = secure_round(grid, secure_aggregation=secure_aggregation, client_dp="adaptive",
                                      client_clipping_norm=clipping_norm, client_noise_multiplier=0.0,
                                      client_clipped_count_stddev=1e-9)
    assert new is not None and list(new.keys()) == list(SHAPES)
    mean = np.concatenate([(new[k].numpy().astype(np.float64) - old[k].numpy()).ravel() for k in SHAPES])
    assert np.linalg.norm(mean) <= clipping_norm * (1 + 1e-4)
    record = strategy.current
    assert record is not None and record.client_level["clipping_norm"] == clipping_norm
    assert record.client_level["unclipped_fraction"] == pytest.approx(unclipped, abs=1e-4)
    adaptive = client_dp(strategy).adaptive
    assert adaptive is not None
    moved = clipping_norm * math.exp(-0.2 * (unclipped - 0.5))
    assert adaptive.clipping_norm == pytest.approx(moved, rel=1e-4)
    assert min(UPDATE_NORMS.values()) > 0.01 and max(UPDATE_NORMS.values()) < 100.0


def test_adaptive_clipping_noises_the_update_at_z_delta_and_accounts_z() -> None:
    grid = InProcessGrid(fake_client_app(), 4)
    strategy, _, _ = secure_round(grid, client_dp="adaptive", client_noise_multiplier=0.3)
    dp = client_dp(strategy)
    assert dp.adaptive is not None and dp.adaptive.count_stddev == 4 / 20  # the default: m / 20
    assert dp.update_noise_multiplier == pytest.approx((0.3 ** -2 - 0.4 ** -2) ** -0.5)
    assert dp.client_level.rounds == [ClientLevelRound(4, 4, 0.3)]
    resumed = build_strategy(strategy.config)
    resumed.load_state_dict(strategy.state_dict())
    assert client_dp(resumed).adaptive == dp.adaptive


def test_adaptive_clipping_refuses_too_little_count_noise_before_any_client_trains() -> None:
    strategy = build_strategy(RunConfig.from_run_config({"client-dp": "adaptive", "client-noise-multiplier": 1.0}))
    strategy.partition_of = {100 + p: p for p in range(4)}
    arrays = ArrayRecord({"w": Array(np.zeros(2, np.float32))})
    with pytest.raises(ValueError, match=r"needs client-clipped-count-stddev > 0.5 \(got 0.2\)"):
        strategy.configure_train(1, arrays, ConfigRecord(), grid=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"client-clipped-count-stddev > 0.5 \(got 0.25\)"):
        RunConfig.from_run_config({"client-dp": "adaptive", "client-clipped-count-stddev": 0.25})
