#!/usr/bin/env bash
# Interoperability test: Samba (smbd) serving a share that lives on a safs
# mount, driven by the real smbclient/smbcacls over SMB3 on the loopback.
#
# Checks, each asserted (the script stops at the first failure):
#   - a file put through the share comes back byte-identical;
#   - DOS attributes set through SMB (setmode) are reported by allinfo and
#     are stored in the user.DOSATTRIB xattr on the safs file;
#   - the mode bits stay as they were (map archive/hidden/readonly/system = no);
#   - acl_xattr stores the NT ACL of files and directories created through
#     the share in security.NTACL, Samba's mapping onto POSIX ACLs is stored
#     in system.posix_acl_access/_default, and an ACE added with smbcacls is
#     stored in security.NTACL and read back;
#   - alternate data streams (streams_xattr) round-trip and are stored as
#     user.DosStream.<name>:$DATA xattrs, including a 32 KiB and a 60 KiB
#     stream (beyond ext4's 4 KiB xattr limit) and 16 more streams on the
#     same file; a 70,000-byte stream (over Linux's 64 KiB xattr limit) is
#     refused by smbd with NT_STATUS_FILE_SYSTEM_LIMITATION, nothing lost;
#   - an SMB extended attribute (ea support) is stored as a user.* xattr;
#   - with a byte quota on the share's directory (safs.quota.max_bytes),
#     smbclient's `du` shows the quota as the share's size and what it
#     leaves as free;
#   - all of it survives stopping smbd, unmounting safs (fsck clean) and
#     mounting again.
# At the end (also on failure) smbd is stopped, safs unmounted, the volume
# checked with `safs fsck` (must be clean) and the temporary directory
# removed (kept only if fsck finds errors, to look at).
#
# smbd runs as root in the foreground with a private smb.conf (every state,
# lock, cache, pid, private and log directory under the temporary directory;
# the system's smb.conf is not read), in a network namespace of its own when
# `unshare --net` works (then also on port 445 there, for smbcacls). The SMB
# user is a system user made for the test (safssmbtest) and removed after.
#
# Usage (root): bash tests/interop/samba.sh
# Environment: SAFS (the safs binary; default target/release/safs of this
# repository), SAFS_FORMAT_OPTS (extra `safs format` options, e.g.
# "--inline-xattr-bytes 1024"), SAMBA_TEST_PORT (first port to try, default 44455).
set -euo pipefail

if [ "$(id -u)" != 0 ]; then
    echo "samba.sh: must run as root" >&2
    exit 2
fi

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SAFS=${SAFS:-$HERE/../../target/release/safs}
if [ ! -x "$SAFS" ]; then
    echo "samba.sh: no safs binary at $SAFS (cargo build --release, or set SAFS)" >&2
    exit 2
fi

if [ -z "${SAFS_SAMBA_NETNS:-}" ]; then
    if ! command -v smbd >/dev/null || ! command -v smbclient >/dev/null \
        || ! command -v smbcacls >/dev/null || ! command -v getfattr >/dev/null \
        || ! command -v getfacl >/dev/null; then
        echo "samba.sh: installing samba smbclient attr acl" >&2
        apt-get -o DPkg::Lock::Timeout=600 install -y samba smbclient attr acl >/dev/null
    fi
    # Run in a network namespace of our own: smbd is reachable only from this
    # test, on a loopback no other service uses. smbcacls (4.17) has no port
    # option and always connects to port 445, which smbd can take here too.
    if unshare --net true 2>/dev/null; then
        exec env SAFS_SAMBA_NETNS=1 unshare --net -- bash "${BASH_SOURCE[0]}" "$@"
    fi
    echo "samba.sh: cannot make a network namespace; smbd on the host loopback, without the smbcacls check" >&2
    export SAFS_SAMBA_NETNS=0
fi
if [ "$SAFS_SAMBA_NETNS" = 1 ]; then
    ip link set lo up
fi

START=$(date +%s%N)
exec 3>&1
T=$(mktemp -d /tmp/safs-samba.XXXXXX)
chmod 0711 "$T" # the SMB user must reach the share below it
VOL=$T/vol
MNT=$T/mnt
CONF=$T/smb.conf
SMBUSER=safssmbtest
SMBPASS='Safs-interop-1'
SMBD_PID=
CREATED_USER=
MOUNTED=
N=0

say() { echo "samba.sh: $*" >&2; }
fail() {
    echo "samba: FAIL: $*" >&2
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

stop_smbd() {
    [ -n "$SMBD_PID" ] || return 0
    local pid=$SMBD_PID i
    SMBD_PID=
    # smbd runs in a session and process group of its own (setsid), with the
    # helpers it starts (samba-dcerpcd, rpcd_*): stop that group, only that.
    kill -TERM -- "-$pid" 2>/dev/null || true
    for i in $(seq 100); do
        kill -0 -- "-$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL -- "-$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

unmount_safs() {
    [ -n "$MOUNTED" ] || return 0
    MOUNTED=
    umount "$MNT" || { sleep 1; umount "$MNT"; } || return 1
    wait_unlocked "$VOL" || { say "safs daemon did not exit within 60 s"; return 1; }
}

cleanup() {
    local rc=$? keep=
    set +e
    trap '' INT TERM
    exec 1>&3 # the script's stdout, also if a failure came from a redirected function
    stop_smbd
    if ! unmount_safs; then
        say "could not unmount $MNT"
        rc=1
        keep=1
    fi
    if [ -z "$keep" ] && [ -d "$VOL" ]; then
        if "$SAFS" fsck "$VOL" >"$T/fsck.out" 2>&1; then
            cat "$T/fsck.out"
        else
            cat "$T/fsck.out" >&2
            echo "samba: FAIL: safs fsck $VOL is not clean (volume kept in $T)" >&2
            rc=1
            keep=1
        fi
    fi
    if [ -n "$CREATED_USER" ]; then
        userdel "$SMBUSER" 2>/dev/null
    fi
    if [ -z "$keep" ]; then
        rm -rf "$T"
    fi
    if [ "$rc" = 0 ]; then
        local ms=$((($(date +%s%N) - START) / 1000000))
        printf 'samba: %d checks passed (%d.%01d s)\n' "$N" $((ms / 1000)) $((ms % 1000 / 100))
    else
        echo "samba: FAILED after $N checks passed" >&2
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---------------------------------------------------------------- safs ----
# shellcheck disable=SC2086 # SAFS_FORMAT_OPTS: options, split on spaces
"$SAFS" format ${SAFS_FORMAT_OPTS:-} "$VOL" >/dev/null
mkdir "$MNT"
"$SAFS" mount "$VOL" "$MNT" -o allow_other
MOUNTED=1
grep -q " $MNT fuse.safs " /proc/self/mounts || fail "$MNT is not a fuse.safs mount"

# A Unix user for the SMB session: smbd works on the share as this user, so
# the safs mount must allow other users (allow_other).
if ! id "$SMBUSER" >/dev/null 2>&1; then
    useradd --system --no-create-home --shell /usr/sbin/nologin "$SMBUSER"
    CREATED_USER=1
fi
mkdir "$MNT/share"
chown "$SMBUSER:" "$MNT/share"
chmod 0755 "$MNT/share"

# ---------------------------------------------------------------- smbd ----
PORT=${SAMBA_TEST_PORT:-44455}
while ss -Hltn "sport = :$PORT" | grep -q .; do
    PORT=$((PORT + 1))
done
EXTRA_PORT=
if [ "$SAFS_SAMBA_NETNS" = 1 ]; then
    EXTRA_PORT=" 445" # for smbcacls, in our private network namespace only
fi
mkdir -p "$T"/{lock,state,cache,pid,private,log,ncalrpc,binddns}
chmod 0700 "$T/private"
cat >"$CONF" <<EOF
[global]
    server role = standalone server
    workgroup = SAFSTEST
    netbios name = SAFSTEST
    server min protocol = SMB2_10
    smb ports = $PORT$EXTRA_PORT
    bind interfaces only = yes
    interfaces = lo
    disable netbios = yes
    passdb backend = tdbsam:$T/private/passdb.tdb
    private dir = $T/private
    binddns dir = $T/binddns
    lock directory = $T/lock
    state directory = $T/state
    cache directory = $T/cache
    pid directory = $T/pid
    ncalrpc dir = $T/ncalrpc
    log file = $T/log/log.%m
    log level = 1
    load printers = no
    printing = bsd
    printcap name = /dev/null
    disable spoolss = yes
    usershare max shares = 0

[safs]
    path = $MNT/share
    read only = no
    # NT ACLs in security.NTACL, streams in user.DosStream.* xattrs
    vfs objects = acl_xattr streams_xattr
    # SMB extended attributes map to user.* xattrs
    ea support = yes
    # DOS attributes (and the create time) in user.DOSATTRIB, not in mode bits
    store dos attributes = yes
    map archive = no
    map hidden = no
    map readonly = no
    map system = no
    # acl_xattr forces these; stated for clarity
    inherit acls = yes
    dos filemode = yes
    # keep Windows inheritance flags (user.SAMBA_PAI) for the POSIX ACL mapping
    map acl inherit = yes
EOF
testparm -s "$CONF" >"$T/testparm.out" 2>&1 || { cat "$T/testparm.out" >&2; fail "testparm rejects $CONF"; }

# setsid: smbd's parent signals its whole process group when it stops, so it
# gets one of its own (and the script's group is left alone).
setsid smbd --foreground --no-process-group --configfile="$CONF" --debug-stdout -d1 \
    </dev/null >"$T/log/smbd.out" 2>&1 &
SMBD_PID=$!

out=$(printf '%s\n%s\n' "$SMBPASS" "$SMBPASS" | smbpasswd -c "$CONF" -a -s "$SMBUSER" 2>&1) \
    || { echo "$out" >&2; fail "smbpasswd -a $SMBUSER failed"; }

for i in $(seq 300); do
    ss -Hltn "sport = :$PORT" | grep -q . && break
    kill -0 "$SMBD_PID" 2>/dev/null || { cat "$T/log/smbd.out" >&2; fail "smbd exited"; }
    sleep 0.1
done
ss -Hltn "sport = :$PORT" | grep -q . || fail "smbd does not listen on port $PORT after 30 s"

# Run smbclient commands ($1, ;-separated) in the share; stops on an error.
smb() {
    local out
    if ! out=$(smbclient -s "$CONF" -p "$PORT" //127.0.0.1/safs -U "$SMBUSER%$SMBPASS" \
        -E -c "$1" 2>&1); then
        echo "$out" >&2
        fail "smbclient -c '$1' failed"
    fi
    if grep -q NT_STATUS_ <<<"$out"; then
        echo "$out" >&2
        fail "smbclient -c '$1' reported an error"
    fi
    printf '%s\n' "$out"
}
cacls() {
    # (no -p: smbcacls connects to the "smb ports" of $CONF)
    smbcacls -s "$CONF" //127.0.0.1/safs -U "$SMBUSER%$SMBPASS" --numeric "$@"
}
# The value of xattr $2 of file $1, hex-encoded (empty if missing)
xattr_hex() {
    getfattr --absolute-names --only-values -e hex -n "$2" "$1" 2>/dev/null | od -An -tx1 -v | tr -d ' \n'
}
xattr_size() {
    python3 -c 'import os,sys; print(len(os.getxattr(sys.argv[1], sys.argv[2])))' "$1" "$2"
}
has_xattr() {
    getfattr --absolute-names -n "$2" "$1" >/dev/null 2>&1
}

L=$T/local
mkdir "$L"
S=$MNT/share

# --------------------------------------------------------- (a) contents ----
head -c 1048577 /dev/urandom >"$L/data.bin"
smb "put $L/data.bin data.bin; get data.bin $L/data.back" >/dev/null
cmp "$L/data.bin" "$L/data.back" || fail "data.bin came back different"
pass "1 MiB file put and got back identical over SMB"
cmp "$L/data.bin" "$S/data.bin" || fail "data.bin on the safs mount differs from what was put"
[ "$(stat -c %U "$S/data.bin")" = "$SMBUSER" ] || fail "data.bin is not owned by $SMBUSER on safs"
pass "the file on the safs mount has the same bytes and is owned by the SMB user"

# -------------------------------------------------- (b) DOS attributes ----
echo "attributes" >"$L/attr.txt"
smb "put $L/attr.txt attr.txt" >/dev/null
has_xattr "$S/attr.txt" user.DOSATTRIB || fail "no user.DOSATTRIB on a file created through SMB"
smb "setmode attr.txt +h" >/dev/null
out=$(smb "allinfo attr.txt")
grep -Eq '^attributes: [A-Z]*H[A-Z]* \(' <<<"$out" || { echo "$out" >&2; fail "allinfo does not show the hidden attribute"; }
# The DOS attributes in user.DOSATTRIB: an NDR xattr_DOSATTRIB (librpc/idl/
# xattr.idl), which Samba 4.17 writes as an empty attrib_hex string, then
# version 5 with valid_flags, attrib, create_time. Older Samba put the
# attributes in attrib_hex ("0x22").
dosattr() {
    python3 - "$1" <<'PY'
import os, struct, sys
v = os.getxattr(sys.argv[1], "user.DOSATTRIB")
end = v.index(b"\0")
if end > 0:
    print(int(v[:end], 16))
    sys.exit(0)
i = end + 1
i += i % 2                                   # uint16 alignment
version, level = struct.unpack_from("<HH", v, i)
i += 4
i = (i + 3) & ~3                             # uint32 alignment
if version not in (3, 4, 5) or level != version:
    sys.exit("user.DOSATTRIB version %d (level %d) not understood: %s" % (version, level, v.hex()))
valid_flags, attrib = struct.unpack_from("<II", v, i)
if not valid_flags & 1:                      # XATTR_DOSINFO_ATTRIB
    sys.exit("user.DOSATTRIB has no valid attributes: %s" % v.hex())
print(attrib)
PY
}
a=$(dosattr "$S/attr.txt")
(((a & 0x2) != 0)) || fail "user.DOSATTRIB of attr.txt ($a) lacks FILE_ATTRIBUTE_HIDDEN"
pass "setmode +h: allinfo shows H and user.DOSATTRIB on safs has 0x2 (value $(printf '0x%x' "$a"))"
smb "setmode attr.txt +rs" >/dev/null
out=$(smb "allinfo attr.txt")
attrs=$(sed -n 's/^attributes: \([A-Z]*\) .*/\1/p' <<<"$out")
[[ $attrs == *R* && $attrs == *S* && $attrs == *H* ]] || { echo "$out" >&2; fail "allinfo attributes '$attrs' lack R, S or H"; }
a=$(dosattr "$S/attr.txt")
(((a & 0x7) == 0x7)) || fail "user.DOSATTRIB of attr.txt ($a) lacks READONLY|HIDDEN|SYSTEM"
pass "setmode +rs: allinfo shows $attrs and user.DOSATTRIB has 0x7 set (value $(printf '0x%x' "$a"))"
[ "$(stat -c %a "$S/attr.txt")" = "$(stat -c %a "$S/data.bin")" ] \
    || fail "DOS attributes changed the mode bits ($(stat -c %a "$S/attr.txt") vs $(stat -c %a "$S/data.bin")); map * = no should leave them"
pass "the mode bits are untouched by DOS attributes (map archive/hidden/readonly/system = no)"
smb "setmode attr.txt -rsh" >/dev/null
a=$(dosattr "$S/attr.txt")
(((a & 0x7) == 0)) || fail "user.DOSATTRIB of attr.txt ($a) still has R/H/S after setmode -rsh"
pass "setmode -rsh clears them in user.DOSATTRIB (value $(printf '0x%x' "$a"))"

# ------------------------------------------------------------ (c) NT ACL ----
smb "mkdir dir; put $L/attr.txt dir/inner.txt" >/dev/null
for f in attr.txt data.bin dir dir/inner.txt; do
    n=$(xattr_size "$S/$f" security.NTACL 2>/dev/null) || fail "no security.NTACL on $f (created through SMB)"
    ((n > 0)) || fail "empty security.NTACL on $f"
done
pass "security.NTACL stored by acl_xattr on files and a directory created through SMB"
# Samba also maps the NT ACL onto a POSIX ACL (acl_xattr:ignore system acls =
# no), which the kernel enforces on the safs mount.
out=$(getfacl --absolute-names "$S/attr.txt") || fail "getfacl $S/attr.txt failed"
grep -q "^user:$SMBUSER:rw" <<<"$out" || { echo "$out" >&2; fail "no POSIX ACL entry for $SMBUSER on attr.txt"; }
has_xattr "$S/dir" system.posix_acl_default || fail "no default POSIX ACL on dir (inherit acls)"
pass "Samba's POSIX ACL mapping is stored too (user:$SMBUSER entry, default ACL on the directory)"
if [ "$SAFS_SAMBA_NETNS" = 1 ]; then
    before=$(xattr_hex "$S/attr.txt" security.NTACL)
    cacls attr.txt -a 'ACL:S-1-5-32-545:ALLOWED/0x0/0x001200a9' >/dev/null \
        || fail "smbcacls could not add an ACE to attr.txt"
    after=$(xattr_hex "$S/attr.txt" security.NTACL)
    [ -n "$after" ] && [ "$after" != "$before" ] || fail "security.NTACL did not change after smbcacls -a"
    # S-1-5-32-545 in binary: rev 1, 2 subauthorities, authority 5, 32, 545
    grep -q 0102000000000005200000002102 <<<"$after" || fail "the added SID is not in security.NTACL"
    out=$(cacls attr.txt) || fail "smbcacls could not read the ACL of attr.txt"
    # --numeric prints the ACE type as 0 (ALLOWED) and the mask in hex
    grep -Eq '^ACL:S-1-5-32-545:(0|ALLOWED)/0x0/(0x001200a9|READ)$' <<<"$out" \
        || { echo "$out" >&2; fail "smbcacls does not read back the added ACE"; }
    pass "an ACE added with smbcacls is stored in security.NTACL and read back over SMB"
else
    echo "skip - smbcacls (needs port 445 in a private network namespace)"
fi

# -------------------------------------------------------- (d) streams ----
echo "the main data" >"$L/ads.txt"
echo "zone identifier" >"$L/zone"
smb "put $L/ads.txt ads.txt; put $L/zone ads.txt:Zone.Identifier; get ads.txt:Zone.Identifier $L/zone.back" >/dev/null
cmp "$L/zone" "$L/zone.back" || fail "stream ads.txt:Zone.Identifier came back different"
pass "alternate data stream put and got back identical"
name='user.DosStream.Zone.Identifier:$DATA'
has_xattr "$S/ads.txt" "$name" || fail "no $name xattr on ads.txt"
python3 - "$S/ads.txt" "$name" "$L/zone" <<'PY' || fail "the $name xattr does not hold the stream's bytes"
import os, sys
v = os.getxattr(sys.argv[1], sys.argv[2])
d = open(sys.argv[3], 'rb').read()
# streams_xattr keeps a trailing NUL after the stream's bytes
sys.exit(0 if v in (d, d + b'\0') else 1)
PY
cmp "$L/ads.txt" "$S/ads.txt" || fail "the main data of ads.txt changed"
pass "the stream is the xattr $name on the safs file; the main data is untouched"

# ------------------------------------- (e) large streams, many streams ----
head -c 32768 /dev/urandom >"$L/s32k"
head -c 61440 /dev/urandom >"$L/s60k"
cmds="put $L/s32k ads.txt:big32k; put $L/s60k ads.txt:big60k"
for i in $(seq -w 1 16); do
    head -c $((1000 + 37 * 10#$i)) /dev/urandom >"$L/small$i"
    cmds+="; put $L/small$i ads.txt:small$i"
done
smb "$cmds" >/dev/null
cmds="get ads.txt:big32k $L/s32k.back; get ads.txt:big60k $L/s60k.back"
for i in $(seq -w 1 16); do cmds+="; get ads.txt:small$i $L/small$i.back"; done
smb "$cmds" >/dev/null
cmp "$L/s32k" "$L/s32k.back" || fail "the 32 KiB stream came back different"
cmp "$L/s60k" "$L/s60k.back" || fail "the 60 KiB stream came back different"
for i in $(seq -w 1 16); do cmp "$L/small$i" "$L/small$i.back" || fail "stream small$i came back different"; done
pass "a 32 KiB, a 60 KiB and 16 ~1 KiB streams on one file round-trip over SMB"
n=$(xattr_size "$S/ads.txt" 'user.DosStream.big32k:$DATA') || fail "no xattr for the 32 KiB stream"
((n >= 32768)) || fail "the 32 KiB stream's xattr holds only $n bytes"
n=$(xattr_size "$S/ads.txt" 'user.DosStream.big60k:$DATA') || fail "no xattr for the 60 KiB stream"
((n >= 61440)) || fail "the 60 KiB stream's xattr holds only $n bytes"
count=$(getfattr --absolute-names -m '^user\.DosStream\.' -d "$S/ads.txt" 2>/dev/null | grep -c '^user\.DosStream\.')
[ "$count" = 19 ] || fail "ads.txt has $count user.DosStream.* xattrs, expected 19"
pass "19 user.DosStream.* xattrs on the safs file, the largest $n bytes (no 4 KiB limit)"
out=$(smb "allinfo ads.txt")
for s in Zone.Identifier big32k big60k small01 small16; do
    grep -q "^stream: \[:$s:\$DATA\]" <<<"$out" || { echo "$out" >&2; fail "allinfo does not list stream $s"; }
done
grep -q '^stream: \[:big32k:\$DATA\], 32768 bytes' <<<"$out" || { echo "$out" >&2; fail "allinfo has a wrong size for big32k"; }
pass "allinfo lists the streams with their sizes"

# Beyond Linux's 64 KiB per xattr value: smbd refuses the write itself
# ("smbd max xattr size" = 65536, which streams_xattr counts with the NUL it
# appends) and the file's other streams stay as they were.
head -c 70000 /dev/urandom >"$L/s70k"
out=$(smbclient -s "$CONF" -p "$PORT" //127.0.0.1/safs -U "$SMBUSER%$SMBPASS" -E \
    -c "put $L/s70k ads.txt:huge" 2>&1) || true
grep -q NT_STATUS_FILE_SYSTEM_LIMITATION <<<"$out" \
    || { echo "$out" >&2; fail "a 70,000-byte stream was not refused with NT_STATUS_FILE_SYSTEM_LIMITATION"; }
smb "get ads.txt:big60k $L/s60k.again" >/dev/null
cmp "$L/s60k" "$L/s60k.again" || fail "the 60 KiB stream changed after the refused 70 KiB write"
pass "a 70,000-byte stream is refused by smbd (NT_STATUS_FILE_SYSTEM_LIMITATION); other streams intact"

# ----------------------------------------------------------- EAs (SMB) ----
smb "setea data.bin SafsTest hello-ea" >/dev/null
[ "$(getfattr --absolute-names --only-values -n user.SafsTest "$S/data.bin" 2>/dev/null)" = hello-ea ] \
    || fail "the SMB EA SafsTest is not the xattr user.SafsTest on the safs file"
out=$(smb "geteas data.bin")
grep -q 'SafsTest' <<<"$out" || { echo "$out" >&2; fail "geteas does not list SafsTest"; }
pass "an SMB extended attribute is stored as user.SafsTest and listed by geteas"

# ------------------------------------------- the share's size (quota) ----
# smbd answers a client's disk-size question with statvfs of the share,
# which safs answers inside a directory with a byte quota from the quota:
# the share is the quota's size, its free space what the quota leaves.
setfattr -n safs.quota.max_bytes -v 104857600 "$S"
out=$(smb "du")
read -r blocks bsize avail < <(sed -n 's/^[[:space:]]*\([0-9]*\) blocks of size \([0-9]*\)\. \([0-9]*\) blocks available.*/\1 \2 \3/p' <<<"$out") \
    || { echo "$out" >&2; fail "smbclient du printed no sizes"; }
used=$(getfattr --absolute-names --only-values -n safs.dir.rbytes "$S")
say "smbclient du with a 100 MiB quota: $blocks blocks of $bsize bytes, $avail available; the share holds $used bytes"
[ "$((blocks * bsize))" = 104857600 ] || { echo "$out" >&2; fail "the share's size is not its 100 MiB quota"; }
[ "$((avail * bsize))" -le "$((104857600 - used))" ] && [ "$((avail * bsize))" -gt "$((104857600 - used - 2 * bsize - 4096))" ] \
    || { echo "$out" >&2; fail "the share's free space is not what its quota leaves"; }
setfattr -x safs.quota.max_bytes "$S"
pass "with a 100 MiB quota on the share's directory, smbclient du shows a 100 MiB share and what is left"

# ------------------------------------------ persistence across remount ----
declare -A saved
for f in attr.txt data.bin dir dir/inner.txt ads.txt; do
    saved[$f]=$(getfattr --absolute-names -m - -d -e hex "$S/$f" 2>/dev/null | grep -v '^#' | sort | md5sum)
done
stop_smbd
unmount_safs || fail "could not unmount $MNT"
"$SAFS" fsck "$VOL" >"$T/fsck1.out" 2>&1 || { cat "$T/fsck1.out" >&2; fail "safs fsck after the SMB checks is not clean"; }
"$SAFS" mount "$VOL" "$MNT" -o allow_other
MOUNTED=1
for f in "${!saved[@]}"; do
    now=$(getfattr --absolute-names -m - -d -e hex "$S/$f" 2>/dev/null | grep -v '^#' | sort | md5sum)
    [ "$now" = "${saved[$f]}" ] || fail "the xattrs of $f differ after unmount and mount"
done
cmp "$L/s60k" <(python3 -c 'import os,sys; sys.stdout.buffer.write(os.getxattr(sys.argv[1], "user.DosStream.big60k:$DATA")[:61440])' "$S/ads.txt") \
    || fail "the 60 KiB stream's xattr differs after unmount and mount"
cmp "$L/data.bin" "$S/data.bin" || fail "data.bin differs after unmount and mount"
pass "all xattrs (DOSATTRIB, NTACL, streams, EAs) identical after smbd stop, unmount, fsck, mount"
