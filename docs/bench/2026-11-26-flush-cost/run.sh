#!/usr/bin/env bash
# open+close of one file, 20,000 times, best of 5 (python os.open/os.close),
# on an LMDB and a PostgreSQL volume, with two safs builds side by side.
# SAFS_OLD=path/to/earlier/safs SAFS=path/to/safs bash run.sh (root).
set -euo pipefail
WORK=$(mktemp -d /tmp/flush.XXXX); chmod 755 $WORK
PG_BIN=$(dirname "$(readlink -f "$(command -v initdb)")")
PG_DATA=$WORK/pgdata
pg() { runuser -u postgres -- "$PG_BIN/$1" "${@:2}"; }
mkdir -p "$PG_DATA" && chown postgres: "$PG_DATA"
pg initdb -D "$PG_DATA" -U postgres -A trust -E UTF8 --no-instructions >/dev/null
printf "listen_addresses = ''\nunix_socket_directories = '%s'\n" "$PG_DATA" >>"$PG_DATA/postgresql.auto.conf"
pg pg_ctl -D "$PG_DATA" -l "$PG_DATA/server.log" -w start >/dev/null
cat > $WORK/loop.py <<'PY'
import os, sys, time
p = sys.argv[1]; n = 20000
with open(p, "w") as f: f.write("x")
for _ in range(2000):
    os.close(os.open(p, os.O_RDONLY))
best = 1e9
for r in range(5):
    t = time.perf_counter()
    for _ in range(n):
        os.close(os.open(p, os.O_RDONLY))
    best = min(best, (time.perf_counter() - t) / n * 1e6)
print(f"{best:.1f}")
PY
i=0
for bin in ${SAFS_OLD:?build the earlier safs and give its path} ${SAFS:-$(pwd)/target/release/safs}; do
  for kind in lmdb pg; do
    i=$((i+1)); VOL=$WORK/vol$i MNT=$WORK/mnt$i; mkdir -p $MNT
    if [ $kind = pg ]; then pg createdb -h "$PG_DATA" -U postgres db$i; $bin format $VOL --meta "host=$PG_DATA user=postgres dbname=db$i" >/dev/null
    else $bin format $VOL >/dev/null; fi
    $bin mount $VOL $MNT
    echo "$(basename $bin) $kind open+close µs (best of 5 x 20000): $(python3 $WORK/loop.py $MNT/f)"
    umount $MNT; sleep 1
  done
done
pg pg_ctl -D "$PG_DATA" -m immediate -w stop >/dev/null
rm -rf $WORK
