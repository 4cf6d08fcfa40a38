#!/bin/bash
# Issue 28's hierarchical validation run: ddp, flat ps and ps:hierarchical=true side by side on
# emulated hosts of 2 ranks each (docs/results/ps_hier_validation.md states the plan and its rule).
# Under the bench lock, from the repository root, as root:
#   /tmp/bench.sh bash experiments/ps_hier_validation_run.sh OUT_DIR
# Configuration A (2 hosts of 2) always runs; B (3 hosts of 2) only if A ended within 330 s of
# the start, with the rest of a 580 s budget as its limit, so the whole run stays under 10 min.
set -u
OUT=${1:?usage: ps_hier_validation_run.sh OUT_DIR}
PY=${PYTHON:-/work/main/.venv/bin/python}
mkdir -p "$OUT"
START=$(date +%s)
echo "start $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)" > "$OUT/load.txt"
COMMON=(--bandwidth 100mbit --strategies ddp,ps,ps:hierarchical=true --warmup 5)
PYTHONPATH=$PWD "$PY" -m caramel.cli bench --workers 2 --nproc-per-node 2 "${COMMON[@]}" --rounds 4 --steps 20 \
    --timeout 360 --json "$OUT/hosts2x2.json" --markdown "$OUT/hosts2x2.md" > "$OUT/hosts2x2.txt" 2> "$OUT/hosts2x2.log"
echo "A exit $? at $(( $(date +%s) - START )) s load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/load.txt"
ELAPSED=$(( $(date +%s) - START ))
if [ "$ELAPSED" -le 330 ]; then
    PYTHONPATH=$PWD "$PY" -m caramel.cli bench --workers 3 --nproc-per-node 2 "${COMMON[@]}" --rounds 3 --steps 12 \
        --timeout $(( 580 - ELAPSED )) --json "$OUT/hosts3x2.json" --markdown "$OUT/hosts3x2.md" \
        > "$OUT/hosts3x2.txt" 2> "$OUT/hosts3x2.log"
    echo "B exit $? at $(( $(date +%s) - START )) s load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/load.txt"
else
    echo "B skipped: A ended at $ELAPSED s (> 330 s)" >> "$OUT/load.txt"
fi
