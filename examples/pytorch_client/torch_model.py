"""The PyTorch side of the example, without the binding: the networks, the local training loop
and the evaluation. client.py wraps them in a huddle_client.Trainer; the Flower App of Huddle's
peer comparison (scripts/flower/) imports this very module, so both frameworks run the same code.

Huddle's tensors have PyTorch's layouts (conv weight [out, in, k, k], dense weight [out, in],
bias [out]; flatten in C order) and its order: each layer's weight, then its bias, layer by
layer, as state_dict() lists them. network_for() picks the network whose tensors a job has.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn


class Cnn(nn.Module):
    """examples/fashion_mnist_cnn.yaml's model, layer for layer: conv2d 16 k5 p2 > relu >
    max_pool2d 2 > conv2d 32 k5 p2 > relu > max_pool2d 2 > flatten > dense 128 > relu > dense
    10."""

    def __init__(self):
        super().__init__()
        self.conv0 = nn.Conv2d(1, 16, kernel_size=5, padding=2)
        self.conv1 = nn.Conv2d(16, 32, kernel_size=5, padding=2)
        self.fc0 = nn.Linear(32 * 7 * 7, 128)
        self.fc1 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv0(x)), 2)
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = torch.flatten(x, 1)
        return self.fc1(F.relu(self.fc0(x)))


class Mlp(nn.Module):
    """Huddle's `model: {kind: mlp, hidden: [...]}` (examples/fashion_mnist.yaml: 784-128-10):
    flatten > dense > relu > ... > dense, the layers named fc0, fc1, ... as Huddle names them."""

    def __init__(self, sizes: Sequence[int]):
        super().__init__()
        if len(sizes) < 2:
            raise ValueError(f"an MLP needs an input and an output size, got {list(sizes)}")
        self.sizes = list(sizes)
        for i in range(len(sizes) - 1):
            self.add_module(f"fc{i}", nn.Linear(sizes[i], sizes[i + 1]))

    def forward(self, x):
        x = torch.flatten(x, 1)
        layers = list(self.children())
        for i, layer in enumerate(layers):
            x = layer(x)
            if i + 1 < len(layers):
                x = F.relu(x)
        return x


def _shapes(net: nn.Module) -> list[tuple[str, tuple]]:
    return [(name, tuple(t.shape)) for name, t in net.state_dict().items()]


def network_for(tensors: Sequence[tuple[str, Sequence[int]]]) -> nn.Module:
    """The network whose tensors are `tensors` ((name, shape) in the job's order): the CNN, or an
    MLP when every tensor is a dense layer's (fcK.weight [out, in], fcK.bias [out], chained).
    Raises ValueError naming the first tensor that fits neither."""
    theirs = [(name, tuple(shape)) for name, shape in tensors]
    cnn = _shapes(Cnn())
    if [s for _, s in theirs] == [s for _, s in cnn]:
        return Cnn()
    sizes = []
    for i in range(0, len(theirs), 2):
        (w_name, w), bias = theirs[i], theirs[i + 1] if i + 1 < len(theirs) else (None, None)
        if len(w) != 2 or bias[1] != (w[0],) or (sizes and sizes[-1] != w[1]):
            raise ValueError(f"tensor {i} ('{w_name}' {list(w)}) fits neither this example's CNN "
                             f"({', '.join(f'{n} {list(s)}' for n, s in cnn)}) nor a chain of "
                             "dense layers (weight [out, in], bias [out])")
        if not sizes:
            sizes.append(w[1])
        sizes.append(w[0])
    return Mlp(sizes)


def describe(net: nn.Module) -> str:
    """'the CNN' or 'an MLP 784-128-10'."""
    if isinstance(net, Mlp):
        return "an MLP " + "-".join(str(s) for s in net.sizes)
    return "the CNN"


def train(net: nn.Module, x: torch.Tensor, y: torch.Tensor, *, epochs: int, batch_size: int,
          learning_rate: float, momentum: float, weight_decay: float = 0.0,
          seed: int = 0) -> tuple[float, float]:
    """`epochs` of SGD with momentum (fresh every call) over shuffled minibatches, the order from
    torch.randperm seeded with `seed`, the last minibatch short; mean cross-entropy. Returns
    (mean training loss, training accuracy)."""
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
    """(mean cross-entropy, accuracy) over (x, y), in batches of 1000."""
    net.eval()
    total_loss, correct = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(y), 1000):
            logits = net(x[start:start + 1000])
            total_loss += F.cross_entropy(logits, y[start:start + 1000], reduction="sum").item()
            correct += (logits.argmax(1) == y[start:start + 1000]).sum().item()
    return total_loss / len(y), correct / len(y)
