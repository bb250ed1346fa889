import os, sys, time
p = os.path.join(sys.argv[1], "f"); n = int(sys.argv[2])
ls = []
for _ in range(n):
    t = time.perf_counter_ns(); os.getxattr(p, "user.x"); ls.append(time.perf_counter_ns() - t)
ls.sort()
print(sys.argv[1], sys.argv[3] if len(sys.argv) > 3 else "", "mean %.1f p50 %.1f p99 %.1f p999 %.1f max %.1f us" % (sum(ls)/n/1e3, ls[n//2]/1e3, ls[n*99//100]/1e3, ls[n*999//1000]/1e3, ls[-1]/1e3))
