"""The ClientApp's side of secure aggregation and client-level DP: one mod around the train handler.

Flower 1.42's `secaggplus_mod` (used unchanged) was written for the legacy NumPyClient: it reads the
handler's reply as a FitRes. This mod is the bridge: it hands the train handler (client/client_app.py)
the Message-API layout it always gets and turns its reply into what `secaggplus_mod` masks: the update
(new minus global weights; under client-dp clipped to C plus this client's Gaussian share of the noise,
drawn from OS entropy), the aggregation weight (1 under client-dp) and, in the clear, the accountant's
metrics without WITHHELD_METRICS. A refusal is carried around `secaggplus_mod` and returned as the same
Error. Under adaptive clipping the unclipped bit, with its share of the count's noise, is one more masked
array. docs/secure-aggregation.md says what the server sees in each mode.
"""

from __future__ import annotations

from typing import cast

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Error, Message, MessageType, MetricRecord
from flwr.client.mod import secaggplus_mod
from flwr.clientapp.mod import adaptiveclipping_mod, fixedclipping_mod
from flwr.clientapp.typing import ClientAppCallable
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, RECORD_KEY_STATE
from flwr.compat.common import recorddict_compat as compat
from flwr.supercore.differential_privacy import KEY_CLIPPING_NORM, clip_inputs_inplace, get_norm

from dirichlet_fl.protocol import ARRAY_KEYS, CLIPPED_COUNT_NOISE_STD, NOISE_SHARE_STD, SETUP_FAILED, WITHHELD_METRICS
from privacy.accounting.client_level import add_gaussian_noise

NDArrays = list[np.ndarray]


class _Refused(Exception):
    """Carries the handler's Error reply around `secaggplus_mod`."""

    def __init__(self, reply: Message) -> None:
        super().__init__(reply.error.reason)
        self.reply = reply


def aggregation_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Route a train message: SecAgg+ when the server runs it, client-side clipping under plain
    client-dp, else straight to the handler."""
    if msg.metadata.message_type != MessageType.TRAIN:
        return call_next(msg, context)
    if RECORD_KEY_CONFIGS in msg.content.config_records:
        return _secaggplus(msg, context, call_next)
    config = msg.content.config_records.get("config", ConfigRecord())
    if KEY_CLIPPING_NORM in config:
        mod = adaptiveclipping_mod if CLIPPED_COUNT_NOISE_STD in config else fixedclipping_mod
        return mod(msg, context, call_next)
    return call_next(msg, context)


def _secaggplus(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Flower's `secaggplus_mod` around the bridged handler; a refusal comes back as the handler's Error."""
    try:
        reply = secaggplus_mod(msg, context, _bridged(call_next))
    except _Refused as refusal:
        return Message(refusal.reply.error, reply_to=msg)
    if not reply.has_error() and "fitres.num_examples" in reply.content.metric_records:
        # The weight is inside the masked vector; the legacy FitRes field would show it in the clear.
        reply.content.metric_records["fitres.num_examples"] = MetricRecord({"num_examples": 0})
    return reply


def _bridged(call_next: ClientAppCallable) -> ClientAppCallable:
    """The handler as `secaggplus_mod` expects it: legacy FitIns in, legacy FitRes (the update) out."""

    def train(msg: Message, context: Context) -> Message:
        fitins = compat.recorddict_to_fitins(msg.content, keep_input=True)
        config = ConfigRecord(dict(fitins.config))
        names = str(config.pop(ARRAY_KEYS)).split(",")
        global_ndarrays = parameters_to_ndarrays(fitins.parameters)
        msg.content["arrays"] = ArrayRecord({name: Array(a) for name, a in zip(names, global_ndarrays)})
        msg.content["config"] = config
        reply = call_next(msg, context)
        if reply.has_error():
            raise _Refused(reply)
        new_ndarrays = reply.content.array_records["arrays"].to_numpy_ndarrays()
        update = [np.subtract(new, old) for new, old in zip(new_ndarrays, global_ndarrays)]
        metrics = dict(reply.content.metric_records["metrics"])
        weight = int(cast(int, metrics["num-examples"]))
        max_weight = float(cast(float, context.state.config_records[RECORD_KEY_STATE]["max_weight"]))
        if KEY_CLIPPING_NORM not in config and weight > max_weight:
            reason = (f"client {int(cast(int, metrics['partition-id']))}: {weight} examples exceed "
                      f"secagg-max-weight={max_weight:g}: raise secagg-max-weight to at least the largest shard")
            raise _Refused(Message(Error(SETUP_FAILED, reason), reply_to=msg))
        if KEY_CLIPPING_NORM in config:
            clipping_norm = float(cast(float, config[KEY_CLIPPING_NORM]))
            unclipped = get_norm(update) <= clipping_norm
            privatize_update(update, clipping_norm, float(cast(float, config.get(NOISE_SHARE_STD, 0.0))))
            if CLIPPED_COUNT_NOISE_STD in config:
                update.append(unclipped_bit(unclipped, float(cast(float, config[CLIPPED_COUNT_NOISE_STD]))))
            weight = 1
        shown = {key: value for key, value in metrics.items() if key not in WITHHELD_METRICS}
        fitres = FitRes(Status(Code.OK, ""), ndarrays_to_parameters(update), weight, shown)  # type: ignore[arg-type]
        return Message(compat.fitres_to_recorddict(fitres, keep_input=False), reply_to=msg)

    return train


def unclipped_bit(unclipped: bool, noise_std: float) -> np.ndarray:
    """The one-entry array 1[update left unclipped] + N(0, noise_std^2) (OS entropy) that adaptive clipping
    sums under SecAgg+ (Andrew et al. 2021; privacy/accounting/client_level.py)."""
    bit = [np.array([float(unclipped)], dtype=np.float64)]
    add_gaussian_noise(bit, noise_std)
    return bit[0]


def privatize_update(update: NDArrays, clipping_norm: float, noise_std: float) -> None:
    """Clip `update` to L2 norm `clipping_norm` (Flower's FlatClip), then add N(0, noise_std^2) to each
    entry from a generator seeded by the OS (never by the run's seed). In place."""
    if get_norm(update) > clipping_norm:
        clip_inputs_inplace(update, clipping_norm)
    add_gaussian_noise(update, noise_std)
