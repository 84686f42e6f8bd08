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
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from testbed_core.contracts.calibration import VerifyCalibration
from testbed_core.workload import EffectiveWorkload


@dataclass(frozen=True)
class VerifyCost:
    """Seconds a rank spends on one sent tensor's pattern (`fill_s`) and on one
    received tensor's check (`check_s`)."""

    fill_s: float
    check_s: float

    @classmethod
    def of(cls, cal: VerifyCalibration) -> VerifyCost:
        """The calibrated means: a rank pays every fill and check, the slow ones included."""
        return cls(cal.fill_mean_s, cal.check_mean_s)


def with_verify(eff: EffectiveWorkload, cost: VerifyCost | None) -> EffectiveWorkload:
    """`eff` with the tensor checks in its stage times (`cost` None: as it is). A
    forward of virtual stage k checks the activation it received (k > 0) and fills the
    one it sends (k < last); a backward checks the gradient it received (k < last) and
    fills the one it sends (k > 0)."""
    if cost is None:
        return eff
    last = eff.stages - 1
    fwd = [t + (cost.check_s if k > 0 else 0.0) + (cost.fill_s if k < last else 0.0)
           for k, t in enumerate(eff.stage_forward_s)]
    bwd = [t + (cost.check_s if k < last else 0.0) + (cost.fill_s if k > 0 else 0.0)
           for k, t in enumerate(eff.stage_backward_s)]
    return replace(eff, stage_forward_s=fwd, stage_backward_s=bwd)


def compute_only(eff: EffectiveWorkload, cost: VerifyCost | None) -> EffectiveWorkload:
    """`eff` (a prediction's stage times, `with_verify(compute, cost)`) without the
    tensor checks: the compute a worker holds its modelled device for. The worker fills
    and checks its tensors for real beside that hold, so its job must not count them
    again (`cost` None: `eff` as it is)."""
    if cost is None:
        return eff
    neg = VerifyCost(-cost.fill_s, -cost.check_s)
    out = with_verify(eff, neg)
    if min(out.stage_forward_s + out.stage_backward_s) < 0:
        raise ValueError(f"stage times {eff.stage_forward_s} / {eff.stage_backward_s} s do not include the tensor "
                         f"checks' {cost.fill_s * 1e3:.1f} ms fill and {cost.check_s * 1e3:.1f} ms check: "
                         "give compute_only a prediction's stage times (with_verify)")
    return out
