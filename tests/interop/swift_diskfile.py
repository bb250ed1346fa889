#!/usr/bin/python3
"""OpenStack Swift's object-server disk layer on a safs mount.

Run by tests/interop/swift.sh with Debian's python3 and python3-swift (2.30):

    /usr/bin/python3 swift_diskfile.py DEVICES_ROOT --swift-dir DIR \
        --state FILE [--phase write|verify] [--device sdb1] [--safs BIN] [--first N] \
        [--user swift]

DEVICES_ROOT is Swift's `devices` directory; DEVICES_ROOT/<device> must be a
safs mount (it is checked with Swift's own mount_check). DIR holds a
swift.conf with a [swift-hash] section (read through set_swift_dir, as the
servers' `swift_dir` option does; /etc/swift is not used).

Everything goes through swift.obj.diskfile (DiskFileRouter, DiskFileManager,
DiskFile, its writer and reader), the code an object server runs for PUT,
GET/HEAD, POST and DELETE. Each check is asserted; the script exits 1 at the
first failure, and prints "ok N - ..." per check (numbered from --first) and
"checks: N" at the end.

--phase write (the default) does the PUT/GET/POST/DELETE checks and saves
what it expects to find later in the JSON file --state; --phase verify (run
after the safs volume was unmounted and mounted again) reads the objects
back through fresh DiskFiles and compares.

--user swift: started as root, work as that user (effective uid and gid, as
the object server's `user = swift` does), taking root back only to ask the
safs daemon for its request counts (its control socket is root's).
"""

import argparse
import hashlib
import json
import os
import pickle
import subprocess
import sys

PASSED = 0


def check(cond, what, detail=""):
    global PASSED
    if not cond:
        print("swift: FAIL: %s%s" % (what, (" (%s)" % detail) if detail else ""),
              file=sys.stderr)
        sys.exit(1)
    PASSED += 1
    print("ok %d - %s" % (PASSED, what))


def main():
    global PASSED
    ap = argparse.ArgumentParser()
    ap.add_argument("devices")
    ap.add_argument("--swift-dir", required=True)
    ap.add_argument("--device", default="sdb1")
    ap.add_argument("--safs", help="safs binary, to count FUSE requests with `safs info --json`")
    ap.add_argument("--state", required=True)
    ap.add_argument("--phase", choices=("write", "verify"), default="write")
    ap.add_argument("--first", type=int, default=1)
    ap.add_argument("--user")
    args = ap.parse_args()
    uid = None
    if args.user:
        import pwd
        pw = pwd.getpwnam(args.user)
        uid = pw.pw_uid
        os.setgroups([])
        os.setegid(pw.pw_gid)
        os.seteuid(uid)
    PASSED = args.first - 1
    first = PASSED

    from swift.common import storage_policy, utils
    # As a server does for `swift_dir = DIR`: swift.conf (hash path
    # prefix/suffix, storage policies) comes from DIR.
    utils.set_swift_dir(args.swift_dir)
    storage_policy.reload_storage_policies()
    if args.phase == "write":
        check(bool(utils.HASH_PATH_SUFFIX or utils.HASH_PATH_PREFIX),
              "swift.conf of %s read (hash path suffix set)" % args.swift_dir)

    import logging
    import xattr
    from swift.common.constraints import check_mount
    from swift.common.exceptions import DiskFileDeleted
    from swift.common.storage_policy import POLICIES
    from swift.common.utils import Timestamp
    from swift.obj import diskfile

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    logger = utils.LogAdapter(logging.getLogger("safs-interop"), "object-server")
    policy = POLICIES.default
    dev_path = os.path.join(args.devices, args.device)
    mountpoint = dev_path

    # ------------------------------------------------------- mount_check ----
    check(utils.ismount(dev_path) and check_mount(args.devices, args.device) == dev_path,
          "mount_check: Swift's ismount() sees the safs mount %s as mounted" % dev_path)
    if args.phase == "write":
        check(not utils.ismount(args.devices),
              "mount_check: the devices root %s is not a mount point" % args.devices)

    conf = {
        "devices": args.devices,
        "mount_check": "true",
        "disk_chunk_size": "65536",
    }

    def manager():
        # A new router per use, as a fresh object-server worker would have.
        return diskfile.DiskFileRouter(conf, logger)[policy]

    if args.phase == "write":
        check(manager().get_dev_path(args.device) == dev_path,
              "DiskFileManager with mount_check = true accepts device %s" % args.device)
        st = os.stat(dev_path)
        check(os.geteuid() == st.st_uid,
              "working as uid %d, the owner of the device %s" % (os.geteuid(), dev_path))

    def fuse_counts():
        if not args.safs:
            return None
        if uid is not None:
            os.seteuid(0)
        try:
            out = subprocess.run([args.safs, "info", "--json", mountpoint],
                                 check=True, capture_output=True, text=True).stdout
        finally:
            if uid is not None:
                os.seteuid(uid)
        d = json.loads(out)
        ops = {o["op"]: o["count"] for o in d["ops"]}
        return ops, d["engine"]

    def delta(before, after, op):
        return after[0].get(op, 0) - before[0].get(op, 0)

    def measure_metadata_read(data_path, raw, meta, when):
        if not args.safs:
            return
        fd = os.open(data_path, os.O_RDONLY)
        try:
            # What asking for the counts costs by itself: `safs info` runs as
            # root, which does not own the mount's root directory, and the
            # kernel fetches that directory's POSIX ACL (it does not cache
            # the ACL of a FUSE mount's root inode) on its path walk.
            b0 = fuse_counts()
            bz = fuse_counts()
            base = delta(b0, bz, "getxattr")
            base_eng = bz[1]["gets"] - b0[1]["gets"]
            blob = xattr.getxattr(fd, b"user.swift.metadata")
            b1 = fuse_counts()
            md_direct = diskfile.read_metadata(fd)
            b2 = fuse_counts()
        finally:
            os.close(fd)
        check(blob == raw and md_direct == meta,
              "%sread_metadata() on an open .data fd returns the metadata" % when)
        n_blob = delta(bz, b1, "getxattr") - base
        n_all = delta(b1, b2, "getxattr") - base
        eng = b1[1]["gets"] - bz[1]["gets"] - base_eng
        check(n_blob == 2,
              "%sgetting the %d-byte user.swift.metadata took %d FUSE getxattr requests "
              "(size probe + value) and %d metadata-engine read(s)" % (when, len(raw), n_blob, eng),
              "expected 2")
        check(n_all <= 5,
              "%sthe whole read_metadata() (chunk, next chunk ENODATA, checksum) took %d "
              "FUSE getxattr requests" % (when, n_all))

    def user_meta(prefix, n, value_len, seed):
        meta = {}
        for i in range(n):
            # ASCII plus some UTF-8 (Swift stores str values UTF-8 encoded)
            v = ("%s-%d-%d-" % (seed, i, value_len)) + "ü€" * 3
            meta["X-Object-Meta-%s-%03d" % (prefix, i)] = (v + "x" * value_len)[:value_len]
        return meta

    def pickled_len(meta):
        return len(pickle.dumps(diskfile._encode_metadata(meta), diskfile.PICKLE_PROTOCOL))

    def fit(meta, target):
        # Drop user metadata items from the end, then pad the last one, until
        # Swift's pickle of meta is exactly target bytes.
        keys = sorted(k for k in meta if k.startswith("X-Object-Meta-"))
        while pickled_len(meta) > target:
            del meta[keys.pop()]
        key = keys[-1]
        for _ in range(20):
            d = target - pickled_len(meta)
            if d == 0:
                return meta
            meta[key] = meta[key] + "p" * d if d > 0 else meta[key][:d]
        raise RuntimeError("could not fit metadata to %d bytes" % target)

    def put_object(obj, data, user, target):
        """PUT as the object server does it: create, write, put, commit."""
        df = manager().get_diskfile(args.device, "0", "AUTH_safs", "interop", obj,
                                    policy=policy)
        ts = Timestamp.now()
        meta = {
            "X-Timestamp": ts.internal,
            "Content-Type": "application/octet-stream",
            "ETag": hashlib.md5(data).hexdigest(),
            "Content-Length": str(len(data)),
        }
        meta.update(user)
        meta["name"] = "/AUTH_safs/interop/" + obj  # what put() adds
        fit(meta, target)
        del meta["name"]
        with df.create(size=len(data)) as writer:
            for i in range(0, len(data), 65536):
                writer.write(data[i:i + 65536])
            writer.put(dict(meta))
            writer.commit(ts)
        meta["name"] = "/AUTH_safs/interop/" + obj
        return df, ts, meta

    def read_object(obj):
        """GET as the object server does it: a new DiskFile, open, read."""
        df = manager().get_diskfile(args.device, "0", "AUTH_safs", "interop", obj,
                                    policy=policy)
        with df.open():
            md = df.get_metadata()
            datafile_md = df.get_datafile_metadata()
            metafile_md = df.get_metafile_metadata()
            body = b"".join(df.reader())
        return df, md, datafile_md, metafile_md, body

    def files_of(df):
        return sorted(os.listdir(df._datadir))

    if args.phase == "verify":
        with open(args.state) as f:
            state = json.load(f)
        c = state["obj-c"]
        raw_c = pickle.dumps(diskfile._encode_metadata(c["meta"]), diskfile.PICKLE_PROTOCOL)
        measure_metadata_read(c["path"], raw_c, c["meta"], "after mount, first read: ")
        _, md, _, _, body = read_object("obj-c")
        check(md == c["meta"] and body == bytes.fromhex(c["data"]),
              "after unmount and mount: obj-c's data and metadata identical")
        _, md, _, _, body = read_object("obj-b")
        check(md == state["obj-b"]["meta"] and body == bytes.fromhex(state["obj-b"]["data"]),
              "after unmount and mount: obj-b's data and %d metadata keys (2 xattr chunks) "
              "identical" % len(md))
        df = manager().get_diskfile(args.device, "0", "AUTH_safs", "interop", "obj-a",
                                    policy=policy)
        try:
            df.open()
            deleted = None
        except DiskFileDeleted as e:
            deleted = e
        check(deleted is not None and deleted.timestamp.internal == state["obj-a"]["deleted"],
              "after unmount and mount: obj-a is still deleted at %s" % state["obj-a"]["deleted"])
        print("checks: %d" % (PASSED - first))
        return

    # ------------------------------------------------- PUT, 31.5 KiB meta ----
    data_a = os.urandom(1024 * 1024 + 7)
    target_a = 31 * 1024 + 512
    df, ts1, meta_a = put_object("obj-a", data_a, user_meta("Safs", 80, 500, "a"), target_a)
    check(pickled_len(meta_a) == target_a,
          "PUT obj-a: 1 MiB of data, %d user metadata items, pickled metadata %d bytes (31.5 KiB)"
          % (sum(k.startswith("X-Object-Meta-") for k in meta_a), target_a))
    linkat = df.manager.use_linkat
    files = files_of(df)
    check(files == [ts1.internal + ".data"], "one .data file in the object's hash dir", files)
    data_path = os.path.join(df._datadir, files[0])
    names = sorted(os.listxattr(data_path))
    check(names == ["user.swift.metadata", "user.swift.metadata_checksum"],
          "the .data file on safs has user.swift.metadata (one chunk) and its checksum", names)
    raw = os.getxattr(data_path, "user.swift.metadata")
    check(len(raw) == target_a,
          "user.swift.metadata is the whole %d-byte pickle in one xattr" % target_a, len(raw))
    check(os.getxattr(data_path, "user.swift.metadata_checksum")
          == hashlib.md5(raw).hexdigest().encode(),
          "user.swift.metadata_checksum matches the stored pickle")
    with open(data_path, "rb") as f:
        check(f.read() == data_a, "the .data file holds the object's bytes")

    # ----------------------------------------------------- GET, fresh df ----
    df2, md, datafile_md, metafile_md, body = read_object("obj-a")
    check(body == data_a, "GET obj-a through a fresh DiskFile: data identical")
    check(md == meta_a and datafile_md == meta_a and metafile_md is None,
          "GET obj-a: metadata identical (%d keys, UTF-8 values intact)" % len(meta_a))
    check(files_of(df2) == files and not os.path.exists(os.path.join(dev_path, "quarantined")),
          "the reader's ETag check passed (nothing quarantined)")

    # FUSE requests for reading the metadata the way Swift does
    measure_metadata_read(data_path, raw, meta_a, "")

    # ----------------------------- PUT with 100 KiB meta: several chunks ----
    data_b = b"small object\n"
    target_b = 100 * 1024
    dfb, tsb, meta_b = put_object("obj-b", data_b, user_meta("Big", 250, 500, "b"), target_b)
    path_b = os.path.join(dfb._datadir, files_of(dfb)[0])
    names = sorted(os.listxattr(path_b))
    check(names == ["user.swift.metadata", "user.swift.metadata1",
                    "user.swift.metadata_checksum"],
          "PUT obj-b with a %d-byte pickle: Swift split it into user.swift.metadata "
          "and user.swift.metadata1" % target_b, names)
    sizes = [len(os.getxattr(path_b, n)) for n in ("user.swift.metadata", "user.swift.metadata1")]
    check(sizes == [65536, target_b - 65536],
          "chunk sizes %s: the first is a full 64 KiB xattr (the Linux maximum)" % sizes)
    _, md, _, _, body = read_object("obj-b")
    check(body == data_b and md == meta_b,
          "GET obj-b through a fresh DiskFile: data and %d metadata keys identical" % len(md))

    # ---------------------------------------------------- POST: .meta file ----
    df3 = manager().get_diskfile(args.device, "0", "AUTH_safs", "interop", "obj-a",
                                 policy=policy)
    ts2 = Timestamp.now()
    post = {"X-Timestamp": ts2.internal, "X-Object-Meta-Posted": "yes ✓"}
    post.update(user_meta("Post", 50, 600, "c"))
    with df3.open():  # the object server opens it first (404 otherwise)
        df3.write_metadata(dict(post))
    post["name"] = "/AUTH_safs/interop/obj-a"
    files = files_of(df3)
    check(files == [ts1.internal + ".data", ts2.internal + ".meta"],
          "POST obj-a: a .meta file beside the .data file", files)
    meta_path = os.path.join(df3._datadir, files[1])
    check(os.path.getsize(meta_path) == 0
          and diskfile.read_metadata(meta_path) == post
          and "user.swift.metadata" in os.listxattr(meta_path),
          "the .meta file is empty and holds the POSTed metadata (%d bytes pickled) in xattrs"
          % pickled_len(post))
    df4, md, datafile_md, metafile_md, body = read_object("obj-a")
    expect = {k: v for k, v in meta_a.items() if not k.startswith("X-Object-Meta-")}
    expect.update({k: v for k, v in post.items() if k.startswith("X-Object-Meta-")})
    expect["X-Timestamp"] = ts2.internal
    # (get_metafile_metadata() drops the 'name' the writer put in the .meta)
    post_no_name = {k: v for k, v in post.items() if k != "name"}
    check(metafile_md == post_no_name and datafile_md == meta_a,
          "GET after POST: .data metadata unchanged, .meta metadata identical")
    check(md == expect and body == data_a,
          "GET after POST: merged metadata has the POSTed user metadata only, data intact")
    check(df4.data_timestamp == ts1 and df4.timestamp == ts2,
          "GET after POST: data timestamp %s, metadata timestamp %s" % (ts1.internal, ts2.internal))

    # ------------------------------------------------ DELETE: .ts tombstone ----
    df5 = manager().get_diskfile(args.device, "0", "AUTH_safs", "interop", "obj-a",
                                 policy=policy)
    ts3 = Timestamp.now()
    df5.delete(ts3)
    files = files_of(df5)
    check(files == [ts3.internal + ".ts"],
          "DELETE obj-a: only a .ts tombstone is left (.data and .meta cleaned up)", files)
    ts_path = os.path.join(df5._datadir, files[0])
    check(diskfile.read_metadata(ts_path) == {"X-Timestamp": ts3.internal,
                                              "name": "/AUTH_safs/interop/obj-a"},
          "the tombstone's xattr metadata names the object and the delete time")
    df6 = manager().get_diskfile(args.device, "0", "AUTH_safs", "interop", "obj-a",
                                 policy=policy)
    try:
        df6.open()
        deleted = None
    except DiskFileDeleted as e:
        deleted = e
    check(deleted is not None and deleted.timestamp == ts3,
          "GET after DELETE: a fresh DiskFile raises DiskFileDeleted at %s" % ts3.internal)

    # ------------------------------------------- replication: suffix hashes ----
    hashes = manager().get_hashes(args.device, "0", [], policy)
    suffixes = {os.path.basename(os.path.dirname(d._datadir)) for d in (df5, dfb)}
    check(suffixes <= set(hashes) and all(hashes[s] for s in suffixes),
          "get_hashes (replicator) lists the suffixes of both objects", hashes)
    found = {h: t for h, t in manager().yield_hashes(args.device, "0", policy)}
    check(os.path.basename(df5._datadir) in found and os.path.basename(dfb._datadir) in found,
          "yield_hashes finds the tombstone and obj-b")

    # obj-c: 31.5 KiB of metadata again, read back cold after the remount
    data_c = os.urandom(4096)
    dfc, _, meta_c = put_object("obj-c", data_c, user_meta("Cold", 80, 500, "d"), target_a)
    path_c = os.path.join(dfc._datadir, files_of(dfc)[0])
    check(sorted(os.listxattr(path_c)) == ["user.swift.metadata", "user.swift.metadata_checksum"],
          "PUT obj-c: 4 KiB of data, %d-byte metadata in one user.swift.metadata xattr"
          % pickled_len(meta_c))
    with open(args.state, "w") as f:
        json.dump({"obj-b": {"meta": meta_b, "data": data_b.hex()},
                   "obj-c": {"meta": meta_c, "data": data_c.hex(), "path": path_c},
                   "obj-a": {"deleted": ts3.internal}}, f)
    print("swift_diskfile.py: temporary files by %s" % (
        "O_TMPFILE + linkat" if linkat else
        "mkstemp + rename (open(O_TMPFILE) refused, Swift's fallback)"), file=sys.stderr)
    print("checks: %d" % (PASSED - first))


if __name__ == "__main__":
    main()
