"""Sample `ss -tin` (srtt, rttvar, rto, backoff, lost, dsack) of the TCP streams in every
network namespace other than this process's, every PERIOD seconds, into OUT as
timestamped blocks. Run as root beside a `testbed run`, once the run holds the
emulation lock (it would sample another run's namespaces otherwise):

    python3 sampler.py OUT [PERIOD]
"""

import os
import subprocess
import sys
import time

out, period = sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 0.1
root = os.stat("/proc/self/ns/net").st_ino
nss: dict[int, str] = {}
last = 0.0
with open(out, "w") as f:
    while True:
        now = time.time()
        if now - last > 2:  # the namespaces, by one process in each
            nss = {}
            for p in os.listdir("/proc"):
                if not p.isdigit():
                    continue
                try:
                    ino = os.stat(f"/proc/{p}/ns/net").st_ino
                except OSError:
                    continue
                if ino != root and ino not in nss:
                    nss[ino] = p
            last = now
        for ino, pid in list(nss.items()):
            r = subprocess.run(["nsenter", "-t", pid, "-n", "ss", "-tinH", "state", "established"],
                               capture_output=True, text=True)
            if r.stdout.strip():
                f.write(f"@ {time.time():.4f} ns {ino} pid {pid}\n{r.stdout}")
        f.flush()
        time.sleep(max(0.0, period - (time.time() - now)))
