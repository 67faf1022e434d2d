"""The ClientApp under client-level DP without SecAgg+: Flower's fixedclipping_mod (routed by
client/secagg_plus.py) clips every update to C; the server adds the noise afterwards."""

from __future__ import annotations

from flwr.app import ArrayRecord
from flwr.supercore.differential_privacy import KEY_CLIPPING_NORM, get_norm

from client.client_app import app as client_app
from dirichlet_fl.config import RunConfig
from dirichlet_fl.data.split import federated_split
from dirichlet_fl.models.run_model import initial_model
from tests.helpers import client_context, train_message


def test_every_update_is_clipped_to_c_before_noising(single_torch_thread: None) -> None:
    """The real ClientApp (Dirichlet training on digits), two rounds."""
    context = client_context({"local-steps": 3, "partitioner": "iid"}, partition_id=0, num_partitions=2)
    config = RunConfig.from_run_config(context.run_config)
    model = initial_model(config, federated_split(config.split_spec(2)).data)
    arrays = ArrayRecord(model.state_dict())
    clipping_norm = 0.01
    for server_round in (1, 2):
        message = train_message(arrays, server_round)
        message.content.config_records["config"][KEY_CLIPPING_NORM] = clipping_norm
        reply = client_app(message, context)
        new = reply.content.array_records["arrays"].to_numpy_ndarrays()
        update = [a - b for a, b in zip(new, arrays.to_numpy_ndarrays())]
        assert 0 < get_norm(update) <= clipping_norm * (1 + 1e-5)
