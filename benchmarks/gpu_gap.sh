#!/usr/bin/env bash
# On the device machine in one call: what 15 us of host work per step costs there
# (vs_raw.py's calibration row, at Python's switch interval and at 0.2 ms: does
# host work cost more than its time because jax's threads wait for the GIL?),
# issue 31's loop ratios with 25 rounds (GPU and the host's CPU), step_gap.py's
# paired table on the GPU, and py-spy profiles of raw / loop on the GPU.
#   run: bash benchmarks/gpu_gap.sh   (carry: .whl, with py-spy's wheel among them)
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
STEPS=${STEPS:-4096}; ROUNDS=${ROUNDS:-7}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PATH=/tmp/site/bin:$PATH
cd benchmarks
t() { echo "### $(date -u +%H:%M:%S) $*"; }
CAL=(vs_raw.py --steps 2048 --rounds 11 --busy-us 15 --only "raw + " "ciclo.loop (managed step)" "train_loop + keras_bar + history")
{ t calibration; timeout 75 python3 "${CAL[@]}"; } 2>&1 | tee "$OUT/calibration.txt"
{ t calibration-switch; timeout 75 python3 "${CAL[@]}" --switch-interval 0.0002; } 2>&1 | tee "$OUT/calibration_switch.txt"
RATIO=(vs_raw.py --steps 2048 --rounds 25 --only "ciclo.loop (managed step)" "train_loop + keras_bar + history")
{ t ratio-device; timeout 100 python3 "${RATIO[@]}"; } 2>&1 | tee "$OUT/ratio_device.txt"
{ t ratio-cpu; JAX_PLATFORMS=cpu timeout 60 python3 "${RATIO[@]}"; } 2>&1 | tee "$OUT/ratio_cpu.txt"
{ t gap-device; timeout 90 python3 step_gap.py --steps "$STEPS" --rounds "$ROUNDS"; } 2>&1 | tee "$OUT/gap_device.txt"
for v in raw loop; do
  timeout 40 py-spy record -r 250 -f raw -o "$OUT/spy_$v.txt" -- python3 step_gap.py --profile $v --steps "$STEPS" --rounds 3 > /dev/null 2>&1
  { t "spy $v"; python3 step_gap.py --summarize "$OUT/spy_$v.txt" | head -40; } 2>&1 | tee "$OUT/spy_${v}_summary.txt"
done
t done
