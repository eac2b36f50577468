"""The ServerApp: FedAvg over every client each round, through SecAggPlusWorkflow (run config
`secagg = true`) or Flower's default fit workflow, from a zero model of `params` float32 values.

When `metrics-out` is set, one JSON line per round goes there when the round's aggregate is done:
`round`, `t_end` (time.time()) and `cpu_s` (this process's CPU time so far: the ServerApp's work,
the protocol's server side included); round 0 marks the start."""
import json
import time

import numpy as np
from flwr.common import Context, ndarrays_to_parameters
from flwr.server import Grid, LegacyContext, ServerApp, ServerConfig
from flwr.server.strategy import FedAvg
from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow

app = ServerApp()


class TimedFedAvg(FedAvg):
    def __init__(self, out, **kwargs):
        super().__init__(**kwargs)
        self.out = out

    def mark(self, server_round: int) -> None:
        if self.out:
            self.out.write(json.dumps({"round": server_round, "t_end": time.time(),
                                       "cpu_s": time.process_time()}) + "\n")
            self.out.flush()

    def aggregate_fit(self, server_round, results, failures):
        aggregated = super().aggregate_fit(server_round, results, failures)
        if failures:
            raise RuntimeError(f"round {server_round}: {len(failures)} failures")
        self.mark(server_round)
        return aggregated


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    n = int(cfg["num-clients"])
    out_path = str(cfg["metrics-out"])
    out = open(out_path, "a", encoding="utf-8") if out_path else None
    strategy = TimedFedAvg(
        out, fraction_fit=1.0, fraction_evaluate=0.0, min_fit_clients=n, min_available_clients=n,
        initial_parameters=ndarrays_to_parameters([np.zeros(int(cfg["params"]), np.float32)]))
    legacy = LegacyContext(context=context,
                           config=ServerConfig(num_rounds=int(cfg["num-server-rounds"])),
                           strategy=strategy)
    fit = None
    if bool(cfg["secagg"]):
        fit = SecAggPlusWorkflow(num_shares=int(cfg["num-shares"]),
                                 reconstruction_threshold=int(cfg["reconstruction-threshold"]))
    strategy.mark(0)
    DefaultWorkflow(fit_workflow=fit)(grid, legacy)
