#!/usr/bin/env bash
# Line and branch coverage of the library (graph/, fusion/, codegen/,
# kernels/), from the unit tests and the ONNX conformance run:
#   tools/coverage.sh [--no-conform] [--filter 'suite/*']
# Builds with gcc --coverage in build-cov/ (Debug, -O0, so each branch is
# a source branch), runs the tests, then prints per folder and for the
# two files with a bar of their own (graph/onnx.c and fusion/rewrite.c,
# 90% branch coverage) the lines and branches executed, as gcov counts
# them (a branch is covered once taken at least once). Needs only gcc's
# gcov and python3, nothing to install. Writes build-cov/coverage.txt
# (every file) as well. Exits non-zero only when the build or a test run
# fails; the figures are for reading, not a gate.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/build-cov
data=/usr/share/libonnx-testdata/data
conform=1
filter=()
while [ $# -gt 0 ]; do
  case $1 in
    --no-conform) conform=0 ;;
    --filter) filter=(--filter "$2"); shift ;;
    *) echo "coverage.sh: unknown argument $1"; exit 2 ;;
  esac
  shift
done
command -v gcov >/dev/null || { echo "coverage.sh: gcov (gcc) is needed"; exit 2; }

cmake -S "$root" -B "$out" -DCMAKE_C_COMPILER=gcc -DCMAKE_BUILD_TYPE=Debug -DKF_COVERAGE=ON -DKF_TESTS=ON >/dev/null
cmake --build "$out" -j"$(nproc)" --target kfuse_tests kfuse_cli >/dev/null
# counts from earlier runs would add up
find "$out" -name '*.gcda' -delete

# Tests fork (Criterion) and each child writes its counts at exit; gcov's
# runtime merges them under a file lock.
"$out/tests/kfuse_tests" --jobs "$(nproc)" "${filter[@]}" >"$out/coverage-tests.log" 2>&1 ||
  { tail -n 20 "$out/coverage-tests.log"; echo "coverage.sh: unit tests failed"; exit 1; }
if [ "$conform" = 1 ] && [ -d "$data" ]; then
  "$out/tools/kfuse" conform "$data/node" "$data/pytorch-converted" "$data/pytorch-operator" "$data/simple" \
    >"$out/coverage-conform.log" 2>&1 || echo "coverage.sh: conformance reported failures (see $out/coverage-conform.log)"
fi

what="unit tests"
[ "${#filter[@]}" -eq 0 ] || what="unit tests ${filter[1]}"
[ "$conform" = 0 ] || what="$what + conformance"
export KF_COV_WHAT=$what

# gcov's JSON for every object of the library, merged per source file
# (a header's inline functions appear in several objects: a line or branch
# counts as covered when any object covered it).
python3 - "$root" "$out" <<'EOF'
import glob, gzip, json, os, subprocess, sys, tempfile
root, out = sys.argv[1], sys.argv[2]
folders = ["graph", "fusion", "codegen", "kernels"]
files = {}  # path -> {"lines": {n: hit}, "branches": {(line, i): hit}}
gcdas = []
for f in folders:
    gcdas += glob.glob(os.path.join(out, f, "CMakeFiles", "**", "*.gcda"), recursive=True)
with tempfile.TemporaryDirectory() as tmp:
    for g in gcdas:
        subprocess.run(["gcov", "-b", "-j", "-o", os.path.dirname(g), g], cwd=tmp,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for j in glob.glob(os.path.join(tmp, "*.gcov.json.gz")):
            with gzip.open(j) as fh:
                doc = json.load(fh)
            os.remove(j)
            for fl in doc.get("files", []):
                path = os.path.realpath(os.path.join(doc.get("current_working_directory", ""), fl["file"]))
                if not path.startswith(root + "/"):
                    continue
                rel = path[len(root) + 1:]
                if rel.split("/")[0] not in folders:
                    continue
                rec = files.setdefault(rel, {"lines": {}, "branches": {}})
                for ln in fl.get("lines", []):
                    n = ln["line_number"]
                    rec["lines"][n] = rec["lines"].get(n, False) or ln["count"] > 0
                    for i, br in enumerate(ln.get("branches", [])):
                        k = (n, i)
                        rec["branches"][k] = rec["branches"].get(k, False) or br["count"] > 0

def fig(recs):
    lh = sum(sum(r["lines"].values()) for r in recs)
    lt = sum(len(r["lines"]) for r in recs)
    bh = sum(sum(r["branches"].values()) for r in recs)
    bt = sum(len(r["branches"]) for r in recs)
    pct = lambda a, b: 100.0 * a / b if b else 100.0
    return "lines %6.1f%% (%6d/%6d)   branches %6.1f%% (%6d/%6d)" % (pct(lh, lt), lh, lt, pct(bh, bt), bh, bt)

report = []
for rel in sorted(files):
    report.append("%-34s %s" % (rel, fig([files[rel]])))
with open(os.path.join(out, "coverage.txt"), "w") as fh:
    fh.write("\n".join(report) + "\n")
print("coverage of the library (%s)" % os.environ.get("KF_COV_WHAT", "unit tests"))
for f in folders:
    recs = [files[r] for r in files if r.startswith(f + "/")]
    print("%-34s %s" % (f + "/", fig(recs)))
print("%-34s %s" % ("all", fig(list(files.values()))))
for rel in ["graph/onnx.c", "fusion/rewrite.c"]:
    if rel in files:
        print("%-34s %s" % (rel, fig([files[rel]])))
print("per file: %s" % os.path.join(out, "coverage.txt"))
EOF
