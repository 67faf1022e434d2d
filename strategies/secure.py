"""PrivateFedAvg under secure aggregation (SecAgg+) and/or client-level DP (DP-FedAvg).

What Flower 1.42 allows. `SecAggPlusWorkflow` (flwr.server.workflow) runs the server's half of
SecAgg+ but only inside the legacy API: it takes a LegacyContext whose legacy Strategy samples
ClientProxies (`configure_fit`) and receives FitRes results (`aggregate_fit`), and it drives one
training round per call. The Message-API strategies have no secure-aggregation counterpart. This
module keeps our strategy (seeded sampling by partition id, per-client ledgers, refusals, the round
loop) and runs Flower's workflow unchanged for the training step of each round:

- `_SampledClients`, a legacy Strategy that hands the workflow exactly the clients PrivateFedAvg
  sampled, and keeps the unmasked aggregate that the workflow passes to `aggregate_fit`;
- `_RecordingGrid`, the run's Grid, which also remembers every reply of every SecAgg+ stage, so that
  each sampled client is told apart as trained (its clear-text ledger metrics), refused (its Error
  code) or dropped out (the stage it vanished in): the workflow itself keeps only anonymous failures.

What the server sees under secaggplus: each client's public keys, encrypted key shares it forwards,
its masked vector (quantized [w, w * update], w the example count, or 1 under client-dp), the shares
needed to unmask, and the clear-text privacy metrics (eps, steps, target, delta, sampling rate, noise
parameter, can-continue); then the weighted mean update. Not: any single update, example count or
training loss (client/secure.py).

Client-level DP (client-dp = "central"). Every update is clipped to client-clipping-norm C on the
client (client/secure.py: Flower's `fixedclipping_mod`, or the same FlatClip inside the SecAgg+ bridge),
and the sum gets N(0, (z C)^2) noise, z = client-noise-multiplier:
- without SecAgg+, by the server, on the uniform mean of the k updates it received (std z C / k, as
  Flower's `compute_stdv`);
- with SecAgg+, by the clients: each of the m sampled clients adds its share N(0, (z C)^2 / m) before
  masking, so the server only ever unmasks a noised sum; when only k < m clients contribute, the
  noise is z sqrt(k / m) C, and that smaller multiplier is what the ledger composes.
Adaptive clipping (client-dp = "adaptive", Andrew et al. 2021; the analysis is in
privacy/client_level.py). C starts at client-clipping-norm and follows the target quantile of the
update norms: each round the server sends the round's C, each sampled client reports whether its update
was left unclipped, and the noised count moves C for the next round. The count's noise is
sigma_b = client-clipped-count-stddev (0: the first round's number of sampled clients / 20, fixed for the
run), and the updates get z_delta = (z^-2 - (2 sigma_b)^-2)^-1/2 so that the round's total noise
multiplier stays z. Without SecAgg+ the bits arrive in the clear (Flower's `adaptiveclipping_mod`) and the
server adds N(0, sigma_b^2) to their count; with SecAgg+ each client adds its share N(0, sigma_b^2 / m)
to its bit inside the masked vector. Flower's DifferentialPrivacy*AdaptiveClipping wrappers count the
clipped updates but move C as if they were the unclipped ones (C runs away from the quantile).

Neither they nor Flower's DifferentialPrivacy*FixedClipping wrappers fit this strategy: they skip
aggregation whenever any client replies with an error (every budget refusal would void the round),
average with the example-count weights, and add noise in the clear on the server. The ledger is
privacy/client_level.py.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import astuple
from logging import WARNING
from typing import Any, cast

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.common import FitIns, FitRes, Parameters, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.common.logger import log
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage
from flwr.compat.common import recorddict_compat as compat
from flwr.server.client_manager import ClientManager, SimpleClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.compat.grid_client_proxy import GridClientProxy
from flwr.server.compat.legacy_context import LegacyContext
from flwr.server.strategy import Strategy as LegacyStrategy
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
from flwr.server.workflow.constant import Key as WorkflowKey
from flwr.serverapp import Grid
from flwr.supercore.differential_privacy import (
    KEY_CLIPPING_NORM,
    KEY_NORM_BIT,
    clip_inputs_inplace,
    compute_stdv,
    get_norm,
)

from dirichlet_fl.config import RunConfig
from dirichlet_fl.protocol import ARRAY_KEYS, CLIPPED_COUNT_NOISE_STD, NOISE_SHARE_STD
from dirichlet_fl.run_writer import RoundRecord
from privacy.client_level import (
    AdaptiveClipping,
    ClientLevelAccountant,
    ClientLevelRound,
    add_gaussian_noise,
    update_noise_multiplier,
)
from strategies.message_exchange import send_and_receive
from strategies.private_fedavg import PrivateFedAvg
from strategies.replies import attribute_replies, exchange

NDArrays = list[np.ndarray]


def build_strategy(config: RunConfig) -> PrivateFedAvg:
    """PrivateFedAvg, or SecureFedAvg when the run asks for secure aggregation or client-level DP."""
    if config.secagg.mode == "none" and config.client_level.mode == "none":
        return PrivateFedAvg(config)
    return SecureFedAvg(config)


def secaggplus_workflow(config: RunConfig, timeout: float | None) -> SecAggPlusWorkflow:
    """Flower's workflow with the run's SecAgg+ keys: a value <= 1 of secagg-num-shares (of the
    sampled clients) or secagg-reconstruction-threshold (of the shares) is a fraction, above 1 a count.
    Under client-dp every weight is 1, so max_weight is 1 and the quantization keeps full precision."""
    def share(value: float) -> int | float:
        return float(value) if value <= 1 else int(value)

    secagg = config.secagg
    return SecAggPlusWorkflow(
        share(secagg.num_shares),
        share(secagg.reconstruction_threshold),
        max_weight=1.0 if config.client_level.mode != "none" else secagg.max_weight,
        clipping_range=secagg.clipping_range,
        quantization_range=secagg.quantization_range,
        timeout=timeout,
    )


def noised_unclipped_count(clipped_bits: list[Any], count_stddev: float) -> float:
    """The number of updates left unclipped (from `adaptiveclipping_mod`'s bits, 1 = clipped) plus
    N(0, sigma_b^2) from OS entropy."""
    count = np.array([float(sum(1 - int(bit) for bit in clipped_bits))])
    add_gaussian_noise([count], count_stddev)
    return float(count[0])


def noised_mean_update(current: NDArrays, weights: list[NDArrays], clipping_norm: float,
                       noise_multiplier: float) -> NDArrays:
    """DP-FedAvg's server step: the uniform mean of the clients' updates (their `weights` minus `current`),
    each clipped to `clipping_norm` (again: the clients already did, and FlatClip is idempotent, so a
    client that skipped it cannot raise the sensitivity), plus N(0, (z C / k)^2) noise (Flower's
    compute_stdv) for k updates."""
    updates = [[np.subtract(new, old, dtype=np.float64) for new, old in zip(client, current)] for client in weights]
    for update in updates:
        if get_norm(update) > clipping_norm:
            clip_inputs_inplace(update, clipping_norm)
    mean = [np.mean([update[i] for update in updates], axis=0) for i in range(len(current))]
    add_gaussian_noise(mean, compute_stdv(noise_multiplier, clipping_norm, len(updates)))
    return mean


class SecureFedAvg(PrivateFedAvg):
    """PrivateFedAvg whose training step runs SecAgg+ and/or adds client-level DP (module docstring)."""

    def __init__(self, config: RunConfig) -> None:
        super().__init__(config)
        self.client_level = ClientLevelAccountant(config.delta) if config.client_level.mode != "none" else None
        self.adaptive: AdaptiveClipping | None = None
        self.eligible = 0

    def state_dict(self) -> dict[str, Any]:
        """PrivateFedAvg's checkpoint plus the client-level ledger's rounds: a resumed run keeps composing."""
        rounds = [] if self.client_level is None else [list(astuple(r)) for r in self.client_level.rounds]
        adaptive = None if self.adaptive is None else self.adaptive.state_dict()
        return {**super().state_dict(), "client_level_rounds": rounds, "adaptive_clipping": adaptive}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if self.client_level is not None:
            for population, sample_size, multiplier in state.get("client_level_rounds", []):
                self.client_level.compose(ClientLevelRound(int(population), int(sample_size), float(multiplier)))
        if state.get("adaptive_clipping"):
            saved = state["adaptive_clipping"]
            self.adaptive = self.config.client_level.adaptive_clipping(float(saved["count_stddev"]))
            self.adaptive.load_state_dict(saved)

    @property
    def clipping_norm(self) -> float:
        """This round's C: client-clipping-norm, or where adaptive clipping has moved it."""
        return self.config.client_level.clipping_norm if self.adaptive is None else self.adaptive.clipping_norm

    @property
    def update_noise_multiplier(self) -> float:
        """The noise multiplier of the update sum: z, or z_delta under adaptive clipping."""
        z = self.config.client_level.noise_multiplier
        return z if self.adaptive is None else update_noise_multiplier(z, self.adaptive.count_stddev)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """PrivateFedAvg's seeded sample; under client-dp the clipping norm rides along (Flower's key)."""
        unavailable = self.unavailable
        self.eligible = sum(client not in unavailable for client in self.clients)
        if self.client_level is not None:
            config[KEY_CLIPPING_NORM] = self.clipping_norm
        client_level = self.config.client_level
        if client_level.mode == "adaptive":
            config[CLIPPED_COUNT_NOISE_STD] = 0.0  # the server noises the count (overridden under SecAgg+)
        messages = list(super().configure_train(server_round, arrays, config, grid))
        if client_level.mode == "adaptive" and self.adaptive is None and messages:
            self.adaptive = client_level.adaptive_clipping(client_level.count_stddev(len(messages)))
        if self.config.secagg.mode == "none" or len(messages) != 1:
            return messages
        reason = (f"secure-aggregation={self.config.secagg.mode!r} needs at least 2 clients per round, but "
                  f"round {server_round} samples 1")
        if server_round == 1:
            raise ValueError(f"{reason}: raise fraction-train or the number of clients")
        log(WARNING, "%s (the others have spent their budgets): one update cannot be hidden in a sum, so the run "
            "stops here", reason)
        return []

    def train_and_aggregate(
        self, grid: Grid, server_round: int, arrays: ArrayRecord, messages: list[Message]
    ) -> ArrayRecord | None:
        if not messages:
            return super().train_and_aggregate(grid, server_round, arrays, messages)
        if self.config.secagg.mode == "secaggplus":
            mean_update = self._secaggplus_round(grid, server_round, arrays, messages)
        else:
            mean_update = self._clear_round(grid, server_round, arrays, messages)
        record = self.current = self.current or RoundRecord(server_round)
        if mean_update is None:
            return None
        if self.client_level is not None:
            self._account(record, sampled=len(messages))
        current = arrays.to_numpy_ndarrays()
        return ArrayRecord({
            name: Array(np.asarray(old + delta).astype(old.dtype))
            for name, old, delta in zip(arrays.keys(), current, mean_update)
        })

    def _clear_round(
        self, grid: Grid, server_round: int, arrays: ArrayRecord, messages: list[Message]
    ) -> NDArrays | None:
        """Client-level DP without SecAgg+: the uniform mean of the clipped updates, noised by the server."""
        replies = exchange(grid, messages, self.reply_timeout)
        self.note_routes(messages)
        self.aggregate_train(server_round, replies)
        answered = [reply for reply in replies if not reply.has_error()]
        updates = [reply.content.array_records["arrays"].to_numpy_ndarrays() for reply in answered]
        if not updates:
            return None
        mean = noised_mean_update(arrays.to_numpy_ndarrays(), updates, self.clipping_norm,
                                  self.update_noise_multiplier)
        if self.adaptive is not None:
            bits = [reply.content.metric_records["metrics"][KEY_NORM_BIT] for reply in answered]
            self._adapt(noised_unclipped_count(bits, self.adaptive.count_stddev) / len(updates))
        return mean

    def _secaggplus_round(
        self, grid: Grid, server_round: int, arrays: ArrayRecord, messages: list[Message]
    ) -> NDArrays | None:
        """One training round through Flower's SecAggPlusWorkflow; returns the unmasked mean update."""
        nodes = [message.metadata.dst_node_id for message in messages]
        fit_config = dict(messages[0].content.config_records["config"])
        fit_config[ARRAY_KEYS] = ",".join(arrays.keys())
        if self.client_level is not None:
            fit_config[NOISE_SHARE_STD] = self.update_noise_multiplier * self.clipping_norm / math.sqrt(len(nodes))
        if self.adaptive is not None:
            fit_config[CLIPPED_COUNT_NOISE_STD] = self.adaptive.count_stddev / math.sqrt(len(nodes))
        parameters = ndarrays_to_parameters(arrays.to_numpy_ndarrays())
        recording = _RecordingGrid(grid)
        run_id = grid.run.run_id
        sampled = _SampledClients(
            [(GridClientProxy(node, recording, run_id), FitIns(parameters, fit_config))  # type: ignore[arg-type]
             for node in nodes]
        )
        state = RecordDict({
            MAIN_CONFIGS_RECORD: ConfigRecord({WorkflowKey.CURRENT_ROUND: server_round}),
            MAIN_PARAMS_RECORD: compat.parameters_to_arrayrecord(parameters, keep_input=True),
        })
        context = LegacyContext(
            Context(run_id=run_id, node_id=0, node_config={}, state=state, run_config={}),
            strategy=sampled, client_manager=sampled.manager,
        )
        secaggplus_workflow(self.config, self.reply_timeout)(recording, context)
        record = self._secaggplus_record(server_round, nodes, recording)
        if sampled.aggregate is None:
            log(WARNING, "round %d: SecAgg+ could not unmask the sum (%d of %d sampled clients sent a masked "
                "update; see the reconstruction threshold above); the round's updates are discarded and the model "
                "is unchanged, every client's spent eps stays in its ledger", server_round, len(record.trained),
                len(nodes))
            return None
        mean = parameters_to_ndarrays(sampled.aggregate)
        if self.adaptive is not None:
            self._adapt(float(mean.pop()[0]))  # the mean of the clients' noised bits (client/secure.py)
        return mean

    def _adapt(self, unclipped_fraction: float) -> None:
        """Note the round's C and the noised unclipped fraction, then move C for the next round."""
        assert self.adaptive is not None and self.current is not None
        record = self.current
        record.client_level["clipping_norm"] = self.adaptive.clipping_norm
        record.client_level["unclipped_fraction"] = unclipped_fraction
        self.adaptive.update(unclipped_fraction)

    def _secaggplus_record(self, server_round: int, nodes: list[int], recording: _RecordingGrid) -> RoundRecord:
        """Each sampled client's outcome, from the replies of every SecAgg+ stage (module docstring)."""
        record = self.current = RoundRecord(server_round)
        for node in nodes:
            partition = self.partition_of[node]
            for stage, replies in recording.stages:
                reply = replies.get(node)
                if reply is None:
                    record.failed[partition] = f"dropped out of SecAgg+ at stage {stage!r}: no reply"
                    break
                if reply.has_error():
                    self._record_error(record, partition, reply, stage=f"SecAgg+ stage {stage!r}: ")
                    break
                if stage == Stage.COLLECT_MASKED_VECTORS:
                    shown = reply.content.config_records["fitres.metrics"]
                    metrics = {key: float(cast(float, value)) for key, value in shown.items()}
                    record.trained[partition] = metrics  # in the sum: a later dropout is unmasked by others
                    if not metrics["can-continue"]:
                        self.exhausted.add(partition)
                    break
            else:
                record.failed[partition] = "secure aggregation halted before this client trained"
        record.spent, record.excluded = set(self.exhausted), set(self.excluded)
        self._count_round(bool(record.trained))
        return record

    def _account(self, record: RoundRecord, sampled: int) -> None:
        """Compose the round's release into the client-level ledger and note it in the round's record."""
        assert self.client_level is not None
        contributed = len(record.trained)
        multiplier = self.config.client_level.noise_multiplier
        if self.config.secagg.mode == "secaggplus":
            multiplier *= math.sqrt(contributed / sampled)
        self.client_level.compose(ClientLevelRound(self.eligible, sampled, multiplier))
        record.client_level = {
            "clipping_norm": self.clipping_norm,
            **record.client_level,
            "epsilon": self.client_level.epsilon(),
            "delta": self.client_level.delta,
            "sample_rate": self.client_level.max_sample_rate,
            "rounds": len(self.client_level.rounds),
        }


class _SampledClients(LegacyStrategy):
    """The legacy Strategy SecAggPlusWorkflow needs: it offers the clients PrivateFedAvg sampled, and
    keeps the unmasked aggregate. The workflow calls only configure_fit and aggregate_fit; the
    evaluation and initialization hooks exist because Flower's abstract class requires them and
    return "nothing" as Flower's own strategies do when a step is switched off."""

    def __init__(self, instructions: list[tuple[ClientProxy, FitIns]]) -> None:
        self.instructions = instructions
        self.manager = SimpleClientManager()
        for proxy, _ in instructions:
            self.manager.register(proxy)
        self.aggregate: Parameters | None = None

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        return None

    def configure_fit(self, server_round: int, parameters: Parameters, client_manager: ClientManager):
        return self.instructions

    def aggregate_fit(self, server_round: int, results: list[tuple[ClientProxy, FitRes]], failures):
        """Every FitRes carries the same unmasked aggregate (SecAggPlusWorkflow.unmask_stage)."""
        self.aggregate = results[0][1].parameters if results else None
        return self.aggregate, {}

    def configure_evaluate(self, server_round: int, parameters: Parameters, client_manager: ClientManager):
        return []

    def aggregate_evaluate(self, server_round: int, results, failures):
        return None, {}

    def evaluate(self, server_round: int, parameters: Parameters):
        return None


class _RecordingGrid(Grid):
    """The run's Grid, remembering each SecAgg+ stage's replies by node (and every other call passed on).

    Each stage is sent by strategies/message_exchange.py: the workflow's own send_and_receive would
    wait up to 3 s per stage on the Deployment Engine."""

    def __init__(self, grid: Grid) -> None:
        self.grid = grid
        self.stages: list[tuple[str, dict[int, Message]]] = []

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        messages = list(messages)
        if not messages:
            return []
        stage = str(messages[0].content.config_records[RECORD_KEY_CONFIGS][Key.STAGE])  # before a client pops it
        replies = attribute_replies(messages, send_and_receive(self.grid, messages, timeout))
        self.stages.append((stage, {reply.metadata.src_node_id: reply for reply in replies}))
        return replies

    @property
    def run(self):
        return self.grid.run

    def set_run(self, run):
        self.grid.set_run(run)

    def create_message(self, *args, **kwargs):
        return self.grid.create_message(*args, **kwargs)

    def get_node_ids(self) -> Iterable[int]:
        return self.grid.get_node_ids()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self.grid.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self.grid.pull_messages(message_ids)
