"""Work a rank does on the host's CPU beside its modelled compute, as the planner counts it.

The tensor checks (``runner.verify_tensors``, testbed/training/transport_comm.py
`TransportComm`): a rank fills each modelled tensor it sends with its own pattern
before handing it over, and compares every byte of each one it receives before the
work that needs it starts, both in the rank's own thread. Neither is on the wire: the
rank is busy, as with compute, so the planner adds them to the stage times of the
stages that send and receive. The calibration times both with the training's own code
(testbed/run/calibration.py `calibrate_verify`, `VerifyCalibration`). The workers hold
their devices for the compute alone (`compute_only`, testbed/run/jobs.py): they do the
checks themselves, and a modelled hold that counted them too paid every check twice.

The emulated device itself (testbed_runtime/device.py): every compute op takes its lock,
writes its records and sleeps a little past its modelled time; a pipeline of millisecond
stages pays that at every op. The calibration times it with the device's own code
(`calibrate_host_ops`), and the planner adds it to every forward and backward (`op_s`);
the workers' holds are for the modelled compute alone, so `compute_only` takes it out
again.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from testbed_core.contracts.calibration import VerifyCalibration
from testbed_core.workload import EffectiveWorkload


@dataclass(frozen=True)
class HostCost:
    """Seconds a rank spends on one sent tensor's pattern (`fill_s`), on one received
    tensor's check (`check_s`), and on each compute op past its modelled time (`op_s`:
    the emulated device's lock, records and sleep, `calibrate_host_ops`)."""

    fill_s: float
    check_s: float
    op_s: float = 0.0

    @classmethod
    def of(cls, cal: VerifyCalibration | None, op_s: float | None = None) -> HostCost | None:
        """The calibrated means (a rank pays every fill and check, the slow ones
        included) and the device's median overhead an op; None where neither was timed."""
        if cal is None and not op_s:
            return None
        fill, check = (cal.fill_mean_s, cal.check_mean_s) if cal is not None else (0.0, 0.0)
        return cls(fill, check, op_s or 0.0)


def with_host_cost(eff: EffectiveWorkload, cost: HostCost | None) -> EffectiveWorkload:
    """`eff` with the tensor checks and the device's overhead in its stage times (`cost`
    None: as it is). A forward of virtual stage k checks the activation it received
    (k > 0) and fills the one it sends (k < last); a backward checks the gradient it
    received (k < last) and fills the one it sends (k > 0); every forward and backward
    pays `op_s`."""
    if cost is None:
        return eff
    last = eff.stages - 1
    fwd = [t + (cost.check_s if k > 0 else 0.0) + (cost.fill_s if k < last else 0.0) + cost.op_s
           for k, t in enumerate(eff.stage_forward_s)]
    bwd = [t + (cost.check_s if k < last else 0.0) + (cost.fill_s if k > 0 else 0.0) + cost.op_s
           for k, t in enumerate(eff.stage_backward_s)]
    return replace(eff, stage_forward_s=fwd, stage_backward_s=bwd)


def compute_only(eff: EffectiveWorkload, cost: HostCost | None) -> EffectiveWorkload:
    """`eff` (a prediction's stage times, `with_host_cost(compute, cost)`) without the
    tensor checks: the compute a worker holds its modelled device for. The worker fills
    and checks its tensors for real beside that hold, so its job must not count them
    again (`cost` None: `eff` as it is)."""
    if cost is None:
        return eff
    neg = HostCost(-cost.fill_s, -cost.check_s, -cost.op_s)
    out = with_host_cost(eff, neg)
    if min(out.stage_forward_s + out.stage_backward_s) < 0:
        raise ValueError(f"stage times {eff.stage_forward_s} / {eff.stage_backward_s} s do not include the tensor "
                         f"checks' {cost.fill_s * 1e3:.1f} ms fill and {cost.check_s * 1e3:.1f} ms check and the "
                         f"device's {cost.op_s * 1e3:.2f} ms an op: give compute_only a prediction's stage times "
                         "(with_host_cost)")
    return out
