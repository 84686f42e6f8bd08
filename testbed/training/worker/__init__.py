"""One training worker, or one end of a calibration probe, as a process on a host.

    python -m testbed.training.worker JOB.json

The runner (testbed/run/jobs.py) writes a job file per process
(testbed_core/contracts/worker_job.py) and starts it on its host (inside the host's
network namespace under emulation). A ``train`` worker is one (pipeline, rank): it
opens its boundary channels (it listens for the channels from the previous stage and
connects to the next), reports ready on the runner's control socket, then runs each
iteration when told to start it, at a common wall-clock instant (plus its pipeline's
planned offset). Its emulated GPU is a shared `testbed_runtime.device.Device` in the run
directory, so a BubbleTea agent next to it can use the same device. Transfer records
go to the job's ``transfers_path``.

With a ``real`` section (``workload.gpu.mode: real``, testbed/training/real_mode.py)
the device is real: the worker trains its stages as torch modules (`RealWork`), its
boundary channels carry the real activations and gradients (through the same
`TransportComm`, so Atlas's temporal plan and tokens apply), it averages its
gradients with the same-stage workers of the other pipelines over channels of its
own (``real.dp_peers``), steps its optimizer on the device after each iteration,
and at the end saves its parameters and per-iteration losses to ``real.out``.

A ``probe-send``/``probe-recv`` pair measures how long a tensor of the workload's
wire size takes over one channel of N streams, for the runner's calibration.

One module per concern:

* `job`: reading and validating the job file;
* `control`: the control connection to the runner (JSON lines);
* `channels`: opening the boundary and DP gradient channels;
* `train`: the training loop of a ``train`` worker;
* `live`: BubbleTea's slot feed and live status of the worker's device;
* `real`: real-device training (the model, the DP average, the optimizer step);
* `probe`: the calibration probes;
* `__main__`: the command line.

The shared secret of the channels comes from the environment (ATLAS_SECRET), never
from the job file.
"""
