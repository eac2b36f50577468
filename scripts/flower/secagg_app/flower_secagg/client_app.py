"""The ClientApp: returns the global model plus a small random update (N(0, 1e-3) per value), what
a client sends after training, without the training; when the server runs SecAggPlusWorkflow, its
messages carry the SecAgg+ configs and Flower's secaggplus_mod quantizes and masks the update."""
import numpy as np
from flwr.client import ClientApp, NumPyClient
from flwr.client.mod import secaggplus_mod
from flwr.common import Context


class UpdateClient(NumPyClient):
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def fit(self, parameters, config):
        out = [p + self.rng.normal(0.0, 1e-3, p.shape).astype(np.float32) for p in parameters]
        return out, 100, {}


def client_fn(context: Context):
    return UpdateClient(int(context.node_id) % (2**32)).to_client()


def secaggplus_if_asked(msg, ctxt, call_next):
    """Flower's SecAgg+ client mod for the secure column's messages, the plain path otherwise."""
    if "secaggplus_configs" in msg.content.config_records:
        return secaggplus_mod(msg, ctxt, call_next)
    return call_next(msg, ctxt)


app = ClientApp(client_fn=client_fn, mods=[secaggplus_if_asked])
