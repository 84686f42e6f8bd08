"""The atlas transport's own cost on this machine, measured before a prediction: two
ranks of the atlas torch.distributed backend on 127.0.0.1 (no emulated delay, no link
limit), each in its own process as the program's ranks are, time

* ``send``: blocking sends of a ladder of sizes from rank 0 to rank 1 (a send is done
  when rank 1's confirmation is back, as in a launch), and
* ``exchange``: all-reduces of the same sizes between two ranks in different sites
  (atlas's two-level all-reduce with one rank per site: one exchange, each rank
  sending its tensor and receiving the other's at once),

on the WAN's stream count (``ATLAS_STREAMS``, 8 unless the profile's launch set
another). Loopback carries many Gbit/s, so what these times show is the transport
itself: the Python around each transfer, the copies, the striping over the streams,
the kernel's socket work. `testbed_core.program.transport` fits each pattern to
``overhead + bytes / rate``; the program's predictor then gives no transfer of that
pattern less than that (testbed_core/program/predict.py).

`testbed launch --profile` runs it after the ranks of a program that used atlas
ended (under the launch's hold of the emulation lock, on the same machine load) and
writes ``transport-calibration.json`` beside ``profile.json``;
``testbed whatif --program DIR --transport-cost measure`` measures it again now.

    python -m testbed.launch.transport_calibration --out DIR/transport-calibration.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from testbed.launch.run import free_port
from testbed_core.program.transport import (
    CALIBRATION_FILE,
    CalibrationPoint,
    TransportCalibration,
    fit_calibration,
)

SIZES = (64 << 10, 512 << 10, 2 << 20, 4 << 20)
REPEATS = 6
WARMUP = 2
TIMEOUT_S = 120.0
STREAMS = 8


class CalibrationError(RuntimeError):
    """The measure could not be made; the message says which rank failed and how."""


def transport_fingerprint() -> str:
    """sha256 over atlas_transport's source files (path and content, in path order): the
    transport version a profile ran with and a calibration measured."""
    import hashlib

    import atlas_transport

    root = Path(atlas_transport.__file__).resolve().parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def _rank(rank: int, sizes: list[int], repeats: int, out: Path) -> None:
    """One rank of the measure (a process of its own): its times per pattern and size."""
    import torch
    import torch.distributed as dist

    import atlas_transport.torch  # noqa: F401  (registers the backend "atlas")

    torch.set_num_threads(1)
    dist.init_process_group("atlas", timeout=__import__("datetime").timedelta(seconds=TIMEOUT_S))
    times: dict[str, dict[int, list[float]]] = {"send": {}, "exchange": {}}
    def send(x: torch.Tensor) -> None:
        if rank == 0:
            dist.send(x, 1)
        else:
            dist.recv(x, 0)

    try:
        for pattern, op in (("send", send), ("exchange", dist.all_reduce)):
            for size in sizes:
                x = torch.ones(size // 4, dtype=torch.float32)
                got = []
                for k in range(WARMUP + repeats):
                    dist.barrier()
                    t0 = time.perf_counter()
                    op(x)
                    if k >= WARMUP:
                        got.append(time.perf_counter() - t0)
                times[pattern][size] = got
    finally:
        dist.destroy_process_group()
    out.write_text(json.dumps(times))


def measure(streams: int = STREAMS, sizes: tuple[int, ...] = SIZES, repeats: int = REPEATS,
            python: str = sys.executable) -> TransportCalibration:
    """Both ranks on 127.0.0.1 (each its own process), their times fitted per pattern."""
    port = free_port()
    load = os.getloadavg()[0]
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="atlas-calibration-") as tmp:
        procs = []
        for rank in (0, 1):
            env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "ATLAS_STREAMS": str(streams),
                   "ATLAS_SITE": f"site{rank}", "ATLAS_INTRA_SITE": "atlas", "PYTHONUNBUFFERED": "1"}
            cmd = [python, "-m", "testbed.launch.transport_calibration", "--rank", str(rank),
                   "--sizes", ",".join(map(str, sizes)), "--repeats", str(repeats), "--result", f"{tmp}/rank-{rank}.json"]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                          cwd=str(Path(__file__).resolve().parents[2])))
        errors = []
        for rank, p in enumerate(procs):
            try:
                _, err = p.communicate(timeout=TIMEOUT_S)
            except subprocess.TimeoutExpired:
                p.kill()
                _, err = p.communicate()
                errors.append(f"rank {rank}: no result in {TIMEOUT_S:g} s")
                continue
            if p.returncode != 0:
                last = (err or b"").decode(errors="replace").strip().splitlines()
                errors.append(f"rank {rank} exited {p.returncode}: {last[-1] if last else 'no message'}")
        if errors:
            raise CalibrationError("the atlas transport's calibration on 127.0.0.1 failed: " + "; ".join(errors))
        per_rank = [json.loads(Path(f"{tmp}/rank-{r}.json").read_text()) for r in (0, 1)]
    points = []
    for pattern in ("send", "exchange"):
        for size in sizes:
            # a send is done on rank 0 once rank 1 confirmed it: rank 0's time; an exchange: both ranks' mean
            ranks = [0] if pattern == "send" else [0, 1]
            samples = [statistics.fmean(per_rank[r][pattern][str(size)][k] for r in ranks) for k in range(repeats)]
            points.append(CalibrationPoint(pattern=pattern, bytes=size, median_s=statistics.median(samples),
                                           samples_s=[round(s, 6) for s in samples]))
    return fit_calibration(points, streams=streams, measured_utc=time.strftime("%Y-%m-%d %H:%M:%S",
                                                                                time.gmtime(started)),
                           load_average=round(load, 2), took_s=round(time.time() - started, 2),
                           fingerprint=transport_fingerprint())


def write(calibration: TransportCalibration, directory: Path) -> Path:
    from testbed_core.atomic import write_text_atomic

    return write_text_atomic(Path(directory) / CALIBRATION_FILE, calibration.model_dump_json(indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rank", type=int, help="(internal) run one rank of the measure")
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--repeats", type=int, default=REPEATS)
    ap.add_argument("--result", help="(internal) where a rank writes its times")
    ap.add_argument("--streams", type=int, default=STREAMS)
    ap.add_argument("--out", help=f"a folder (writes {CALIBRATION_FILE} there) or print the calibration")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    if args.rank is not None:
        _rank(args.rank, sizes, args.repeats, Path(args.result))
        return 0
    cal = measure(args.streams, tuple(sizes), args.repeats)
    if args.out:
        print(write(cal, Path(args.out)))
    else:
        print(cal.model_dump_json(indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
