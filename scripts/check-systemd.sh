#!/usr/bin/env bash
# packaging/systemd/mt6d@.service passes `systemd-analyze verify` without a single warning (the
# command exits 0 on unknown keys and bad values, so any output fails this check). The unit's
# binary path is pointed at this build and its Documentation= man pages at the pages this build
# generates, since verify checks that both exist.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v systemd-analyze >/dev/null 2>&1 || ! command -v man >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq systemd man-db
fi
cargo build --release --locked -p mt6d
bin="$PWD/target/release/mt6d"
dir=$(mktemp -d /tmp/mt6d-unit.XXXXXX)
trap 'rm -rf "$dir"' EXIT
"$bin" man --out "$dir/man/man1" >/dev/null
sed "s#/usr/bin/mt6d#$bin#g" packaging/systemd/mt6d@.service >"$dir/mt6d@example.service"
out=$(MANPATH="$dir/man" systemd-analyze verify "$dir/mt6d@example.service" 2>&1) || {
    echo "$out"
    echo "check-systemd: systemd-analyze verify failed" >&2
    exit 1
}
if [ -n "$out" ]; then
    echo "$out"
    echo "check-systemd: systemd-analyze verify warned (above)" >&2
    exit 1
fi
echo "check-systemd: packaging/systemd/mt6d@.service verifies cleanly"
