#!/usr/bin/env bash
# Validates `autopar export` with the target projects' own code: installs
# megatron-core, torchtitan 0.2 (the last release whose jobs are TOML files)
# and DeepSpeed from PyPI into a virtual environment on the CPU, plans every
# run of Megatron-LM's SC'21 Table 1 and takes every fixture plan, exports
# each to all three tools and loads the files with scripts/check_exports.py.
#
#   scripts/check-exports.sh                     # venv in target/exports-venv
#   VENV=/path/to/venv AUTOPAR=target/release/autopar scripts/check-exports.sh
#
# Not part of .ci/run: PyPI's torch wheel imports only with its CUDA
# libraries beside it, about 3 GB to download for a check that needs none.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${VENV:-target/exports-venv}"
out="${OUT:-target/exports-check}"
mkdir -p "$out"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
"$venv/bin/python" -c "import torch, deepspeed, megatron.core, torchtitan" 2> /dev/null || {
    echo "== installing torch, deepspeed, megatron-core and torchtitan 0.2 into $venv"
    "$venv/bin/pip" install --progress-bar off -q torch deepspeed megatron-core 'torchtitan>=0.2,<0.3'
}
"$venv/bin/python" - << 'EOF'
from importlib.metadata import version
print("validators:", ", ".join(f"{p} {version(p)}" for p in ["torch", "megatron-core", "torchtitan", "deepspeed"]))
EOF
autopar="${AUTOPAR:-${CARGO_TARGET_DIR:-target}/debug/autopar}"
[ -x "$autopar" ] || cargo build --bin autopar

plans=()
rows=$(python3 -c "import json; print(len(json.load(open('fixtures/megatron_sc21_table1.json'))['rows']))")
for i in $(seq 0 $((rows - 1))); do
    read -r layers hidden heads gpus batch < <(python3 -c "
import json; r = json.load(open('fixtures/megatron_sc21_table1.json'))['rows'][$i]
print(r['layers'], r['hidden'], r['heads'], r['gpus'], r['batch'])")
    plan="$out/sc21-$i-${gpus}gpus.json"
    "$autopar" plan "gpt:layers=$layers,hidden=$hidden,heads=$heads,vocab=51200,seq=2048,dtype=bf16" \
        --cluster dgx-a100-80g --gpus "$gpus" --global-batch "$batch" -o "$plan" > /dev/null
    plans+=("$plan")
done
for plan in fixtures/plans/*.json; do
    plans+=("$plan")
done

passed=0
failed=0
for plan in "${plans[@]}"; do
    dir="$out/$(basename "$plan" .json)"
    mkdir -p "$dir"
    "$autopar" export "$plan" --to megatron -o "$dir/megatron_args.sh" 2> "$dir/caveats.txt" > /dev/null
    "$autopar" export "$plan" --to torchtitan -o "$dir/torchtitan.toml" 2>> "$dir/caveats.txt" > /dev/null
    "$autopar" export "$plan" --to deepspeed -o "$dir/ds_config.json" 2>> "$dir/caveats.txt" > /dev/null
    result=$("$venv/bin/python" scripts/check_exports.py "$plan" "$dir" 2> "$dir/validators.log" || true)
    echo "$result" | grep -E '^(ok|FAIL)'
    passed=$((passed + $(echo "$result" | tail -1 | awk '{print $1}')))
    failed=$((failed + $(echo "$result" | tail -1 | awk '{print $3}')))
done
echo "exports check: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
