import os, sys, time
base=sys.argv[1]; n=int(sys.argv[2]) if len(sys.argv)>2 else 2000
d=os.path.join(base,'d%d'%time.time_ns()); os.mkdir(d)
def t(f, k):
    s=time.perf_counter(); [f(i) for i in range(k)]; return (time.perf_counter()-s)/k*1e6
r={}
r['create']=t(lambda i: os.close(os.open(f'{d}/f{i}', os.O_CREAT|os.O_WRONLY, 0o644)), n)
r['setxattr 32B']=t(lambda i: os.setxattr(f'{d}/f{i}', 'user.a', b'x'*32), n)
r['getxattr hot']=t(lambda i: os.getxattr(f'{d}/f{i}', 'user.a'), n)
def absent(i):
    try: os.getxattr(f'{d}/f{i}', 'security.NTACL')
    except OSError: pass
r['getxattr absent']=t(absent, n)
r['stat']=t(lambda i: os.stat(f'{d}/f{i}'), n)
r['remove']=t(lambda i: os.unlink(f'{d}/f{i}'), n)
buf=b'y'*4096
def w(i):
    fd=os.open(f'{d}/w{i}', os.O_CREAT|os.O_WRONLY, 0o644); os.write(fd, buf); os.close(fd)
r['create+write 4KiB+close']=t(w, n//2)
def rd(i):
    fd=os.open(f'{d}/w{i}', os.O_RDONLY); os.read(fd, 8192); os.close(fd)
r['open+read 4KiB+close (hot)']=t(rd, n//2)
print(' | '.join(f'{k} {v:.1f}' for k,v in r.items()))
