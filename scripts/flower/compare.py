#!/usr/bin/env python3
"""Driver of issue 20's peer comparison: the same PyTorch job under Flower and under Huddle.

The job (--model): cnn, examples/fashion_mnist_cnn.yaml's; mlp, the quickstart's
(examples/fashion_mnist.yaml, MLP 784-128-10). Both: 10 IID clients, 1 local epoch of SGD (batch
32, lr 0.02, momentum 0.9), FedAvg over all 10 every round, server evaluation on the 10k test set.
Every PyTorch column runs examples/pytorch_client/torch_model.py's network and training loop.

Tooling only, never a dependency of Huddle; scripts/flower_compare.sh runs it inside .venv-flower
(flwr pinned there; torch and numpy from Debian). Each subcommand runs one federation on
127.0.0.1, samples the processes' memory and CPU time from /proc every 0.2 s (keeping them all at
the driver's niceness), and writes OUT/result.json:

  flower-deploy    Flower's deployment engine: flower-superlink, one flower-supernode per client
                   (each with its shard), the Flower App in scripts/flower/app submitted with
                   `flwr run` (--insecure everywhere: plaintext HTTP on 127.0.0.1)
  flower-sim       Flower's simulation engine (`flwr run` against a local simulation SuperLink,
                   Ray backend), for reference only: one process pool, not a process federation
  huddle-pytorch   examples/pytorch_client/run.sh: `huddle coordinator` + 10 Python clients
                   (PyTorch through the huddle_client binding)
  huddle-builtin   `huddle run` of the job with `rounds` overridden: the coordinator + 10
                   built-in C++ client processes
  table            the Markdown table of several result.json files

result.json: per round `round`, `t_end` (wall clock at the round's end, after the server's
evaluation), `round_s` (since the previous round's end; round 1: Flower since the strategy started, Huddle
since the coordinator started, waiting for clients included), `test_accuracy`, `test_loss`;
`t_launch` (when the first process was started); `launch_to_last_round_s` (from starting the first
process to the last round's end), `total_s` (from the first process started to all exited),
`steady_round_s` (median round_s over rounds 2..N), `rounds_per_min` (60 / steady_round_s),
`memory`: for the `server` and `clients` groups, per process the peak VmHWM read, their sum, the
peak of the summed VmRSS over samples (the group's simultaneous peak), and the group's CPU seconds
(user + system, as last sampled every 0.2 s); `load_avg_before` / `load_avg_after` (the machine's
load averages: on a shared machine, other work slows every column).

The Huddle rounds' `t_end` is when the driver saw the round's line in metrics.jsonl (0.2 s
resolution); their `round_s` comes from metrics.jsonl's `elapsed_s`.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
APP = HERE / "app"
DATA = "/usr/share/datasets/fashion-mnist"
# --model: the Huddle job whose network and recipe every column runs.
JOBS = {"cnn": ROOT / "examples" / "fashion_mnist_cnn.yaml",
        "mlp": ROOT / "examples" / "fashion_mnist.yaml"}
LOAD_BEFORE = os.getloadavg()  # the machine's load when this run began (others may share it)


# ---------------------------------------------------------------------------------------------
# Processes and memory

def _status(pid: int) -> dict[str, str]:
    out = {}
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as f:
            for line in f:
                k, _, v = line.partition(":")
                out[k] = v.strip()
    except OSError:
        pass
    return out


def _kb(v: str | None) -> int:
    return int(v.split()[0]) if v else 0


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _cpu_ticks(pid: int) -> int:
    """utime + stime of a process, in clock ticks."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return 0


def _children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", encoding="utf-8") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(d))
    return kids


def _tree(roots: list[int], kids: dict[int, list[int]]) -> list[int]:
    out, todo = [], list(roots)
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


class MemorySampler:
    """Samples named groups of process trees: per process peak VmHWM, per group peak sum of RSS.

    `groups` maps a name to a function returning the group's member pids (called each sample), so
    groups can be defined by role (e.g. the `huddle coordinator` process under `huddle run`)."""

    def __init__(self, groups, interval_s: float = 0.2, niceness: int | None = None):
        self.groups = groups
        # Every sampled process is kept at this niceness (the driver's): scripts that `nice` their
        # own children (examples/pytorch_client/run.sh does) would otherwise run them at a lower
        # priority than the other columns' processes on a shared machine.
        self.niceness = os.nice(0) if niceness is None else niceness
        self.interval_s = interval_s
        self.procs: dict[str, dict[int, dict]] = {g: {} for g in groups}
        self.peak_sum_rss_kb: dict[str, int] = {g: 0 for g in groups}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def sample(self) -> None:
        kids = _children_map()
        for name, members in self.groups.items():
            total = 0
            for pid in members(kids):
                st = _status(pid)
                if not st:
                    continue
                try:
                    if os.getpriority(os.PRIO_PROCESS, pid) != self.niceness:
                        os.setpriority(os.PRIO_PROCESS, pid, self.niceness)
                except OSError:
                    pass
                rss, hwm = _kb(st.get("VmRSS")), _kb(st.get("VmHWM"))
                total += rss
                rec = self.procs[name].setdefault(pid, {"pid": pid, "cmd": _cmdline(pid)[:160],
                                                        "peak_hwm_kb": 0, "cpu_ticks": 0})
                rec["peak_hwm_kb"] = max(rec["peak_hwm_kb"], hwm)
                rec["cpu_ticks"] = max(rec["cpu_ticks"], _cpu_ticks(pid))
            self.peak_sum_rss_kb[name] = max(self.peak_sum_rss_kb[name], total)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def report(self) -> dict:
        out = {}
        for name in self.groups:
            procs = sorted(self.procs[name].values(), key=lambda r: -r["peak_hwm_kb"])
            out[name] = {
                "processes": len(procs),
                "sum_peak_hwm_mib": round(sum(r["peak_hwm_kb"] for r in procs) / 1024, 1),
                "peak_sum_rss_mib": round(self.peak_sum_rss_kb[name] / 1024, 1),
                # CPU time (user + system) of the group's processes as last sampled: a process
                # that exits loses at most its last interval_s.
                "cpu_s": round(sum(r["cpu_ticks"] for r in procs) / os.sysconf("SC_CLK_TCK"), 1),
                "per_process": [{"cmd": r["cmd"], "peak_hwm_mib": round(r["peak_hwm_kb"] / 1024, 1),
                                 "cpu_s": round(r["cpu_ticks"] / os.sysconf("SC_CLK_TCK"), 2)}
                                for r in procs],
            }
        return out


class Launcher:
    """Starts processes in their own sessions and ends exactly those (their process groups)."""

    def __init__(self, logs: Path):
        self.logs = logs
        self.procs: list[subprocess.Popen] = []
        logs.mkdir(parents=True, exist_ok=True)

    def start(self, name: str, argv: list[str], env=None, cwd=None) -> subprocess.Popen:
        log = open(self.logs / f"{name}.log", "wb")
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                             start_new_session=True)
        self.procs.append(p)
        return p

    def stop_all(self, grace_s: float = 5.0) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.time() + grace_s
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                pass
        # Whatever is left of those groups (children that ignored SIGTERM).
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            if p.poll() is None:
                p.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited ({proc.returncode}) before listening on {port}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout_s} s")


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass  # a line being written
    return out


def summarize(kind: str, rounds: list[dict], t_launch: float, t_exit: float, memory: dict,
              extra: dict) -> dict:
    """rounds: [{round, t_end, test_accuracy, test_loss[, round_s]}] sorted by round."""
    prev = None
    for r in rounds:
        if prev is not None and "round_s" not in r:
            r["round_s"] = r["t_end"] - prev
        prev = r["t_end"]
    steady = [r["round_s"] for r in rounds if r["round"] >= 2 and "round_s" in r]
    steady_s = statistics.median(steady) if steady else None
    return {
        "kind": kind,
        "t_launch": t_launch,
        "rounds": rounds,
        "rounds_completed": len(rounds),
        "launch_to_last_round_s": round(rounds[-1]["t_end"] - t_launch, 2) if rounds else None,
        "total_s": round(t_exit - t_launch, 2),
        "steady_round_s": round(steady_s, 3) if steady_s else None,
        "steady_round_s_mean": round(statistics.mean(steady), 3) if steady else None,
        "rounds_per_min": round(60.0 / steady_s, 2) if steady_s else None,
        "final_test_accuracy": rounds[-1]["test_accuracy"] if rounds else None,
        "memory": memory,
        "load_avg_before": LOAD_BEFORE,
        "load_avg_after": os.getloadavg(),
        **extra,
    }


def write_result(out: Path, result: dict) -> None:
    (out / "result.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    r = result
    print(f"{r['kind']}: {r['rounds_completed']} rounds | steady {r['steady_round_s']} s/round "
          f"({r['rounds_per_min']} rounds/min) | launch->last round {r['launch_to_last_round_s']} s"
          f" | final acc {r['final_test_accuracy']} | server peak RSS "
          f"{r['memory']['server']['peak_sum_rss_mib']} MiB")


def fresh_dir(path: Path) -> Path:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


# ---------------------------------------------------------------------------------------------
# Flower

def prepare(args) -> dict:
    """Shards, test set and initial model files (prepare_data.py; cached across runs)."""
    sys.path.insert(0, str(HERE))
    import prepare_data  # noqa: E402  (uses examples/pytorch_client/fmnist_data.py)
    return prepare_data.prepare(Path(args.data_cache), args.clients, args.seed, DATA, args.model)


def flower_env(home: Path, superlink_address: str) -> dict:
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(
        '[superlink]\ndefault = "deploy"\n\n[superlink.deploy]\n'
        f'address = "{superlink_address}"\ninsecure = true\n', encoding="utf-8")
    env = dict(os.environ)
    env["FLWR_HOME"] = str(home)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    # The App imports examples/pytorch_client/torch_model.py, the Huddle PyTorch clients' network
    # and training code; the SuperLink's and SuperNodes' App processes inherit this.
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT / "examples" / "pytorch_client"), env.get("PYTHONPATH")) if p)
    return env


def run_overrides(args, metrics: Path) -> str:
    return (f'model="{args.model}" num-server-rounds={args.rounds} num-clients={args.clients} '
            f'seed={args.seed} metrics-out="{metrics}" data-dir="{args.data_cache}"')


def wait_flower(args, link: subprocess.Popen, cli: subprocess.Popen, metrics: Path) -> None:
    """Until the ServerApp has written the last round's line (and the run's CLI stream ended)."""
    deadline = time.time() + args.timeout_s
    while not [r for r in read_jsonl(metrics) if r.get("round") == args.rounds]:
        if link.poll() is not None:
            raise RuntimeError("flower-superlink exited; see logs/superlink.log")
        if cli.poll() is not None and not [r for r in read_jsonl(metrics)
                                           if r.get("round") == args.rounds]:
            raise RuntimeError(f"flwr run ended (exit {cli.returncode}) before round "
                               f"{args.rounds}; see logs/flwr_run.log")
        if time.time() > deadline:
            raise TimeoutError(f"no round {args.rounds} within {args.timeout_s} s")
        time.sleep(0.5)
    # Let the ServerApp finish (the CLI's stream ends with the run).
    try:
        cli.wait(timeout=60)
    except subprocess.TimeoutExpired:
        pass


def flower_rounds(metrics: Path) -> list[dict]:
    """The ServerApp's rounds; round 1's round_s counts from the strategy's start (round 0)."""
    lines = read_jsonl(metrics)
    rounds = [r for r in lines if r["round"] >= 1]
    start = [r for r in lines if r["round"] == 0]
    if rounds and start:
        rounds[0]["round_s"] = rounds[0]["t_end"] - start[0]["t_end"]
    return rounds


def run_flower_deploy(args) -> dict:
    out = fresh_dir(Path(args.out))
    shards = prepare(args)["shards"]
    port = free_port()
    env = flower_env(out / "flwr_home", f"127.0.0.1:{port}")
    metrics = out / "rounds.jsonl"
    launcher = Launcher(out / "logs")
    roots: dict[str, list[int]] = {"server": [], "clients": []}
    sampler = MemorySampler({
        "server": lambda kids: _tree(roots["server"], kids),
        "clients": lambda kids: _tree(roots["clients"], kids),
    })
    sampler.start()
    t_launch = time.time()
    try:
        link = launcher.start("superlink", [
            "flower-superlink", "--insecure", "--host", "127.0.0.1", "--port", str(port),
            "--disable-runtime-dependency-installation"], env=env)
        roots["server"].append(link.pid)
        wait_port(port, 120, link)
        for i in range(args.clients):
            node = launcher.start(f"supernode{i}", [
                "flower-supernode", "--insecure", "--superlink", f"127.0.0.1:{port}",
                "--port", str(free_port()),
                "--node-config",
                f'partition-id={i} num-partitions={args.clients} data-file="{shards[i]}"'],
                env=env)
            roots["clients"].append(node.pid)
        cli = launcher.start("flwr_run", ["flwr", "run", str(APP), "deploy", "-c",
                                          run_overrides(args, metrics), "--stream"], env=env)
        wait_flower(args, link, cli, metrics)
        sampler.sample()
    finally:
        sampler.stop()
        launcher.stop_all()
    t_exit = time.time()
    rounds = flower_rounds(metrics)
    result = summarize("flower-deployment", rounds, t_launch, t_exit, sampler.report(), {
        "model": args.model, "clients": args.clients,
        "transport": "Flower Fleet API, protobuf over HTTP/1.1, --insecure (no TLS)"})
    write_result(out, result)
    return result


def run_flower_sim(args) -> dict:
    """The simulation engine: `flwr run` against a local SuperLink in simulation mode."""
    out = fresh_dir(Path(args.out))
    prepare(args)
    port = free_port()
    env = flower_env(out / "flwr_home", f"127.0.0.1:{port}")
    # A simulation connection; `--federation-config` below: N virtual SuperNodes, each ClientApp
    # given 1 CPU by Ray (Flower's default is 2, which would run one client at a time here).
    (out / "flwr_home" / "config.toml").write_text(
        '[superlink]\ndefault = "sim"\n\n[superlink.sim]\n'
        f'address = "127.0.0.1:{port}"\ninsecure = true\n', encoding="utf-8")
    metrics = out / "rounds.jsonl"
    launcher = Launcher(out / "logs")
    roots: dict[str, list[int]] = {"server": []}
    sampler = MemorySampler({"server": lambda kids: _tree(roots["server"], kids)})
    sampler.start()
    t_launch = time.time()
    try:
        link = launcher.start("superlink", [
            "flower-superlink", "--insecure", "--simulation", "--host", "127.0.0.1",
            "--port", str(port), "--disable-runtime-dependency-installation"], env=env)
        roots["server"].append(link.pid)
        wait_port(port, 120, link)
        cli = launcher.start("flwr_run", [
            "flwr", "run", str(APP), "sim", "-c", run_overrides(args, metrics), "--stream",
            "--federation-config",
            f"num-supernodes={args.clients} client-resources-num-cpus=1"], env=env)
        roots["server"].append(cli.pid)
        wait_flower(args, link, cli, metrics)
        sampler.sample()
    finally:
        sampler.stop()
        launcher.stop_all()
    t_exit = time.time()
    rounds = flower_rounds(metrics)
    result = summarize("flower-simulation", rounds, t_launch, t_exit, sampler.report(), {
        "model": args.model, "clients": args.clients,
        "transport": "in-process (simulation engine, Ray)"})
    write_result(out, result)
    return result


# ---------------------------------------------------------------------------------------------
# Huddle

def _huddle_rounds(metrics: Path) -> list[dict]:
    rounds = []
    prev_elapsed = None
    for m in read_jsonl(metrics):
        r = {"round": m["round"], "elapsed_s": m.get("elapsed_s"),
             "duration_s": m.get("duration_s"), "test_accuracy": m.get("test_accuracy"),
             "test_loss": m.get("test_loss")}
        if m.get("elapsed_s") is not None:
            r["round_s"] = m["elapsed_s"] - (prev_elapsed if prev_elapsed is not None else 0.0)
            prev_elapsed = m["elapsed_s"]
        rounds.append(r)
    return rounds


def _attach_wall(rounds: list[dict], seen: dict[int, float]) -> None:
    """t_end: when the driver saw each round's metrics line appear (0.2 s resolution)."""
    for r in rounds:
        r["t_end"] = seen.get(r["round"], float("nan"))


def _watch_huddle(proc, metrics: Path, timeout_s: float, seen: dict[int, float]) -> None:
    deadline = time.time() + timeout_s
    while proc.poll() is None:
        for m in read_jsonl(metrics):
            seen.setdefault(m["round"], time.time())
        if time.time() > deadline:
            raise TimeoutError(f"the Huddle run did not end within {timeout_s} s")
        time.sleep(0.2)
    for m in read_jsonl(metrics):
        seen.setdefault(m["round"], time.time())


def _check_exit(proc, what: str, metrics: Path, rounds: int, log: Path) -> None:
    """A failed exit fails the measurement unless every round completed (then it is a warning:
    e.g. a launcher script edited while it ran fails after the federation's end)."""
    if proc.returncode == 0:
        return
    done = {m.get("round") for m in read_jsonl(metrics)}
    if set(range(1, rounds + 1)) <= done:
        print(f"warning: {what} exited {proc.returncode} after all {rounds} rounds; see {log}",
              file=sys.stderr)
        return
    raise RuntimeError(f"{what} exited {proc.returncode}; see {log}")


def _is_coordinator(pid: int) -> bool:
    cmd = _cmdline(pid).split()
    return len(cmd) >= 2 and cmd[0].endswith("huddle") and cmd[1] == "coordinator"


def _huddle_groups(root: list[int]):
    def server(kids):
        return [p for p in _tree(root, kids) if _is_coordinator(p)]

    def clients(kids):
        return [p for p in _tree(root, kids) if p not in root and not _is_coordinator(p)]
    return {"server": server, "clients": clients}


def run_huddle_builtin(args) -> dict:
    out = fresh_dir(Path(args.out))
    job = Path(args.job or JOBS[args.model]).read_text(encoding="utf-8")
    lines = [f"rounds: {args.rounds}" if ln.startswith("rounds:") else ln
             for ln in job.splitlines()]
    yaml = out / "job.yaml"
    yaml.write_text("\n".join(lines) + "\n", encoding="utf-8")
    run_dir = out / "run"
    root: list[int] = []
    sampler = MemorySampler(_huddle_groups(root))
    launcher = Launcher(out / "logs")
    argv = [args.huddle, "run", str(yaml), "--out", str(run_dir)] + (
        ["--insecure"] if args.insecure else [])
    seen: dict[int, float] = {}
    sampler.start()
    t_launch = time.time()
    try:
        proc = launcher.start("huddle_run", argv)
        root.append(proc.pid)
        _watch_huddle(proc, run_dir / "metrics.jsonl", args.timeout_s, seen)
        _check_exit(proc, "huddle run", run_dir / "metrics.jsonl", args.rounds,
                    out / "logs/huddle_run.log")
    finally:
        sampler.stop()
        launcher.stop_all()
    t_exit = time.time()
    rounds = _huddle_rounds(run_dir / "metrics.jsonl")
    _attach_wall(rounds, seen)
    result = summarize("huddle-builtin", rounds, t_launch, t_exit, sampler.report(), {
        "model": args.model, "clients": 10, "command": " ".join(argv),
        "transport": "ZeroMQ, " + ("plaintext (--insecure)" if args.insecure else
                                   "CurveZMQ (encrypted, authenticated; huddle run's default)"),
        "summary": json.loads((run_dir / "summary.json").read_text()) if (
            run_dir / "summary.json").exists() else None})
    # Huddle's own clock for the last round's end (elapsed_s from the coordinator's start).
    write_result(out, result)
    return result


def run_huddle_pytorch(args) -> dict:
    out = fresh_dir(Path(args.out))
    script = Path(args.example_dir) / "run.sh"
    if not script.exists():
        raise FileNotFoundError(f"no {script}: --example-dir names examples/pytorch_client")
    run_dir = out / "run"
    root: list[int] = []
    sampler = MemorySampler(_huddle_groups(root))
    launcher = Launcher(out / "logs")
    # run.sh's interface: OUT as its argument; ROUNDS, HUDDLE (and INSECURE, ...) from the
    # environment. Its default is CurveZMQ with keys it generates, as `huddle run`'s.
    argv = ["bash", str(script), str(run_dir)]
    env = dict(os.environ)
    job = out / "job.yaml"  # a snapshot: run.sh resizes it into run_dir
    shutil.copyfile(JOBS[args.model], job)
    env.update({"JOB": str(job), "ROUNDS": str(args.rounds), "HUDDLE": args.huddle,
                "PYTHONPATH": str(ROOT / "build" / "client" / "python")})
    env.update(dict(kv.split("=", 1) for kv in args.env))
    seen: dict[int, float] = {}
    sampler.start()
    t_launch = time.time()
    try:
        proc = launcher.start("run_sh", argv, env=env, cwd=str(ROOT))
        root.append(proc.pid)
        _watch_huddle(proc, run_dir / "metrics.jsonl", args.timeout_s, seen)
        _check_exit(proc, "run.sh", run_dir / "metrics.jsonl", args.rounds, out / "logs/run_sh.log")
    finally:
        sampler.stop()
        launcher.stop_all()
    t_exit = time.time()
    rounds = _huddle_rounds(run_dir / "metrics.jsonl")
    _attach_wall(rounds, seen)
    result = summarize("huddle-pytorch", rounds, t_launch, t_exit, sampler.report(), {
        "model": args.model, "clients": 10, "command": " ".join(argv) + f" (ROUNDS={args.rounds})",
        "transport": "ZeroMQ, " + ("plaintext (INSECURE=1)" if env.get("INSECURE") == "1" else
                                   "CurveZMQ (encrypted, authenticated; run.sh's default)"),
        "summary": json.loads((run_dir / "summary.json").read_text()) if (
            run_dir / "summary.json").exists() else None})
    write_result(out, result)
    return result


# ---------------------------------------------------------------------------------------------
# Table

def table(paths: list[str]) -> str:
    results = [json.loads(Path(p).read_text()) for p in paths]
    rows = ["| | " + " | ".join(f"{r['kind']} ({r.get('model', 'cnn')})" for r in results) + " |",
            "|---|" + "---|" * len(results)]

    def row(label, fn):
        cells = []
        for r in results:
            try:
                v = fn(r)
            except (KeyError, IndexError, TypeError, ZeroDivisionError):
                v = None
            cells.append("–" if v is None else str(v))
        rows.append(f"| {label} | " + " | ".join(cells) + " |")

    row("steady seconds per round (median, rounds 2..N)", lambda r: f"{r['steady_round_s']:.2f}")
    row("rounds per minute", lambda r: f"{r['rounds_per_min']:.1f}")
    row("launch to round 1 end, s (start-up + round 1)",
        lambda r: f"{r['rounds'][0]['t_end'] - r['t_launch']:.1f}")
    row("launch to last round end, s", lambda r: f"{r['launch_to_last_round_s']:.1f}")
    row("whole run (launch to all exited), s", lambda r: f"{r['total_s']:.1f}")
    n = max(len(r["rounds"]) for r in results)
    for i in range(n):
        row(f"test accuracy, round {i + 1}", lambda r, i=i: f"{r['rounds'][i]['test_accuracy']:.4f}")
    row("server peak RSS, MiB (sum of sampled RSS)",
        lambda r: f"{r['memory']['server']['peak_sum_rss_mib']:.0f}")
    row("server processes' VmHWM, MiB (summed)",
        lambda r: f"{r['memory']['server']['sum_peak_hwm_mib']:.0f} "
                  f"({r['memory']['server']['processes']} proc)")
    row("clients' peak RSS, MiB (sum of sampled RSS)",
        lambda r: f"{r['memory']['clients']['peak_sum_rss_mib']:.0f}")
    row("server CPU seconds, whole run", lambda r: f"{r['memory']['server']['cpu_s']:.0f}")
    row("clients' CPU seconds, whole run", lambda r: f"{r['memory']['clients']['cpu_s']:.0f}")
    row("CPU seconds per round, all processes (whole run / rounds)",
        lambda r: f"{(r['memory']['server']['cpu_s'] + r['memory'].get('clients', {}).get('cpu_s', 0)) / len(r['rounds']):.1f}")
    row("machine load average (1 min) before / after the run",
        lambda r: f"{r['load_avg_before'][0]:.1f} / {r['load_avg_after'][0]:.1f}")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)

    def common(p):
        p.add_argument("--model", choices=sorted(JOBS), default="cnn",
                       help="cnn: examples/fashion_mnist_cnn.yaml's job; mlp: the quickstart's, "
                       "examples/fashion_mnist.yaml (same recipe)")
        p.add_argument("--out", required=True)
        p.add_argument("--rounds", type=int, default=5)
        p.add_argument("--timeout-s", type=float, default=1800)

    for name in ("flower-deploy", "flower-sim"):
        p = sub.add_parser(name)
        common(p)
        p.add_argument("--clients", type=int, default=10)
        p.add_argument("--seed", type=int, default=1)
        p.add_argument("--data-cache", default="/tmp/huddle-flower-data",
                       help="prepare_data.py's files (written on first use)")
    p = sub.add_parser("huddle-builtin")
    common(p)
    p.add_argument("--huddle", default=str(ROOT / "build" / "cli" / "huddle"))
    p.add_argument("--job", help="default: the --model's job")
    p.add_argument("--insecure", action="store_true")
    p = sub.add_parser("huddle-pytorch")
    common(p)
    p.add_argument("--huddle", default=str(ROOT / "build" / "cli" / "huddle"))
    p.add_argument("--example-dir", default=str(ROOT / "examples" / "pytorch_client"),
                   help="the examples/pytorch_client to run (flower_compare.sh runs a snapshot)")
    p.add_argument("--env", action="append", default=[], help="KEY=VALUE for run.sh")
    p = sub.add_parser("table")
    p.add_argument("results", nargs="+")
    args = ap.parse_args()

    if args.cmd == "table":
        print(table(args.results))
        return
    run = {"flower-deploy": run_flower_deploy, "flower-sim": run_flower_sim,
           "huddle-builtin": run_huddle_builtin, "huddle-pytorch": run_huddle_pytorch}[args.cmd]
    run(args)


if __name__ == "__main__":
    main()
