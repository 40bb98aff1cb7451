#!/usr/bin/env bash
# Runs every cargo-fuzz target for N seconds (default 20): ./fuzz/run-short.sh [N]
# Installs cargo-fuzz if missing; uses nightly if installed, else stable with RUSTC_BOOTSTRAP=1.
set -euo pipefail
cd "$(dirname "$0")"
secs="${1:-20}"
if ! cargo fuzz --help >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi
if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
    fuzz=(cargo +nightly fuzz)
else
    export RUSTC_BOOTSTRAP=1
    fuzz=(cargo fuzz)
fi
for t in $("${fuzz[@]}" list); do
    echo "== fuzz target $t for ${secs}s"
    "${fuzz[@]}" run "$t" -- -max_total_time="$secs"
done
echo "all fuzz targets ran ${secs}s without a crash"
