#!/usr/bin/env bash
# The project's one test command (README, .ci/run): formatting, lints, every unit, property,
# simulator and network-namespace end-to-end test, and a short run of every fuzz target.
# The namespace tests need root; run as root (CI is root).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cargo fmt --all -- --check
scripts/check-layout.sh
cargo clippy --workspace --all-targets --locked -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked
(cd fuzz && cargo fmt --all -- --check && cargo clippy --all-targets --locked -- -D warnings)
scripts/check-msrv.sh
scripts/check-deps.sh
# Release profile: the end-to-end tests push real traffic through the gateways.
cargo test --workspace --locked --release -- --include-ignored
scripts/check-systemd.sh
scripts/check-deb.sh
fuzz/run-short.sh "${MT6D_FUZZ_SECS:-10}"
# The lab bench's quick profile: every scenario on every topology, checked complete.
scripts/install-bench-deps.sh
cargo build --release --locked -p mt6d -p mt6d-bench
bench_out=$(mktemp -d /tmp/mt6d-bench-ci.XXXXXX)
target/release/mt6d bench --quick --out "$bench_out"
scripts/check-bench-json.py "$bench_out/results.json"
rm -rf "$bench_out"
