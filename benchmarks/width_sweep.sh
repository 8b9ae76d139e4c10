#!/usr/bin/env bash
# Issue 30's measured width curve on one GPU: for each tree in turn (chain = the MTP chain k = 3), one mode's 35B
# sweep (benchmarks/sweep_pair.sh with IN_TURN=1, so every server of the call shares its host), each server with
# its own STOP_AFTER_S. Each tree's folders come back as OUT/<tree, dashed>/<mode>.tar.gz.
#
#     TREES="chain 2,2,1 3,3,3" MODES=reconstruct bash benchmarks/width_sweep.sh OUT GMU STOP_AFTER_S [sweep args ...]
#
# vLLM must be importable (see vllm_pieces.sh). Exit status: the largest of the sweeps'.
set -u
out=${1:?usage: width_sweep.sh OUT GMU STOP_AFTER_S [sweep arguments ...]}
gmu=${2:?usage}; stop=${3:?usage}; shift 3
rc=0
for tree in ${TREES:-chain 2,2,1 2,2,2 3,3,3}; do
    tree_args=()
    if [ "$tree" != chain ]; then tree_args=(--tree "$tree"); fi
    IN_TURN=1 bash "$(dirname "$0")/sweep_pair.sh" "$out/${tree//,/-}" "$gmu" "$stop" "$@" ${tree_args[@]+"${tree_args[@]}"}
    r=$?
    if [ "$r" -gt "$rc" ]; then rc=$r; fi
done
echo "width_sweep rc=$rc"
exit $rc
