import os, sys, time
p = os.path.join(sys.argv[1], "f"); n = int(sys.argv[2]); size = int(sys.argv[3])
open(p, "a").close()
v = b"x" * size
for _ in range(200): os.setxattr(p, "user.big", v)
best = 1e9
for r in range(3):
    t = time.perf_counter()
    for _ in range(n): os.setxattr(p, "user.big", v)
    best = min(best, (time.perf_counter() - t) / n * 1e6)
print(sys.argv[4], size, "set hot %.1f us" % best)
