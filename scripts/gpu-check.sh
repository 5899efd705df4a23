#!/usr/bin/env bash
# GPU check of the CUDA backend on one GPU (written for one H200), in one go:
#   1. build (release, CUDA feature on);
#   2. the CUDA test suite: kernel compilation (no spills), kernel numerics
#      against Rust references, and every parallel-strategy test on the CUDA
#      backend (the same test bodies as the CPU backend's);
#   3. GPT-2-tiny and a zoo GPT (4 layers, hidden 512): a few steps on the CPU
#      and on CUDA, f32 and bf16, losses compared (gradients are compared by
#      the test suite in step 2);
#   4. hybrid plans on the one GPU (the same-device exchange: the ranks' streams
#      read each other's buffers, through the backend's device-collective code
#      that NCCL runs between GPUs): dp2 x pp2 on 4 ranks and dp2 x tp2 x pp2
#      on 8, against one rank (the parallel suite's CUDA copies), and a 4-rank
#      plan from `--plan auto` through the CLI, against the CPU;
#   5. one process per rank: a 2-rank plan launched as two processes (both on
#      the one GPU, so they must agree not to use NCCL and talk over TCP)
#      against the same plan in one process;
#   6. `autopar profile --backend cuda --quick` launched as two processes on
#      the one GPU: rank 0 writes a loadable calibration whose GEMM and
#      bandwidth figures are measured, and says NCCL could not be measured;
#   7. MFU of a 1.3B-parameter GPT step in bf16 on one GPU, with its measured
#      peak device memory next to the planned;
# and writes a JSON summary to $OUT/gpu-check.json (or ./gpu-check.json).
# Tolerances: f32 losses within 1e-3 relative of the CPU backend; bf16 within
# 5e-2 (bf16 keeps 8 bits of mantissa; activations and GEMM inputs round).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${OUT:-.}"
mkdir -p "$OUT_DIR"
SUMMARY="$OUT_DIR/gpu-check.json"
LOG="$OUT_DIR/gpu-check.log"
: >"$LOG"
start=$(date +%s)

# CUDA libraries from Python wheels (nvidia-*), when the system has none on
# the loader path. cudarc looks for libX.so first, so link that name too.
libdir="$PWD/.cuda-libs"
mkdir -p "$libdir"
for so in $(python3 - <<'PY' 2>/dev/null
import glob, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()] + sys.path
seen = set()
for r in roots:
    for f in glob.glob(f"{r}/nvidia/*/lib/lib*.so*"):
        if f not in seen:
            seen.add(f)
            print(f)
PY
); do
  base=$(basename "$so")
  ln -sf "$so" "$libdir/$base"
  stem="${base%%.so*}"
  [ -e "$libdir/$stem.so" ] || ln -sf "$so" "$libdir/$stem.so"
  inc="$(dirname "$(dirname "$so")")/include"
  [ -f "$inc/cuda_bf16.h" ] && export AUTOPAR_CUDA_INCLUDE="${AUTOPAR_CUDA_INCLUDE:-$inc}"
done
export LD_LIBRARY_PATH="$libdir:${LD_LIBRARY_PATH:-}"
if [ -z "${AUTOPAR_CUDA_INCLUDE:-}" ]; then
  for inc in "${CUDA_HOME:-/usr/local/cuda}/include" /usr/local/cuda/include; do
    [ -f "$inc/cuda_bf16.h" ] && export AUTOPAR_CUDA_INCLUDE="$inc" && break
  done
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >>"$LOG" 2>&1

results=()
record() { # name status detail
  results+=("{\"check\":\"$1\",\"status\":\"$2\",\"detail\":$(python3 -c 'import json,sys;print(json.dumps(sys.argv[1]))' "$3")}")
  echo "== $1: $2 — $3" | tee -a "$LOG"
}

echo "== build" | tee -a "$LOG"
if cargo build --release --features cuda >>"$LOG" 2>&1; then
  record build ok "cargo build --release --features cuda"
else
  record build fail "see gpu-check.log"
fi
BIN=target/release/autopar

echo "== CUDA tests" | tee -a "$LOG"
# On this machine a missing compiler or GPU is a failure, never a skip.
export AUTOPAR_REQUIRE_NVRTC=1 AUTOPAR_REQUIRE_GPU=1
if cargo test --release -p autopar-cuda --features cuda --lib >>"$LOG" 2>&1 &&
   cargo test --release -p autopar-cuda --features cuda --test cuda_kernels --test parallel -- cuda >>"$LOG" 2>&1; then
  record tests ok "kernel numerics, compilation and the parallel-strategy suite on CUDA"
else
  record tests fail "see gpu-check.log (search for 'panicked' or 'FAILED')"
fi
if cargo test --release -p autopar-cuda --features cuda --test parallel -- cuda::hybrid >>"$LOG" 2>&1; then
  record hybrid-on-one-gpu ok "dp2 x pp2 (4 ranks) and dp2 x tp2 x pp2 (8 ranks) match one rank on CUDA"
else
  record hybrid-on-one-gpu fail "see gpu-check.log"
fi

# `autopar run ... --json` on a backend and precision; prints the JSON.
run_json() { # model backend precision ranks steps extra...
  local model=$1 backend=$2 precision=$3 ranks=$4 steps=$5
  shift 5
  timeout 300 "$BIN" run "$model" --plan auto --backend "$backend" --precision "$precision" \
    --ranks "$ranks" --steps "$steps" --seed 1 --json "$@" 2>>"$LOG"
}

# Compare losses of CPU (f32) with CUDA (f32 and bf16).
compare_losses() { # name model ranks steps extra...
  local name=$1 model=$2 ranks=$3 steps=$4
  shift 4
  local cpu f32 bf16
  cpu=$(run_json "$model" cpu f32 "$ranks" "$steps" "$@") || { record "$name" fail "cpu run failed"; return; }
  f32=$(run_json "$model" cuda f32 "$ranks" "$steps" "$@") || { record "$name" fail "cuda f32 run failed"; return; }
  bf16=$(run_json "$model" cuda bf16 "$ranks" "$steps" "$@") || { record "$name" fail "cuda bf16 run failed"; return; }
  python3 - "$name" "$cpu" "$f32" "$bf16" >>"$OUT_DIR/compare.txt" <<'PY'
import json, sys
name, cpu, f32, bf16 = sys.argv[1], *(json.loads(a) for a in sys.argv[2:])
def worst(a, b):
    return max(abs(x - y) / abs(x) for x, y in zip(a["losses"], b["losses"]))
e32, e16 = worst(cpu, f32), worst(cpu, bf16)
# Attention (masked, for the ONNX models) must run on the GPU's flash kernels.
on_host = f32.get("gpu", {}).get("host_nodes", {})
ok = e32 <= 1e-3 and e16 <= 5e-2 and not {"Attention", "AttentionGrad"} & set(on_host)
print(json.dumps({"check": name, "ok": ok, "f32_rel": e32, "bf16_rel": e16,
                  "cpu_losses": cpu["losses"], "cuda_f32_losses": f32["losses"],
                  "cuda_bf16_losses": bf16["losses"],
                  "cuda_f32_step_s": f32["median_step_time_s"],
                  "collectives": f32.get("gpu", {}).get("collectives", ""),
                  "host_nodes": f32.get("gpu", {}).get("host_nodes", {})}))
PY
  local line
  line=$(tail -1 "$OUT_DIR/compare.txt")
  if python3 -c 'import json,sys; sys.exit(0 if json.loads(sys.argv[1])["ok"] else 1)' "$line"; then
    record "$name" ok "$line"
  else
    record "$name" fail "$line"
  fi
}

: >"$OUT_DIR/compare.txt"
compare_losses gpt2-tiny fixtures/models/gpt2-tiny.ts.onnx 1 4 --global-batch 8
compare_losses zoo-gpt-512 'gpt:layers=4,hidden=512,heads=8,vocab=4096,seq=128' 1 3 --global-batch 4
compare_losses four-ranks-cli 'gpt:layers=4,hidden=256,heads=4,vocab=4096,seq=128' 4 3 --global-batch 16

echo "== one process per rank" | tee -a "$LOG"
LAUNCH_MODEL='gpt:layers=4,hidden=256,heads=4,vocab=4096,seq=128'
PLAN2="$OUT_DIR/plan-2-ranks.json"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
if "$BIN" plan "$LAUNCH_MODEL" --cluster cpu --gpus 2 --global-batch 8 -o "$PLAN2" >>"$LOG" 2>&1; then
  one=$(timeout 300 "$BIN" run "$PLAN2" --backend cuda --ranks 2 --steps 3 --json 2>>"$LOG")
  for rank in 1 0; do
    RANK=$rank WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      timeout 300 "$BIN" run "$PLAN2" --backend cuda --steps 3 --json >"$OUT_DIR/launched-$rank.json" 2>>"$LOG" &
  done
  wait
  line=$(python3 - "$one" "$OUT_DIR/launched-0.json" <<'PY' 2>>"$LOG"
import json, sys
one, launched = json.loads(sys.argv[1]), json.load(open(sys.argv[2]))
rel = max(abs(a - b) / abs(a) for a, b in zip(one["losses"], launched["losses"]))
# Both processes are on the one GPU, where NCCL refuses duplicate devices:
# the ranks must agree to stage their collectives through the host.
collectives = launched.get("gpu", {}).get("collectives", "")
print(json.dumps({"ok": rel <= 1e-3 and launched["processes"] == 2 and "share a GPU" in collectives,
                  "rel": rel, "collectives": collectives,
                  "one_process": one["losses"], "two_processes": launched["losses"],
                  "step_s": [one["median_step_time_s"], launched["median_step_time_s"]]}))
PY
)
  if [ -n "$line" ] && python3 -c 'import json,sys; sys.exit(0 if json.loads(sys.argv[1])["ok"] else 1)' "$line"; then
    record launched-processes ok "$line"
  else
    record launched-processes fail "${line:-see gpu-check.log}"
  fi
else
  record launched-processes fail "planning the 2-rank plan failed (see gpu-check.log)"
fi

echo "== profile, two processes" | tee -a "$LOG"
PROFILE="$OUT_DIR/gpu-quick.json"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
for rank in 1 0; do
  RANK=$rank WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    timeout 180 "$BIN" profile --backend cuda --quick -o "$PROFILE" >>"$LOG" 2>&1 &
done
wait
line=$(python3 - "$PROFILE" <<'PY' 2>>"$LOG"
import json, sys
cal = json.load(open(sys.argv[1]))
gemms = [m["flops_per_s"] for m in cal["matmul"]["measured"]]
about = cal["about"]
# Two processes on one GPU: NCCL refuses, so the network stays unmeasured.
ok = (len(gemms) > 0 and min(gemms) > 0 and cal["memory"]["measured_bytes_per_s"] > 0
      and "not measured" in about and "share a GPU" in about)
print(json.dumps({"ok": ok, "gemm_samples": len(gemms), "about": about}))
PY
)
if [ -n "$line" ] && python3 -c 'import json,sys; sys.exit(0 if json.loads(sys.argv[1])["ok"] else 1)' "$line"; then
  record profile ok "$line"
else
  record profile fail "${line:-see gpu-check.log}"
fi

echo "== MFU, 1.3B GPT, bf16, one GPU" | tee -a "$LOG"
GPT1B='gpt:layers=24,hidden=2048,heads=16,vocab=50304,seq=2048'
mfu_json=$(run_json "$GPT1B" cuda bf16 1 6 --global-batch 8)
flops=$("$BIN" inspect "$GPT1B" --batch 8 --json 2>>"$LOG" | python3 -c 'import json,sys; print(json.load(sys.stdin)["flops_per_step"]["total"])')
if [ -n "$mfu_json" ] && [ -n "$flops" ]; then
  line=$(python3 - "$mfu_json" "$flops" <<'PY'
import json, sys
run, flops = json.loads(sys.argv[1]), float(sys.argv[2])
peak = 989e12  # H200 dense bf16 (cost-models/src/presets/hgx-h200.toml)
step = run["median_step_time_s"]
mfu = flops / step / peak
gpu = run.get("gpu", {})
print(json.dumps({"step_s": step, "model_flops_per_step": flops, "mfu": mfu,
                  "target": 0.5, "host_nodes": gpu.get("host_nodes", {}),
                  "measured_peak_bytes": gpu.get("measured_peak_bytes"),
                  "planned_bytes": gpu.get("planned_here_bytes"),
                  "memory_model_bytes": gpu.get("predicted_here_bytes")}))
PY
)
  if python3 -c 'import json,sys; sys.exit(0 if json.loads(sys.argv[1])["mfu"] >= 0.5 else 1)' "$line"; then
    record mfu ok "$line"
  else
    record mfu below-target "$line"
  fi
else
  record mfu fail "the 1.3B run or its FLOP count failed (see gpu-check.log)"
fi

elapsed=$(( $(date +%s) - start ))
python3 - "$SUMMARY" "$elapsed" "${results[@]}" <<'PY'
import json, sys
path, elapsed, items = sys.argv[1], int(sys.argv[2]), [json.loads(x) for x in sys.argv[3:]]
json.dump({"seconds": elapsed, "checks": items}, open(path, "w"), indent=2)
print(f"wrote {path} ({elapsed} s)")
PY
