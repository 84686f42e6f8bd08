"""Which pipeline schedules a workload may run, and what each holds in device memory.

Atlas's scheduling (``runner.atlas_schedule: auto``) predicts the workload with each
schedule its devices can hold and runs the fastest (testbed/run/variants.py). The
schedules differ in how many micro-batches a stage has in flight: 1F1B starts a
backward pass after at most ``pp`` forward ones, so on a WAN boundary each group of
``pp`` micro-batches waits for a round trip; GPipe sends every micro-batch's forward
before the first backward, so the round trips overlap, at the cost of holding every
micro-batch's activations at once. Across long round trips GPipe can be the faster;
across short ones the extra fill and drain costs more than it saves. The prediction
decides; the memory check keeps only the schedules that fit.

Memory per device (one stage of a pipeline, tp = 1): the stage's parameters at
``STATE_BYTES_PER_PARAM`` (bf16/fp16 weights and gradients, fp32 master weights and the
two Adam moments: 2 + 2 + 4 + 4 + 4 bytes, as in Rajbhandari et al., "ZeRO", 2020, for
mixed-precision Adam) plus the activations of the micro-batches in flight
(`activation_memory_bytes` per layer and micro-batch).
"""

from __future__ import annotations

import math

from testbed_core.compute_model import GPUS, param_count
from testbed_core.workload import Workload

STATE_BYTES_PER_PARAM = 16  # mixed-precision Adam: weights, gradients, master weights, two moments
ALTERNATIVES = ("1f1b", "gpipe")  # the schedules Atlas weighs (interleaved needs chunks > 1: only as configured)


def activation_memory_bytes(workload: Workload) -> int:
    """Activations one transformer layer keeps for its backward pass, per micro-batch:
    s b h (34 + 5 a s / h) bytes in 16-bit (Korthikanti et al., "Reducing Activation
    Recomputation in Large Transformer Models", 2022, eq. 1 with t = 1), scaled by the
    dtype's bytes over 2; with activation_recompute only the layer's input (2 s b h)."""
    m, par = workload.model, workload.parallelism
    sbh = m.seq_len * par.micro_batch * m.hidden
    if par.activation_recompute:
        return sbh * workload.model_spec().dtype_bytes
    per = sbh * (34 + 5 * m.heads * m.seq_len / m.hidden)
    return int(per * workload.model_spec().dtype_bytes / 2)


def in_flight(schedule: str, pp: int, microbatches: int) -> int:
    """Micro-batches whose activations the first stage holds at once (the most of any
    stage): all of them in GPipe, at most ``pp`` in 1F1B and interleaved 1F1B."""
    return microbatches if schedule == "gpipe" else min(microbatches, pp)


def device_memory_bytes(workload: Workload, schedule: str) -> int:
    """What one device of the workload holds with `schedule`: its stage's model state
    and the activations of its micro-batches in flight (the module docstring)."""
    par = workload.parallelism
    params = param_count(workload.model_spec()) / (par.pp * par.tp)
    layers = math.ceil(workload.model.layers / par.pp)
    acts = in_flight(schedule, par.pp, par.num_micro_batches) * layers * activation_memory_bytes(workload)
    return int(params * STATE_BYTES_PER_PARAM + acts / par.tp)


def device_memory_limit(workload: Workload) -> float | None:
    """The device's memory in bytes (the GPU table's), None for a custom device."""
    spec = GPUS.get(workload.gpu.type)
    return spec.memory_bytes if spec is not None else None


def schedule_options(workload: Workload) -> tuple[list[str], dict[str, str]]:
    """The schedules Atlas may weigh for `workload`, the configured one first, and why
    each other one is not weighed (by name). Only the configured schedule where the
    stages are split into chunks (interleaved) or the device's memory is unknown."""
    par = workload.parallelism
    configured = par.schedule
    others = [s for s in ALTERNATIVES if s != configured]
    if par.chunks > 1:
        return [configured], {s: f"the workload splits stages into {par.chunks} chunks (interleaved)" for s in others}
    limit = device_memory_limit(workload)
    if limit is None:
        return [configured], {s: f"the memory of a {workload.gpu.type} device is not known" for s in others}
    options, refused = [configured], {}
    for s in others:
        need = device_memory_bytes(workload, s)
        if need > limit:
            refused[s] = (f"needs {need / 1e9:.1f} GB per {workload.gpu.type} ({limit / 1e9:.0f} GB): "
                          f"{in_flight(s, par.pp, par.num_micro_batches)} micro-batches' activations at once")
        else:
            options.append(s)
    return options, refused


def with_schedule(workload: Workload, schedule: str) -> Workload:
    """The same workload run with another pipeline schedule."""
    par = workload.parallelism.model_copy(update={"schedule": schedule})
    return workload.model_copy(update={"parallelism": par})
