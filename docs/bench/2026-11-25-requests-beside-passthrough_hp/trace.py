#!/usr/bin/env python3
"""Counts the FUSE requests that creates, removes and dbench cost on safs and
on libfuse's passthrough_hp, side by side.

    python3 trace.py SAFS PASSTHROUGH_HP SCRATCH [TRANSPORT]

SAFS is the safs binary, PASSTHROUGH_HP libfuse's example (3.18), SCRATCH an
empty directory on the filesystem both should sit on; TRANSPORT (dev or
uring, default dev) is the transport of both. safs counts its requests
itself (`safs info --json`); passthrough_hp is run with --debug-fuse and its
log's `opcode:` lines are counted. Both are unmounted at the end, also on
failure. Needs dbench for the last part.
"""
import collections, json, os, re, subprocess, sys, time

safs, pthp, scratch = sys.argv[1:4]
transport = sys.argv[4] if len(sys.argv) > 4 else "dev"
vol, m_safs = f"{scratch}/vol", f"{scratch}/safs"
backing, m_pthp, log = f"{scratch}/backing", f"{scratch}/pthp", f"{scratch}/pthp.log"
for d in (m_safs, backing, m_pthp):
    os.makedirs(d, exist_ok=True)


def safs_counts():
    out = subprocess.run([safs, "info", "--json", m_safs], check=True, capture_output=True)
    return collections.Counter({o["op"].upper(): o["count"] for o in json.loads(out.stdout)["ops"]})


def pthp_counts():
    with open(log, errors="replace") as f:
        return collections.Counter(re.findall(r"opcode: ([A-Z_]+)", f.read()))


def workload(mnt, counts, name, fn):
    time.sleep(0.5)
    before = counts()
    extra = fn(mnt)
    time.sleep(0.5)  # RELEASE and FORGET come in the background
    after = counts()
    return name, {k: after[k] - before[k] for k in after if after[k] - before[k] > 0}, extra


def creates(mnt):
    os.makedirs(f"{mnt}/t", exist_ok=True)
    for i in range(100):
        os.close(os.open(f"{mnt}/t/f{i}", os.O_CREAT | os.O_WRONLY, 0o644))


def removes(mnt):
    for i in range(100):
        os.unlink(f"{mnt}/t/f{i}")


def dbench(mnt):
    os.makedirs(f"{mnt}/db", exist_ok=True)
    out = subprocess.run(
        ["dbench", "-D", f"{mnt}/db", "-t", "8", "-c", "/usr/share/dbench/client.txt", "1"],
        check=True, capture_output=True, text=True).stdout
    ntcreatex = int(re.search(r"NTCreateX\s+(\d+)", out).group(1))
    mbs = float(re.search(r"Throughput ([\d.]+) MB/sec", out).group(1))
    return ntcreatex, mbs


if transport == "uring":
    pthp_args = ["-o", "io_uring"]
    safs_opts = ["-o", "transport=uring"]
else:
    pthp_args, safs_opts = [], ["-o", "transport=dev"]
subprocess.run([safs, "format", vol], check=True, capture_output=True)
subprocess.run([safs, "mount", *safs_opts, vol, m_safs], check=True)
logf = open(log, "w")
peer = subprocess.Popen([pthp, "--foreground", "--debug-fuse", "-o", "allow_other", *pthp_args,
                         backing, m_pthp], stdout=logf, stderr=logf)
try:
    for _ in range(100):
        if os.path.ismount(m_pthp):
            break
        time.sleep(0.05)
    with open("/proc/self/mounts") as f:
        for line in f:
            if line.split()[1] in (m_safs, m_pthp):
                print("mount:", line.strip())
    rows = {}
    for mnt, counts, who in ((m_safs, safs_counts, "safs"), (m_pthp, pthp_counts, "passthrough_hp")):
        for name, fn in (("100 creates", creates), ("100 removes", removes), ("dbench 1 client 8 s", dbench)):
            rows[(who, name)] = workload(mnt, counts, name, fn)
    for (who, name), (_, diff, extra) in rows.items():
        line = ", ".join(f"{k} {v}" for k, v in sorted(diff.items(), key=lambda kv: -kv[1]))
        if extra:
            ntc, mbs = extra
            per = ", ".join(f"{k} {1000 * v / ntc:.0f}" for k, v in sorted(diff.items(), key=lambda kv: -kv[1]))
            line = f"{mbs} MB/s, {ntc} NTCreateX; per 1,000 NTCreateX: {per}"
        print(f"{who:15} {name:22} {line}")
finally:
    for m in (m_safs, m_pthp):
        subprocess.run(["umount", m])
    peer.wait(timeout=10)
