#!/usr/bin/env bash
# Renders `autopar report` pages in headless Chromium (Debian's package,
# installed here when missing) and checks what a person would see: no
# console messages, every section present, the load under 2 s, a screenshot
# taken. Pages: Megatron-LM's 1T-parameter plan on 3,072 GPUs and a 4-rank
# CPU plan of the bundled GPT-2. Screenshots go to $OUT (default
# target/report-check/).
#
#   scripts/check-report.sh            # uses target/debug/autopar, built if missing
#   AUTOPAR=target/release/autopar scripts/check-report.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-target/report-check}"
mkdir -p "$out"
out="$(cd "$out" && pwd)" # absolute: Chromium opens the pages by file:// URL
if ! command -v chromium > /dev/null; then
    echo "== installing Debian's chromium"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium > /dev/null
fi
autopar="${AUTOPAR:-${CARGO_TARGET_DIR:-target}/debug/autopar}"
[ -x "$autopar" ] || cargo build --bin autopar

"$autopar" plan 'gpt:layers=128,hidden=25600,heads=160,vocab=51200,seq=2048,dtype=bf16' \
    --cluster dgx-a100-80g --gpus 3072 --global-batch 3072 -o "$out/plan-3072.json" > /dev/null
"$autopar" plan fixtures/models/gpt2-tiny.ts.onnx --cluster cpu --gpus 4 --global-batch 16 \
    -o "$out/plan-cpu.json" > /dev/null

# Chromium as the machine allows it: no sandbox as root, no GPU, and none of
# the background connections a closed network refuses.
chrome() {
    chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
        --disable-background-networking --disable-component-update --disable-sync \
        --user-data-dir="$(mktemp -d)" "$@"
}

passed=0
failed=0
check() { # name, condition result (0 = ok), detail
    if [ "$2" -eq 0 ]; then
        passed=$((passed + 1))
        echo "ok   $1${3:+: $3}"
    else
        failed=$((failed + 1))
        echo "FAIL $1${3:+: $3}"
    fi
}

for name in 3072 cpu; do
    page="$out/report-$name.html"
    "$autopar" report "$out/plan-$name.json" -o "$page" > /dev/null
    bytes=$(stat -c %s "$page")
    check "$name: page under 2 MB" $((bytes >= 2097152)) "$bytes bytes"

    chrome --enable-logging=stderr --v=0 --dump-dom "file://$page" \
        > "$out/dom-$name.html" 2> "$out/chromium-$name.log"
    console=$(grep -cE 'CONSOLE|Uncaught|net::ERR' "$out/chromium-$name.log" || true)
    check "$name: no console messages or failed loads" "$console" \
        "$(grep -E 'CONSOLE|Uncaught|net::ERR' "$out/chromium-$name.log" | head -3)"

    missing=""
    for id in summary why mesh groups mesh-grid stages stage-table memory memory-bars \
        time time-bar time-table timeline timeline-svg ranking top-k; do
        grep -q "id=\"$id\"" "$out/dom-$name.html" || missing="$missing $id"
    done
    check "$name: every section rendered" "$([ -z "$missing" ]; echo $?)" "${missing:+missing$missing}"

    ms=$(grep -o 'data-render-ms="[0-9]*"' "$out/dom-$name.html" | grep -o '[0-9]*' || echo 99999)
    check "$name: loaded in under 2 s" "$([ "$ms" -lt 2000 ]; echo $?)" "$ms ms from navigation to load"

    start=$(date +%s%N)
    chrome --window-size=1280,4000 --screenshot="$out/report-$name.png" "file://$page" \
        2> /dev/null > /dev/null
    took=$((($(date +%s%N) - start) / 1000000))
    shot=$(stat -c %s "$out/report-$name.png" 2> /dev/null || echo 0)
    check "$name: screenshot taken" "$([ "$shot" -gt 20000 ]; echo $?)" \
        "$out/report-$name.png, $shot bytes, browser start to file in $took ms"
done

echo "report check: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
