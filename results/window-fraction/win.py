"""Rank 0 (useast) sends N x 1 MiB back to back to rank 1 (uswest) on one TCP socket, the receiver
reads fast; both print ss -ti of the socket after each burst (snd_wnd = the window the receiver advertises)."""
import os, socket, subprocess, time
rank = int(os.environ["RANK"]); master = os.environ["MASTER_ADDR"]; port = int(os.environ["MASTER_PORT"]) + 7
MB = 1 << 20
def ss(tag):
    out = subprocess.run(["ss", "-tinm", "state", "established"], capture_output=True, text=True).stdout
    print(tag, " ".join(l.strip() for l in out.splitlines() if "snd_wnd" in l or "rcv_space" in l or "skmem" in l)[:2000], flush=True)
if rank == 1:
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.connect((master, 9)); open(os.environ.get("WIN_IP_FILE", "/tmp/win-ip"), "w").write(u.getsockname()[0])
    srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); srv.bind(("0.0.0.0", port)); srv.listen(1)
    c, _ = srv.accept(); got = 0
    for burst in range(6):
        need = 4 * MB
        while need:
            b = c.recv(min(need, 1 << 20)); need -= len(b)
        ss(f"recv burst {burst}")
        c.sendall(b"k")
    time.sleep(1)
elif rank == 0:
    # connect to rank 1's host address, found from the environment the launcher gives
    time.sleep(3)
    peer = open(os.environ.get("WIN_IP_FILE", "/tmp/win-ip")).read().strip()
    s = socket.create_connection((peer, port))
    buf = bytes(4 * MB)
    for burst in range(6):
        t = time.time(); s.sendall(buf); s.recv(1); dt = time.time() - t
        ss(f"send burst {burst} {dt*1000:.1f} ms")
        time.sleep(0.3)
