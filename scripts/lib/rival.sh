# shellcheck shell=bash
# The benchmarks' rival, the ElectricSQL Rust server (`durable-streams-server`), as the bench
# scripts run it: sourced by bench-compare, bench-profile and bench-instructions.

# Where scripts/bench-compare installs it (under $BROOK_BENCH_CACHE, default ~/.cache/brook-bench).
RIVAL_BIN=${BROOK_BENCH_CACHE:-$HOME/.cache/brook-bench}/bin/durable-streams-server

# rival_cmd PORT DIR MODE: sets the array RIVAL_CMD to the rival's command line, listening on
# 127.0.0.1 only, in the durability mode paired with brook's MODE: `wal` against sync (every
# append fsynced), `memory` against buffered (appends written to its files, never synced).
rival_cmd() {
  local durability=wal
  [[ $3 == buffered ]] && durability=memory
  RIVAL_CMD=("$RIVAL_BIN" --host 127.0.0.1 --port "$1" --data-dir "$2" --durability "$durability")
}
