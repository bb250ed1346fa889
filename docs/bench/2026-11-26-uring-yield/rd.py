import os, sys, time
p = sys.argv[1]; ls = []
fd = os.open(p, os.O_RDONLY | os.O_DIRECT)
import mmap
buf = mmap.mmap(-1, 1 << 20)
for i in range(int(sys.argv[2])):
    t = time.perf_counter_ns(); os.preadv(fd, [buf], (i % 64) << 20); ls.append(time.perf_counter_ns() - t)
ls.sort(); n = len(ls)
print(sys.argv[3], "1MiB O_DIRECT read: mean %.0f p50 %.0f p99 %.0f max %.0f us" % (sum(ls)/n/1e3, ls[n//2]/1e3, ls[n*99//100]/1e3, ls[-1]/1e3))
