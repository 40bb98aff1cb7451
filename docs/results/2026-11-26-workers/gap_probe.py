#!/usr/bin/env python3
"""Records every time this SCHED_FIFO thread, asking to sleep 2 ms, was not run for more than
20 ms: the machine (or this VM) did not run anything of ours then. Bounded: exits after the
given seconds. Output: one line per gap: unix time at wake, gap ms."""
import os, sys, time
secs = float(sys.argv[1]); out = open(sys.argv[2], 'a', buffering=1)
try:
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(50))
except Exception as e:
    out.write(f"# no SCHED_FIFO: {e}\n")
end = time.monotonic() + secs
last = time.monotonic()
out.write(f"# start {time.time():.3f}\n")
while True:
    time.sleep(0.002)
    now = time.monotonic()
    gap = (now - last) * 1000
    if gap > 20:
        out.write(f"{time.time():.3f} {gap:.1f}\n")
    last = now
    if now > end:
        break
out.write(f"# end {time.time():.3f}\n")
