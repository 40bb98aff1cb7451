#!/usr/bin/env bash
# The project's one test command (README, .ci/run): formatting, lints, every unit, property,
# simulator and network-namespace end-to-end test, and a short run of every fuzz target.
# The namespace tests need root; run as root (CI is root).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# Release profile: the end-to-end tests push real traffic through the gateways.
cargo test --workspace --locked --release
fuzz/run-short.sh "${MT6D_FUZZ_SECS:-10}"
