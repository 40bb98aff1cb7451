#!/bin/bash
# Same-run A/B of the packet worker change: before (main at becf9cd) and after, interleaved.
# usage: ab.sh TAG BEFORE AFTER
tag=$1; A=$2; B=$3; out=${OUT:-ab}/$tag; mkdir -p $out
run() { # name bin args...
  local name=$1 bin=$2; shift 2
  echo "$(date +%T) start $name" >> $out/log
  $bin bench "$@" --out $out/$name > $out/$name.stdout 2>&1
  echo "$(date +%T) end $name rc=$?" >> $out/log
}
for round in 1 2; do
  if [ $round = 1 ]; then order="A B"; else order="B A"; fi
  for w in $order; do
    bin=$A; [ $w = B ] && bin=$B
    run gw-$w-$round $bin --quick --only mt6d-encrypt,boringtun --topology switched
    run srv-$w-$round $bin --server --quick --clients 1000 --rates 10000,30000 --handshakes 1000 --netlink-fig2 0 --netlink-limit 0
    run relay-$w-$round $bin --relays --quick
  done
done
echo done >> $out/log
