"""The ClientApp: one epoch of local SGD on this node's shard, the new model sent back.

The shard is a file (scripts/flower/prepare_data.py writes them from Huddle's IID partition, with
the Huddle PyTorch client's data code): a SuperNode's node config names its own, `data-file`, as
a deployed client reads its local data; the simulation engine's virtual nodes, which have only
`partition-id` and `num-partitions`, read shard{I}_of{N}_seed{S}.npz from the run config's
`data-dir`. Each ClientApp process loads a shard once (a simulation worker serves several nodes).
"""
import os
import time

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from flower_fmnist.task import load_npz, network_for, train

# 10 clients share 2 cores; the Huddle PyTorch clients run with --threads 1 too.
torch.set_num_threads(1)

app = ClientApp()
_shards: dict = {}


def _process_age_s() -> float:
    """Seconds since this process started (a SuperNode starts a ClientApp process per message)."""
    with open("/proc/self/stat", encoding="utf-8") as f:
        start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime", encoding="utf-8") as f:
        uptime = float(f.read().split()[0])
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


def _shard_file(context: Context) -> str:
    node, run = context.node_config, context.run_config
    path = str(node.get("data-file", ""))
    if not path:
        path = os.path.join(str(run["data-dir"]),
                            f"shard{int(node['partition-id'])}_of{int(node['num-partitions'])}"
                            f"_seed{int(run['seed'])}.npz")
    return path


@app.train()
def train_fn(msg: Message, context: Context) -> Message:
    age_at_call = _process_age_s()
    path = _shard_file(context)
    if path not in _shards:
        x, y = load_npz(path, "x", "y")
        _shards[path] = (torch.from_numpy(x), torch.from_numpy(y))
    x, y = _shards[path]
    cfg = msg.content["config"]
    state = msg.content["arrays"].to_torch_state_dict()
    net = network_for([(name, tuple(t.shape)) for name, t in state.items()])
    net.load_state_dict(state)
    # This client's seed for the round (Huddle's coordinator sends each client one per round).
    partition = int(context.node_config.get("partition-id", 0))
    seed = (int(cfg["seed"]) * 1_000_003 + int(cfg["server-round"]) * 1009 + partition) % 2**63
    began = time.perf_counter()
    loss, accuracy = train(net, x, y, epochs=int(cfg["local-epochs"]),
                           batch_size=int(cfg["batch-size"]),
                           learning_rate=float(cfg["learning-rate"]),
                           momentum=float(cfg["momentum"]), seed=seed)
    train_s = time.perf_counter() - began
    content = RecordDict({
        "arrays": ArrayRecord(net.state_dict()),
        "metrics": MetricRecord({"train_loss": loss, "train_accuracy": accuracy,
                                 "num-examples": len(y), "train_s": train_s,
                                 "process_age_at_call_s": age_at_call}),
    })
    return Message(content=content, reply_to=msg)
