#!/usr/bin/env bash
# Installs what building and testing mt6d needs on a fresh Debian 12 machine (root). Idempotent:
# a step whose result is already there is skipped.
#   - a C compiler (ring builds its assembly, aws-lc-rs its C library, with cc), pkg-config, iproute2 (the tests inspect
#     kernel state with `ip`; the daemon itself never runs it), nftables (the daemon loads its
#     own table with `nft`)
#   - p0f (the SYN fingerprint normalisation test reads what arrives with it)
#   - util-linux's setpriv and unshare (the least-privilege test runs the daemon as `nobody`
#     with two capabilities; essential on Debian, checked anyway)
#   - promtool, from Debian's prometheus package (the metrics tests check the endpoint with it)
#   - the Rust toolchain's rustfmt and clippy components
#   - cargo-deb (crates.io), which scripts/check-deb.sh builds the .deb with, and debootstrap,
#     which makes the clean chroot that script installs it into
set -euo pipefail

need=()
command -v cc >/dev/null 2>&1 || need+=(build-essential)
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v nft >/dev/null 2>&1 || need+=(nftables)
{ command -v setpriv && command -v unshare; } >/dev/null 2>&1 || need+=(util-linux)
command -v p0f >/dev/null 2>&1 || need+=(p0f)
if ((${#need[@]})); then
    echo "install-deps: apt-get install ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${need[@]}"
fi

# promtool (Debian's prometheus package) checks the metrics endpoint's output. The package would
# start a Prometheus server at install; a policy-rc.d that refuses service starts is put in place
# for the install only (and only if none exists), so nothing is left running.
if ! command -v promtool >/dev/null 2>&1; then
    echo "install-deps: apt-get install prometheus (for promtool; its service is not started)"
    export DEBIAN_FRONTEND=noninteractive
    guard=
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod 0755 /usr/sbin/policy-rc.d
        guard=1
    fi
    apt-get update -qq
    status=0
    apt-get install -y -qq --no-install-recommends prometheus || status=$?
    if [ -n "$guard" ]; then
        rm -f /usr/sbin/policy-rc.d
    fi
    if [ "$status" -ne 0 ]; then
        echo "install-deps: installing prometheus (promtool) failed" >&2
        exit "$status"
    fi
fi

if ! command -v cargo >/dev/null 2>&1; then
    echo "install-deps: cargo not found; install Rust (rustup) first" >&2
    exit 1
fi
for component in rustfmt clippy; do
    rustup component list --installed 2>/dev/null | grep -q "^$component" || rustup component add "$component"
done
command -v debootstrap >/dev/null 2>&1 || {
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq debootstrap
}
# Pinned: the package's layout is checked against what this version writes.
cargo_deb_version=3.8.0
if ! cargo deb --version 2>/dev/null | grep -q " $cargo_deb_version\b"; then
    echo "install-deps: cargo install cargo-deb $cargo_deb_version"
    cargo install --locked --version "$cargo_deb_version" cargo-deb
fi
echo "install-deps: ok"
