#!/usr/bin/env bash
# Pass all tests — the README's test command; .ci/run runs exactly this.
#
#   bash scripts/test.sh
#
# On a fresh Debian 12 machine, as root, it first installs only what is
# missing (apt packages, a Rust toolchain, the `tests` user pjdfstest needs,
# pjdfstest itself), then runs:
#   1. cargo fmt --all -- --check
#   2. cargo clippy --workspace --all-targets --profile ci -- -D warnings
#   3. cargo test --workspace --profile ci --no-fail-fast: unit and property tests
#      (the core, the control protocol, the bench, the FUSE wire protocol and
#      transports), and tests/mount_*.rs, which format and mount real volumes —
#      over FUSE over io_uring, then the integration tests that mount
#      again over /dev/fuse
#      (among them the full-disk durability test, tests/mount_enospc.rs: a
#      writer outside safs fills the filesystem under the volume while safs
#      writes with fsyncs; every acknowledged change must survive)
#   4. pjdfstest (tests/pjdfstest.toml) in a directory of a fresh
#      `safs mount -o allow_other`, with a secondary file system for EXDEV
#      (over io_uring; steps 4 and 5 run again on a volume over /dev/fuse)
#   5. pjdfstest's EROFS tests on their own (they remount read-only)
#   6. stress-ng: its file-system stressors with --verify, one after the
#      other, a few seconds each, on the same mount
#   7. safs fsck of that volume once unmounted: it must be clean; then it
#      is dumped, moved to PostgreSQL (pjdfstest on it there) and back with
#      safs migrate (fsck after each), and its dump loaded beside a copy of
#      its data/ (fsck)
#   8. pjdfstest, data and directory stressors and fsck (with the passphrase)
#      again on an encrypted volume (sealed names, records and contents)
#  8b. pjdfstest, data stressors and fsck on a volume whose contents are in
#      the run's S3 server (--data s3://), then its cache thrown away and
#      every file read back from the store
#   9. real Samba (smbd, smbclient) and OpenStack Swift (its object-server
#      diskfile layer) on safs mounts: tests/interop/samba.sh and swift.sh
# Before step 3 it starts one private S3 server (a one-node Ceph cluster with
# radosgw on 127.0.0.1, crates/safs-s3server) that the object-store tests
# share, and stops it on exit.
# Both transports: the script sets /sys/module/fuse/parameters/enable_uring
# to Y for the run when the kernel has it (and puts the old value back on
# exit); on a kernel without FUSE over io_uring only /dev/fuse runs, and the
# summary says so.
# Every step runs even if an earlier one failed (except that pjdfstest needs a
# built safs); the script prints a summary and exits non-zero if any failed.
# Whatever it mounted is unmounted on exit, on failure and on Ctrl-C too.
#
# Environment: CARGO_TEST_TIMEOUT, PJDFSTEST_TIMEOUT (seconds) bound the two
# long steps so that a hung mount cannot hang CI.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

PJDFSTEST_VERSION=0.2.2
# The background build of pjdfstest (its PID while it runs).
PJDFSTEST_INSTALL=
CARGO_TEST_TIMEOUT=${CARGO_TEST_TIMEOUT:-1200}
PJDFSTEST_TIMEOUT=${PJDFSTEST_TIMEOUT:-900}
START=$SECONDS

say() { printf '\n== %s\n' "$*"; }
die() { printf 'scripts/test.sh: %s\n' "$*" >&2; exit 1; }
have() { command -v "$1" >/dev/null 2>&1; }

[ "$(id -u)" = 0 ] || die "run as root: the tests mount FUSE file systems and switch users"

# --- 1. system packages, only the missing ones -------------------------------
need=()
have fusermount3 || need+=(fuse3)
have getfattr || need+=(attr)
have setfacl || need+=(acl)
have setpriv || need+=(util-linux)
have flock || need+=(util-linux)
have umount || need+=(mount)
have useradd || need+=(passwd)
have cc || need+=(build-essential)
have pkg-config || need+=(pkg-config)
have stress-ng || need+=(stress-ng)
# A private S3 server for the object-store tests: a one-node Ceph cluster
# with radosgw (crates/safs-s3server), and s3cmd to make buckets.
have radosgw || need+=(radosgw ceph-mon ceph-osd ceph-common)
have s3cmd || need+=(s3cmd)
# Samba's CTDB recovery-lock helper takes its lock through two mounts
# (tests/two_mounts.rs: fcntl locks that hold across mounts).
[ -x /usr/libexec/ctdb/ctdb_mutex_fcntl_helper ] || need+=(ctdb)
# Prometheus and promtool scrape and check `-o metrics=` (tests/mount_metrics.rs).
have promtool || need+=(prometheus)
[ -e /usr/include/sys/acl.h ] || need+=(libacl1-dev) # pjdfstest links libacl
if ! have cargo && [ ! -x "${CARGO_HOME:-$HOME/.cargo}/bin/cargo" ]; then
  have curl || need+=(curl ca-certificates)
fi
if [ ${#need[@]} -gt 0 ]; then
  say "installing missing packages: ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # Wait for another apt run (unattended upgrades, a first boot) instead of failing.
  apt-get -o DPkg::Lock::Timeout=600 update -qq
  apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${need[@]}"
fi
# PostgreSQL's server, for the volumes whose metadata lives there (tests
# start private clusters of their own): without the default cluster the
# package would create and start.
pg_bin() {
  # The directory of the server's own tools (symlinks on PATH resolved:
  # createdb lives beside initdb there).
  if have initdb && have pg_ctl; then dirname "$(readlink -f "$(command -v initdb)")"; else
    find /usr/lib/postgresql -mindepth 2 -maxdepth 2 -name bin 2>/dev/null | sort -V | tail -n 1
  fi
}
if [ -z "$(pg_bin)" ]; then
  say "installing PostgreSQL (no default cluster)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=600 update -qq
  apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends postgresql-common
  sed -i 's/^#* *create_main_cluster.*/create_main_cluster = false/' /etc/postgresql-common/createcluster.conf
  apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends postgresql
fi
PG_BIN=$(pg_bin)
[ -x "$PG_BIN/initdb" ] || die "PostgreSQL's initdb is missing after installing postgresql"
[ -e /dev/fuse ] || modprobe fuse 2>/dev/null || true
[ -e /dev/fuse ] || die "/dev/fuse is missing: safs's tests need FUSE (modprobe fuse, or run the container with --device /dev/fuse)"

# --- 2. Rust toolchain, only if cargo is missing -----------------------------
CARGO_BIN=${CARGO_HOME:-$HOME/.cargo}/bin
if ! have cargo && [ ! -x "$CARGO_BIN/cargo" ]; then
  say "installing a Rust toolchain with rustup"
  curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal --component rustfmt,clippy
fi
case ":$PATH:" in *":$CARGO_BIN:"*) ;; *) export PATH="$CARGO_BIN:$PATH" ;; esac
if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
  have rustup || die "cargo fmt / cargo clippy are missing and there is no rustup to add them"
  rustup component add rustfmt clippy
fi

# --- 3. users: pjdfstest switches to nobody:nogroup and tests:tests ----------
# (the integration tests create their own users safs_u1/safs_u2 when needed)
if ! id -u tests >/dev/null 2>&1; then
  if getent group tests >/dev/null; then
    useradd --no-create-home --gid tests --shell /usr/sbin/nologin tests
  else
    useradd --no-create-home --user-group --shell /usr/sbin/nologin tests
  fi
fi
[ "$(id -gn tests)" = tests ] || die "user 'tests' exists but its primary group is not 'tests' (pjdfstest needs that)"
[ "$(id -gn nobody 2>/dev/null)" = nogroup ] || die "pjdfstest needs the user nobody with primary group nogroup"

# --- the steps -----------------------------------------------------------------
WORK=$(mktemp -d /tmp/safs-test-run.XXXXXX)
chmod 0755 "$WORK" # the pjdfstest users must reach the mount point
VOL=$WORK/vol
MNT=$WORK/mnt
# The encrypted volume of step 8 (and its passphrase file).
ENC_VOL=$WORK/evol
ENC_MNT=$WORK/emnt
ENC_PASS=$WORK/passphrase
# The second volume, served over /dev/fuse, for pjdfstest on that transport.
DEV_VOL=$WORK/dvol
DEV_MNT=$WORK/dmnt
# The volume whose metadata lives in PostgreSQL, and its private cluster.
PG_VOL=$WORK/pgvol
PG_MNT=$WORK/pgmnt
PG_DATA=$WORK/pgdata
# The volume whose contents live in the run's S3 server.
S3_VOL=$WORK/s3vol
S3_MNT=$WORK/s3mnt
SUMMARY=()
FAILURES=0
TOTAL_PASSED=0
TOTAL_FAILED=0
TOTAL_SKIPPED=0
CLEAN_STRAY_MOUNTS=0

is_mounted() { awk -v m="$1" '$5 == m { found = 1 } END { exit !found }' /proc/self/mountinfo; }

# Detaches FUSE mounts that integration tests left behind under /tmp/safs-test-*
# (only after a failed or timed-out `cargo test`): aborting the connection
# first releases any process stuck in a request to a dead or hung daemon.
clean_stray_mounts() {
  awk '$5 ~ "^/tmp/safs-test-" { for (i = 7; i <= NF; i++) if ($i == "-") { if ($(i + 1) ~ /^fuse/) print $3, $5; break } }' \
    /proc/self/mountinfo | while read -r devno mnt; do
    local minor=${devno#*:}
    echo "cleaning up stray test mount $mnt"
    if [ -w "/sys/fs/fuse/connections/$minor/abort" ]; then
      echo 1 >"/sys/fs/fuse/connections/$minor/abort" || true
    fi
    umount -l "$mnt" 2>/dev/null || true
  done
}

# pjdfstest's EROFS tests remount the mount read-only and back with
# mount(8), which runs /sbin/mount.fuse.safs (or mount.fuse3, which runs
# `safs` from a PATH that mount(8) resets to the system's own). So for the
# run the helper is the binary under test, and whatever was installed there
# (scripts/run.sh installs one) is put back on exit.
HELPER=/sbin/mount.fuse.safs
HELPER_INSTALLED=0
install_helper() {
  if [ -e "$HELPER" ] || [ -L "$HELPER" ]; then cp -P "$HELPER" "$WORK/helper.saved"; fi
  ln -sfn "$SAFS" "$HELPER"
  HELPER_INSTALLED=1
}
restore_helper() {
  [ "$HELPER_INSTALLED" = 1 ] || return 0
  rm -f "$HELPER"
  if [ -e "$WORK/helper.saved" ] || [ -L "$WORK/helper.saved" ]; then cp -P "$WORK/helper.saved" "$HELPER"; fi
  HELPER_INSTALLED=0
}

# A private PostgreSQL cluster in $PG_DATA, on a Unix socket there only,
# run as the postgres user (the server refuses root).
pg() { runuser -u postgres -- "$PG_BIN/$1" "${@:2}"; }
pg_start() {
  mkdir -p "$PG_DATA" && chown postgres: "$PG_DATA" &&
    pg initdb -D "$PG_DATA" -U postgres -A trust -E UTF8 --no-instructions >"$WORK/initdb.log" 2>&1 &&
    printf "listen_addresses = ''\nunix_socket_directories = '%s'\n" "$PG_DATA" >>"$PG_DATA/postgresql.auto.conf" &&
    pg pg_ctl -D "$PG_DATA" -l "$PG_DATA/server.log" -w start >/dev/null
}
pg_stop() {
  if [ -f "$PG_DATA/postmaster.pid" ]; then pg pg_ctl -D "$PG_DATA" -m immediate -w stop >/dev/null 2>&1 || true; fi
}

# The S3 server the whole run shares (tests find it through the variables
# `safs-s3server start` prints); stopped by its daemons' PIDs on exit.
S3_DIR=$WORK/s3
S3_SERVER=$ROOT/target/ci/safs-s3server
s3_start() {
  mkdir -p "$S3_DIR" && cargo build --profile ci --locked --quiet -p safs-s3server &&
    "$S3_SERVER" start "$S3_DIR" >"$WORK/s3.env" && . "$WORK/s3.env"
}
s3_stop() {
  if [ -d "$S3_DIR/ceph" ] && [ -x "$S3_SERVER" ]; then "$S3_SERVER" stop "$S3_DIR" || true; fi
}

cleanup() {
  local rc=$?
  trap - EXIT
  if [ -n "$PJDFSTEST_INSTALL" ]; then kill -- "-$PJDFSTEST_INSTALL" "$PJDFSTEST_INSTALL" 2>/dev/null || true; fi
  restore_helper
  local m v
  for m in "$MNT" "$ENC_MNT" "$DEV_MNT" "$PG_MNT" "$S3_MNT"; do
    v=$VOL
    [ "$m" = "$ENC_MNT" ] && v=$ENC_VOL
    [ "$m" = "$DEV_MNT" ] && v=$DEV_VOL
    [ "$m" = "$PG_MNT" ] && v=$PG_VOL
    [ "$m" = "$S3_MNT" ] && v=$S3_VOL
    if is_mounted "$m"; then
      umount "$m" 2>/dev/null || fusermount3 -u -z "$m" 2>/dev/null || umount -l "$m" || true
      # The daemon flushes and exits; wait (bounded) until it released the lock.
      for _ in $(seq 1 100); do
        flock -n "$v/lock" true 2>/dev/null && break
        sleep 0.1
      done
    fi
  done
  [ "$CLEAN_STRAY_MOUNTS" = 1 ] && clean_stray_mounts
  pg_stop
  s3_stop
  restore_uring
  if ! is_mounted "$MNT" && ! is_mounted "$ENC_MNT" && ! is_mounted "$DEV_MNT" && ! is_mounted "$PG_MNT" && ! is_mounted "$S3_MNT"; then rm -rf "$WORK"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# FUSE over io_uring on for the run when the kernel has it; the first
# transport in TRANSPORTS is what the main volume, the encrypted one and the
# interop tests use.
URING_PARAM=/sys/module/fuse/parameters/enable_uring
URING_WAS=
TRANSPORTS=(dev)
if [ -w "$URING_PARAM" ]; then
  URING_WAS=$(cat "$URING_PARAM")
  echo Y >"$URING_PARAM"
  TRANSPORTS=(uring dev)
fi
restore_uring() {
  if [ -n "$URING_WAS" ]; then echo "$URING_WAS" >"$URING_PARAM" || true; fi
}
MAIN_TRANSPORT=${TRANSPORTS[0]}

# record STATUS SECONDS DESCRIPTION (STATUS: PASS, FAIL or SKIP)
record() {
  SUMMARY+=("$(printf '%-4s %5ss  %s' "$1" "$2" "$3")")
  case $1 in PASS | SKIP) ;; *) FAILURES=$((FAILURES + 1)) ;; esac
}
# check_fsck LOGNAME WHAT VOLUME [ARG...]: `safs fsck` of an unmounted
# volume (it waits for the daemon's last commit by itself); it must be clean.
check_fsck() {
  local log=$WORK/$1.log what=$2 t0=$SECONDS rc
  shift 2
  set +e
  "$SAFS" fsck "$@" >"$log" 2>&1
  rc=$?
  set -e
  cat "$log"
  if [ "$rc" = 0 ]; then
    TOTAL_PASSED=$((TOTAL_PASSED + 1))
    record PASS $((SECONDS - t0)) "$what: clean"
  else
    TOTAL_FAILED=$((TOTAL_FAILED + 1))
    record FAIL $((SECONDS - t0)) "$what: exit $rc"
  fi
}
if [ "$MAIN_TRANSPORT" = dev ]; then
  TOTAL_SKIPPED=$((TOTAL_SKIPPED + 1))
  record SKIP 0 "FUSE over io_uring: this kernel has none ($URING_PARAM missing); everything ran over /dev/fuse"
fi

# step NAME COMMAND...: runs the command, records PASS/FAIL and its duration.
step() {
  local name=$1
  shift
  say "$name"
  local t0=$SECONDS
  if "$@"; then record PASS $((SECONDS - t0)) "$name"; else record FAIL $((SECONDS - t0)) "$name (exit $?)"; fi
}

step "cargo fmt --all -- --check" cargo fmt --all -- --check
# In the tests' profile: its build scripts and proc-macros are the ones the
# tests' build below reuses.
step "cargo clippy --workspace --all-targets --profile ci -- -D warnings" \
  cargo clippy --workspace --all-targets --profile ci --locked -- -D warnings

# run_cargo_test TRANSPORT ARGS...: cargo test --profile ci ARGS with every safs
# mount over TRANSPORT (SAFS_TRANSPORT is the daemon's default for
# -o transport=), per-binary counts taken from its output.
run_cargo_test() {
  local transport=$1
  shift
  local name="cargo test ${CARGO_TEST_LABEL:-$*} (transport=$transport)"
  local log=$WORK/cargo-test-$transport.log t0=$SECONDS rc
  say "$name"
  set +e
  SAFS_TRANSPORT=$transport timeout -k 30 "$CARGO_TEST_TIMEOUT" \
    cargo test "$@" --profile ci --locked --no-fail-fast -- --test-threads=2 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  set -e
  read -r passed failed ignored < <(awk '/^test result:/ {
      for (i = 1; i <= NF; i++) {
        if ($(i + 1) ~ /^passed/) p += $i
        if ($(i + 1) ~ /^failed/) f += $i
        if ($(i + 1) ~ /^ignored/) g += $i
      }
    } END { print p + 0, f + 0, g + 0 }' "$log")
  TOTAL_PASSED=$((TOTAL_PASSED + passed))
  TOTAL_FAILED=$((TOTAL_FAILED + failed))
  TOTAL_SKIPPED=$((TOTAL_SKIPPED + ignored))
  local desc="$name: $passed passed, $failed failed, $ignored ignored"
  if [ "$rc" = 124 ]; then desc="$desc (TIMED OUT after ${CARGO_TEST_TIMEOUT}s)"; fi
  if [ "$rc" = 0 ] && [ "$failed" = 0 ] && [ "$passed" -gt 0 ]; then
    record PASS $((SECONDS - t0)) "$desc"
  else
    record FAIL $((SECONDS - t0)) "$desc (exit $rc)"
    CLEAN_STRAY_MOUNTS=1
    clean_stray_mounts
  fi
}
# One S3 server for every test that needs one (started once per run).
step "start a private S3 server (Ceph radosgw) for the run" s3_start
# pjdfstest, the pinned version, unless it is on PATH: built at the lowest
# CPU priority beside the tests below, which mostly wait on mounts and
# servers (73 s of the run when it came after them; it is waited for
# before pjdfstest runs).
pjdfstest_ready() { have pjdfstest && [ "$(pjdfstest --version 2>/dev/null)" = "pjdfstest $PJDFSTEST_VERSION" ]; }
if ! pjdfstest_ready; then
  say "cargo install --locked pjdfstest --version $PJDFSTEST_VERSION (in the background)"
  setsid -w nice -n 19 cargo install --locked --quiet pjdfstest --version "$PJDFSTEST_VERSION" \
    >"$WORK/pjdfstest-install.log" 2>&1 &
  PJDFSTEST_INSTALL=$!
fi
run_cargo_test "$MAIN_TRANSPORT" --workspace
# The integration tests once more over /dev/fuse — those that mount: the
# store client's own tests (objstore.rs) and the decoder fuzzing never do.
if [ "$MAIN_TRANSPORT" != dev ]; then
  mounting=()
  for t in tests/*.rs; do
    t=$(basename "$t" .rs)
    case $t in objstore | fuzz_decoders) ;; *) mounting+=(--test "$t") ;; esac
  done
  CARGO_TEST_LABEL="-p safs, $((${#mounting[@]} / 2)) integration test binaries" run_cargo_test dev -p safs "${mounting[@]}"
fi

# pjdfstest: built beside the tests above (started before them).
if [ -n "$PJDFSTEST_INSTALL" ]; then
  t0=$SECONDS
  if wait "$PJDFSTEST_INSTALL"; then
    record PASS $((SECONDS - t0)) "cargo install --locked pjdfstest --version $PJDFSTEST_VERSION (built beside the tests; waited $((SECONDS - t0))s for it here)"
  else
    cat "$WORK/pjdfstest-install.log"
    record FAIL $((SECONDS - t0)) "cargo install --locked pjdfstest --version $PJDFSTEST_VERSION (see its output above)"
  fi
  PJDFSTEST_INSTALL=
fi

# run_pjdfstest NAME CONFIG DIR [PATTERN...]: runs pjdfstest in DIR and
# records its summary line; it fails on any failed test or a missing summary.
run_pjdfstest() {
  local name=$1 config=$2 dir=$3
  shift 3
  local log=$WORK/$name.log t0=$SECONDS rc
  say "$name: pjdfstest -c $config -p $dir -s $WORK/secondary $*"
  mkdir -p "$dir"
  chmod 0755 "$dir"
  set +e
  NO_COLOR=1 timeout -k 10 "$PJDFSTEST_TIMEOUT" \
    pjdfstest -c "$config" -p "$dir" -s "$WORK/secondary" "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  set -e
  local line failed skipped passed
  line=$(grep -E '^Summary: ' "$log" | tail -n 1 || true)
  if [ -z "$line" ]; then
    record FAIL $((SECONDS - t0)) "$name: no summary (exit $rc)"
    return
  fi
  failed=$(sed -E 's/^Summary: ([0-9]+) failed.*/\1/' <<<"$line")
  skipped=$(sed -E 's/.* ([0-9]+) skipped.*/\1/' <<<"$line")
  passed=$(sed -E 's/.* ([0-9]+) passed.*/\1/' <<<"$line")
  TOTAL_PASSED=$((TOTAL_PASSED + passed))
  TOTAL_FAILED=$((TOTAL_FAILED + failed))
  # The EROFS tests the full run skips run (and are counted) in the next
  # step: count a skip only once.
  local later=0
  if [ "$name" = pjdfstest ] || [ "$name" = pjdfstest-encrypted ] || [ "$name" = pjdfstest-dev ]; then
    later=$(grep -cE '::erofs_[a-z_]+ +skipped$' "$log" || true)
  fi
  TOTAL_SKIPPED=$((TOTAL_SKIPPED + skipped - later))
  local desc="$name: $passed passed, $failed failed, $skipped skipped"
  [ "$later" -gt 0 ] && desc="$desc ($later of them run in the next step)"
  if [ "$rc" = 0 ] && [ "$failed" = 0 ] && [ "$passed" -gt 0 ]; then
    record PASS $((SECONDS - t0)) "$desc"
  else
    record FAIL $((SECONDS - t0)) "$desc (exit $rc)"
    grep -E ' FAILED$' "$log" | sed 's/^/    /' || true
  fi
  if [ "$skipped" -gt 0 ]; then
    echo "$name skipped:"
    grep -E ' skipped$' "$log" | awk '{ print "    " $1 }'
  fi
}

SAFS=$ROOT/target/ci/safs
t0=$SECONDS
if ! cargo build --profile ci --locked --quiet --bin safs || [ ! -x "$SAFS" ]; then
  record FAIL $((SECONDS - t0)) "pjdfstest: not run, safs did not build"
elif ! pjdfstest_ready; then
  record FAIL 0 "pjdfstest: not run, pjdfstest $PJDFSTEST_VERSION is not installed"
else
  mkdir -p "$MNT" "$WORK/secondary"
  if ! "$SAFS" format "$VOL"; then
    record FAIL $((SECONDS - t0)) "pjdfstest: not run, safs format failed"
  elif ! "$SAFS" mount "$VOL" "$MNT" -o "allow_other,transport=$MAIN_TRANSPORT"; then
    record FAIL $((SECONDS - t0)) "pjdfstest: not run, safs mount failed"
    tail -n 50 "$VOL/safs.log" 2>/dev/null || true
  else
    install_helper
    run_pjdfstest pjdfstest "$ROOT/tests/pjdfstest.toml" "$MNT/pjdfstest"
    # The EROFS tests remount the file system read-only and back, which fails
    # with EBUSY while other tests still hold files open for writing, so they
    # run on their own, with remounting allowed.
    sed 's/^allow_remount = false$/allow_remount = true/' "$ROOT/tests/pjdfstest.toml" >"$WORK/pjdfstest-erofs.toml"
    if grep -q '^allow_remount = true$' "$WORK/pjdfstest-erofs.toml"; then
      run_pjdfstest pjdfstest-erofs "$WORK/pjdfstest-erofs.toml" "$MNT/pjdfstest-erofs" erofs
    else
      record FAIL 0 "pjdfstest-erofs: tests/pjdfstest.toml has no 'allow_remount = false' line to flip"
    fi
  fi
fi

# pjdfstest (and its EROFS tests) again on a volume served over /dev/fuse,
# then its fsck.
if [ "$MAIN_TRANSPORT" != dev ] && [ -x "$SAFS" ] && pjdfstest_ready && [ -f "$WORK/pjdfstest-erofs.toml" ]; then
  t0=$SECONDS
  mkdir -p "$DEV_MNT"
  if ! "$SAFS" format "$DEV_VOL" >/dev/null; then
    record FAIL $((SECONDS - t0)) "pjdfstest-dev: not run, safs format failed"
  elif ! "$SAFS" mount "$DEV_VOL" "$DEV_MNT" -o allow_other,transport=dev; then
    record FAIL $((SECONDS - t0)) "pjdfstest-dev: not run, safs mount -o transport=dev failed"
    tail -n 50 "$DEV_VOL/safs.log" 2>/dev/null || true
  else
    run_pjdfstest pjdfstest-dev "$ROOT/tests/pjdfstest.toml" "$DEV_MNT/pjdfstest"
    run_pjdfstest pjdfstest-dev-erofs "$WORK/pjdfstest-erofs.toml" "$DEV_MNT/pjdfstest-erofs" erofs
    umount "$DEV_MNT"
    check_fsck fsck-dev "safs fsck after pjdfstest over /dev/fuse" "$DEV_VOL"
  fi
fi

# pjdfstest (and its EROFS tests) and stress-ng on a volume whose metadata
# lives in PostgreSQL (a private cluster), then its fsck.
if [ -x "$SAFS" ] && pjdfstest_ready && [ -f "$WORK/pjdfstest-erofs.toml" ]; then
  t0=$SECONDS
  mkdir -p "$PG_MNT"
  if ! pg_start; then
    record FAIL $((SECONDS - t0)) "pjdfstest-postgres: not run, the PostgreSQL cluster did not start"
    cat "$WORK/initdb.log" "$PG_DATA/server.log" 2>/dev/null | tail -n 30
  elif ! "$SAFS" format "$PG_VOL" --meta "host=$PG_DATA user=postgres dbname=postgres" >/dev/null; then
    record FAIL $((SECONDS - t0)) "pjdfstest-postgres: not run, safs format --meta failed"
  elif ! "$SAFS" mount "$PG_VOL" "$PG_MNT" -o allow_other; then
    record FAIL $((SECONDS - t0)) "pjdfstest-postgres: not run, safs mount failed"
    tail -n 50 "$PG_VOL/safs.log" 2>/dev/null || true
  else
    run_pjdfstest pjdfstest-postgres "$ROOT/tests/pjdfstest.toml" "$PG_MNT/pjdfstest"
    run_pjdfstest pjdfstest-postgres-erofs "$WORK/pjdfstest-erofs.toml" "$PG_MNT/pjdfstest-erofs" erofs
    PG_STRESS=1
  fi
fi

# --- 6. stress-ng ----------------------------------------------------------------
# File-system stressors that check what they read back (--verify): data
# through both caches, locks, mmap, links, renames, xattrs, directories.
# Left out: io-uring (this stress-ng's IORING_OP_STATX check fails on ext4
# too) and fiemap (FIEMAP is not forwarded by FUSE; it skips itself).
STRESSORS=(fallocate flock fcntl lockf mmap seek sync-file readahead rename
  symlink chown getdent xattr dirdeep dirmany copy-file fsize iomix sendfile
  splice file-ioctl hdd dentry utime mknod chmod filename fstat link open
  fpunch dir lease)
STRESS_SECONDS=${STRESS_SECONDS:-2}

# run_stress NAME MOUNTPOINT STRESSOR...: each stressor --verify in turn.
run_stress() {
  local name=$1 mnt=$2 t0=$SECONDS s log rc
  shift 2
  if ! is_mounted "$mnt"; then
    record FAIL 0 "$name: not run, nothing mounted"
    return
  elif ! have stress-ng; then
    record FAIL 0 "$name: not run, stress-ng is not installed"
    return
  fi
  say "$name: $# stressors, ${STRESS_SECONDS}s each, --verify, in $mnt/stress"
  mkdir -p "$mnt/stress"
  local failed=()
  for s in "$@"; do
    log=$WORK/$name-$s.log
    set +e
    (cd "$mnt/stress" && timeout -k 10 $((STRESS_SECONDS * 10 + 60)) \
      stress-ng --temp-path "$mnt/stress" --"$s" 1 --verify --timeout "$STRESS_SECONDS" \
      --metrics-brief) >"$log" 2>&1
    rc=$?
    set -e
    if [ "$rc" != 0 ] || grep -q ' fail: ' "$log"; then
      failed+=("$s")
      echo "stress-ng --$s: exit $rc"
      grep -E ' (fail|error): ' "$log" | head -n 5 | sed 's/^/    /'
    else
      echo "stress-ng --$s: ok"
    fi
  done
  if [ ${#failed[@]} = 0 ]; then
    TOTAL_PASSED=$((TOTAL_PASSED + $#))
    record PASS $((SECONDS - t0)) "$name: $# stressors passed --verify"
  else
    TOTAL_PASSED=$((TOTAL_PASSED + $# - ${#failed[@]}))
    TOTAL_FAILED=$((TOTAL_FAILED + ${#failed[@]}))
    record FAIL $((SECONDS - t0)) "$name: failed: ${failed[*]}"
  fi
}
run_stress stress-ng "$MNT" "${STRESSORS[@]}"
# The metadata stressors on the PostgreSQL volume, then its fsck.
if [ "${PG_STRESS:-0}" = 1 ]; then
  run_stress stress-ng-postgres "$PG_MNT" rename symlink chown getdent xattr dirdeep \
    dirmany dentry utime mknod chmod filename link open dir fsize
  umount "$PG_MNT"
  check_fsck fsck-pg "safs fsck of the PostgreSQL volume after pjdfstest and stress-ng" "$PG_VOL"
fi

# --- 7. fsck of the volume all of the above ran on ---------------------------
if is_mounted "$MNT"; then
  umount "$MNT"
  check_fsck fsck "safs fsck after pjdfstest and stress-ng" "$VOL"
fi

# --- 7b. that volume moved to PostgreSQL and back, and restored from a dump --
# `safs dump` of it, `safs migrate` onto a new database of the cluster,
# fsck, pjdfstest on the moved volume, `safs migrate` back to LMDB, fsck;
# then the dump loaded into a new directory beside a copy of its data/, fsck.
migrate_roundtrip() {
  local conn="host=$PG_DATA user=postgres dbname=migrated"
  # The dump and a copy of the contents it names, taken together.
  pg createdb -h "$PG_DATA" -U postgres migrated &&
    "$SAFS" dump "$VOL" "$WORK/main.dump" &&
    mkdir -p "$WORK/restored" && cp -a "$VOL/data" "$WORK/restored/data" &&
    "$SAFS" migrate "$VOL" --meta "$conn" &&
    "$SAFS" mount "$VOL" "$MNT" -o allow_other || return 1
  # A short directory: pjdfstest binds Unix sockets under it, whose paths
  # must fit sockaddr_un's 108 bytes.
  run_pjdfstest pjdfstest-migrated "$ROOT/tests/pjdfstest.toml" "$MNT/pjdm"
  umount "$MNT" && "$SAFS" migrate "$VOL" --meta lmdb || return 1
  "$SAFS" load "$WORK/main.dump" "$WORK/restored" --replace
}
if [ "${PG_STRESS:-0}" = 1 ] && [ -x "$SAFS" ] && ! is_mounted "$MNT"; then
  t0=$SECONDS
  say "migrate the main volume to PostgreSQL and back; restore its dump"
  if migrate_roundtrip; then
    record PASS $((SECONDS - t0)) "migrate LMDB -> PostgreSQL -> LMDB (fsck after each), dump -> load"
    check_fsck fsck-restored "safs fsck of the volume restored from its dump" "$WORK/restored"
  else
    record FAIL $((SECONDS - t0)) "migrate/dump/load of the main volume"
  fi
fi
pg_stop

# --- 8. an encrypted volume: pjdfstest, data stressors, fsck ---------------------
# Names, records and contents sealed, contents through the daemon, the
# directory cache on (its default there). The test KDF keeps unlocking fast.
t0=$SECONDS
if [ ! -x "$SAFS" ] || ! pjdfstest_ready; then
  record FAIL 0 "encrypted: not run (no safs build or no pjdfstest)"
else
  mkdir -p "$ENC_MNT"
  head -c 24 /dev/urandom | base64 >"$ENC_PASS"
  chmod 0600 "$ENC_PASS"
  if ! "$SAFS" format "$ENC_VOL" --encrypt --kdf-testing --passphrase-file "$ENC_PASS"; then
    record FAIL $((SECONDS - t0)) "encrypted: not run, safs format --encrypt failed"
  elif ! "$SAFS" mount "$ENC_VOL" "$ENC_MNT" -o "allow_other,transport=$MAIN_TRANSPORT,passphrase_file=$ENC_PASS"; then
    record FAIL $((SECONDS - t0)) "encrypted: not run, safs mount failed"
    tail -n 50 "$ENC_VOL/safs.log" 2>/dev/null || true
  else
    run_pjdfstest pjdfstest-encrypted "$ROOT/tests/pjdfstest.toml" "$ENC_MNT/pjdfstest"
    run_pjdfstest pjdfstest-encrypted-erofs "$WORK/pjdfstest-erofs.toml" "$ENC_MNT/pjdfstest-erofs" erofs
    # The contents path (sealed blocks) and the directory cache.
    run_stress stress-ng-encrypted "$ENC_MNT" fallocate mmap seek readahead hdd iomix \
      fpunch copy-file sendfile splice fsize sync-file rename getdent dirmany xattr \
      dentry link filename
    umount "$ENC_MNT"
    check_fsck fsck-encrypted "safs fsck of the encrypted volume (every record and block)" \
      "$ENC_VOL" --passphrase-file "$ENC_PASS"
  fi
fi

# --- 8b. contents in the object store: pjdfstest, data stressors, fsck, and
# every file read back once the node's cache is gone --------------------------
t0=$SECONDS
if [ ! -x "$SAFS" ] || ! pjdfstest_ready; then
  record FAIL 0 "s3: not run (no safs build or no pjdfstest)"
elif [ -z "${SAFS_TEST_S3_ENDPOINT:-}" ] || ! "$S3_SERVER" bucket safs-ci >/dev/null ||
  ! eval "$("$S3_SERVER" aws-env)"; then
  record FAIL $((SECONDS - t0)) "s3: not run, no S3 server or no bucket on it"
else
  mkdir -p "$S3_MNT"
  if ! "$SAFS" format "$S3_VOL" --data s3://safs-ci/run >/dev/null; then
    record FAIL $((SECONDS - t0)) "s3: not run, safs format --data failed"
  elif ! "$SAFS" mount "$S3_VOL" "$S3_MNT" -o "allow_other,transport=$MAIN_TRANSPORT"; then
    record FAIL $((SECONDS - t0)) "s3: not run, safs mount failed"
    tail -n 50 "$S3_VOL/safs.log" 2>/dev/null || true
  else
    run_pjdfstest pjdfstest-s3 "$ROOT/tests/pjdfstest.toml" "$S3_MNT/pjdfstest"
    run_pjdfstest pjdfstest-s3-erofs "$WORK/pjdfstest-erofs.toml" "$S3_MNT/pjdfstest-erofs" erofs
    run_stress stress-ng-s3 "$S3_MNT" fallocate mmap seek readahead hdd iomix fpunch \
      copy-file sendfile splice fsize sync-file rename link
    # Files of every shape to read back: several blocks, one, a sparse one.
    mkdir -p "$S3_MNT/back"
    head -c 9437307 /dev/urandom >"$S3_MNT/back/big"
    head -c 5000 /dev/urandom >"$S3_MNT/back/small"
    truncate -s 21M "$S3_MNT/back/sparse" && echo tail >>"$S3_MNT/back/sparse"
    (cd "$S3_MNT" && find . -type f -print0 | sort -z | xargs -0 -r sha256sum) >"$WORK/s3.sums"
    umount "$S3_MNT"
    check_fsck fsck-s3 "safs fsck of the object-store volume after pjdfstest and stress-ng" "$S3_VOL"
    t0=$SECONDS
    find "$S3_VOL/data" -type f -delete
    files=$(wc -l <"$WORK/s3.sums")
    if ! "$SAFS" mount "$S3_VOL" "$S3_MNT" -o "allow_other,transport=$MAIN_TRANSPORT"; then
      TOTAL_FAILED=$((TOTAL_FAILED + 1))
      record FAIL $((SECONDS - t0)) "s3-cache-lost: safs mount failed"
    elif (cd "$S3_MNT" && sha256sum --quiet -c "$WORK/s3.sums"); then
      TOTAL_PASSED=$((TOTAL_PASSED + 1))
      record PASS $((SECONDS - t0)) "s3-cache-lost: $files files read back from the store, every byte"
    else
      TOTAL_FAILED=$((TOTAL_FAILED + 1))
      record FAIL $((SECONDS - t0)) "s3-cache-lost: files differ once read back from the store"
    fi
    if is_mounted "$S3_MNT"; then umount "$S3_MNT"; fi
  fi
fi

# --- 9. real Samba and Swift on a safs mount -----------------------------------
# smbd + smbclient/smbcacls over SMB on the loopback (DOS attributes, NT
# ACLs, streams in xattrs), and OpenStack Swift's object-server diskfile
# layer writing and reading ~31.5 KiB of object metadata. Each script
# installs what it needs, formats and mounts its own volume, and checks it
# with fsck at the end. Recipes: docs/samba-and-swift.md.
for interop in samba swift; do
  t0=$SECONDS
  say "interop: $interop (tests/interop/$interop.sh)"
  set +e
  SAFS="$SAFS" timeout -k 10 600 bash "$ROOT/tests/interop/$interop.sh" 2>&1 | tee "$WORK/interop-$interop.log"
  rc=${PIPESTATUS[0]}
  set -e
  line=$(grep -E "^$interop: [0-9]+ checks passed" "$WORK/interop-$interop.log" | tail -n 1 || true)
  if [ "$rc" = 0 ] && [ -n "$line" ]; then
    n=$(sed -E 's/^[a-z]+: ([0-9]+) .*/\1/' <<<"$line")
    TOTAL_PASSED=$((TOTAL_PASSED + n))
    record PASS $((SECONDS - t0)) "$line"
  else
    TOTAL_FAILED=$((TOTAL_FAILED + 1))
    record FAIL $((SECONDS - t0)) "interop $interop (exit $rc)"
  fi
done

# --- summary -------------------------------------------------------------------
printf '\n==================== safs test summary ====================\n'
printf '%s\n' "${SUMMARY[@]}"
printf 'time: %ss\n' $((SECONDS - START))
if [ "$FAILURES" -gt 0 ]; then
  printf 'RESULT: FAILED (%s step(s))\n' "$FAILURES"
else
  printf 'RESULT: all steps passed\n'
fi
printf 'total: %s passed, %s failed, %s skipped\n' "$TOTAL_PASSED" "$TOTAL_FAILED" "$TOTAL_SKIPPED"
[ "$FAILURES" -eq 0 ]
