"""The network, the local training and the evaluation of the Flower App (issue 20's comparison).

Tooling only, never a dependency of Huddle. They are examples/pytorch_client/client.py's, line
for line: the CNN of examples/fashion_mnist_cnn.yaml (client.py's Cnn), client.py's
TorchTrainer._train (config.epochs of SGD with momentum over a torch.randperm order seeded with
the round's seed, the last minibatch short, mean cross-entropy, fresh momentum every round) and its
evaluate (mean cross-entropy and accuracy in batches of 1000). They are a copy because client.py
has them only as methods of a huddle_client.Trainer subclass in a module that needs the
huddle_client binding to import; see docs/peers/flower.md.

The data (each client's shard of Huddle's IID partition, the test set) and the initial model
(Huddle's InitModel) are files that scripts/flower/prepare_data.py writes with
examples/pytorch_client/fmnist_data.py, the data code the Huddle PyTorch clients run: this module
only reads them (load_npz).
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class Net(nn.Module):
    """conv2d 16 k5 p2 > relu > max_pool2d 2 > conv2d 32 k5 p2 > relu > max_pool2d 2 > flatten >
    dense 128 > relu > dense 10, with Huddle's tensor order and layouts (state_dict order)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv0 = nn.Conv2d(1, 16, kernel_size=5, padding=2)
        self.conv1 = nn.Conv2d(16, 32, kernel_size=5, padding=2)
        self.fc0 = nn.Linear(32 * 7 * 7, 128)
        self.fc1 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv0(x)), 2)
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = torch.flatten(x, 1)
        return self.fc1(F.relu(self.fc0(x)))


def load_npz(path: str, *keys: str) -> tuple:
    with np.load(path) as f:
        return tuple(f[k] for k in keys)


def set_weights(net: nn.Module, weights: list[np.ndarray]) -> None:
    keys = list(net.state_dict().keys())
    if len(keys) != len(weights):
        raise ValueError(f"{len(weights)} tensors for a network of {len(keys)}")
    net.load_state_dict(OrderedDict((k, torch.from_numpy(np.ascontiguousarray(w)))
                                    for k, w in zip(keys, weights)), strict=True)


def train(net: nn.Module, x: torch.Tensor, y: torch.Tensor, *, epochs: int, batch_size: int,
          learning_rate: float, momentum: float, weight_decay: float = 0.0,
          seed: int = 0) -> tuple[float, float]:
    """client.py's TorchTrainer._train: (mean training loss, training accuracy)."""
    torch.manual_seed(seed)
    shuffle = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.SGD(net.parameters(), lr=learning_rate, momentum=momentum,
                                weight_decay=weight_decay)
    net.train()
    n = len(y)
    total_loss, correct, seen = 0.0, 0, 0
    for _ in range(epochs):
        order = torch.randperm(n, generator=shuffle)
        for start in range(0, n, batch_size):
            rows = order[start:start + batch_size]
            xb, yb = x[rows], y[rows]
            optimizer.zero_grad(set_to_none=True)
            logits = net(xb)
            loss = F.cross_entropy(logits, yb)
            loss.backward()
            optimizer.step()
            total_loss += loss.item() * len(rows)
            correct += (logits.argmax(1) == yb).sum().item()
            seen += len(rows)
    return total_loss / seen, correct / seen


def evaluate(net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """client.py's TorchTrainer.evaluate: (mean cross-entropy, accuracy)."""
    net.eval()
    total_loss, correct = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(y), 1000):
            logits = net(x[start:start + 1000])
            total_loss += F.cross_entropy(logits, y[start:start + 1000], reduction="sum").item()
            correct += (logits.argmax(1) == y[start:start + 1000]).sum().item()
    return total_loss / len(y), correct / len(y)
