#!/usr/bin/env bash
# A federation of PyTorch clients on 127.0.0.1: `huddle coordinator` with JOB and CLIENTS client.py
# processes, each on its IID shard of Fashion-MNIST, over CurveZMQ with keys generated into
# OUT/keys (INSECURE=1: plaintext). Waits for the coordinator and exits with its status.
#
#   examples/pytorch_client/run.sh [OUT]          # OUT defaults to runs/pytorch_client
#   JOB=examples/fashion_mnist.yaml examples/pytorch_client/run.sh   # the quickstart's MLP
#
# Environment: JOB (default job.yaml here: the CNN), HUDDLE (default build/cli/huddle), PYTHON
# (/usr/bin/python3), PYTHONPATH (default build/client/python, where the huddle_client module is
# built), CLIENTS (10), ROUNDS (the job's rounds), LIMIT (0: whole shards), THREADS (torch
# threads per client, 1), INSECURE (0). The job's cohort, quorum and minimum are resized to
# CLIENTS (it must say `clients: 10`, `size: 10}`, `quorum: 8,` and `min_clients: 10`, as both
# jobs do). Outputs: OUT/{metrics.jsonl,summary.json,model.bin}; logs in OUT/logs/.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
JOB="${JOB:-$here/job.yaml}"
HUDDLE="${HUDDLE:-$root/build/cli/huddle}"
PYTHON="${PYTHON:-/usr/bin/python3}"
export PYTHONPATH="${PYTHONPATH:-$root/build/client/python}"
CLIENTS="${CLIENTS:-10}"
ROUNDS="${ROUNDS:-}"
LIMIT="${LIMIT:-0}"
THREADS="${THREADS:-1}"
INSECURE="${INSECURE:-0}"
out="${1:-runs/pytorch_client}"

if [ ! -x "$HUDDLE" ]; then
  echo "run.sh: no huddle binary at $HUDDLE (build it, or set HUDDLE)" >&2
  exit 2
fi
"$PYTHON" -c "import huddle_client, torch" || {
  echo "run.sh: $PYTHON cannot import huddle_client and torch (PYTHONPATH=$PYTHONPATH)" >&2
  exit 2
}
mkdir -p "$out/logs"

# The job, with the cohort, quorum and minimum sized to CLIENTS (and ROUNDS if set).
job="$out/job.yaml"
sed -e "s/^clients: 10 /clients: $CLIENTS /" \
    -e "s/size: 10}/size: $CLIENTS}/" \
    -e "s/quorum: 8,/quorum: $(( CLIENTS * 8 / 10 > 0 ? CLIENTS * 8 / 10 : 1 )),/" \
    -e "s/min_clients: 10/min_clients: $CLIENTS/" \
    ${ROUNDS:+-e "s/^rounds: [0-9]*/rounds: $ROUNDS/"} \
    "$JOB" > "$job"

port="$("$PYTHON" -c '
import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])')"
endpoint="tcp://127.0.0.1:$port"

coord_security=(--insecure)
if [ "$INSECURE" != "1" ]; then
  rm -rf "$out/keys"
  "$HUDDLE" keygen server --out "$out/keys" > /dev/null
  mkdir -p "$out/keys/allowed"
  for ((i = 0; i < CLIENTS; i++)); do
    "$HUDDLE" keygen client --id "torch-$i" --out "$out/keys" > /dev/null
    cp "$out/keys/torch-$i.pub" "$out/keys/allowed/"
  done
  coord_security=(--server-key "$out/keys/server.key" --allow "$out/keys/allowed")
fi

pids=()
coordinator=""
cleanup() {
  for pid in "${pids[@]}" $coordinator; do kill "$pid" 2> /dev/null || true; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "run.sh: coordinator on $endpoint, $CLIENTS PyTorch clients, logs in $out/logs"
"$HUDDLE" coordinator --config "$job" --out "$out" --bind "$endpoint" --force \
  "${coord_security[@]}" 2> "$out/logs/coordinator.log" &
coordinator=$!
for ((i = 0; i < CLIENTS; i++)); do
  if [ "$INSECURE" = "1" ]; then
    security=(--insecure --client-id "torch-$i")
  else
    security=(--key "$out/keys/torch-$i.key" --server-key "$out/keys/server.pub")
  fi
  nice "$PYTHON" "$here/client.py" --coordinator "$endpoint" "${security[@]}" \
    --shard "$i" --num-shards "$CLIENTS" --limit "$LIMIT" --threads "$THREADS" \
    > "$out/logs/torch-$i.log" 2>&1 &
  pids+=($!)
done

status=0
wait "$coordinator" || status=$?
coordinator=""
# Clients leave on the coordinator's shutdown; give them a moment before cleanup stops the rest.
for pid in "${pids[@]}"; do
  for _ in $(seq 50); do kill -0 "$pid" 2> /dev/null || break; sleep 0.2; done
done
exit "$status"
