#!/usr/bin/env bash
# The long random-graph differential run (issue 6): N random graphs (default
# 100,000) through ref, opt, fuse, OpenCL and opt/fuse with every pass family
# disabled in turn, split over J processes with disjoint seed ranges. Each
# shard's log (failures with their graph, shrunk graph and reproduce line)
# is kept in OUT; the summary adds the shards up. Exit 1 if any graph failed.
#
#   bench/random_graphs/run.sh [--count N] [--seed S] [--jobs J] [--opencl-every K]
#                              [--families all|rotate|none] [--build DIR] [--out DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
count=100000 seed=$(date +%s) jobs=$(nproc) cl_every=1 families=all
build="$root/build" out=""
while [ $# -gt 0 ]; do
  case $1 in
    --count) count=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --opencl-every) cl_every=$2; shift 2 ;;
    --families) families=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --out) out=$2; mkdir -p "$out"; shift 2 ;;
    *) echo "usage: $0 [--count N] [--seed S] [--jobs J] [--opencl-every K] [--families all|rotate|none] [--build DIR] [--out DIR]" >&2; exit 2 ;;
  esac
done
[ -n "$out" ] || out=$(mktemp -d /tmp/kfuse_randgraph.XXXXXX)
bin="$build/tests/kfuse_randgraph"
[ -x "$bin" ] || { echo "$bin not built (cmake -DKF_TESTS=ON, make kfuse_randgraph)" >&2; exit 2; }
# kernels repeat across graphs: one disk cache for the run, not the user's
export KFUSE_CACHE_DIR="$out/cache"
chunk=$(( (count + jobs - 1) / jobs ))
echo "random graphs: $count from seed $seed, $jobs shards of $chunk, opencl every $cl_every, families $families; logs in $out"
start=$(date +%s)
pids=()
for j in $(seq 0 $((jobs - 1))); do
  n=$(( count - j * chunk )); [ "$n" -gt "$chunk" ] && n=$chunk; [ "$n" -le 0 ] && break
  "$bin" --seed $((seed + j * chunk)) --count "$n" --opencl-every "$cl_every" --families "$families" \
         --max-fail 20 --quiet > "$out/shard$j.log" 2>&1 &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
# add up the shards' summary lines
awk '/^graphs /{g+=$2; n+=$4; ref+=$7; opt+=$9; fuse+=$11; cl+=$13; sk+=$15; fam+=$17; f+=$19;
       if ($21 > slow) {slow=$21; seed=$24}}
     END {printf "graphs %d (nodes %d), agreed: ref %d, opt %d, fuse %d, opencl %d (skipped %d), family-disabled %d; failed %d; slowest %.3f s (seed %s)\n",
          g, n, ref, opt, fuse, cl, sk, fam, f, slow, seed}' \
  <(sed 's/[(),;]/ /g' "$out"/shard*.log | grep '^graphs ' | tr -s ' ')
echo "wall $(( $(date +%s) - start )) s"
grep -h '^FAIL' "$out"/shard*.log || true
exit $rc
