#!/usr/bin/env bash
# Sets up and runs safs for real on a fresh Debian machine: installs what is
# missing, builds and installs safs (with the mount.fuse.safs helper), formats
# a volume on the embedded engine and mounts it.
#
#   bash scripts/run.sh [VOLUME_DIR] [MOUNTPOINT]
#
# Defaults: /var/lib/safs/demo and /mnt/safs. Unmount with `umount MOUNTPOINT`.
set -euo pipefail
cd "$(dirname "$0")/.."

VOLUME=${1:-/var/lib/safs/demo}
MOUNTPOINT=${2:-/mnt/safs}

need_root() { [ "$(id -u)" = 0 ] || { echo "run as root (mounting and installing need it)" >&2; exit 1; }; }
need_root

missing=()
for pkg_cmd in "fuse3:fusermount3" "attr:getfattr" "acl:getfacl" "build-essential:cc" "curl:curl" "pkg-config:pkg-config" "man-db:man"; do
  pkg=${pkg_cmd%%:*}; cmd=${pkg_cmd##*:}
  command -v "$cmd" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "== installing: ${missing[*]}"
  # Wait for another apt run (unattended upgrades, a first boot) instead of failing.
  apt-get -o DPkg::Lock::Timeout=600 update -qq && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq "${missing[@]}"
fi
if ! command -v cargo >/dev/null 2>&1; then
  [ -x "$HOME/.cargo/bin/cargo" ] || curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
  export PATH="$HOME/.cargo/bin:$PATH"
fi
[ -e /dev/fuse ] || modprobe fuse

echo "== building safs (release)"
cargo build --release --locked --quiet
install -m 0755 target/release/safs /usr/local/bin/safs
ln -sf /usr/local/bin/safs /sbin/mount.fuse.safs
# man safs, man safs-mount, man mount.fuse.safs, ...
safs man /usr/local/share/man/man8
mandb -q >/dev/null 2>&1 || true

if [ ! -e "$VOLUME/meta/data.mdb" ]; then
  mkdir -p "$(dirname "$VOLUME")"
  safs format "$VOLUME"
fi
mkdir -p "$MOUNTPOINT"
if findmnt -rn "$MOUNTPOINT" >/dev/null 2>&1; then
  echo "== $MOUNTPOINT is already mounted"
else
  safs mount "$VOLUME" "$MOUNTPOINT" -o allow_other
fi
safs info "$MOUNTPOINT"
cat <<MSG

safs is mounted on $MOUNTPOINT (volume $VOLUME). Try:
  cd $MOUNTPOINT && touch f && setfattr -n user.demo -v hello f && getfattr -d f
Unmount with:  umount $MOUNTPOINT
Mount again:   safs mount $VOLUME $MOUNTPOINT -o allow_other
               (or: mount -t fuse.safs $VOLUME $MOUNTPOINT -o allow_other)
MSG
