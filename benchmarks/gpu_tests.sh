#!/usr/bin/env bash
# The GPU test run, for a machine with a CUDA GPU and the project's dependencies (a GPU machine lacking polars gets
# it from a carried wheel under .whl/). Writes under OUT: gpu_tests.log (pytest -v -rf), failures.txt (each
# failure's traceback as it happens) and durations.txt (each test's seconds), so that a run cut off by its time
# limit still says what failed and what was slow.
#
#     bash benchmarks/gpu_tests.sh OUT [LIMIT_S] [first test ids ...]
#     GPU_TESTS_PART=kernels|engines bash benchmarks/gpu_tests.sh OUT ...
#
# The tests given after LIMIT_S run first, on their own; then the GPU test files below under what is left of
# LIMIT_S (default 560 s), with the property tests at 100 examples: the kernels' files on 12 workers, the engines'
# (test_decode_graph, test_serve_tree_plugin) on one. The engines' tests are host-bound (many small launches and
# reads back), and several processes sharing the GPU slow them by up to 14x (H200, 2026-12-02: one tree-plugin
# test 30 s alone, 422 s beside 11 other workers; 12 of them 32 s in one process, while 4 workers finished 4 in
# 400 s). GPU_TESTS_PART=kernels (304 s on 12 workers) or engines (174 s) picks one part per run; all runs both.
set -u
out=${1:?usage: gpu_tests.sh OUT [LIMIT_S] [first test ids ...]}
limit=${2:-560}
shift $(( $# >= 2 ? 2 : 1 ))
# the property tests first, as they are the longest (up to 279 s each, H100 2026-12-07). xdist's default `load`
# hands each worker a run of consecutive tests at the start, so all eight went to one worker, one after another
# (six in 514 s, then the part hit its limit: gpu_tests_h100_2026-12-07.md); `--dist worksteal` lets idle workers
# take the tests still queued on a busy one: 303.9 s for the part, its longest test 154 s (H100,
# gpu_tests_h100_2026-12-07b.md)
kernels="tests/test_properties.py tests/test_serve_spec_step.py tests/test_serve_reconstruct.py tests/test_verify.py
    tests/test_commit.py tests/test_store_all.py tests/test_conv.py tests/test_input_checks.py
    tests/test_tree_attention.py tests/test_serve_tree_spec.py"
engines="tests/test_decode_graph.py tests/test_serve_tree_plugin.py"
case "${GPU_TESTS_PART:-all}" in
    kernels|engines|all) ;;
    *) echo "GPU_TESTS_PART=$GPU_TESTS_PART: expected kernels, engines or all" >&2; exit 2 ;;
esac
mkdir -p "$out"
start=$(date +%s)
if ! python3 -c "import polars" 2>/dev/null && ls .whl/polars-*.whl >/dev/null 2>&1; then
    pip install -q --no-index --no-deps --target /tmp/pl .whl/polars-*.whl >/dev/null 2>&1
    export PYTHONPATH=/tmp/pl${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TREEWY_PROPERTY_EXAMPLES=100
export TREEWY_FAILURE_LOG=$out/failures.txt TREEWY_DURATION_LOG=$out/durations.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$out/gpu_tests.log" 2>&1
if [ $# -gt 0 ]; then
    timeout $(( limit / 3 )) python3 -m pytest -v -rf -p no:cacheprovider "$@" >> "$out/gpu_tests.log" 2>&1
fi
# run_part NAME WORKERS FILES...: one pytest over FILES under what is left of LIMIT_S (WORKERS 1: no xdist)
run_part() {
    local name=$1 workers=$2 left
    shift 2
    left=$(( limit - ($(date +%s) - start) ))
    echo "part $name ($workers workers):" "$@" >> "$out/gpu_tests.log"
    if [ "$workers" -gt 1 ]; then set -- -n "$workers" --dist worksteal "$@"; fi
    timeout "$left" python3 -m pytest -v -rf -p no:cacheprovider "$@" >> "$out/gpu_tests.log" 2>&1
}
rc=0
# shellcheck disable=SC2086  # the file lists split into their names
case "${GPU_TESTS_PART:-all}" in
    kernels) run_part kernels 12 $kernels || rc=$? ;;
    engines) run_part engines 1 $engines || rc=$? ;;
    all) run_part kernels 12 $kernels || rc=$?
         run_part engines 1 $engines || rc=$? ;;
esac
grep -E "passed|failed" "$out/gpu_tests.log" | tail -2
echo "pytest rc=$rc (124: cut off at the time limit)"
exit $rc
