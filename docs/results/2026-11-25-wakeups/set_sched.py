# Experiment, not product: gives every mt6d packet thread a scheduler slice (argument: ns, 0 = the default) or SCHED_FIFO 10 ("fifo") for a number of seconds.
import ctypes, os, struct, sys, time
libc = ctypes.CDLL(None, use_errno=True)
FIFO = sys.argv[1] == 'fifo'
SLICE = 0 if FIFO else int(sys.argv[1])
DUR = float(sys.argv[2]) if len(sys.argv) > 2 else 140
names = {'mt6d-rx', 'mt6d-tx', 'mt6d-icmp', 'mt6d-router'}
done = set()
def set_slice(tid):
    nice = os.getpriority(os.PRIO_PROCESS, tid)
    # size, policy, flags, nice, priority, runtime, deadline, period, util_min, util_max
    attr = struct.pack('IIQiIQQQII', 56, 1 if FIFO else 0, 0, 0 if FIFO else nice, 10 if FIFO else 0, SLICE, 0, 0, 0, 0)
    buf = ctypes.create_string_buffer(attr)
    r = libc.syscall(314, tid, buf, 0)
    if r != 0:
        print('sched_setattr', tid, os.strerror(ctypes.get_errno()), flush=True)
    return r == 0
end = time.time() + DUR
while time.time() < end:
    for pid in os.listdir('/proc'):
        if not pid.isdigit(): continue
        try:
            for tid in os.listdir(f'/proc/{pid}/task'):
                t = int(tid)
                if t in done: continue
                comm = open(f'/proc/{pid}/task/{tid}/comm').read().strip()
                if comm in names and set_slice(t):
                    done.add(t)
        except OSError:
            pass
    time.sleep(0.3)
print('threads given a slice:', len(done))
