#!/usr/bin/env bash
# The slim vLLM 0.26.0 payload (../shared/gpu-vllm: vllm026.part-a + vllm026.part-b, the site; vllm026-moe.tar.xz,
# the MoE ops) cut into pieces small enough to travel beside the working tree (64 MiB per run, tree included),
# then put together on the GPU machine, one piece per run while the machine stays up:
#
#   here, once:     bash benchmarks/vllm_pieces.sh cut ../shared/gpu-vllm build/vllm-pieces 4 [WHEEL ...]
#   run k of N:     bash benchmarks/vllm_pieces.sh stage build/vllm-pieces piece.K   (carry that piece and manifest)
#
# The run that brings the last piece joins them: it checks the site's sha256 (the one ../shared/gpu-vllm/stage.sh
# checks), unpacks the site and the MoE ops into SITE (default /tmp/site), unpacks the WHEELs cut with them there too
# (polars, which the GPU machine lacks: .whl/ holds what `pip download` fetched), registers treewy's vLLM plugin
# entry point, writes the site's bytecode, and imports vllm. Then:  export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH VLLM_USE_FLASHINFER_SAMPLER=0
# STAGE (default /tmp/stage) keeps the pieces between runs; VLLM_PIECES_CHECK=0 skips the import (for tests).
set -eu
STAGE=${STAGE:-/tmp/stage}; SITE=${SITE:-/tmp/site}
SITE_SHA=0d7c9e12bb22c921dda71b49aae1ad77b195925641704bfd4252c46a769e8a29

cut_payload() {   # SRC DEST N [WHEEL ...]
    local src=$1 dest=$2 n=$3; shift 3
    mkdir -p "$dest"; rm -f "$dest"/piece.* "$dest"/manifest
    local site_bytes=$(( $(stat -c %s "$src/vllm026.part-a") + $(stat -c %s "$src/vllm026.part-b") ))
    local moe_bytes; moe_bytes=$(stat -c %s "$src/vllm026-moe.tar.xz")
    local total=$(( site_bytes + moe_bytes )) wheels="" w
    for w in "$@"; do
        wheels="$wheels $(basename "$w"):$(stat -c %s "$w")"; total=$(( total + $(stat -c %s "$w") ))
    done
    cat "$src/vllm026.part-a" "$src/vllm026.part-b" "$src/vllm026-moe.tar.xz" "$@" \
        | split -b $(( (total + n - 1) / n )) -d -a 1 - "$dest/piece."
    printf 'pieces=%s\nsite_bytes=%s\nsite_sha=%s\nmoe_bytes=%s\nwheels="%s"\n' "$n" "$site_bytes" \
        "${SITE_SHA_OVERRIDE:-$SITE_SHA}" "$moe_bytes" "${wheels# }" > "$dest/manifest"
    ls -l "$dest"
}

join_pieces() {
    # shellcheck disable=SC1091
    . "$STAGE/manifest"
    cat $(for i in $(seq 0 $((pieces - 1))); do echo "$STAGE/piece.$i"; done) > "$STAGE/all"
    head -c "$site_bytes" "$STAGE/all" > "$STAGE/site.tar.xz"
    local offset=$(( site_bytes + ${moe_bytes:-0} )) w name bytes
    if [ -n "${moe_bytes:-}" ]; then
        tail -c +"$((site_bytes + 1))" "$STAGE/all" | head -c "$moe_bytes" > "$STAGE/moe.tar.xz"
    else   # a manifest cut before wheels travelled: the MoE ops are the rest
        tail -c +"$((site_bytes + 1))" "$STAGE/all" > "$STAGE/moe.tar.xz"
    fi
    mkdir -p "$STAGE/wheels"
    for w in ${wheels:-}; do
        name=${w%%:*}; bytes=${w##*:}
        tail -c +"$((offset + 1))" "$STAGE/all" | head -c "$bytes" > "$STAGE/wheels/$name"
        offset=$(( offset + bytes ))
    done
    rm -f "$STAGE/all"
    echo "$site_sha  $STAGE/site.tar.xz" | sha256sum -c
    mkdir -p "$SITE"
    tar xJf "$STAGE/site.tar.xz" -C "$SITE"
    tar xJf "$STAGE/moe.tar.xz" -C "$SITE"
    for w in "$STAGE"/wheels/*.whl; do   # a wheel is a zip of site-packages entries
        [ -e "$w" ] || continue
        python3 -m zipfile -e "$w" "$SITE" && echo "unpacked $(basename "$w")"
    done
    rm -rf "$STAGE/site.tar.xz" "$STAGE/moe.tar.xz" "$STAGE/wheels" "$STAGE"/piece.*
    local d=$SITE/treewy_plugin-0.0.0.dist-info; mkdir -p "$d"
    printf 'Metadata-Version: 2.1\nName: treewy-plugin\nVersion: 0.0.0\n' > "$d/METADATA"
    printf '[vllm.general_plugins]\ntreewy = treewy.serve.plugin:register\n' > "$d/entry_points.txt"
    # the payload carries no bytecode: written once here, or every process that imports vLLM compiles its sources
    # (5,167 files, 4.1 s on a 2-core CPU) and the API server and the engine core each do it at every server start
    local t0=$SECONDS
    python3 -m compileall -q -j 0 "$SITE" > /dev/null || echo "compileall: some of the site's sources did not compile"
    echo "the site's bytecode written in $(( SECONDS - t0 )) s"
    if [ "${VLLM_PIECES_CHECK:-1}" != 0 ]; then
        PYTHONPATH=$SITE python3 -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
    fi
    echo "joined: vLLM unpacked into $SITE"
}

stage_piece() {   # DIR PIECE
    local dir=$1 piece=$2
    mkdir -p "$STAGE"
    cp "$dir/manifest" "$STAGE/manifest"
    cp "$dir/$piece" "$STAGE/$piece"
    # shellcheck disable=SC1091
    . "$STAGE/manifest"
    local have; have=$(ls "$STAGE"/piece.* 2>/dev/null | wc -l)
    echo "staged $piece: $have of $pieces pieces on this machine"
    if [ "$have" -eq "$pieces" ]; then join_pieces; fi
}

case "${1:-}" in
    cut) cut_payload "${2:?SRC}" "${3:?DEST}" "${4:-4}" "${@:5}" ;;
    stage) stage_piece "${2:?DIR}" "${3:?PIECE}" ;;
    *) echo "usage: vllm_pieces.sh cut SRC DEST [N [WHEEL ...]] | stage DIR piece.K"; exit 2 ;;
esac
