#!/usr/bin/env bash
# The one command to run on a lent (shared) GPU: read-only, nothing on the card is changed.
#
#   bash scripts/gpu_check_device.sh [OUT_DIR]      # OUT_DIR defaults to $OUT, then ./gpu_check_out
#
# Prints nvidia-smi's read-only header (no serials, no UUIDs), runs scripts/gpu_check.py in its
# default read-only mode, `perseus doctor --json`, scripts/gpu_runtime_check.py on a GPU-bound and a
# host-bound stage (measure-only), and prints the markdown table last. Every part has a `timeout`, so the
# whole command ends in about 9.5 minutes at most (GPU_CHECK_LIMIT_S, GPU_RUNTIME_CHECK_LIMIT_S); the JSON is rewritten after each part of the
# check, so a run cut short still leaves what it measured in OUT_DIR/gpu_check.json.
set -u
cd "$(dirname "$0")/.."
OUT_DIR="${1:-${OUT:-gpu_check_out}}"
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
CHECK_LIMIT_S="${GPU_CHECK_LIMIT_S:-230}"

hide_ids() { grep -viE 'serial|uuid|board id|part number|inforom|vbios|bus id|minor number|module id'; }

echo "== nvidia-smi -q (read-only header) =="
timeout -k 5 20 nvidia-smi -q 2>&1 | head -n 40 | hide_ids
echo "== clocks, power and clock-event reasons before the check =="
timeout -k 5 20 nvidia-smi -q -d CLOCK,POWER,PERFORMANCE 2>&1 | grep -vE '^\s*$' | head -n 70 | hide_ids

echo "== scripts/gpu_check.py --read-only (limit ${CHECK_LIMIT_S} s) =="
timeout -k 10 "$CHECK_LIMIT_S" "$PY" scripts/gpu_check.py --read-only --json --out "$OUT_DIR" \
    > "$OUT_DIR/gpu_check.stdout.json" 2> "$OUT_DIR/gpu_check.stderr.txt"
rc=$?
echo "gpu_check.py exit status: $rc (124/137: stopped by the time limit; its JSON keeps the finished parts)"
tail -n 20 "$OUT_DIR/gpu_check.stderr.txt"

echo "== clocks after the check (should read as before: nothing was locked) =="
timeout -k 5 20 nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,clocks.mem,power.draw,power.limit,temperature.gpu \
    --format=csv 2>&1 | head -n 5 | hide_ids

echo "== perseus doctor --json (read-only) =="
timeout -k 5 60 "$PY" -m perseus.cli doctor --json > "$OUT_DIR/doctor.json" 2> "$OUT_DIR/doctor.stderr.txt"
echo "perseus doctor exit status: $? (0 run, 1 measure-only, 2 unavailable; other: it could not run, see doctor.stderr.txt)"
head -c 4000 "$OUT_DIR/doctor.json"; echo; tail -n 5 "$OUT_DIR/doctor.stderr.txt"

RUNTIME_LIMIT_S="${GPU_RUNTIME_CHECK_LIMIT_S:-120}"
for stage in "gpt:" "host_bound:--hidden 256 --seq 256"; do
    name="${stage%%:*}"; extra="${stage#*:}"
    echo "== scripts/gpu_runtime_check.py --steps 24 $extra (measure-only, limit ${RUNTIME_LIMIT_S} s) =="
    # shellcheck disable=SC2086 - $extra holds separate arguments
    timeout -k 10 "$RUNTIME_LIMIT_S" "$PY" scripts/gpu_runtime_check.py --steps 24 $extra \
        > "$OUT_DIR/runtime_$name.json" 2> "$OUT_DIR/runtime_$name.stderr.txt"
    echo "gpu_runtime_check.py ($name) exit status: $?"
    head -c 3000 "$OUT_DIR/runtime_$name.json"; echo; tail -n 5 "$OUT_DIR/runtime_$name.stderr.txt"
done

if [ -s "$OUT_DIR/gpu_check.json" ]; then
    echo "== results (markdown for docs/gpu.md; JSON in $OUT_DIR/gpu_check.json) =="
    timeout -k 5 30 "$PY" scripts/gpu_check.py --render "$OUT_DIR/gpu_check.json" --out "$OUT_DIR"
else
    echo "no results: $OUT_DIR/gpu_check.json was not written"
fi
exit "$rc"
