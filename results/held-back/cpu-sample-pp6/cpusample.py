"""Sample machine-wide busy cores every 20 ms to a CSV; at exit, per-command CPU seconds."""
import os, sys, time, signal, collections
out = sys.argv[1]
def stat():
    with open('/proc/stat') as f:
        v = list(map(int, f.readline().split()[1:]))
    idle = v[3] + v[4]
    return sum(v[:8]), idle
def procs():
    d = collections.Counter()
    for p in os.listdir('/proc'):
        if not p.isdigit(): continue
        try:
            s = open(f'/proc/{p}/stat').read()
            comm = s[s.index('(')+1:s.rindex(')')]
            f = s[s.rindex(')')+2:].split()
            cmd = open(f'/proc/{p}/cmdline','rb').read().split(b'\0')
            key = comm + ' ' + ' '.join(x.decode(errors='replace') for x in cmd[1:3])[:60]
            d[key] += (int(f[11]) + int(f[12])) / os.sysconf('SC_CLK_TCK')
        except Exception: pass
    return d
stop = False
def h(*a):
    global stop; stop = True
signal.signal(signal.SIGTERM, h); signal.signal(signal.SIGINT, h)
p0 = procs()
hz = os.sysconf('SC_CLK_TCK')
with open(out, 'w') as f:
    f.write('t,busy_cores\n')
    t_prev, (tot0, idle0) = time.time(), stat()
    while not stop:
        time.sleep(0.02)
        t, (tot, idle) = time.time(), stat()
        dt = t - t_prev
        if dt > 0:
            f.write(f'{t:.4f},{((tot - tot0) - (idle - idle0)) / hz / dt:.3f}\n')
        t_prev, tot0, idle0 = t, tot, idle
p1 = procs()
with open(out + '.procs', 'w') as f:
    for k, v in sorted(((k, p1[k] - p0.get(k, 0)) for k in p1), key=lambda x: -x[1])[:40]:
        f.write(f'{v:8.2f} {k}\n')
