#!/usr/bin/env bash
# Issue 28's measurement in one call on the GPU machine: every notebook executed headless twice in new kernels
# (cold: an empty Triton cache and lab bytecode cache on a fresh machine; warm: the caches the first pass left),
# then the engine's start phase by phase (benchmarks/lab_startup.py), then once more under cProfile for where the
# slow phases go. Only the summaries come back: OUT/summary_<tag>_{cold,warm}.{json,txt},
# OUT/lab_startup_<tag>.{json,txt} and OUT/lab_startup_profile_<tag>.txt.
#
#     bash benchmarks/notebooks_gpu.sh OUT TAG [run_notebooks_gpu arguments ...]
#
# SITE_TAR (default build/nbsite.tar.xz, see benchmarks/gpu_wheels.txt): the lab's wheels, unpacked into SITE
# (default /tmp/site) and compiled to bytecode once, as a pip install would; SITE_TAR= uses the Python as it is.
# PASSES (default "cold warm") names the passes; LAB_STARTUP=0 leaves out the start-up phases; LAB_PROFILE (default
# 1.0) is the shortest phase whose top functions the profiled run lists, LAB_PROFILE= leaves that run out; DEVICE=cpu
# runs the same on a CPU (small sizes), for a check anywhere.
# Exit status: the largest of the steps'.
set -u
out=${1:?usage: notebooks_gpu.sh OUT TAG [run_notebooks_gpu arguments ...]}
tag=${2:?usage: notebooks_gpu.sh OUT TAG [run_notebooks_gpu arguments ...]}
shift 2
mkdir -p "$out"
site_tar=${SITE_TAR-build/nbsite.tar.xz}
site=${SITE:-/tmp/site}
device=${DEVICE:-cuda}
profile=${LAB_PROFILE-1.0}
work=$(mktemp -d)
rc=0
if [ -n "$site_tar" ]; then
    mkdir -p "$site" && tar -xJf "$site_tar" -C "$site" && python3 -m compileall -q -j 0 "$site" || exit 1
    export PYTHONPATH=$site:$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
for pass in ${PASSES:-cold warm}; do
    echo "$(date -u +%H:%M:%S) notebooks, $pass"
    python3 -m benchmarks.run_notebooks_gpu --device "$device" --out "$work/$pass" "$@" > "$work/$pass.log" 2>&1
    r=$?; [ "$r" -gt "$rc" ] && rc=$r
    tail -n 2 "$work/$pass.log"
    for ext in json txt; do cp "$work/$pass/summary.$ext" "$out/summary_${tag}_$pass.$ext" 2>/dev/null; done
done
if [ "${LAB_STARTUP:-1}" = 1 ]; then
    echo "$(date -u +%H:%M:%S) lab_startup"
    python3 -m benchmarks.lab_startup --device "$device" --out "$work/startup" > "$work/startup.log" 2>&1
    r=$?; [ "$r" -gt "$rc" ] && rc=$r
    for ext in json txt; do cp "$work/startup/lab_startup.$ext" "$out/lab_startup_$tag.$ext" 2>/dev/null; done
    if [ -n "$profile" ]; then
        echo "$(date -u +%H:%M:%S) lab_startup under cProfile"
        python3 -m benchmarks.lab_startup --device "$device" --out "$work/profile" --profile "$profile" \
            > "$work/profile.log" 2>&1
        r=$?; [ "$r" -gt "$rc" ] && rc=$r
        cp "$work/profile/lab_startup_profile.txt" "$out/lab_startup_profile_$tag.txt" 2>/dev/null
    fi
fi
cat "$out"/summary_"$tag"_*.txt "$out/lab_startup_$tag.txt" 2>/dev/null
rm -rf "$work"
echo "notebooks_gpu rc=$rc"
exit $rc
