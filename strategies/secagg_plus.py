"""SecAgg+ as the transport of a round's training step, under any strategy (strategies/private.py).

What Flower 1.42 allows. `SecAggPlusWorkflow` (flwr.server.workflow) runs the server's half of
SecAgg+ but only inside the legacy API: it takes a LegacyContext whose legacy Strategy samples
ClientProxies (`configure_fit`) and receives FitRes results (`aggregate_fit`), and it drives one
training round per call. The Message-API strategies have no secure-aggregation counterpart. So the private
wrapper keeps sampling, ledgers and refusals, and `SecAggPlus` carries each round's training messages
through Flower's workflow, unchanged:

- `_SampledClients`, a legacy Strategy that hands the workflow exactly the clients the wrapper sampled,
  and keeps the unmasked aggregate that the workflow passes to `aggregate_fit`;
- `_RecordingGrid`, the run's Grid, which also remembers every reply of every SecAgg+ stage, so that
  each sampled client is told apart as trained (its clear-text ledger metrics), refused (its Error
  code) or dropped out (the stage it vanished in): the workflow itself keeps only anonymous failures.

The unmasked weighted mean is all there is to aggregate: it goes to the wrapped strategy (Flower's FedAvg,
FedAdam, ..., or the client-level DP wrapper around one) as one reply of weight 1 marked SECURE_SUM, the
weights sent plus the mean update. FedAvg returns it as it is; a server optimizer steps on it.

What the server sees under secaggplus: each client's public keys, encrypted key shares it forwards,
its masked vector (quantized [w, w * update], w the example count, or 1 under client-dp), the shares
needed to unmask, and the clear-text privacy metrics (eps, steps, target, delta, sampling rate, noise
parameter, can-continue); then the weighted mean update. Not: any single update, example count or
training loss (client/secagg_plus.py). Under client-dp the clients add the noise before masking
(strategies/client_dp.py, noise_shares).
"""

from __future__ import annotations

from collections.abc import Iterable
from logging import WARNING
from typing import cast

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
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

from dirichlet_fl.config import RunConfig
from dirichlet_fl.protocol import ARRAY_KEYS, Metrics
from dirichlet_fl.runs.writer import RoundRecord
from strategies.client_dp import UNCLIPPED_FRACTION, ClientLevelDp, plus_update
from strategies.message_exchange import send_and_receive
from strategies.private import PrivateStrategy
from strategies.replies import attribute_replies
from strategies.wrapped import CONFIG, SECURE_SUM, WEIGHT, one_reply


def secaggplus_workflow(config: RunConfig, timeout: float | None, max_weight: float) -> SecAggPlusWorkflow:
    """Flower's workflow with the run's SecAgg+ keys: a value <= 1 of secagg-num-shares (of the
    sampled clients) or secagg-reconstruction-threshold (of the shares) is a fraction, above 1 a count.
    Under client-dp every weight is 1, so max_weight is 1 and the quantization keeps full precision."""
    def share(value: float) -> int | float:
        return float(value) if value <= 1 else int(value)

    secagg = config.secagg
    return SecAggPlusWorkflow(
        share(secagg.num_shares),
        share(secagg.reconstruction_threshold),
        max_weight=max_weight,
        clipping_range=secagg.clipping_range,
        quantization_range=secagg.quantization_range,
        timeout=timeout,
    )


class SecAggPlus:
    """The training step of every round through Flower's SecAgg+ (module docstring); `client_dp`, the run's
    client-level DP wrapper, if any, sets the noise each client adds before masking."""

    def __init__(self, config: RunConfig, client_dp: ClientLevelDp | None = None) -> None:
        self.config = config
        self.client_dp = client_dp

    def checked(self, server_round: int, messages: list[Message]) -> list[Message]:
        """One update cannot be hidden in a sum: a first round of one client is refused, a later one (the
        others have spent their budgets) ends the run."""
        if len(messages) != 1:
            return messages
        reason = (f"secure-aggregation='secaggplus' needs at least 2 clients per round, but round {server_round} "
                  "samples 1")
        if server_round == 1:
            raise ValueError(f"{reason}: raise fraction-train or the number of clients")
        log(WARNING, "%s (the others have spent their budgets): one update cannot be hidden in a sum, so the run "
            "stops here", reason)
        return []

    def train(self, strategy: PrivateStrategy, grid: Grid, server_round: int, arrays: ArrayRecord,
              messages: list[Message]) -> list[Message]:
        """One training round through Flower's SecAggPlusWorkflow; every sampled client's outcome recorded in
        strategy.current; returns the unmasked mean as one SECURE_SUM reply ([] when it could not unmask)."""
        nodes = [message.metadata.dst_node_id for message in messages]
        fit_config = dict(messages[0].content.config_records[CONFIG])
        fit_config[ARRAY_KEYS] = ",".join(arrays.keys())
        if self.client_dp is not None:
            fit_config.update(self.client_dp.noise_shares(len(nodes)))
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
        max_weight = 1.0 if self.client_dp is not None else self.config.secagg.max_weight
        secaggplus_workflow(self.config, strategy.reply_timeout, max_weight)(recording, context)
        record = _record(strategy, server_round, nodes, recording)
        if sampled.aggregate is None:
            log(WARNING, "round %d: SecAgg+ could not unmask the sum (%d of %d sampled clients sent a masked "
                "update; see the reconstruction threshold above); the round's updates are discarded and the model "
                "is unchanged, every client's spent eps stays in its ledger", server_round, len(record.trained),
                len(nodes))
            return []
        mean = parameters_to_ndarrays(sampled.aggregate)
        update, extra = mean[:len(arrays.keys())], mean[len(arrays.keys()):]
        metrics: Metrics = {WEIGHT: 1.0, SECURE_SUM: len(record.trained)}
        if extra:  # client-dp = "adaptive": the mean of the clients' noised bits (client/secagg_plus.py)
            metrics[UNCLIPPED_FRACTION] = float(extra[0][0])
        return [one_reply(plus_update(arrays, update), metrics)]


def _record(strategy: PrivateStrategy, server_round: int, nodes: list[int], recording: _RecordingGrid) -> RoundRecord:
    """Each sampled client's outcome, from the replies of every SecAgg+ stage (module docstring)."""
    record = strategy.begin_round(server_round)
    for node in nodes:
        partition = strategy.partition_of[node]
        for stage, replies in recording.stages:
            reply = replies.get(node)
            if reply is None:
                record.failed[partition] = f"dropped out of SecAgg+ at stage {stage!r}: no reply"
                break
            if reply.has_error():
                strategy.record_error(record, partition, reply, stage=f"SecAgg+ stage {stage!r}: ")
                break
            if stage == Stage.COLLECT_MASKED_VECTORS:
                shown = reply.content.config_records["fitres.metrics"]
                metrics = {key: float(cast(float, value)) for key, value in shown.items()}
                strategy.record_trained(record, partition, metrics)  # in the sum: a later dropout is unmasked
                break
        else:
            record.failed[partition] = "secure aggregation halted before this client trained"
    strategy.close_round(record)
    return record


class _SampledClients(LegacyStrategy):
    """The legacy Strategy SecAggPlusWorkflow needs: it offers the clients the private wrapper sampled, and
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
