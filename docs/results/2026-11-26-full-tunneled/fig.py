import json,sys
d=json.load(open(sys.argv[1]))
rows={(r['topology'],r['scenario']):r for r in d['rows']}
topos=sorted(set(t for t,_ in rows))
for topo in topos:
    print('##',topo)
    base=rows.get((topo,'none'),{}).get('tests',{}).get('ping_std',{}).get('rtt_p50_ms')
    for (t,s),r in rows.items():
        if t!=topo: continue
        T=r.get('tests',{})
        g=lambda k,m: (T.get(k) or {}).get(m)
        ps=T.get('ping_std',{})
        line=f"{s:14} p50 {ps.get('rtt_p50_ms',0):.3f} (+{(ps.get('rtt_p50_ms',0)-(base or 0)):.3f}) p99 {ps.get('rtt_p99_ms',0):.3f} max {ps.get('rtt_max_ms',0):.2f} slow {ps.get('slow_echoes')} lost {ps.get('lost')}"
        if '1s' in str(T.keys()):
            p1=T.get('ping_std_1s_rotation',{})
            line+=f" | 1s: p50 {p1.get('rtt_p50_ms',0):.3f} max {p1.get('rtt_max_ms',0):.2f} slow {p1.get('slow_echoes')} lost {p1.get('lost')}; flood1s lost {g('ping_flood_1s_rotation','lost')}"
        line+=f" | tcp {g('iperf_tcp_1','mbit_per_s') or 0:.0f}/{g('iperf_tcp_4','mbit_per_s') or 0:.0f} cpu4 {((g('iperf_tcp_4','gateway_a_cpu') or {}).get('cpu_percent') or 0):.0f}% flows {g('http_small_flows','flows_per_s') or 0:.0f} p99 {g('http_small_flows','flow_ms_p99')} flood50k {g('ping_flood_50k','rtt_avg_ms') or 0:.3f} lost {g('ping_flood_50k','lost')}"
        print(line)
        if 'workers_scaling' in r:
            w=r['workers_scaling']
            for k in ('one','default'):
                x=w.get(k,{})
                print(f"   workers {k}: tcp1 {x.get('tcp_1_mbit_per_s') or 0:.0f} ({x.get('tcp_1_cpu_percent_per_gbit') or 0:.1f}%/Gb) tcp4 {x.get('tcp_4_mbit_per_s') or 0:.0f} ({x.get('tcp_4_cpu_percent_per_gbit') or 0:.1f}%/Gb) flows {x.get('flows_per_s') or 0:.0f} p99 {x.get('flow_ms_p99')} cpu {x.get('flows_cpu_percent') or 0:.0f}%")
        if 'scrub_cost' in r:
            c=r['scrub_cost']; print(f"   scrub off {c.get('off_median')} on {c.get('on_median')} {c.get('on_vs_off_pct')}")
