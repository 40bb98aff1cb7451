#!/usr/bin/env bash
# The long run ("soak, as 001 did"): two gateways in the switched lab, rotation every
# second, rekey every two minutes, carrying a long-lived TCP transfer, a 50 packets/s RTP-like
# UDP stream and a ping train for HOURS; reports session breaks, loss, jitter and the daemons'
# memory and open descriptors over time. Root. Results go to docs/results/DATE-soak/ unless
# --out DIR is given; extra arguments go to `mt6d bench --soak`, e.g.
#   scripts/soak.sh 2
#   scripts/soak.sh 0.5 --restart-every 10 --sample-secs 30
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $# -lt 1 || "$1" == -* ]]; then
    echo "usage: scripts/soak.sh HOURS [--sample-secs S] [--restart-every MINUTES] [--out DIR]" >&2
    exit 2
fi
hours=$1
shift
scripts/install-deps.sh >/dev/null
nice -n 10 cargo build --release --locked -p mt6d -p mt6d-bench
out=(--out "docs/results/$(date -u +%Y-%m-%d)-soak")
for a in "$@"; do [[ "$a" == --out ]] && out=(); done
exec target/release/mt6d-bench --soak "$hours" "${out[@]}" "$@"
