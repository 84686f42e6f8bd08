"""How long a temporal plan's transfers hold their link, from the turns probe
(testbed_core/planning/calibrated.py `turns_hold_s`, `turns_rate_bps`): the later of the
planned end and the last byte out plus the hand-over, averaged."""

from __future__ import annotations

import pytest

from testbed.training.transport_comm import WATCH_LEAD_S
from testbed_core.planning.calibrated import TOKEN_HANDOVER_S, turns_hold_s, turns_rate_bps


def test_a_transfer_on_time_holds_its_slot_and_a_late_one_its_wire_time_and_hand_over() -> None:
    # 25 ms one way, a 50 ms slot: 65 ms and 75 ms on the wire overrun it (70 and 80 ms held), 45 ms does not
    times = [0.070, 0.090, 0.100]
    assert turns_hold_s(times, 0.025, 0.050) == pytest.approx((0.050 + 0.070 + 0.080) / 3)
    assert turns_hold_s([0.03, 0.04], 0.025, 0.050) == pytest.approx(0.050)  # all on time: the slot
    assert turns_rate_bps(1 << 20, times, 0.025, 0.050) == pytest.approx((1 << 20) * 8 / (0.2 / 3))


def test_the_hand_over_is_the_senders_watch_lead() -> None:
    assert TOKEN_HANDOVER_S == WATCH_LEAD_S  # testbed/training/transport_comm.py announces a later end so


@pytest.mark.parametrize(("times", "slot", "message"), [
    ([], 0.05, "the turns probe timed no transfer"),
    ([0.1], 0.0, "the planned hold must be positive, not 0.0 s"),
])
def test_what_cannot_give_a_hold_is_refused(times: list[float], slot: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        turns_hold_s(times, 0.025, slot)
