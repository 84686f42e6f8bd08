"""How long a temporal plan's transfers hold their link, from the turns probe
(testbed_core/planning/calibrated.py `turns_hold_s`, `turns_rate_bps`): the later of the
planned end and the last byte out plus the hand-over, averaged."""

from __future__ import annotations

import pytest

from testbed.training.transport_comm import WATCH_LEAD_S
from testbed_core.planning.calibrated import (
    MIN_WIRE_S,
    TOKEN_HANDOVER_S,
    turns_hold_s,
    turns_rate_bps,
    turns_wire_rate_bps,
)


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


def test_the_bytes_reach_the_receiver_at_the_wire_rate_without_the_hand_over() -> None:
    # 16 KiB tensors, 25 ms one way, 2 ms slots: on the wire 1 ms, held 6 ms (1 + the 5 ms hand-over)
    times = [0.0255, 0.0265]
    assert turns_wire_rate_bps(16384, times, 0.025) == pytest.approx(16384 * 8 / 0.001)
    assert turns_hold_s(times, 0.025, 0.002) == pytest.approx(0.001 + TOKEN_HANDOVER_S)
    assert turns_wire_rate_bps(16384, [0.0249], 0.025) == pytest.approx(16384 * 8 / MIN_WIRE_S)  # timer noise
    with pytest.raises(ValueError, match="the turns probe timed no transfer"):
        turns_wire_rate_bps(16384, [], 0.025)
