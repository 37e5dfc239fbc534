#!/usr/bin/env bash
# The GPU table of benchmarks/RESULTS.md in one device call (see its "GPU table"
# entry): wheels in .whl/ (einop, pkbar, keras, namex, optree) are installed to
# /tmp/site, the checkout goes on PYTHONPATH, every output lands in $OUT.
#   run: bash benchmarks/gpu_table.sh   (carry: .whl)
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export KERAS_BACKEND=jax PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; lscpu | grep "Model name"; nproc
  python3 -c "import jax, flax, optax, orbax.checkpoint as o, keras; print(jax.__version__, jax.devices(), flax.__version__, optax.__version__, keras.__version__)"; } 2>&1 | tee "$OUT/env.txt"
t() { echo "### $(date -u +%H:%M:%S) $*"; }
{ t digits; KERAS_BACKEND=jax timeout 240 python3 benchmarks/vs_raw.py --steps 4096 --rounds 3; } 2>&1 | tee "$OUT/digits.txt"
{ t big; timeout 110 python3 benchmarks/vs_raw.py --model big --steps 512 --rounds 3 --only "at most 8" "already on the device" \
  "ciclo.loop (managed step)" "train_loop + keras_bar + history" "create_flax_state one-liner" \
  "fused K=32 (train_loop + bar + history)" "create_flax_state one-liner, fused K=32"; } 2>&1 | tee "$OUT/big.txt"
{ t fused_reads; timeout 30 python3 benchmarks/fused_reads.py; } 2>&1 | tee "$OUT/fused_reads.txt"
# the same host work on this machine's CPU (the loop-overhead targets of issue 31)
{ t observers-cpu; JAX_PLATFORMS=cpu timeout 60 python3 benchmarks/observers.py --steps 2000 --rounds 5; } 2>&1 | tee "$OUT/observers_cpu.txt"
{ t vs_raw-cpu; JAX_PLATFORMS=cpu timeout 50 python3 benchmarks/vs_raw.py --only "ciclo.loop" "train_loop + keras_bar + history" --rounds 5; } 2>&1 | tee "$OUT/vs_raw_cpu.txt"
{ t host_work-cpu; JAX_PLATFORMS=cpu timeout 45 python3 benchmarks/host_work.py --rounds 7; } 2>&1 | tee "$OUT/host_work_cpu.txt"
t done
