"""The Flower App's model code (issue 20's comparison; tooling only, never a dependency of Huddle).

The networks, the local training loop and the evaluation are examples/pytorch_client/torch_model.py,
the very module the Huddle PyTorch clients (client.py) run: the driver (scripts/flower/compare.py)
puts examples/pytorch_client on the PYTHONPATH of the SuperLink and SuperNodes, whose ServerApp and
ClientApp processes inherit it. This file adds only what Flower's side needs: reading the data and
initial-model files that scripts/flower/prepare_data.py writes (with examples/pytorch_client/
fmnist_data.py, the data code of the Huddle PyTorch clients) and loading weights by order.
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np
import torch
from torch import nn

try:
    from torch_model import evaluate, network_for, train
except ImportError as e:
    raise ImportError(f"{e}: the Flower App needs examples/pytorch_client on PYTHONPATH "
                      "(scripts/flower/compare.py sets it)") from None

__all__ = ["evaluate", "load_model_npz", "load_npz", "network_for", "network_from", "set_weights",
           "train"]


def load_npz(path: str, *keys: str) -> tuple:
    with np.load(path) as f:
        return tuple(f[k] for k in keys)


def load_model_npz(path: str) -> list[np.ndarray]:
    """w0, w1, ... of an initial-model file (prepare_data.py), in the model's tensor order."""
    with np.load(path) as f:
        return [f[f"w{i}"] for i in range(len(f.files))]


def network_from(weights: list[np.ndarray]) -> nn.Module:
    """The network with these tensors (torch_model.network_for), holding them."""
    net = network_for([(f"w{i}", w.shape) for i, w in enumerate(weights)])
    set_weights(net, weights)
    return net


def set_weights(net: nn.Module, weights: list[np.ndarray]) -> None:
    keys = list(net.state_dict().keys())
    if len(keys) != len(weights):
        raise ValueError(f"{len(weights)} tensors for a network of {len(keys)}")
    net.load_state_dict(OrderedDict((k, torch.from_numpy(np.ascontiguousarray(w)))
                                    for k, w in zip(keys, weights)), strict=True)
