"""A profiled program on another network (testbed_core/program/): the replay's figures
against the network model worked by hand, and every refusal of a profile that does not
fit (another version of the program, other arguments, a topology with too few hosts)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from testbed.cli import main
from testbed_core.planning.calibrated import LINK_GOODPUT
from testbed_core.program.predict import (
    INITIAL_WINDOW,
    PredictError,
    _restart,
    algorithms_for,
    measured_windows,
    predict,
    retarget,
)
from testbed_core.program.profile import (
    PROFILE_FILE,
    GroupRecord,
    OpRecord,
    ProfileError,
    ProgramProfile,
    RankProfile,
    StepRecord,
    check_program,
    program_identity,
    read_profile,
)
from testbed_core.topology import TopologyError, load_topology, parse_topology

ROOT = Path(__file__).resolve().parents[3]
TOPO = ROOT / "topologies" / "2dc.yaml"
MB4 = 4 << 20
LINK_BPS = 1e9 * LINK_GOODPUT / 8


def _topology(slow_start: bool = False, rtt_ms: float = 50, hosts: int = 1):
    return parse_topology({
        "name": "t", "tcp": {"rmem_max": "1MB", "wmem_max": "1MB", "slow_start_after_idle": slow_start},
        "dcs": [{"name": "dc1", "hosts": hosts}, {"name": "dc2", "hosts": hosts}],
        "wan": [{"between": ["dc1", "dc2"], "rate": "1Gbit", "delay": f"{rtt_ms / 2}ms"}]}, "t.yaml")


def _op(i, kind, op, nbytes, peer, t, waits, blocking=False, done=None):
    return OpRecord(id=i, kind=kind, op=op, bytes=nbytes, peer=peer, group=0, blocking=blocking, t_issue=t,
                    t_issue_end=t, waits=waits, t_done=done)


def _pipeline_profile(tmp_path: Path, steps: int = 4, step_s: float = 1.0, backend: str = "gloo",
                      compute: float = 0.1, sender_busy: float | None = None) -> ProgramProfile:
    """Rank 0 sends one 4 MiB tensor to rank 1 per step and waits for it; rank 1
    receives it, computes `compute` s, prints its line. Times as a 1 s step would give;
    with `sender_busy`, rank 0's wait on its send ends that long after it began and it
    computes the rest of the step (its connection idles)."""
    script = tmp_path / "prog.py"
    if not script.exists():
        script.write_text("print('hi')\n")
    ops0, ops1, lines0, lines1 = [], [], [], []
    for k in range(steps):
        t = 1.0 + k * step_s
        arrival = t + step_s - compute - 0.01
        send_end = arrival - 0.025 if sender_busy is None else t + sender_busy
        ops0.append(_op(k + 1, "send", "isend", MB4, 1, t, [(t, send_end)]))
        ops1.append(_op(k + 1, "recv", "irecv", MB4, 0, t, [(t, arrival)]))
        lines0.append(StepRecord(step=k, step_s=arrival - 0.025 - t + 0.005, t_line=arrival - 0.025))
        lines1.append(StepRecord(step=k, step_s=step_s - 0.005, t_line=t + step_s - 0.01))  # from t - 0.005
    group = [GroupRecord(index=0, ranks=[0, 1], backend=backend)]
    ranks = [RankProfile(rank=0, host="dc1-h1", dc="dc1", groups=group, ops=ops0, steps=lines0, t_start=0.5),
             RankProfile(rank=1, host="dc2-h1", dc="dc2", groups=group, ops=ops1, steps=lines1, t_start=0.5)]
    return ProgramProfile(program=program_identity([sys.executable, str(script), "--steps", str(steps)], str(tmp_path)),
                          topology=_topology().model_dump(mode="json"), topology_file="t.yaml", world_size=2, started=1000.0,
                          wall_s=steps * step_s + 2, ranks=ranks)


def test_a_transfer_takes_latency_plus_bytes_over_window_per_rtt(tmp_path):
    """One window-limited gloo flow on a new connection: six round trips of slow start
    (10 segments doubling to the 0.5 MB window), then the first window's flight at once
    and a window per RTT after it, then the one-way delay; gloo sends once the receive's
    notice arrived (one more one-way delay); rank 1's first step adds its 0.1 s of
    compute and 5 ms before the receive."""
    prof = _pipeline_profile(tmp_path)
    for rtt in (0.01, 0.1, 0.2):
        pred = predict(prof, retarget(_topology(), rtt), extra_rtts=0.0, windows={})
        left = MB4 - INITIAL_WINDOW * 63
        ramp = 6 * rtt + max(left / LINK_BPS, (left - 0.5e6) / 0.5e6 * rtt)
        assert pred.ranks[1].steps[0] == pytest.approx(rtt / 2 + ramp + rtt / 2 + 0.1 + 0.005, rel=1e-3), rtt
        assert pred.paths[0].window_source == "nominal" and pred.paths[0].window_bytes == 0.5e6


def test_a_flight_within_the_window_leaves_at_the_link_rate_unless_paced():
    """A warm flow sends what fits in its window at once; a paced one (BBR: atlas's WAN
    streams) at a window per round trip from the first byte."""
    from testbed_core.program.predict import _Path, _serialization

    path = _Path(0.05, 0.1, LINK_BPS, 0.5e6, 0.3, False)
    assert _serialization(0.4e6, 1, path, 0.5e6)[0] == pytest.approx(0.4e6 / LINK_BPS)
    assert _serialization(1.5e6, 1, path, 0.5e6)[0] == pytest.approx(2 * 0.1)  # two windows after the first
    assert _serialization(0.4e6, 1, path, 0.5e6, paced=True)[0] == pytest.approx(0.4e6 / (0.5e6 / 0.1))


def test_predictions_grow_with_the_rtt_and_shrink_with_more_bandwidth(tmp_path):
    prof = _pipeline_profile(tmp_path, backend="atlas")
    times = [predict(prof, retarget(prof.network, rtt), extra_rtts=0.0).seconds_per_step for rtt in (0.01, 0.1, 0.2)]
    assert times[0] < times[1] < times[2]
    narrow = predict(prof, retarget(prof.network, 0.01, 1e8), extra_rtts=0.0).seconds_per_step
    assert narrow > times[0]  # at 10 ms the 8 streams fill 1 Gbit/s; 100 Mbit/s is the limit then


def test_the_fit_reproduces_the_profiled_step(tmp_path):
    prof = _pipeline_profile(tmp_path)
    pred = predict(prof, prof.network)
    assert -0.5 <= pred.extra_rtts <= 8.0
    if -0.5 < pred.extra_rtts < 8.0:
        assert pred.seconds_per_step == pytest.approx(pred.ranks[0].measured_median_s, rel=1e-3)


def test_a_collective_by_ring_takes_two_rounds_of_half_the_tensor(tmp_path):
    """gloo's ring all-reduce of two ranks: two rounds, each a round trip (the receiver's
    notice, then the data) plus half the tensor at the window's pace once warm; a scalar
    (fewer elements than ranks) one round (a round trip at 50 ms: 2dc's loss all-reduce)."""
    def profile(nbytes: int) -> ProgramProfile:
        ranks = []
        for r in (0, 1):
            ops = [_op(k + 1, "collective", "all_reduce", nbytes, None, 1.0 + k, [(1.0 + k, 1.5 + k)], blocking=True)
                   for k in range(5)]
            steps = [StepRecord(step=k, step_s=0.6, t_line=1.6 + k) for k in range(5)]
            ranks.append(RankProfile(rank=r, host=f"dc{r + 1}-h1", dc=f"dc{r + 1}", ops=ops, steps=steps, t_start=0.0,
                                     groups=[GroupRecord(index=0, ranks=[0, 1], backend="gloo")]))
        return ProgramProfile(program=program_identity(["true"], str(tmp_path)),
                              topology=_topology().model_dump(mode="json"), topology_file="t", world_size=2,
                              started=0.0, wall_s=6.0, ranks=ranks)

    chunk = (1 << 20) / 2
    pred = predict(profile(1 << 20), retarget(_topology(), 0.1), extra_rtts=0.0, windows={})
    round_s = 0.1 + max(chunk / LINK_BPS, (chunk - 0.5e6) / 0.5e6 * 0.1)
    assert pred.ranks[0].steps[3] == pytest.approx(0.6 - 0.5 + 2 * round_s, rel=1e-3)  # warm by then
    from testbed_core.program.predict import ALGORITHMS, Replay, _Collective, _paths, _streams_rule

    prof = profile(4)  # a scalar: one round (its replay as a step would be a metric line's all-reduce)
    replay = Replay(prof, _paths(_topology(), {"dc1", "dc2"}, {})[0], {0: "dc1", 1: "dc2"},
                    _streams_rule(prof, None), ALGORITHMS, False, 0.0)
    coll = _Collective([0, 1], "ring", "gloo")
    coll.ops = {0: replay.ops[(0, 1)], 1: replay.ops[(1, 1)]}
    gkey = replay.group_key[(0, 0)]
    assert replay._run_collective(gkey, coll, prof.ranks[0].ops[0], 1.0) == pytest.approx(1.0 + 0.05 + 2 / LINK_BPS)


def test_slow_start_after_idle_halves_the_window_per_rto():
    assert _restart(512e3, 0.1, 0.25) == 512e3  # idle less than an RTO: untouched (the caller checks)
    assert _restart(512e3, 0.4, 0.25) == 256e3  # one RTO more
    assert _restart(512e3, 100.0, 0.25) == INITIAL_WINDOW  # at most down to the initial window


def test_slow_start_makes_a_cold_transfer_slower(tmp_path):
    prof = _pipeline_profile(tmp_path, step_s=3.0, sender_busy=0.1)
    warm = predict(prof, retarget(_topology(False), 0.1), extra_rtts=0.0, windows={}).ranks[1].median_s
    cold = predict(prof, retarget(_topology(True), 0.1), extra_rtts=0.0, windows={}).ranks[1].median_s
    assert cold > warm + 0.1


def test_window_measured_from_back_to_back_transfers(tmp_path):
    """Four 4 MiB sends queued at once, arriving 0.4 s apart at 50 ms RTT: 0.4 s = (4 MiB - W) / W
    round trips, a window of 466 kB."""
    ops0 = [_op(k + 1, "send", "isend", MB4, 1, 1.0, []) for k in range(4)]
    ops1 = [_op(k + 1, "recv", "irecv", MB4, 0, 1.0, [(1.0, 1.5 + 0.4 * k)]) for k in range(4)]
    group = [GroupRecord(index=0, ranks=[0, 1], backend="gloo")]
    prof = ProgramProfile(program=program_identity(["true"], str(tmp_path)), topology=_topology().model_dump(mode="json"), topology_file="t",
                          world_size=2, started=0.0, wall_s=4.0,
                          ranks=[RankProfile(rank=0, host="dc1-h1", dc="dc1", groups=group, ops=ops0, t_start=0.0),
                                 RankProfile(rank=1, host="dc2-h1", dc="dc2", groups=group, ops=ops1, t_start=0.0)])
    (window,) = measured_windows(prof, prof.network).values()
    assert window == pytest.approx(MB4 * 0.05 / (0.4 + 0.05))


def _striped_profile(tmp_path: Path, transfer_s: float, steps: int = 5, backend: str = "atlas") -> ProgramProfile:
    """Rank 0 sends a 4 MiB tensor to rank 1 (through atlas) each 2 s step and waits for its
    confirmation (its line 1 ms later); rank 1 receives it `transfer_s` after the send
    (arrival) and computes 0.05 s before its line."""
    ops0, ops1, lines0, lines1 = [], [], [], []
    for k in range(steps):
        t = 1.0 + 2.0 * k
        arrival = t + transfer_s
        ops0.append(_op(k + 1, "send", "isend", MB4, 1, t, [(t, arrival + 0.025)]))
        ops1.append(_op(k + 1, "recv", "irecv", MB4, 0, t, [(t, arrival)]))
        lines0.append(StepRecord(step=k, step_s=transfer_s + 0.026, t_line=arrival + 0.026))
        lines1.append(StepRecord(step=k, step_s=transfer_s + 0.05, t_line=arrival + 0.05))
    group = [GroupRecord(index=0, ranks=[0, 1], backend=backend)]
    ranks = [RankProfile(rank=0, host="dc1-h1", dc="dc1", groups=group, ops=ops0, steps=lines0, t_start=0.5),
             RankProfile(rank=1, host="dc2-h1", dc="dc2", groups=group, ops=ops1, steps=lines1, t_start=0.5)]
    return ProgramProfile(program=program_identity(["true"], str(tmp_path)), topology=_topology().model_dump(mode="json"),
                          topology_file="t", world_size=2, started=0.0, wall_s=2.0 * steps + 1, ranks=ranks)


def test_a_striped_paths_window_is_fitted_to_the_profiled_step(tmp_path):
    """Only atlas's 8 paced streams crossed the WAN (no one-stream transfer to measure the
    window): where the step depends on the window at the profiled RTT, the window is the
    one whose replay gives the measured step (here steps made with 0.6 MB), not the
    nominal 0.5 MB, and no round trips are fitted on top. Where a one-stream connection
    crossed, or the step does not depend on the window, nothing is fitted."""
    from testbed_core.program.predict import fit_windows

    pair = frozenset({"dc1", "dc2"})
    guess = _striped_profile(tmp_path, 0.1)
    made = predict(guess, guess.network, windows={pair: 0.6e6}, extra_rtts=0.0).ranks[1].steps[-1] - 0.05
    nominal = predict(guess, guess.network, windows={pair: 0.5e6}, extra_rtts=0.0).ranks[1].steps[-1] - 0.05
    assert made < nominal  # 8 x 0.6 MB per 50 ms is under the link's rate: the window shows in the step
    prof = _striped_profile(tmp_path, made)
    (window,) = measured_windows(prof, prof.network).values()
    assert window == pytest.approx(0.6e6, rel=1e-3)
    fitted = predict(prof, prof.network)
    assert fitted.extra_rtts == pytest.approx(0.0, abs=0.01)
    assert fitted.paths[0].window_source == "fitted"  # said as fitted, not as measured in the profile
    assert measured_windows(prof, prof.network, fit=False) == {}
    assert fit_windows(prof.model_copy(update={"env": {"ATLAS_STREAMS": "1"}}), {}) == {}  # one stream: not fitted
    assert fit_windows(_striped_profile(tmp_path, made, backend="gloo"), {}) == {}  # gloo's one stream: not fitted
    fast = retarget(_topology(), 0.002)
    small = _striped_profile(tmp_path, 0.02).model_copy(update={"topology": fast.model_dump(mode="json")})
    assert fit_windows(small, {}) == {}  # at 2 ms RTT no window binds: the step does not show it


# --------------------------------------------------------------------------- what does not fit


def test_a_changed_program_file_is_refused(tmp_path):
    prof = _pipeline_profile(tmp_path)
    check_program(prof, "DIR")
    (tmp_path / "prog.py").write_text("print('another version')\n")
    with pytest.raises(ProfileError, match=r"prog\.py, the program's file, has changed since it was profiled "
                                           r"\(sha256 .* in the profile, .* now\): the profile describes another "
                                           r"version of the program"):
        check_program(prof, "DIR")


def test_a_changed_module_of_the_program_is_refused(tmp_path):
    """A module the program imported from its own folder (the examples' _common.py) is
    part of its version: its change is named."""
    from testbed_core.program.profile import ProgramFile, file_sha256

    prof = _pipeline_profile(tmp_path)
    (tmp_path / "helpers.py").write_text("X = 1\n")
    prof.program.modules = [ProgramFile(path="helpers.py", sha256=file_sha256(tmp_path / "helpers.py"))]
    check_program(prof, "DIR")
    (tmp_path / "helpers.py").write_text("X = 2\n")
    with pytest.raises(ProfileError, match=r"DIR: helpers\.py, the program's module \(imported by it\), has changed "
                                           r"since it was profiled .* another version of the program"):
        check_program(prof, "DIR")
    (tmp_path / "helpers.py").unlink()
    with pytest.raises(ProfileError, match=r"the profiled program's module \(imported by it\) helpers\.py is gone"):
        check_program(prof, "DIR")


def test_a_deleted_program_file_is_refused(tmp_path):
    prof = _pipeline_profile(tmp_path)
    (tmp_path / "prog.py").unlink()
    with pytest.raises(ProfileError, match=r"the profiled program's file .*prog\.py is gone"):
        check_program(prof, "DIR")


def test_other_arguments_are_refused(tmp_path):
    prof = _pipeline_profile(tmp_path)
    script = str(tmp_path / "prog.py")
    check_program(prof, "DIR", ["python3", script, "--steps", "4"])  # another interpreter is the same program
    with pytest.raises(ProfileError, match=r"argument 3: '4' in the profile, '8' now"):
        check_program(prof, "DIR", ["python3", script, "--steps", "8"])
    with pytest.raises(ProfileError, match=r"extra arguments now: --schedule 1f1b"):
        check_program(prof, "DIR", ["python3", script, "--steps", "4", "--schedule", "1f1b"])


def test_a_topology_with_too_few_hosts_is_refused(tmp_path):
    prof = _pipeline_profile(tmp_path)
    one = parse_topology({"name": "one", "dcs": [{"name": "dc1", "hosts": 1}], "wan": []}, "one.yaml")
    with pytest.raises(PredictError, match=r"one\.yaml has 1 host \(dc1 \(1 host\)\); the profile's 2 ranks ran on "
                                           r"2 hosts: too few hosts"):
        predict(prof, one, source="one.yaml")


def test_a_topology_without_the_ranks_host_is_refused(tmp_path):
    prof = _pipeline_profile(tmp_path)
    other = parse_topology({"name": "o", "dcs": [{"name": "dc1", "hosts": 1}, {"name": "dc3", "hosts": 1}],
                            "wan": [{"between": ["dc1", "dc3"], "rate": "1Gbit", "delay": "5ms"}]}, "o.yaml")
    with pytest.raises(PredictError, match=r"rank 1 ran on dc2-h1 in the profile, but o\.yaml has no host dc2-h1 "
                                           r"\(it has dc1 \(1 host\), dc3 \(1 host\)\)"):
        predict(prof, other, source="o.yaml")
    pred = predict(prof, other, source="o.yaml", hosts=["dc1-h1", "dc3-h1"], extra_rtts=0.0)
    assert pred.seconds_per_step is not None
    with pytest.raises(PredictError, match=r"--hosts puts rank 1 on dc2-h1, but o\.yaml has no host dc2-h1 \(it has "
                                           r"dc1 \(1 host\), dc3 \(1 host\); hosts are named <dc>-h<k>, e\.g\. dc1-h1\)"):
        predict(prof, other, source="o.yaml", hosts=["dc1-h1", "dc2-h1"])
    with pytest.raises(PredictError, match=r"--hosts names 1 hosts for a profile of 2 ranks"):
        predict(prof, other, source="o.yaml", hosts=["dc1-h1"])


def test_an_incomplete_profile_is_refused(tmp_path):
    prof = _pipeline_profile(tmp_path)
    prof.ranks[0].ops.pop()  # rank 1's last receive has no send
    with pytest.raises(PredictError, match=r"the replay stops at rank 1, waiting for irecv #4 \(peer 0\)"):
        predict(prof, prof.network, extra_rtts=0.0)


def test_a_profile_without_steps_is_refused(tmp_path):
    prof = _pipeline_profile(tmp_path)
    for r in prof.ranks:
        r.steps = []
    with pytest.raises(PredictError, match=r"the profile has no step lines"):
        predict(prof, prof.network)


def test_read_profile_says_what_is_missing(tmp_path):
    with pytest.raises(ProfileError, match=r"no profile\.json there; make one with"):
        read_profile(tmp_path)
    (tmp_path / "launch.json").write_text("{}")
    with pytest.raises(ProfileError, match=r"that launch was not profiled; run it again with --profile"):
        read_profile(tmp_path)
    (tmp_path / PROFILE_FILE).write_text('{"format": 2}')
    with pytest.raises(ProfileError, match=r"not a profile this version reads"):
        read_profile(tmp_path)


# --------------------------------------------------------------------------- the command


def _saved(tmp_path: Path) -> Path:
    prof = _pipeline_profile(tmp_path)
    prof.topology = load_topology(TOPO).model_dump(mode="json")
    out = tmp_path / "launch"
    out.mkdir()
    (out / PROFILE_FILE).write_text(prof.model_dump_json())
    return out


def test_whatif_program_prints_one_row_per_target(tmp_path):
    out = _saved(tmp_path)
    result = CliRunner().invoke(main, ["whatif", "--program", str(out), "--rtt", "10ms,200ms", "--bandwidth", "10Gbit"])
    assert result.exit_code == 0, result.output
    assert "RTT 10 ms, 10Gbit/s" in result.output and "RTT 200 ms, 10Gbit/s" in result.output
    rows = [line.split() for line in result.output.splitlines() if line.strip().startswith("RTT")]
    assert float(rows[0][5]) < float(rows[1][5])
    assert not math.isnan(float(rows[0][5]))


def test_whatif_program_refusals(tmp_path):
    out = _saved(tmp_path)
    run = CliRunner().invoke
    result = run(main, ["whatif", "--program", str(out), "--command", f"python {tmp_path / 'prog.py'} --steps 9"])
    assert result.exit_code != 0 and "argument 3: '4' in the profile, '9' now" in result.output
    result = run(main, ["whatif", "--rtt", "10ms"])
    assert result.exit_code != 0 and "--rtt, --bandwidth, --hosts and --command go with --program DIR" in result.output
    result = run(main, ["whatif", "--program", str(out), "--rtt", "0ms"])
    assert result.exit_code != 0 and "must be more than 0" in result.output
    result = run(main, ["whatif", "--program", str(out), "--workload", "w.yaml", "--calibration", str(tmp_path)])
    assert result.exit_code != 0
    assert "--workload, --calibration predict the built-in workload model; --program predicts the profiled program " \
        "itself" in result.output
    result = run(main, ["whatif", "--program", str(out), "--topology", str(ROOT / "topologies" / "1dc-lan.yaml")])
    assert result.exit_code != 0
    assert "rank 1 ran on dc2-h1 in the profile, but" in result.output and "has no host dc2-h1" in result.output


def test_whatif_program_out_of_range_targets_and_workload_options(tmp_path):
    """A target a link cannot take is refused naming the range; one the emulation could not
    hold in flight (10 Tbit/s at 200 ms) is still predicted: nothing is emulated. The
    built-in workload's options are refused beside --program, not silently dropped."""
    out = _saved(tmp_path)
    run = CliRunner().invoke
    result = run(main, ["whatif", "--program", str(out), "--rtt", "30s"])
    assert result.exit_code != 0 and "RTT 30000 ms is out of range for a WAN link: allowed above 0 up to 20 s" \
        in result.output and "Traceback" not in result.output
    result = run(main, ["whatif", "--program", str(out), "--bandwidth", "20Tbit"])
    assert result.exit_code != 0 and "bandwidth 20Tbit/s is out of range for a WAN link: allowed 1kbit/s to 10Tbit/s" \
        in result.output
    result = run(main, ["whatif", "--program", str(out), "--rtt", "200ms", "--bandwidth", "10Tbit"])
    assert result.exit_code == 0, result.output
    assert "RTT 200 ms, 10Tbit/s" in result.output
    result = run(main, ["whatif", "--program", str(out), "--gpus", "dc1=1", "--no-allreduce"])
    assert result.exit_code != 0
    assert "--gpus, --no-allreduce predict the built-in workload model; --program predicts" in result.output
    with pytest.raises(TopologyError, match=r"RTT 0 ms is out of range"):
        retarget(_topology(), 0.0)


def _all_reduce_profile(tmp_path: Path, backend: str, hosts: int, nbytes: int) -> ProgramProfile:
    """Every rank all-reduces `nbytes` once a step (3 steps), blocking, nothing else."""
    n = 2 * hosts
    ranks = []
    for r in range(n):
        dc, h = divmod(r, hosts)
        ops = [_op(k + 1, "collective", "all_reduce", nbytes, None, 1.0 + k, [(1.0 + k, 1.5 + k)], blocking=True)
               for k in range(3)]
        steps = [StepRecord(step=k, step_s=0.6, t_line=1.6 + k) for k in range(3)]
        ranks.append(RankProfile(rank=r, host=f"dc{dc + 1}-h{h + 1}", dc=f"dc{dc + 1}", ops=ops, steps=steps,
                                 t_start=0.0, groups=[GroupRecord(index=0, ranks=list(range(n)), backend=backend)]))
    return ProgramProfile(program=program_identity(["true"], str(tmp_path)),
                          topology=_topology(hosts=hosts).model_dump(mode="json"), topology_file="t", world_size=n,
                          started=0.0, wall_s=4.0, ranks=ranks)


def test_atlas_all_reduce_by_its_installed_algorithm(tmp_path):
    """The two-level all-reduce crosses the WAN once (a shard per pair of sites); the ring
    crosses it in each of its 2(n-1) rounds. Two ranks: one exchange of the whole tensor."""
    topo = retarget(_topology(hosts=2), 0.2)
    prof = _all_reduce_profile(tmp_path, "atlas", 2, 4 << 20)
    ring = predict(prof, topo, extra_rtts=0.0, algorithms=algorithms_for("ring")).seconds_per_step
    two = predict(prof, topo, extra_rtts=0.0, algorithms=algorithms_for("hierarchical")).seconds_per_step
    assert two < ring - 4 * 0.1  # at least four one-way delays fewer
    prof.atlas_all_reduce = "hierarchical"
    assert predict(prof, topo, extra_rtts=0.0).seconds_per_step == pytest.approx(two)
    pair = _all_reduce_profile(tmp_path, "atlas", 1, 4 << 20)
    topo1 = retarget(_topology(), 0.2)
    exchange = predict(pair, topo1, extra_rtts=0.0, algorithms=algorithms_for("hierarchical")).seconds_per_step
    forced = {"atlas": {"all_reduce": "exchange"}}
    assert exchange == pytest.approx(predict(pair, topo1, extra_rtts=0.0, algorithms=forced).seconds_per_step)
    with pytest.raises(ValueError, match="use ring or hierarchical"):
        algorithms_for("tree")


def test_an_exchange_completes_each_rank_when_the_others_tensors_arrived(tmp_path):
    """atlas's one-round exchange: each rank sends from its own issue and is done once the
    other's tensor reached it (its own send not waited for): rank 0, issuing 80 ms after
    rank 1 at 100 ms RTT, finds rank 1's tensor there; rank 1 waits one one-way delay."""
    from testbed_core.program.predict import ALGORITHMS, Replay, _paths, _streams_rule

    prof = _all_reduce_profile(tmp_path, "atlas", 1, 8 << 10)  # under 64 KiB: one exchange
    for op in prof.ranks[0].ops:
        op.t_issue = op.t_issue_end = op.t_issue + 0.08
        op.waits = [(op.t_issue, op.t_issue + 0.1)]
    topo = retarget(_topology(), 0.1)
    replay = Replay(prof, _paths(topo, {"dc1", "dc2"}, {})[0], {0: "dc1", 1: "dc2"}, _streams_rule(prof, None),
                    ALGORITHMS, False, 0.0)
    replay.run()
    first0, first1 = replay.ops[(0, 1)], replay.ops[(1, 1)]
    assert first0.done == pytest.approx(first0.issued)  # rank 1's 8 KiB left at 1.0 s, arrived by 1.06 s
    assert first1.done == pytest.approx(first0.issued + 0.05, abs=0.01)  # + 8 KiB paced at a fresh window


def test_the_ranks_mean_is_free_of_which_rank_runs_ahead():
    """Two ranks meeting in one exchange a step time it as c + L + d and c + L - d (d: the
    lead of one over the other); the mean over ranks is c + L whatever d, step by step."""
    from testbed_core.program.predict import ranks_mean_median

    c, lat = 0.01, 0.05
    leads = [0.04, -0.03, 0.05, 0.0, -0.05]
    steps = {0: {k: c + lat + d for k, d in enumerate(leads)}, 1: {k: c + lat - d for k, d in enumerate(leads)}}
    assert ranks_mean_median(steps, 1) == pytest.approx(c + lat)
    assert ranks_mean_median({0: {0: 1.0, 1: 2.0}, 1: {1: 4.0}}, 0) == pytest.approx(3.0)  # steps both timed
    assert ranks_mean_median({}, 1) is None


def test_the_fit_targets_the_ranks_mean(tmp_path):
    """The fitted round trips make the replay's mean over ranks match the profile's."""
    prof = _pipeline_profile(tmp_path)
    pred = predict(prof, prof.network)
    assert pred.ranks_mean_s_per_step == pytest.approx(pred.measured_ranks_mean_s_per_step, rel=0.01)


def test_an_idle_emulated_link_passes_its_bucket_at_once():
    """The emulated links' HTB bucket (1 ms at line rate): a flight starting on an idle link
    passes that much at once, the rest at the link's rate."""
    from testbed_core.program.predict import _Path, _serialization, link_burst_bytes

    assert link_burst_bytes(LINK_BPS) == pytest.approx(125_000)
    assert link_burst_bytes(1e6) == 65536 + 1514  # at least a GSO packet and a frame
    path = _Path(0.05, 0.1, LINK_BPS, 0.5e6, 0.3, False)
    full = _serialization(0.3e6, 1, path, 0.5e6, tokens=125_000)[0]
    assert full == pytest.approx((0.3e6 - 125_000) / LINK_BPS)
    assert _serialization(0.1e6, 1, path, 0.5e6, tokens=125_000)[0] == 0.0


def test_an_atlas_channel_gives_pacing_up_after_sixteen_small_sends(tmp_path):
    """atlas_transport/torch/mesh.py: a WAN channel whose last 16 sends were all under
    256 KiB per stream leaves BBR for cubic (unpaced); a send that large paces again."""
    from testbed_core.program.predict import BIG_SHARE_BYTES, Replay, _paths, _streams_rule

    prof = _all_reduce_profile(tmp_path, "atlas", 1, 8 << 10)
    paths = _paths(_topology(), {"dc1", "dc2"}, {})[0]
    replay = Replay(prof, paths, {0: "dc1", 1: "dc2"}, _streams_rule(prof, None), algorithms_for("ring"), False, 0.0)
    path = paths[("dc1", "dc2")]
    paced = [replay._paced(("g",), "atlas", 0, 1, 64 << 10, 8, path) for _ in range(17)]
    assert paced[:15] == [True] * 15 and paced[15:] == [False, False]
    assert replay._paced(("g",), "atlas", 0, 1, BIG_SHARE_BYTES * 8, 8, path) is True
    assert replay._paced(("g",), "gloo", 0, 1, 64 << 10, 1, path) is False
