"""Data rows beside JuiceFS: `python3 dmeas.py MNT PHASE` (see run.sh).

write  -- 1 GiB sequential in 1 MiB writes, then fsync: MB/s; then 10,000
          small files (create, write 4 KiB, close), then syncfs: files/s
read   -- (after the caller dropped every cache) the 1 GiB file read
          sequentially: MB/s cold, then again: MB/s hot; then the 10,000
          small files read back: files/s (cold: they were not read before)
"""
import os, sys, time
mnt, phase = sys.argv[1], sys.argv[2]
big, small = os.path.join(mnt, 'big'), os.path.join(mnt, 'small')
GIB, N = 1 << 30, 10_000
chunk = os.urandom(1 << 20)

def rate(t0, amount):
    return amount / (time.perf_counter() - t0)

if phase == 'write':
    t0 = time.perf_counter()
    fd = os.open(big, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    for _ in range(GIB // len(chunk)):
        os.write(fd, chunk)
    os.fsync(fd)
    os.close(fd)
    print(f'seq write 1 GiB + fsync: {rate(t0, GIB) / 1e6:.1f} MB/s')
    os.mkdir(small)
    buf = os.urandom(4096)
    t0 = time.perf_counter()
    for i in range(N):
        fd = os.open(f'{small}/f{i}', os.O_CREAT | os.O_WRONLY, 0o644)
        os.write(fd, buf)
        os.close(fd)
    fd = os.open(small, os.O_RDONLY)
    os.syncfs(fd) if hasattr(os, 'syncfs') else os.fsync(fd)
    os.close(fd)
    print(f'small files, create + write 4 KiB + close: {rate(t0, N):.0f} files/s')
else:
    for label in ('cold', 'hot'):
        t0 = time.perf_counter()
        fd = os.open(big, os.O_RDONLY)
        n = 0
        while True:
            b = os.read(fd, 1 << 20)
            if not b:
                break
            n += len(b)
        os.close(fd)
        assert n == GIB, n
        print(f'seq read 1 GiB {label}: {rate(t0, GIB) / 1e6:.1f} MB/s')
    t0 = time.perf_counter()
    for i in range(N):
        fd = os.open(f'{small}/f{i}', os.O_RDONLY)
        assert len(os.read(fd, 8192)) == 4096
        os.close(fd)
    print(f'small files read back cold: {rate(t0, N):.0f} files/s')
