#!/bin/bash
# Issue 28's validation of the ps simulator on traffic probe version 5 (the model frozen): the two
# flat configurations of docs/results/ps_sim_pull_flows.md, then, if time allows, 2 hosts of 2
# ranks (docs/results/ps_sim_probe5.md states the plan and its rule). Under the bench lock, from
# the repository root, as root:
#   /tmp/bench.sh bash experiments/ps_sim_probe5_run.sh OUT_DIR
# Each part has a wall-clock limit; the hierarchical part runs only if the flat ones ended within
# 330 s of the start, limited to the rest of 540 s, so the whole run stays under 9 minutes
# (9 min 15 s should a bench overrun its own limit and the outer timeout fire).
set -u
OUT=${1:?usage: ps_sim_probe5_run.sh OUT_DIR}
PY=${PYTHON:-/work/main/.venv/bin/python}
mkdir -p "$OUT/w2" "$OUT/w4" "$OUT/hosts2x2"
START=$(date +%s)
now() { echo "$(date -u +%T) at $(( $(date +%s) - START )) s, load $(cut -d' ' -f1-3 /proc/loadavg)"; }
echo "start $(now) code $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo -dirty)" > "$OUT/log.txt"
MODEL=(--model resnet18 --model-option width=16 --batch-size 8)
# The outer timeout gets 15 s over the bench's own, so that the bench's limit fires first and
# writes its partial JSON (added after the 21:56 run, where every part ended well within both).
bench() {  # NAME LIMIT_S ARGS...: one bench command, its outputs under OUT/NAME
    local name=$1 limit=$2; shift 2
    PYTHONPATH=$PWD timeout "$(( limit + 15 ))" "$PY" -m caramel.cli bench "$@" --timeout "$limit" \
        --json "$OUT/$name/bench.json" --markdown "$OUT/$name/bench.md" > "$OUT/$name/out.txt" 2> "$OUT/$name/log.txt"
    echo "$name exit $? $(now)" >> "$OUT/log.txt"
}
bench w2 200 "${MODEL[@]}" --workers 2 --ratio 2 --strategies ddp,ps,ps:order=random,ps:consistency=ssp:2
bench w4 260 "${MODEL[@]}" --workers 4 --ratio 1 --strategies ddp,ps,ps:consistency=ssp:2
ELAPSED=$(( $(date +%s) - START ))
if [ "$ELAPSED" -le 330 ]; then
    bench hosts2x2 $(( 540 - ELAPSED )) "${MODEL[@]}" --workers 2 --nproc-per-node 2 --bandwidth 100mbit \
        --strategies ddp,ps:hierarchical=true --warmup 5 --rounds 4 --steps 20
else
    echo "hosts2x2 skipped: the flat parts ended at $ELAPSED s (> 330 s)" >> "$OUT/log.txt"
fi
