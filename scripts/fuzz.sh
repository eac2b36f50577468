#!/usr/bin/env bash
# Usage: scripts/fuzz.sh [SECONDS] [WORKERS]
# Checks the thread-safety annotations with clang (scripts/thread_safety.py), then fuzzes the wire
# decoder and the update validator (fuzz/codec_fuzzer.cc) with libFuzzer under
# ASan+UBSan for SECONDS (default 60) in WORKERS parallel processes (default 1), then prints the
# final stats: executions, exec/s, coverage (cov/ft), corpus size, crashes.
#
# Installs the packages (scripts/setup.sh), configures BUILD_DIR (default build-fuzz) with clang and
# HUDDLE_FUZZ=ON, builds codec_fuzzer and make_seed_corpus, and writes the seed corpus into
# BUILD_DIR/seeds. The grown corpus stays in BUILD_DIR/corpus (minimised after each run), so a rerun
# continues from it; logs go to BUILD_DIR/logs. Crash, leak, timeout and OOM inputs go to
# BUILD_DIR/artifacts, and the script fails while any is there (reproduce:
# BUILD_DIR/fuzz/codec_fuzzer ARTIFACT; delete it once fixed).
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZ_SECONDS="${1:-60}"
WORKERS="${2:-1}"
if ! [[ "$FUZZ_SECONDS" =~ ^[1-9][0-9]*$ && "$WORKERS" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: scripts/fuzz.sh [SECONDS] [WORKERS]  (positive integers)" >&2
  exit 2
fi
scripts/setup.sh
BUILD_DIR="$(realpath -m "${BUILD_DIR:-build-fuzz}")"
JOBS="${JOBS:-$(nproc)}"

# Only the fuzz targets are built: tests, benchmarks and CUDA stay off in this configuration.
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}" \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DHUDDLE_FUZZ=ON -DHUDDLE_SANITIZE=OFF \
  -DHUDDLE_BUILD_TESTS=OFF -DHUDDLE_BUILD_BENCH=OFF -DHUDDLE_ENABLE_CUDA=OFF >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS" --target codec_fuzzer make_seed_corpus
# The same clang configuration checks the thread-safety annotations (absl's ABSL_GUARDED_BY on
# every mutex-holding class), which GCC ignores: -fsyntax-only -Wthread-safety -Werror.
scripts/thread_safety.py "$BUILD_DIR" "$JOBS"

FUZZER="$BUILD_DIR/fuzz/codec_fuzzer"
CORPUS="$BUILD_DIR/corpus"
ARTIFACTS="$BUILD_DIR/artifacts"
LOGS="$BUILD_DIR/logs"
mkdir -p "$CORPUS" "$ARTIFACTS" "$LOGS"
rm -f "$LOGS"/fuzz-*.log "$LOGS"/driver.log
"$BUILD_DIR/fuzz/make_seed_corpus" "$BUILD_DIR/seeds"

corpus_before=$(find "$CORPUS" -type f | wc -l)
echo "== fuzzing codec_fuzzer for ${FUZZ_SECONDS}s with ${WORKERS} worker(s)," \
  "corpus ${corpus_before} files, logs in $LOGS =="
args=(-max_total_time="$FUZZ_SECONDS" -print_final_stats=1 -timeout=25
      -dict="$(pwd)/fuzz/dict" -artifact_prefix="$ARTIFACTS/" "$CORPUS" "$BUILD_DIR/seeds")
rc=0
if [ "$WORKERS" -eq 1 ]; then
  "$FUZZER" "${args[@]}" >"$LOGS/fuzz-0.log" 2>&1 || rc=$?
else
  # -jobs runs WORKERS full fuzzing processes at once, sharing the corpus; each logs to
  # fuzz-<n>.log in the working directory.
  (cd "$LOGS" && "$FUZZER" -jobs="$WORKERS" -workers="$WORKERS" "${args[@]}" >driver.log 2>&1) ||
    rc=$?
fi

# Final stats, summed over the workers (coverage: the best worker's). Helpers never fail: a worker
# that crashed has no final stats.
sum_stat() {
  grep -h "^stat::$1:" "$LOGS"/fuzz-*.log | awk '{s += $2} END {print s + 0}' || true
}
max_stat() {
  grep -h "^stat::$1:" "$LOGS"/fuzz-*.log | awk '$2 > m {m = $2} END {print m + 0}' || true
}
# Largest "cov: C ft: F" over the status lines matching $1 (INITED, DONE), as C/F.
cov_ft() {
  grep -hE "$1 +cov:" "$LOGS"/fuzz-*.log |
    sed -n 's/.* cov: \([0-9]*\) ft: \([0-9]*\) .*/\1\/\2/p' | sort -n | tail -1 || true
}
artifacts=$(find "$ARTIFACTS" -type f | sort)
echo "== codec_fuzzer: ${FUZZ_SECONDS}s, ${WORKERS} worker(s) =="
echo "executions:   $(sum_stat number_of_executed_units)"
echo "exec/s:       $(sum_stat average_exec_per_sec)"
echo "cov/ft:       $(cov_ft DONE) (at start $(cov_ft INITED))"
echo "new units:    $(sum_stat new_units_added)"
echo "corpus:       ${corpus_before} -> $(find "$CORPUS" -type f | wc -l) files in $CORPUS"
echo "peak RSS:     $(max_stat peak_rss_mb) MB per worker"
echo "crashes:      $(find "$ARTIFACTS" -type f | wc -l) artifact(s) in $ARTIFACTS"

if [ "$rc" -ne 0 ] || [ -n "$artifacts" ]; then
  echo "FAILED: codec_fuzzer exited with $rc" >&2
  for f in "$LOGS"/fuzz-*.log; do
    if grep -qE '^==[0-9]+==ERROR|^SUMMARY|property violated|deadly signal' "$f"; then
      echo "-- $f (tail) --" >&2
      grep -vE '^"|# Uses:' "$f" | tail -60 >&2
    fi
  done
  for a in $artifacts; do echo "artifact: $a  (reproduce: $FUZZER $a)" >&2; done
  exit 1
fi

# Minimise the grown corpus (same coverage, fewer files) so that the next run starts fast.
rm -rf "$CORPUS.min" && mkdir "$CORPUS.min"
if "$FUZZER" -merge=1 "$CORPUS.min" "$CORPUS" >"$LOGS/merge.log" 2>&1; then
  rm -rf "$CORPUS" && mv "$CORPUS.min" "$CORPUS"
  echo "corpus minimised to $(find "$CORPUS" -type f | wc -l) files"
else
  rm -rf "$CORPUS.min"
  echo "corpus minimisation failed (see $LOGS/merge.log); corpus kept as is" >&2
fi
