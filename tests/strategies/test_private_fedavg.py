"""Seeded client sampling by partition id, and exclusion of spent clients."""

from __future__ import annotations

from flwr.app import ArrayRecord, ConfigRecord

from strategies.private_fedavg import PrivateFedAvg, RoundRecord
from tests.helpers import set_task_identity

set_task_identity()


def strategy(seed: int, fraction: float = 0.5) -> PrivateFedAvg:
    s = PrivateFedAvg(seed=seed, fraction_train=fraction, fraction_evaluate=0.0)
    s.partition_of = {node: partition for partition, node in enumerate([9001, 17, 4242, 5, 777, 31337])}
    return s


def sampled(s: PrivateFedAvg, server_round: int) -> list[int]:
    messages = s.configure_train(server_round, ArrayRecord(), ConfigRecord(), grid=None)
    return sorted(s.partition_of[message.metadata.dst_node_id] for message in messages)


def test_sampling_depends_on_seed_and_round_not_on_node_ids() -> None:
    a, b = strategy(seed=1), strategy(seed=1)
    b.partition_of = {node + 1: partition for node, partition in a.partition_of.items()}  # other node ids
    assert [sampled(a, r) for r in range(1, 6)] == [sampled(b, r) for r in range(1, 6)]
    assert len({tuple(sampled(a, r)) for r in range(1, 6)}) > 1
    assert [sampled(strategy(seed=2), r) for r in range(1, 6)] != [sampled(a, r) for r in range(1, 6)]
    assert all(len(sampled(a, r)) == 3 for r in range(1, 6))


def test_spent_clients_are_not_sampled_and_an_empty_federation_stops() -> None:
    s = strategy(seed=0, fraction=1.0)
    s.exhausted = {17, 5}
    assert sampled(s, 1) == [0, 2, 4, 5]
    s.exhausted = set(s.partition_of)
    assert list(s.configure_train(2, ArrayRecord(), ConfigRecord(), grid=None)) == []


def test_round_record_reports_the_max_eps_not_a_mean() -> None:
    record = RoundRecord(1, trained={0: {"epsilon": 0.2, "num-examples": 1000, "train-loss": 1.0},
                                     1: {"epsilon": 0.9, "num-examples": 10, "train-loss": 3.0}})
    assert record.max_epsilon == 0.9
    assert record.train_loss == (1000 * 1.0 + 10 * 3.0) / 1010
