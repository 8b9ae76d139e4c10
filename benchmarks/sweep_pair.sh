#!/usr/bin/env bash
# Both modes' 35B sweeps at once on a two-GPU machine: store-all (stock vLLM) on GPU 0, TreeWY on GPU 1, each
# server on its own GPU and port (never two vLLM servers on one GPU: see vllm_serve_gpu's docstring), the same
# gmu, workloads and --stop-after. Each mode's --out folder (table, checkpoint, capacity report, packed results,
# its sweep log) comes back as one file, OUT/<mode>.tar.gz.
#
#     bash benchmarks/sweep_pair.sh OUT GMU STOP_AFTER_S [more sweep arguments ...]
#     RESUME_STORE_ALL=DIR RESUME_RECONSTRUCT=DIR bash benchmarks/sweep_pair.sh ...   # continue earlier runs
#     MODES=reconstruct bash benchmarks/sweep_pair.sh ...   # one mode (on GPU 0): a one-GPU machine
#     IN_TURN=1 bash benchmarks/sweep_pair.sh ...           # both modes on GPU 0, one after the other, each with
#                                                           # its own STOP_AFTER_S: a pair measured in one call
#
# On one GPU, each mode in its own call measured the host of that call as much as the mode: the same one-request
# prefill step took 133-186 ms across four calls, in either mode (benchmarks/results/serve35b_h200_gmu0.75_2026-12-02/
# README.md). IN_TURN=1 with a few short points (--concurrency 1,8) puts both modes' servers in one call.
#
# vLLM must be importable (PYTHONPATH with the staged site, see vllm_pieces.sh). Exit status: the larger of the
# two sweeps'.
set -u
out=${1:?usage: sweep_pair.sh OUT GMU STOP_AFTER_S [sweep arguments ...]}
gmu=${2:?usage: sweep_pair.sh OUT GMU STOP_AFTER_S [sweep arguments ...]}
stop=${3:?usage: sweep_pair.sh OUT GMU STOP_AFTER_S [sweep arguments ...]}
shift 3
mkdir -p "$out"
modes=${MODES:-store_all reconstruct}
gpu=0
pids=()
statuses=()
for mode in $modes; do
    resume_var=RESUME_$(echo "$mode" | tr '[:lower:]' '[:upper:]')
    resume=()
    if [ -n "${!resume_var:-}" ]; then resume=(--resume-from "${!resume_var}"); fi
    dir=$out/$mode
    mkdir -p "$dir"
    CUDA_VISIBLE_DEVICES=$gpu python3 -m benchmarks.vllm_serve_gpu sweep --mode "$mode" --gmu "$gmu" \
        --out "$dir" --stop-after "$stop" --port $(( 8021 + 10 * gpu )) --pack "${resume[@]}" "$@" \
        > "$dir/sweep_${mode}_gmu${gmu}.log" 2>&1 &
    if [ "${IN_TURN:-0}" = 1 ]; then wait "$!"; statuses+=($?); else pids+=($!); gpu=$(( gpu + 1 )); fi
done
for pid in ${pids[@]+"${pids[@]}"}; do
    wait "$pid"
    statuses+=($?)
done
rc=0
for r in "${statuses[@]}"; do
    if [ "$r" -gt "$rc" ]; then rc=$r; fi
done
for mode in $modes; do
    tail -3 "$out/$mode/sweep_${mode}_gmu${gmu}.log"
    tar -czf "$out/$mode.tar.gz" -C "$out" "$mode" && rm -rf "${out:?}/$mode"
done
echo "sweep_pair rc=$rc"
exit $rc
