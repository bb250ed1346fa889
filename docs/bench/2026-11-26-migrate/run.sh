#!/usr/bin/env bash
# A 100,000-file volume migrated LMDB -> PostgreSQL -> LMDB: time and peak
# memory of each `safs migrate`, and the tree compared after each move.
# Needs root, a built safs (SAFS=path, default target/release/safs) and
# PostgreSQL's server binaries (the test script installs them).
set -euo pipefail
SAFS=${SAFS:-$(pwd)/target/release/safs}
FILES=${FILES:-100000}
W=$(mktemp -d /tmp/safs-migrate-bench.XXXXXX)
chmod 755 "$W"
trap 'umount -l "$W/mnt" 2>/dev/null || true; [ -n "${PG:-}" ] && su postgres -s /bin/sh -c "$PG/pg_ctl -D $W/pg -m immediate stop" >/dev/null 2>&1 || true; rm -rf "$W"' EXIT
PG=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
mkdir -p "$W/pg" "$W/mnt" && chown postgres "$W/pg"
su postgres -s /bin/sh -c "$PG/initdb -D $W/pg -A trust >/dev/null && $PG/pg_ctl -D $W/pg -o '-k $W/pg -c listen_addresses=' -l $W/pg/log start >/dev/null"
su postgres -s /bin/sh -c "$PG/createdb -h $W/pg vol"
CONN="host=$W/pg user=postgres dbname=vol"

"$SAFS" format "$W/vol" >/dev/null
"$SAFS" mount "$W/vol" "$W/mnt"
t0=$(date +%s.%N)
for d in $(seq 0 99); do
  mkdir "$W/mnt/d$d"
  ( cd "$W/mnt/d$d" && for i in $(seq 1 $((FILES / 100))); do echo "$i" > "f$i"; done
    setfattr -n user.tag -v "dir$d" f1 )
done
echo "populated $FILES files in $(echo "$(date +%s.%N) - $t0" | bc) s"
( cd "$W/mnt" && find . -printf '%p %s %m\n' | sort | md5sum ) > "$W/tree.before"
umount "$W/mnt"; sleep 1

move() {
  echo "== safs migrate --meta $1"
  /usr/bin/time -f "wall %e s, peak RSS %M KiB" "$SAFS" migrate "$W/vol" --meta "$2" 2>&1 | grep -v '^$'
  "$SAFS" mount "$W/vol" "$W/mnt"
  ( cd "$W/mnt" && find . -printf '%p %s %m\n' | sort | md5sum ) > "$W/tree.after"
  getfattr -n user.tag --only-values "$W/mnt/d7/f1"; echo
  umount "$W/mnt"; sleep 1
  cmp "$W/tree.before" "$W/tree.after" && echo "tree identical after the move"
}
move postgresql "$CONN"
move lmdb lmdb

# dump while mounted, then load into a new directory and over the volume.
"$SAFS" mount "$W/vol" "$W/mnt"
echo "== safs dump (mounted)"
/usr/bin/time -f "wall %e s, peak RSS %M KiB" "$SAFS" dump "$W/mnt" "$W/vol.dump" 2>&1
ls -l "$W/vol.dump" | awk '{printf "dump file: %.1f MiB\n", $5 / 1048576}'
umount "$W/mnt"; sleep 1
echo "== safs load --replace"
/usr/bin/time -f "wall %e s, peak RSS %M KiB" "$SAFS" load "$W/vol.dump" "$W/vol" --replace 2>&1
"$SAFS" mount "$W/vol" "$W/mnt"
( cd "$W/mnt" && find . -printf '%p %s %m\n' | sort | md5sum ) > "$W/tree.after"
umount "$W/mnt"; sleep 1
cmp "$W/tree.before" "$W/tree.after" && echo "tree identical after the load"
"$SAFS" dump "$W/vol" "$W/vol2.dump" 2>/dev/null
"$SAFS" load "$W/vol2.dump" "$W/copy" >/dev/null && "$SAFS" dump "$W/copy" "$W/vol3.dump" 2>/dev/null
cmp "$W/vol2.dump" "$W/vol3.dump" && echo "dump -> load -> dump byte-identical"
