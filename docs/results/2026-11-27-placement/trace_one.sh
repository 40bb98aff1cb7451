#!/bin/bash
S=$1; O=$2
/work/main/target/release/mt6d bench --quick --topology switched --only $S --ping-std 150 --out /tmp/w/tr-$O > /tmp/w/tr-$O.log 2>&1 &
B=$!
sleep 12
sh -c 'exec perf record -q -o /tmp/w/tr-'$O'.data -a -e sched:sched_switch,sched:sched_wakeup,sched:sched_waking,net:net_dev_xmit,net:netif_receive_skb,irq_vectors:reschedule_entry,irq_vectors:call_function_single_entry,power:cpu_idle -e raw_syscalls:sys_enter --filter "common_pid != $$" -e raw_syscalls:sys_exit --filter "common_pid != $$" -- sleep 4' >/dev/null 2>&1
wait $B
