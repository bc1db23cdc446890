# shellcheck shell=bash
# The ElectricSQL benchmark harness's client, as scripts/bench-ds builds and runs it: sourced by
# bench-ds.
#
# electric-sql/ds-bench is a Kubernetes harness (kind or GKE: a server pod, a client fleet of
# pods, MinIO, cgroup memory sampling) around one Rust load client, `ds-bench`. The client
# talks plain HTTP to any Durable Streams server, so it runs here as it is, against a server on
# 127.0.0.1; the fleet and the pod sampling are what bench-ds replaces (one client process
# pinned to the load CPU; the server's RSS from /proc).

# The ds-bench commit measured with (the newest stored snapshot: 2026-06-30, the source of the
# 2026-06-30 REPORT.md).
DS_BENCH_COMMIT=${DS_BENCH_COMMIT:-190eb7fc2c55fbad2d69ee925cee3ab725b16a5b}
# Where its source comes from: a git directory holding DS_BENCH_COMMIT (the default is the
# snapshot the project's tooling fetches), else it is cloned from GitHub.
DS_BENCH_GIT=${DS_BENCH_GIT:-/work/.mirror/electric-sql+ds-bench/repo}
DS_BENCH_URL=${DS_BENCH_URL:-https://github.com/electric-sql/ds-bench}

# ds_bench_build CACHE: builds ds-bench at DS_BENCH_COMMIT (release, its own Cargo.lock) under
# CACHE once; sets DS_BENCH to the binary.
ds_bench_build() {
  local dir=$1/ds-bench-${DS_BENCH_COMMIT:0:7}
  DS_BENCH=$dir/ds-bench/target/release/ds-bench
  [[ -x $DS_BENCH ]] && return 0
  mkdir -p "$dir"
  local git=$DS_BENCH_GIT
  if ! git --git-dir="$git" cat-file -e "$DS_BENCH_COMMIT^{commit}" 2>/dev/null; then
    git=$1/ds-bench-src.git
    [[ -d $git ]] || git clone --bare --quiet "$DS_BENCH_URL" "$git"
  fi
  git --git-dir="$git" archive "$DS_BENCH_COMMIT" ds-bench | tar -x -C "$dir"
  (cd "$dir/ds-bench" && cargo build --release --locked >&2)
}

# ds_pool_build ROOT CACHE: builds scripts/lib/ds-pool (the same workload over a fixed pool of
# connections, for stream counts past one loopback address's ephemeral ports); sets DS_POOL.
ds_pool_build() {
  local target=$2/ds-pool-target
  DS_POOL=$target/release/ds-pool
  (cd "$1/scripts/lib/ds-pool" && CARGO_TARGET_DIR=$target cargo build --release --locked >&2)
}
