# Reads a perf script text of sched_switch/sched_wakeup: per thread name, how long a woken thread waited to run.
import re,sys,collections
wake={}; delays=collections.defaultdict(list); worst=[]
ksoft=collections.defaultdict(float); ks_start={}
for line in open(sys.argv[1]):
    m=re.match(r'\s*(.+?)\s+(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+(\S+):\s*(.*)',line)
    if not m: continue
    comm,tid,cpu,t,ev,rest=m.groups(); t=float(t)
    if ev=='sched:sched_wakeup':
        w=re.search(r'comm=(\S+) pid=(\d+)',rest)
        if w and w.group(1).startswith(('mt6d','ksoftirqd','bench')):
            wake.setdefault(w.group(2),(t,w.group(1)))
    elif ev=='sched:sched_switch':
        s=re.search(r'prev_comm=(.+?) prev_pid=(\d+).*next_comm=(.+?) next_pid=(\d+)',rest)
        pc,pp,nc,np_=s.groups()
        wake.pop(pp,None)
        if np_ in wake:
            t0,c=wake.pop(np_); d=(t-t0)*1000
            delays[c].append(d)
            if d>2: worst.append((d,t0,c,cpu,pc))
        if nc.startswith('ksoftirqd'): ks_start[cpu]=t
        if pc.startswith('ksoftirqd') and cpu in ks_start: ksoft[cpu]+=t-ks_start.pop(cpu)
for c,ds in sorted(delays.items()):
    ds.sort(); n=len(ds)
    print(f"{c:14s} wakeups {n:7d}  p50 {ds[n//2]:.3f} ms  p99 {ds[n*99//100]:.3f} ms  p99.9 {ds[min(n-1,n*999//1000)]:.3f}  max {ds[-1]:.3f} ms  over 2 ms {sum(d>2 for d in ds)}")
print('ksoftirqd running s per cpu', dict(ksoft))
worst.sort(reverse=True)
for w in worst[:15]: print('%.2f ms wake at %.6f %s cpu %s, ran after %s'%w)
