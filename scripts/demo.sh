#!/usr/bin/env bash
# Builds mt6d and runs the zero-configuration demo (root). Extra arguments go to `mt6d demo`,
# e.g. scripts/demo.sh --rotation 1 --pcap /tmp/public.pcap
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh >/dev/null
cargo build --release --locked -p mt6d
exec target/release/mt6d demo "$@"
