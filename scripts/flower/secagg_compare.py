#!/usr/bin/env python3
"""Driver of issue 21's peer figure: what secure aggregation costs a round, Flower's SecAgg+ beside
Huddle's, at the same sizes (N clients, a model of `params` float32 values, every client in every
round, SecAgg+ of the same degree and threshold), each against its own plain round in the same run.

Columns (--only picks some):
  flower-sim-plain, flower-sim-secagg
      Flower 1.42's simulation engine (a local simulation SuperLink, Ray; each virtual client given
      one CPU): the Flower App in scripts/flower/secagg_app, FedAvg through Flower's default fit
      workflow or SecAggPlusWorkflow (num_shares k + 1, reconstruction_threshold t). The clients'
      "training" adds N(0, 1e-3) noise to the model: the round is the framework and the protocol.
  flower-deploy-plain, flower-deploy-secagg
      the same under the deployment engine: flower-superlink and N flower-supernode processes
      (--insecure). Heavy: N Python processes, each with its ClientApp process.
  huddle-plain, huddle-secagg
      build/bench/coordinator_rss: `huddle coordinator` and N `huddle client` processes over
      CurveZMQ, a 784-1262-10 MLP (1,003,300 parameters) trained on 8 rows (negligible), with
      and without secure_aggregation (Huddle picks k and t; every update clipped to norm 10).

For each: the rounds' wall time (Flower: between the ServerApp's aggregates; Huddle: metrics.jsonl's
duration_s), the server's CPU seconds per round (Flower: the ServerApp process, where its SecAgg+
server runs, median over rounds 2..; Huddle: the coordinator process over the whole run, per round)
and the server side's peak memory (Flower's simulation: the SuperLink's process tree, Ray and the
virtual clients included; Huddle: the coordinator). OUT/table.md and
OUT/<column>/result.json. Tooling only; scripts/flower_secagg_compare.sh runs it in .venv-flower.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

from compare import (Launcher, MemorySampler, ROOT, _tree, flower_env, free_port, fresh_dir,
                     read_jsonl, wait_flower, wait_port)

APP = Path(__file__).resolve().parent / "secagg_app"


def flower(args, secagg: bool, deploy: bool, out: Path) -> dict:
    out = fresh_dir(out)
    port = free_port()
    env = flower_env(out / "flwr_home", f"127.0.0.1:{port}")
    metrics = out / "rounds.jsonl"
    overrides = (f"num-server-rounds={args.rounds} num-clients={args.clients} "
                 f"params={args.params} secagg={'true' if secagg else 'false'} "
                 f"num-shares={args.neighbours + 1} reconstruction-threshold={args.threshold} "
                 f'metrics-out="{metrics}"')
    launcher = Launcher(out / "logs")
    roots: dict[str, list[int]] = {"server": [], "clients": []}
    sampler = MemorySampler({"server": lambda kids: _tree(roots["server"], kids),
                             "clients": lambda kids: _tree(roots["clients"], kids)})
    sampler.start()
    try:
        link_args = ["flower-superlink", "--insecure", "--host", "127.0.0.1", "--port", str(port),
                     "--disable-runtime-dependency-installation"]
        if not deploy:
            link_args.insert(2, "--simulation")
            (out / "flwr_home" / "config.toml").write_text(
                '[superlink]\ndefault = "sim"\n\n[superlink.sim]\n'
                f'address = "127.0.0.1:{port}"\ninsecure = true\n', encoding="utf-8")
        link = launcher.start("superlink", link_args, env=env)
        roots["server"].append(link.pid)
        wait_port(port, 120, link)
        run = ["flwr", "run", str(APP), "deploy" if deploy else "sim", "-c", overrides, "--stream"]
        if deploy:
            for i in range(args.clients):
                node = launcher.start(f"supernode{i}", [
                    "flower-supernode", "--insecure", "--superlink", f"127.0.0.1:{port}",
                    "--port", str(free_port())], env=env)
                roots["clients"].append(node.pid)
        else:
            run += ["--federation-config",
                    f"num-supernodes={args.clients} client-resources-num-cpus=1"]
        cli = launcher.start("flwr_run", run, env=env)
        wait_flower(args, link, cli, metrics)
        sampler.sample()
    finally:
        sampler.stop()
        launcher.stop_all()
    lines = read_jsonl(metrics)
    rounds = [lines[i]["t_end"] - lines[i - 1]["t_end"] for i in range(1, len(lines))]
    cpu = [lines[i]["cpu_s"] - lines[i - 1]["cpu_s"] for i in range(1, len(lines))]
    memory = sampler.report()
    return {"column": out.name, "round_s": rounds, "server_app_cpu_s_per_round": cpu,
            "server_cpu_s": memory["server"]["cpu_s"], "memory": memory}


def huddle(args, secagg: bool, out: Path) -> dict:
    out = fresh_dir(out)
    cmd = [str(ROOT / "build" / "bench" / "coordinator_rss"), "--clients", str(args.clients),
           "--rounds", str(args.rounds), "--encrypted", "1", "--secagg", "1" if secagg else "0",
           "--idle-s", "1"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout_s)
    (out / "coordinator_rss.log").write_text(p.stdout + p.stderr, encoding="utf-8")
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr[-2000:]}")
    text = p.stdout
    rounds = [float(x) for x in re.search(r"round wall time \(s\):(.*)", text).group(1).split()]
    cpu = float(re.search(r"CPU time: [\d.]+ s in all, ([\d.]+) s per round", text).group(1))
    peak = float(re.search(r"rounds, .* peak RSS ([\d.]+) MiB", text).group(1))
    return {"column": out.name, "round_s": rounds, "server_cpu_s_per_round": cpu,
            "coordinator_peak_rss_mib": peak, "log": text}


def row(r: dict, rounds: int) -> str:
    steady = statistics.median(r["round_s"][1:] or r["round_s"])
    cpu = r.get("server_cpu_s_per_round")
    if cpu is None:  # Flower: the ServerApp process's own CPU time, rounds 2.. (median)
        per_round = r["server_app_cpu_s_per_round"]
        cpu = statistics.median(per_round[1:] or per_round)
    mem = r.get("coordinator_peak_rss_mib")
    if mem is None:
        mem = r["memory"]["server"]["peak_sum_rss_mib"]
    return (f"| {r['column']} | {steady:.2f} | {' / '.join(f'{x:.2f}' for x in r['round_s'])} | "
            f"{cpu:.2f} | {mem:.0f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "runs" / "flower_secagg"))
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--params", type=int, default=1003300)
    ap.add_argument("--neighbours", type=int, default=24)
    ap.add_argument("--threshold", type=int, default=13)
    ap.add_argument("--timeout-s", type=float, default=3600)
    ap.add_argument("--only", default="huddle-plain huddle-secagg flower-sim-plain "
                                      "flower-sim-secagg")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for column in args.only.split():
        print(f"== {column}", flush=True)
        if column.startswith("huddle"):
            r = huddle(args, column.endswith("secagg"), out / column)
        else:
            r = flower(args, column.endswith("secagg"), "deploy" in column, out / column)
        (out / column / "result.json").write_text(json.dumps(r, indent=2), encoding="utf-8")
        print(row(r, args.rounds), flush=True)
        results.append(r)
    table = ["| column | median round (s) | rounds (s) | server CPU s / round | server peak "
             "memory (MiB) |", "|---|---|---|---|---|"]
    table += [row(r, args.rounds) for r in results]
    (out / "table.md").write_text("\n".join(table) + "\n", encoding="utf-8")
    print("\n".join(table))


if __name__ == "__main__":
    sys.exit(main())
