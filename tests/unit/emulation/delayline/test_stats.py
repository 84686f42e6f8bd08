"""Relay delay-line counters over a window of a run: drops attributed to the emulated
queue, the loss model, or the relay itself (which makes results suspect)."""

from __future__ import annotations

from testbed.emulation.delayline.stats import RelaySnapshot, window, windows


def snap(a2b: dict, b2a: dict, kernel: dict) -> RelaySnapshot:
    return RelaySnapshot.model_validate({"a": "w-eth0", "b": "w-eth1", "a2b": a2b, "b2a": b2a, "kernel_drops": kernel})


def test_window_attributes_drops() -> None:
    before = snap({"rx_frames": 10, "send_drops": 1, "lost_segments": 2}, {"rx_frames": 5}, {"a": 0, "b": 3})
    after = snap({"rx_frames": 110, "send_drops": 4, "lost_segments": 2, "overflow_drops": 2},
                 {"rx_frames": 25, "truncated": 1}, {"a": 5, "b": 3})
    w = window(before, after)
    fwd, back = w.directions()["w-eth0->w-eth1"], w.directions()["w-eth1->w-eth0"]
    assert fwd.rx_frames == 100 and fwd.queue_drops == 3 and fwd.loss_model == 0
    assert fwd.socket_drops == 5 and fwd.relay_drops == 2 + 5
    assert back.rx_frames == 20 and back.relay_drops == 1 and back.socket_drops == 0
    assert w.relay_drops == 8


def test_windows_by_link_and_a_relay_first_seen() -> None:
    after = {"dc1-dc2": snap({"rx_frames": 7}, {}, {"a": 0, "b": 0})}
    w = windows({}, after)
    assert w["dc1-dc2"].directions()["w-eth0->w-eth1"].rx_frames == 7 and w["dc1-dc2"].relay_drops == 0
    assert windows({}, {}) == {}


def test_a_relay_line_reads_through_its_model_and_unknown_counters_read_zero() -> None:
    line = ('{"a": "w-eth0", "b": "w-eth1", "a2b": {"rx_frames": 3, "queued": 1, "params": "delay=25ms"}, '
            '"b2a": {}, "kernel_drops": {"a": 0, "b": 0}, "cpu_s": 0.5, "wakeups": 9, "new_field": 1}')
    got = RelaySnapshot.model_validate_json(line)
    assert got.a2b.rx_frames == 3 and got.b2a.tx_bytes == 0 and got.cpu_s == 0.5
