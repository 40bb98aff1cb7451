#!/usr/bin/env bash
# The minimum supported Rust version (`rust-version` in Cargo.toml) builds the product: every
# library and binary of the workspace. Dev-dependencies are not held to it (criterion needs
# 1.86, proptest 1.88), so tests and benches are checked with the current toolchain only.
set -euo pipefail
cd "$(dirname "$0")/.."
msrv=$(sed -n 's/^rust-version = "\(.*\)"$/\1/p' Cargo.toml)
if [ -z "$msrv" ]; then
    echo "check-msrv: no rust-version in Cargo.toml" >&2
    exit 1
fi
rustup toolchain install "$msrv" --profile minimal --no-self-update
cargo +"$msrv" check --workspace --locked --target-dir target/msrv
echo "check-msrv: the workspace builds with Rust $msrv"
