#!/usr/bin/env python3
"""Checks that a `mt6d bench` results.json has a row for every scenario on every topology
(CI runs `mt6d bench --quick` and checks the JSON is complete).

A row is complete when it was measured (available, no error, a tests object; mt6d-encrypt also the
TCP policy's cost off and on, `scrub_cost`, and one data-plane worker against the default,
`workers_scaling`; every measured row also the many small flows, `http_small_flows`), or when it says why its peer is not available. Also the server role's CPU probe, `server_cpu`: CPU per request beside the kernel's plain echo and per rotated client.
Exits non-zero, naming what is missing, otherwise."""
import json
import sys

TOPOLOGIES = ["switched", "routed", "tunneled"]
SCENARIOS = ["none", "kernel-vxlan", "mt6d-plain", "mt6d-auth", "mt6d-encrypt", "wireguard-go", "boringtun"]

path = sys.argv[1]
with open(path) as f:
    doc = json.load(f)
rows = {(r.get("topology"), r.get("scenario")): r for r in doc.get("rows", [])}
problems = []
unavailable = []
for t in TOPOLOGIES:
    for s in SCENARIOS:
        r = rows.get((t, s))
        if r is None:
            problems.append(f"{t}/{s}: no row")
        elif r.get("available") is True:
            if r.get("error"):
                problems.append(f"{t}/{s}: error {r['error']}")
            elif not isinstance(r.get("tests"), dict) or not r["tests"]:
                problems.append(f"{t}/{s}: no tests measured")
            elif s == "mt6d-encrypt":
                # The TCP policy's cost, off and on, in the same run.
                c = r.get("scrub_cost")
                if not isinstance(c, dict):
                    problems.append(f"{t}/{s}: no scrub_cost")
                elif c.get("error"):
                    problems.append(f"{t}/{s}: scrub_cost error {c['error']}")
                elif not all(isinstance(c.get(k), (int, float)) and c[k] > 0
                             for k in ("off_median", "on_median")):
                    problems.append(f"{t}/{s}: scrub_cost without off and on throughput")
                # One worker against the default, in the same run.
                w = r.get("workers_scaling")
                if not isinstance(w, dict):
                    problems.append(f"{t}/{s}: no workers_scaling")
                elif w.get("error"):
                    problems.append(f"{t}/{s}: workers_scaling error {w['error']}")
                elif not all(isinstance((w.get(k) or {}).get(m), (int, float)) and w[k][m] > 0
                             for k in ("one", "default")
                             for m in ("tcp_1_mbit_per_s", "tcp_4_mbit_per_s", "flows_per_s")):
                    problems.append(f"{t}/{s}: workers_scaling without TCP and flow figures")
            if isinstance(r.get("tests"), dict) and r["tests"]:
                f = r["tests"].get("http_small_flows")
                if not isinstance(f, dict) or f.get("error") or not f.get("flows_per_s"):
                    problems.append(f"{t}/{s}: http_small_flows not measured: {f}")
        elif not r.get("reason") and not r.get("error"):
            problems.append(f"{t}/{s}: not available and no reason given")
        else:
            unavailable.append(f"{t}/{s}: {r.get('reason') or r.get('error')}")
# The server role's CPU per request beside the kernel's plain echo, and per rotated client.
sc = doc.get("server_cpu")
if not isinstance(sc, dict):
    problems.append("server_cpu: missing")
elif sc.get("error"):
    problems.append(f"server_cpu: error {sc['error']}")
else:
    def positive(v):
        return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
    rows = sc.get("cpu_vs_kernel_echo") or []
    if not rows:
        problems.append("server_cpu: no cpu_vs_kernel_echo rows")
    for r in rows:
        for k in ("server_us_per_request", "server_workers_us_per_request",
                  "kernel_echo_us_per_request", "ratio"):
            if not positive(r.get(k)):
                problems.append(f"server_cpu: {r.get('clients')} clients at {r.get('rate')}/s: no {k}")
    for run in sc.get("server_role") or [{}]:
        idle = (run.get("idle_cpu") or {})
        if not positive(idle.get("client_boundaries")) or \
                not positive((idle.get("threads") or {}).get("main_us_per_rotated_client")):
            problems.append(f"server_cpu: {run.get('clients')} clients: no main_us_per_rotated_client")
for u in unavailable:
    print(f"bench: not available: {u}")
if problems:
    print(f"bench: {path} incomplete:\n  " + "\n  ".join(problems))
    sys.exit(1)
print(f"bench: {path}: all {len(TOPOLOGIES) * len(SCENARIOS)} rows present")
