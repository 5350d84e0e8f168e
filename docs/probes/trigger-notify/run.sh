#!/bin/bash
# Paired rounds of pgbench, 32 clients, each variant once per round in
# rotated order; prints each variant's median ratio to the plain INSERT (b)
# of the same round. Usage: run.sh URL [rounds] [seconds]
set -euo pipefail
url=$1; rounds=${2:-6}; secs=${3:-4}
dir=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
printf '\\set r random(0, 30)\nBEGIN;\nUPDATE probe_accounts SET balance = balance + 1 WHERE id = 1 + :client_id * 31 + :r;\nINSERT INTO outbox_events (id, type, subject, payload) VALUES (gen_random_uuid(), '"'"'account.changed'"'"', '"'"'account:1'"'"', '"'"'{}'"'"');\nCOMMIT;\n' > "$tmp/b.sql"
variants=(b w_none w_ship w_never w_exact w_view)
for v in "${variants[@]:1}"; do
  printf '\\set r random(0, 30)\nBEGIN;\nUPDATE %s SET balance = balance + 1 WHERE id = 1 + :client_id * 31 + :r;\nCOMMIT;\n' "$v" > "$tmp/$v.sql"
done
for r in $(seq "$rounds"); do
  for k in $(seq 0 $((${#variants[@]} - 1))); do
    v=${variants[$(( (k + r) % ${#variants[@]} ))]}
    tps=$(pgbench -n -M prepared -c 32 -j 2 -T "$secs" -f "$tmp/$v.sql" "$url" 2>&1 | awk '/^tps/ {print $3}')
    echo "$r $v $tps"
  done
done | python3 -c '
import collections, statistics, sys
by = collections.defaultdict(dict)
for line in sys.stdin:
    r, v, tps = line.split()
    by[r][v] = float(tps)
for v in sorted({v for row in by.values() for v in row}):
    ratios = sorted(row[v] / row["b"] for row in by.values())
    rounds = " ".join("%.2f" % x for x in ratios)
    print("%-8s paired median %.2f  rounds %s" % (v, statistics.median(ratios), rounds))
'
rm -rf "$tmp"
