#!/bin/bash
# Run from the repository root as root, with the release test binaries built.
# One loaded run: two busy loops (nice 0) and a release build (nice 10) beside the stall test's
# bench-conditions trains, with sched_switch/sched_wakeup recorded system-wide.
out=$1
(timeout 170 sh -c 'while :; do :; done' &) ; (timeout 170 sh -c 'while :; do :; done' &)
rm -rf /tmp/target-trace; (CARGO_TARGET_DIR=/tmp/target-trace timeout 170 nice -n 10 cargo build --release -p mt6d-proto > /tmp/trace-build.log 2>&1 &)
perf record -a -k mono -e sched:sched_switch,sched:sched_wakeup -o /tmp/$out.data -- sleep 150 > /tmp/$out.perf.log 2>&1 &
sleep 2
(sleep 30; for d in /proc/[0-9]*/task/*; do c=$(cat $d/comm 2>/dev/null); [ "$c" = mt6d-rx ] && grep -m1 "se.slice" $d/sched; done > /tmp/$out.slice) &
cargo test --release -p mt6d --test stall_netns -- --include-ignored bench_conditions --nocapture 2>&1 | grep -E "GRO on|test result|panicked" | cut -c1-600
while pgrep -x perf >/dev/null; do sleep 3; done; sleep 12
cat /tmp/$out.slice
perf script -i /tmp/$out.data -F comm,tid,cpu,time,event,trace > /tmp/$out.txt 2>/dev/null
python3 "$(dirname "$0")/wakeups.py" /tmp/$out.txt 2>/dev/null | head -8
