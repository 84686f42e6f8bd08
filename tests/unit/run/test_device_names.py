"""testbed/run/jobs.py: a worker's device name and its parts, both ways (the timeline's
device column; scripts/ring_tails.py and scripts/last_hops.py read it back)."""

from __future__ import annotations

import pytest

from testbed.run.jobs import device_name, device_parts


def test_a_device_name_reads_back_into_its_host_pipeline_and_rank() -> None:
    assert device_parts(device_name(1, 3, "dc-west-h12")) == ("dc-west-h12", 1, 3)
    assert device_parts(device_name(10, 0, "a-p2r1")) == ("a-p2r1", 10, 0)  # the last -p..r.. counts


@pytest.mark.parametrize("bad", ["dc1-h1", "dc1-h1-p1", "p0r1", "dc1-h1-pXr1"])
def test_another_name_is_refused_saying_what_a_device_name_is(bad: str) -> None:
    with pytest.raises(ValueError, match=r"not a worker's device name \(<host>-p<pipeline>r<rank>\)"):
        device_parts(bad)
