#!/bin/bash
# Logs the machine's idle share (/proc/stat idle + iowait over all fields) while iperf3 TCP
# clients (-t) run, with the bench's last progress line. Usage, beside a running bench:
#   tcp_idle.sh OUT.txt BENCH.log
# Back-to-back runs (1 then 4 streams) fall into one window. Reads /proc only (no load).
out=$1
log=$2
end=$((SECONDS + 6000))
while [ $SECONDS -lt $end ]; do
  if pgrep -f "iperf3 .*-t" >/dev/null; then
    cmd=$(pgrep -af "iperf3 .*-t" | head -1)
    sleep 0.3
    a=($(head -1 /proc/stat)); t0=$(date +%s.%N)
    while pgrep -f "iperf3 .*-t" >/dev/null; do sleep 0.2; done
    b=($(head -1 /proc/stat)); t1=$(date +%s.%N)
    tot=0; for i in 1 2 3 4 5 6 7 8; do tot=$((tot + b[i] - a[i])); done
    idle=$(( b[4] - a[4] + b[5] - a[5] ))
    prog=$(grep -a '^\[' "$log" | tail -1 | cut -c1-70)
    echo "$(date +%T) idle $(awk "BEGIN{printf \"%.3f\", $idle/$tot}") secs $(awk "BEGIN{printf \"%.1f\", $t1-$t0}") | $prog | ${cmd##*iperf3}" >> "$out"
  fi
  sleep 0.2
done
