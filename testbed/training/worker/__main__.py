"""``python -m testbed.training.worker JOB.json``: run the job, exit 1 with a one-line
message for a job that cannot run (WorkerError), 2 for a wrong command line."""

from __future__ import annotations

import logging
import sys

from testbed.training.worker.job import WorkerError, load_job
from testbed_core.contracts.worker_job import RingProbeJob, TrainJob
from testbed_runtime.lifetime import watch_owner


def main(argv: list[str] | None = None) -> int:
    """Run the job file named on the command line; the exit status (see the module doc)."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        print("usage: python -m testbed.training.worker JOB.json | --probe-agent  (job files are written by "
              "`testbed run`)", file=sys.stderr)
        return 2
    watch_owner()  # ends this process promptly once the run that started it is gone
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if argv[0] == "--probe-agent":  # the calibration's probes of one host (testbed/training/worker/probe.py)
        from testbed.training.worker.probe import run_agent

        run_agent()
        return 0
    try:
        job = load_job(argv[0])
        if isinstance(job, TrainJob):
            from testbed.training.worker.train import run_train

            run_train(job)
        elif isinstance(job, RingProbeJob):
            from testbed.training.worker.probe import run_ring_probe

            run_ring_probe(job)
        else:
            from testbed.training.worker.probe import run_probe

            run_probe(job)
    except WorkerError as exc:
        print(f"worker error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
