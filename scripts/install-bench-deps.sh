#!/bin/sh
# Installs what `mt6d bench` drives besides mt6d itself (docs/BENCH.md). Idempotent: every step
# is skipped when its result is already there, so running it again is cheap.
#
#   Debian packages: iperf3 nginx-light (or nginx) curl wireguard-tools ethtool apache2-utils (ab)
#   wireguard-go:    `go install golang.zx2c4.com/wireguard@latest` into $BENCH_BIN (never the
#                    Debian wireguard-go package: it lags upstream by years)
#   boringtun-cli:   `cargo install boringtun-cli --locked --root $BENCH_PREFIX`
#
# The bench looks for wireguard-go and boringtun-cli in $BENCH_BIN first, then in $PATH.
# A step that fails is reported and the others still run: the bench marks the rows of a peer it
# cannot find as "not available" and measures the rest.
set -u

BENCH_PREFIX=${BENCH_PREFIX:-/opt/mt6d-bench}
BENCH_BIN="$BENCH_PREFIX/bin"
mkdir -p "$BENCH_BIN"
failed=""

have() { command -v "$1" >/dev/null 2>&1; }

missing=""
for pair in iperf3:iperf3 curl:curl wg:wireguard-tools ethtool:ethtool ab:apache2-utils; do
    cmd=${pair%%:*}; pkg=${pair#*:}
    have "$cmd" || missing="$missing $pkg"
done
if ! have nginx && [ ! -x /usr/sbin/nginx ]; then
    missing="$missing nginx-light"
fi
if [ -n "$missing" ]; then
    echo "install-bench-deps: apt-get install$missing"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q || failed="$failed apt-get-update"
    # nginx-light was folded into nginx in newer Debian releases; fall back to it.
    if ! apt-get install -y -q --no-install-recommends $missing; then
        alt=$(echo "$missing" | sed 's/nginx-light/nginx/')
        apt-get install -y -q --no-install-recommends $alt || failed="$failed apt:$alt"
    fi
    # The Debian nginx package starts a system-wide server; the bench runs its own per namespace.
    if have systemctl; then systemctl disable --now nginx >/dev/null 2>&1 || true; fi
    if [ -f /run/nginx.pid ]; then kill "$(cat /run/nginx.pid)" 2>/dev/null || true; fi
else
    echo "install-bench-deps: Debian packages present"
fi

if [ -x "$BENCH_BIN/wireguard-go" ]; then
    echo "install-bench-deps: wireguard-go present ($BENCH_BIN/wireguard-go)"
elif have go; then
    echo "install-bench-deps: go install golang.zx2c4.com/wireguard@latest"
    GOBIN="$BENCH_BIN" go install golang.zx2c4.com/wireguard@latest || failed="$failed wireguard-go"
    # The module's main package builds a binary named after the module path's last element.
    if [ -x "$BENCH_BIN/wireguard" ] && [ ! -e "$BENCH_BIN/wireguard-go" ]; then
        mv "$BENCH_BIN/wireguard" "$BENCH_BIN/wireguard-go"
    fi
else
    echo "install-bench-deps: no go toolchain: wireguard-go not installed" >&2
    failed="$failed wireguard-go(no-go)"
fi

if [ -x "$BENCH_BIN/boringtun-cli" ]; then
    echo "install-bench-deps: boringtun-cli present ($BENCH_BIN/boringtun-cli)"
elif have cargo; then
    echo "install-bench-deps: cargo install boringtun-cli --locked"
    cargo install boringtun-cli --locked --root "$BENCH_PREFIX" || failed="$failed boringtun-cli"
else
    echo "install-bench-deps: no cargo: boringtun-cli not installed" >&2
    failed="$failed boringtun-cli(no-cargo)"
fi

if [ -n "$failed" ]; then
    echo "install-bench-deps: FAILED:$failed (the bench marks those rows not available)" >&2
    exit 1
fi
echo "install-bench-deps: done; binaries in $BENCH_BIN"
