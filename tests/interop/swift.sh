#!/usr/bin/env bash
# Interoperability test: OpenStack Swift's object-server disk layer
# (swift.obj.diskfile of Debian's python3-swift 2.30) storing objects on a
# safs mount; the checks themselves are in swift_diskfile.py next to this
# script.
#
# Layout: a Swift `devices` root (a plain directory) holding the device
# directory sdb1, which is the safs mount itself, so Swift's mount_check
# (os.lstat st_dev of sdb1 against sdb1/..) can be on. swift.conf (hash path
# suffix and prefix, policy 0) is written under the temporary directory and
# read through Swift's set_swift_dir; /etc/swift is not touched.
#
# Checks: PUT of an object with 31.5 KiB of pickled metadata (one
# user.swift.metadata xattr) and of one with 100 KiB (split by Swift into
# user.swift.metadata + user.swift.metadata1), GET through fresh DiskFiles
# (data and metadata identical), the xattrs really on the safs files, the
# FUSE requests one metadata read takes, POST (.meta file) and DELETE (.ts
# tombstone) read back, the replicator's suffix hashes; then the volume is
# unmounted, checked with `safs fsck` (must be clean), mounted again and the
# objects read back again. At the end (also on failure) safs is unmounted,
# fsck'd and the temporary directory removed (kept only if fsck finds
# errors).
#
# Usage (root): bash tests/interop/swift.sh
# Environment: SAFS (the safs binary; default target/release/safs of this
# repository), SAFS_FORMAT_OPTS (extra `safs format` options, e.g.
# "--inline-xattr-bytes 1024").
set -euo pipefail

if [ "$(id -u)" != 0 ]; then
    echo "swift.sh: must run as root" >&2
    exit 2
fi

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SAFS=${SAFS:-$HERE/../../target/release/safs}
PY=/usr/bin/python3 # python3-swift is installed for Debian's python
if [ ! -x "$SAFS" ]; then
    echo "swift.sh: no safs binary at $SAFS (cargo build --release, or set SAFS)" >&2
    exit 2
fi

if ! "$PY" -c 'import swift.obj.diskfile' 2>/dev/null; then
    echo "swift.sh: installing python3-swift" >&2
    apt-get -o DPkg::Lock::Timeout=600 install -y python3-swift >/dev/null
fi

START=$(date +%s%N)
exec 3>&1
T=$(mktemp -d /tmp/safs-swift.XXXXXX)
VOL=$T/vol
DEVICES=$T/node
DEV=sdb1
MNT=$DEVICES/$DEV
MOUNTED=
N=0

fail() {
    echo "swift: FAIL: $*" >&2
    exit 1
}
pass() {
    N=$((N + 1))
    echo "ok $N - $*"
}

wait_unlocked() { # the daemon of volume $1 has exited
    local i
    for i in $(seq 600); do
        flock -n "$1/lock" true 2>/dev/null && return 0
        sleep 0.1
    done
    return 1
}

unmount_safs() {
    [ -n "$MOUNTED" ] || return 0
    MOUNTED=
    umount "$MNT" || { sleep 1; umount "$MNT"; } || return 1
    wait_unlocked "$VOL" || { echo "swift.sh: safs daemon did not exit within 60 s" >&2; return 1; }
}

cleanup() {
    local rc=$? keep=
    set +e
    trap '' INT TERM
    exec 1>&3
    if ! unmount_safs; then
        echo "swift.sh: could not unmount $MNT" >&2
        rc=1
        keep=1
    fi
    if [ -z "$keep" ] && [ -d "$VOL" ]; then
        if "$SAFS" fsck "$VOL" >"$T/fsck.out" 2>&1; then
            cat "$T/fsck.out"
        else
            cat "$T/fsck.out" >&2
            echo "swift: FAIL: safs fsck $VOL is not clean (volume kept in $T)" >&2
            rc=1
            keep=1
        fi
    fi
    [ -n "$keep" ] || rm -rf "$T"
    if [ "$rc" = 0 ]; then
        local ms=$((($(date +%s%N) - START) / 1000000))
        printf 'swift: %d checks passed (%d.%01d s)\n' "$N" $((ms / 1000)) $((ms % 1000 / 100))
    else
        echo "swift: FAILED after $N checks passed" >&2
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# shellcheck disable=SC2086 # SAFS_FORMAT_OPTS: options, split on spaces
"$SAFS" format ${SAFS_FORMAT_OPTS:-} "$VOL" >/dev/null
mkdir -p "$MNT"
"$SAFS" mount "$VOL" "$MNT" -o allow_other
MOUNTED=1
grep -q " $MNT fuse.safs " /proc/self/mounts || fail "$MNT is not a fuse.safs mount"
# Swift's servers run as the swift user (python3-swift makes it) and own the
# devices; the safs mount lets them in because of allow_other.
SWIFT_USER=swift
id "$SWIFT_USER" >/dev/null 2>&1 || fail "no $SWIFT_USER user (python3-swift makes it)"
chmod 0711 "$T"
chown "$SWIFT_USER:" "$MNT"
mkdir "$T/state"
chown "$SWIFT_USER:" "$T/state"

mkdir "$T/swift"
cat >"$T/swift/swift.conf" <<EOF
[swift-hash]
swift_hash_path_suffix = safs-interop-$$-$RANDOM
swift_hash_path_prefix = safs

[storage-policy:0]
name = Policy-0
default = yes
EOF

# Run a phase of swift_diskfile.py; its "ok" lines continue our numbering.
run_py() {
    local out rc=0
    out=$("$PY" "$HERE/swift_diskfile.py" "$DEVICES" --swift-dir "$T/swift" \
        --device "$DEV" --safs "$SAFS" --state "$T/state/state.json" --user "$SWIFT_USER" \
        --first $((N + 1)) "$@") || rc=$?
    grep -v '^checks: ' <<<"$out" || true
    N=$((N + $(grep -c '^ok ' <<<"$out" || true)))
    [ "$rc" = 0 ] || fail "swift_diskfile.py $* exited with $rc"
    grep -qx "checks: $(grep -c '^ok ' <<<"$out")" <<<"$out" \
        || fail "swift_diskfile.py $* did not finish its checks"
}

run_py --phase write

unmount_safs || fail "could not unmount $MNT"
"$SAFS" fsck "$VOL" >"$T/fsck1.out" 2>&1 || { cat "$T/fsck1.out" >&2; fail "safs fsck after the Swift checks is not clean"; }
pass "safs fsck after the PUT/POST/DELETE checks: $(sed 's/^[^:]*: //' "$T/fsck1.out")"
# With safs unmounted, sdb1 is a plain directory: mount_check must refuse it
# (so Swift never writes objects to the filesystem below the mountpoint).
"$PY" - "$DEVICES" "$DEV" <<'PY' || fail "Swift's mount_check accepts $MNT while safs is not mounted"
import sys
from swift.common.constraints import check_mount
try:
    check_mount(sys.argv[1], sys.argv[2])
except ValueError:
    sys.exit(0)
sys.exit(1)
PY
pass "with safs unmounted, Swift's check_mount refuses $MNT (\"is not mounted\")"
"$SAFS" mount "$VOL" "$MNT" -o allow_other
MOUNTED=1

run_py --phase verify
