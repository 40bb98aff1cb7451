#!/usr/bin/env bash
# Installs what building and testing mt6d needs on a fresh Debian 12 machine (root). Idempotent:
# a step whose result is already there is skipped.
#   - a C compiler (ring builds its assembly with cc), pkg-config, iproute2 (the tests inspect
#     kernel state with `ip`; the daemon itself never runs it), nftables (the daemon loads its
#     own table with `nft`)
#   - util-linux's setpriv and unshare (the least-privilege test runs the daemon as `nobody`
#     with two capabilities; essential on Debian, checked anyway)
#   - the Rust toolchain's rustfmt and clippy components
set -euo pipefail

need=()
command -v cc >/dev/null 2>&1 || need+=(build-essential)
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v nft >/dev/null 2>&1 || need+=(nftables)
{ command -v setpriv && command -v unshare; } >/dev/null 2>&1 || need+=(util-linux)
if ((${#need[@]})); then
    echo "install-deps: apt-get install ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${need[@]}"
fi

if ! command -v cargo >/dev/null 2>&1; then
    echo "install-deps: cargo not found; install Rust (rustup) first" >&2
    exit 1
fi
for component in rustfmt clippy; do
    rustup component list --installed 2>/dev/null | grep -q "^$component" || rustup component add "$component"
done
echo "install-deps: ok"
