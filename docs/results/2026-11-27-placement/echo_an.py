import sys,re
lines=open(sys.argv[1]).read().splitlines()
ev=[]
for l in lines:
    m=re.match(r'\s*(\S.*?)\s+(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+(\S+):\s*(.*)',l)
    if m: ev.append((float(m.group(4)),int(m.group(3)),m.group(1),int(m.group(2)),m.group(5),m.group(6)))
# echo start: net_dev_xmit dev=eth0 by mt6d-bench (host A's pinger)
starts=[i for i,e in enumerate(ev) if e[4]=='net:net_dev_xmit' and 'dev=eth0' in e[5] and e[2].startswith('mt6d-bench')]
for s in starts:
    t0=ev[s][0]
    # end: waking of mt6d-bench after start
    end=None
    for j in range(s+1,min(s+400,len(ev))):
        if ev[j][4]=='sched:sched_waking' and 'comm=mt6d-bench' in ev[j][5]:
            end=j;break
    if end is None: continue
    cpus=[ev[j][1] for j in range(s,end+1) if not ev[j][2].startswith('swapper')]
    switches=sum(1 for a,b in zip(cpus,cpus[1:]) if a!=b)
    wak=[(ev[j][5].split()[0], ev[j][5].split()[-1], ev[j][1]) for j in range(s,end) if ev[j][4]=='sched:sched_wakeup']
    print(f"{(ev[end][0]-t0)*1e6:7.0f} us  cpu-changes={switches} wakeups={len(wak)} {wak}")
