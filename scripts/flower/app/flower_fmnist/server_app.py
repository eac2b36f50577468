"""The ServerApp: FedAvg over all 10 SuperNodes every round, evaluation on the 10k test set.

Mirrors the Huddle coordinator of examples/fashion_mnist_cnn.yaml (run config `model = "cnn"`) or of
the quickstart, examples/fashion_mnist.yaml (`model = "mlp"`; same recipe): every client trains
every round (fraction_train 1.0; Huddle's `cohort: {sampling: fixed, size: 10}`), the update is the
example-weighted mean of the clients' models (FedAvg; Huddle's `server: {learning_rate: 1.0}`), no
client-side evaluation (fraction_evaluate 0.0), and the server evaluates the new global model on the
test set after every round (Huddle's `evaluation: {every: 1}`). It starts from the model Huddle's
coordinator starts from, and reads the test set, from the run config's `data-dir`
(init_{model}_seed{S}.npz and test.npz, written by scripts/flower/prepare_data.py); the network is
the one with the initial model's tensors (task.network_from).

When the run config's `metrics-out` is set, one JSON line per round goes there: `round`,
`t_end` (time.time() after the round's evaluation: the round's end, like Huddle's elapsed_s),
`eval_s`, `test_accuracy`, `test_loss`, `clients` (the aggregated training metrics, with the
clients' mean and max `train_s` and `process_age_at_call_s`); round 0 marks the start of round 1.
"""
import json
import os
import time

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg
from flwr.serverapp.strategy.strategy_utils import aggregate_metricrecords

from flower_fmnist.task import evaluate, load_model_npz, load_npz, network_from

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    # Huddle's coordinator evaluates on one worker thread; so does this.
    torch.set_num_threads(1)
    cfg = context.run_config
    rounds = int(cfg["num-server-rounds"])
    clients = int(cfg["num-clients"])
    seed = int(cfg["seed"])
    out_path = str(cfg["metrics-out"])
    out = open(out_path, "a", encoding="utf-8") if out_path else None

    data = str(cfg["data-dir"])
    init = os.path.join(data, f"init_{cfg['model']}_seed{seed}.npz")
    net = network_from(load_model_npz(init))
    x_test, y_test = (torch.from_numpy(a) for a in load_npz(os.path.join(data, "test.npz"),
                                                             "x", "y"))

    def central_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        t0 = time.time()
        if server_round == 0:  # Huddle does not evaluate the initial model
            if out:
                out.write(json.dumps({"round": 0, "t_end": t0}) + "\n")
                out.flush()
            return None
        net.load_state_dict(arrays.to_torch_state_dict())
        loss, accuracy = evaluate(net, x_test, y_test)
        t1 = time.time()
        if out:
            out.write(json.dumps({"round": server_round, "t_end": t1, "eval_s": t1 - t0,
                                  "test_accuracy": accuracy, "test_loss": loss,
                                  "clients": dict(pending)}) + "\n")
            pending.clear()
            out.flush()
        return MetricRecord({"accuracy": accuracy, "loss": loss})

    def train_metrics(records: list, weight_key: str) -> MetricRecord:
        """FedAvg's weighted means, plus the clients' mean and max training time and ClientApp
        process age when called (start-up: process spawn, imports) for the round's record."""
        agg = aggregate_metricrecords(records, weight_key)
        for key in ("train_s", "process_age_at_call_s"):
            values = [float(r["metrics"][key]) for r in records if key in r["metrics"]]
            if values:
                agg[f"{key}_mean"] = sum(values) / len(values)
                agg[f"{key}_max"] = max(values)
        pending.update(agg)
        return agg

    pending: dict = {}
    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=clients,
                      min_evaluate_nodes=0, min_available_nodes=clients,
                      train_metrics_aggr_fn=train_metrics)
    strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(net.state_dict()),
        num_rounds=rounds,
        train_config=ConfigRecord({
            "seed": seed,
            "local-epochs": int(cfg["local-epochs"]),
            "batch-size": int(cfg["batch-size"]),
            "learning-rate": float(cfg["learning-rate"]),
            "momentum": float(cfg["momentum"]),
        }),
        evaluate_fn=central_evaluate,
    )
    if out:
        out.close()
