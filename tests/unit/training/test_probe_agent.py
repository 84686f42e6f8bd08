"""The probe agent (testbed/training/worker/probe.py `run_agent`): one process per host
runs every calibration probe handed to it, each in a thread, and answers in lines the
runner reads (testbed/run/calibration.py `ProbeAgents`)."""

from __future__ import annotations

import io
import json
import socket
import time
from pathlib import Path

from testbed.training.worker.probe import run_agent
from testbed_core.contracts.worker_job import ProbeJob, TransportJob

TRANSPORT = TransportJob(chunk_bytes=1 << 20, congestion=None, pacing_rate_mbps=None, connect_timeout_s=10.0)
# streams paced at 100 Mbit/s (SO_MAX_PACING_RATE, loopback too): a 1 MiB tensor takes tens of
# milliseconds, so tensors handed together are all handed before the first is confirmed even
# when a busy machine delays the sender's thread between two of them
PACED = TransportJob(chunk_bytes=1 << 20, congestion=None, pacing_rate_mbps=100.0, connect_timeout_s=10.0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _play(tmp_path: Path, tag: str, common: dict, recv_extra: dict | None = None,
          send_extra: dict | None = None) -> tuple[dict, dict]:
    """One probe (`tag`-recv, `tag`-send) over loopback in one agent, the sender told to go
    0.3 s on; both ends must say done. Returns what the receiver and the sender wrote."""
    recv = ProbeJob(role="probe-recv", name=f"{tag}-recv", out=str(tmp_path / "r.json"), **common,
                    **(recv_extra or {}))
    send = ProbeJob(role="probe-send", name=f"{tag}-send", peer_ip="127.0.0.1", wait_go=True,
                    out=str(tmp_path / "s.json"), **common, **(send_extra or {}))
    for job, name in ((recv, "r.job.json"), (send, "s.job.json")):
        (tmp_path / name).write_text(job.model_dump_json())
    stdin = io.StringIO(f"job {tmp_path / 'r.job.json'}\njob {tmp_path / 's.job.json'}\n"
                        f"go {tag}-send {time.time() + 0.3}\nquit\n")
    stdout = io.StringIO()
    run_agent(stdin, stdout)
    assert {f"{tag}-recv done", f"{tag}-send done"} <= set(stdout.getvalue().splitlines()), stdout.getvalue()
    return json.loads((tmp_path / "r.json").read_text()), json.loads((tmp_path / "s.json").read_text())


def test_one_agent_runs_both_ends_of_a_probe(tmp_path: Path, monkeypatch) -> None:
    """A receiver and a sender in one agent, over loopback: both say where they are,
    the sender starts at the instant its 'go' gives, both write their times."""
    monkeypatch.setenv("ATLAS_SECRET", "agent-test")
    port = _free_port()
    common = {"port": port, "streams": 2, "nbytes": 1 << 16, "count": 3, "transport": TRANSPORT, "timeout_s": 30}
    recv = ProbeJob(role="probe-recv", name="p-recv", out=str(tmp_path / "r.json"), **common)
    send = ProbeJob(role="probe-send", name="p-send", peer_ip="127.0.0.1", wait_go=True, gap_s=0.01,
                    out=str(tmp_path / "s.json"), **common)
    for job, name in ((recv, "r.job.json"), (send, "s.job.json")):
        (tmp_path / name).write_text(job.model_dump_json())
    start = time.time() + 0.5
    stdin = io.StringIO(f"job {tmp_path / 'r.job.json'}\njob {tmp_path / 's.job.json'}\ngo p-send {start}\nquit\n")
    stdout = io.StringIO()
    run_agent(stdin, stdout)
    lines = stdout.getvalue().splitlines()
    assert lines[0] == "ready"
    assert {"p-recv listening", "p-send connected", "p-recv done", "p-send done"} <= set(lines), lines
    sent = json.loads((tmp_path / "s.json").read_text())["sent"]
    arrived = json.loads((tmp_path / "r.json").read_text())["arrived"]
    assert len(sent) == len(arrived) == 3 and sent[0] >= start
    assert all(a > s for s, a in zip(sent, arrived, strict=True))


def test_the_agent_reports_what_it_cannot_run(tmp_path: Path) -> None:
    """A job file that is not a probe job, a missing file and a line it cannot read are
    answered with 'failed' lines naming the file or the line; the agent goes on."""
    train = tmp_path / "train.job.json"
    train.write_text(json.dumps({"role": "probe-send", "name": "x"}))
    stdin = io.StringIO(f"job {train}\njob {tmp_path / 'none.json'}\nhello there\n")
    stdout = io.StringIO()
    run_agent(stdin, stdout)
    lines = stdout.getvalue().splitlines()
    assert lines[0] == "ready"
    assert lines[1].startswith("train.job.json failed WorkerError: ") and "train.job.json: " in lines[1]
    assert lines[2].startswith("none.json failed WorkerError: ") and "no such job file" in lines[2]
    assert lines[3] == ("agent failed WorkerError: cannot read 'hello there' (job <file> | go <name> <time> | quit)")


def test_a_probe_with_verify_times_the_trainings_tensor_checks(tmp_path: Path, monkeypatch) -> None:
    """With verify (runner.verify_tensors), the sender fills each tensor with the
    training's pattern and the receiver checks every byte, each timed: one fill and one
    check per tensor (a tensor not of its pattern fails the check: the next test)."""
    monkeypatch.setenv("ATLAS_SECRET", "agent-test")
    common = {"port": _free_port(), "streams": 1, "nbytes": 1 << 16, "count": 3, "transport": TRANSPORT,
              "timeout_s": 30, "verify": True}
    r, s = _play(tmp_path, "v", common)
    fill, check = s["fill_s"], r["check_s"]
    assert len(fill) == len(check) == 3 and all(t > 0 for t in fill + check)


def test_the_probe_check_fails_on_a_tensor_not_of_its_pattern() -> None:
    """The receiver's timed check is the training's: zeros (a sender without verify)
    fail it with a message naming the probe and the bytes that differ."""
    import pytest
    import torch

    from testbed.training.transport_comm import CommError
    from testbed.training.worker.probe import _checker

    job = ProbeJob(role="probe-recv", name="v-recv", port=_free_port(), streams=1, nbytes=4096, count=1,
                   out="unused", transport=TRANSPORT, verify=True)
    check = _checker(job)
    assert check is not None
    with pytest.raises(CommError, match=r"v-recv: .* failed verification \(\d+ of 4096 bytes differ\)"):
        check(0, torch.zeros(4096, dtype=torch.uint8))


def test_a_probe_clamps_its_streams_windows_as_its_job_says(tmp_path: Path, monkeypatch) -> None:
    """ProbeJob.window_clamp (the run's cap on the channels a probe stands for,
    testbed/run/pacing.py window_caps): every stream of that end advertises at most it
    (TCP_WINDOW_CLAMP), the receiver's accepted streams included, and the tensors still
    cross; an end without one keeps the kernel's own."""
    import socket as sk

    from atlas_transport.sockets import TCP_WINDOW_CLAMP
    from testbed.training.worker import probe

    monkeypatch.setenv("ATLAS_SECRET", "agent-test")
    clamps: dict[str, list[int]] = {}
    opened = probe._open_channel

    def record(job, listening, deadline, what, io):
        ch = opened(job, listening, deadline, what, io)
        clamps[job.name] = [s.sock.getsockopt(sk.IPPROTO_TCP, TCP_WINDOW_CLAMP) for s in ch._streams]
        return ch

    monkeypatch.setattr(probe, "_open_channel", record)
    common = {"port": _free_port(), "streams": 3, "nbytes": 1 << 20, "count": 2, "transport": TRANSPORT,
              "timeout_s": 30}
    r, _ = _play(tmp_path, "c", common, recv_extra={"window_clamp": 150_000})
    assert clamps["c-recv"] == [150_000] * 3
    assert all(c != 150_000 for c in clamps["c-send"])  # the sender's job has none
    assert len(r["arrived"]) == 2


def test_a_duplex_probe_times_tensors_both_ways_over_one_channel(tmp_path: Path, monkeypatch) -> None:
    """ProbeJob.duplex: the receiver hands a tensor back over the same channel as each
    arrives (a run's boundary channel carries activations one way, gradients the
    other); it writes when it handed each back, the sender when each came back, every
    one after it was handed back; each end's warm-up tensor crosses both ways first."""
    monkeypatch.setenv("ATLAS_SECRET", "agent-test")
    common = {"port": _free_port(), "streams": 2, "nbytes": 1 << 16, "count": 3, "transport": TRANSPORT,
              "timeout_s": 30, "duplex": True, "warmup_bytes": 1 << 16}
    r, s = _play(tmp_path, "d", common, send_extra={"gap_s": 0.01})
    assert len(r["returned_sent"]) == len(s["returned"]) == len(r["arrived"]) == 3
    assert all(a <= b < c for a, b, c in zip(r["arrived"], r["returned_sent"], s["returned"], strict=True))
    assert "returned" not in r and "returned_sent" not in s


def test_the_untimed_tensors_go_out_as_many_at_once_as_the_job_says(tmp_path: Path, monkeypatch) -> None:
    """ProbeJob.untimed / untimed_at_once (issue 40, held-far-pp4): the first tensors are
    handed over in groups, each group at once (as a 1F1B warm-up hands a channel pp - 1),
    the next group after the last one's confirmation and the gap; the timed ones one at a
    time, each after the one before was confirmed and the gap."""
    monkeypatch.setenv("ATLAS_SECRET", "agent-test")
    common = {"port": _free_port(), "streams": 2, "nbytes": 1 << 20, "count": 7, "transport": PACED,
              "timeout_s": 30, "duplex": True}
    gap = 0.05
    r, s = _play(tmp_path, "u", common, send_extra={"gap_s": gap, "untimed": 5, "untimed_at_once": 3})
    sent, confirmed = s["sent"], s["confirmed"]
    assert len(sent) == len(confirmed) == len(r["arrived"]) == len(s["returned"]) == 7
    # groups of 3 and 2: handed within one another's instant, before any of them was confirmed
    for group in ((0, 1, 2), (3, 4)):
        assert all(sent[k] < min(confirmed[j] for j in group) for k in group)
        assert sent[group[-1]] - sent[group[0]] < gap
    for k in (3, 5, 6):  # the next group, and each timed tensor, after the last confirmation and the gap
        assert sent[k] >= max(confirmed[:k]) + gap * 0.9


def test_a_duplex_probe_times_its_first_tensor_once_the_untimed_ones_are_back(tmp_path: Path, monkeypatch) -> None:
    """Issue 40, held-regions-gpipe: handed eight at once, the untimed tensors' returns were
    still queued on the way back when the first timed tensor arrived, and its return
    waited behind them (docs/results/fidelity.md, "the duplex probe's returns"). The first
    timed tensor goes out only once every untimed one has come back."""
    monkeypatch.setenv("ATLAS_SECRET", "agent-test")
    common = {"port": _free_port(), "streams": 1, "nbytes": 1 << 20, "count": 6, "transport": PACED,
              "timeout_s": 30, "duplex": True}
    r, s = _play(tmp_path, "b", common, send_extra={"gap_s": 0.0, "untimed": 4, "untimed_at_once": 4})
    sent, returned = s["sent"], s["returned"]
    assert len(sent) == len(returned) == 6
    assert sent[4] >= max(returned[:4])  # the first timed tensor after every untimed one came back
    assert all(sent[k] < min(returned[:4]) for k in range(4))  # the untimed ones handed at once
