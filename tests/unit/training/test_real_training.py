"""Real pipeline training in one process (threads, LocalComm) against the one-process
reference: same parameters and loss curve for GPipe, 1F1B and interleaved 1F1B, dp 1
and 2, SGD and Adam; and the check catches training that did change."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

from testbed.training.executor import ExecutorError, LocalComm, run_local
from testbed.training.model import (
    ModelError,
    build_model,
    build_stage,
    param_seed,
    stage_layer_ranges,
)
from testbed.training.real_work import (
    LocalGradGroup,
    OptimConfig,
    PeerGradSync,
    RealWork,
    RealWorkError,
    SyntheticData,
    ordered_mean,
    train_in_process,
)
from testbed.training.reference import (
    ATOL,
    RTOL,
    compare_params,
    tolerance_for,
    train_reference,
)
from testbed_core.schedules import build_schedule
from testbed_core.workload import ModelConfig, Workload, load_workload
from testbed_runtime.device import Device

ROOT = Path(__file__).resolve().parents[3]
SGD = OptimConfig(kind="sgd", lr=0.5)
ADAM = OptimConfig(kind="adam", lr=3e-3)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Worker threads each run torch ops; one intra-op thread each avoids oversubscribing
    the 2 cores (bitwise comparisons hold at any count, the same for both sides)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny() -> Workload:
    return load_workload(ROOT / "scenarios" / "workloads" / "tiny.yaml")


def with_par(w: Workload, **par: object) -> Workload:
    return w.model_copy(update={"parallelism": w.parallelism.model_copy(update=par)})


def assert_equivalent(w: Workload, params: list[dict], losses: list[float], optim: OptimConfig,
                      iterations: int = 3) -> None:
    """Bit-equal to the micro-batched reference; allclose to the global-batch one."""
    acc = train_reference(w, iterations=iterations, optim=optim, mode="accumulate")
    ref = train_reference(w, iterations=iterations, optim=optim)
    rtol, atol = tolerance_for(optim)
    for d, p in enumerate(params):
        exact = compare_params(p, acc.params)
        assert exact.bitwise_equal, f"replica {d}: {exact.describe()}"
        close = compare_params(p, ref.params, rtol=rtol, atol=atol)
        assert close.ok, f"replica {d}: {close.describe()}"
    assert losses == acc.losses
    assert losses == pytest.approx(ref.losses, rel=1e-6)


# ------------------------------------------------------------------ the model


def test_stages_hold_the_whole_models_parameters_with_the_same_values(tiny: Workload) -> None:
    whole = dict(build_model(tiny.model, seed=3).named_parameters())
    for stages in (1, 2, 3, 4):
        union: dict[str, torch.Tensor] = {}
        for s in range(stages):
            part = dict(build_stage(tiny.model, s, stages, seed=3).named_parameters())
            assert not set(part) & set(union), "a parameter on two stages"
            union.update(part)
        assert set(union) == set(whole)
        assert all(torch.equal(union[n], whole[n]) for n in whole)
    other = dict(build_model(tiny.model, seed=4).named_parameters())
    assert not torch.equal(other["blocks.0.attn.qkv.weight"], whole["blocks.0.attn.qkv.weight"])
    assert param_seed(3, "a") == param_seed(3, "a") != param_seed(3, "b")


@pytest.mark.parametrize("shape", [
    {},
    {"positional": "rotary", "kv_heads": 2, "gated_mlp": True, "bias": False, "ffn_hidden": 96},
])
def test_chained_stages_compute_what_the_whole_model_computes(tiny: Workload, shape: dict) -> None:
    cfg = tiny.model.model_copy(update=shape)
    tokens = SyntheticData(cfg.vocab, cfg.seq_len, 2, seed=1).tokens(0, 0, 0)[:, :-1]
    whole = build_model(cfg, seed=0)(tokens)
    h = tokens
    for s in range(3):  # 4 layers on 3 stages: 2 + 1 + 1
        h = build_stage(cfg, s, 3, seed=0)(h)
    assert h.shape == (2, cfg.seq_len, cfg.vocab)
    assert torch.equal(h, whole)


def test_layer_split_follows_the_compute_model() -> None:
    assert stage_layer_ranges(5, 2) == [range(0, 3), range(3, 5)]
    with pytest.raises(ModelError, match="cannot split 2 layers into 3 pipeline stages"):
        stage_layer_ranges(2, 3)


def test_model_errors_name_the_problem(tiny: Workload) -> None:
    with pytest.raises(ModelError, match=r"stage 2 does not exist: the model is split into 2 stages \(0..1\)"):
        build_stage(tiny.model, 2, 2, seed=0)
    first = build_stage(tiny.model, 0, 2, seed=0)
    with pytest.raises(ModelError, match="takes token ids"):
        first(torch.zeros(1, 4, tiny.model.hidden))
    with pytest.raises(ModelError, match=r"longer than model.seq_len \(32\)"):
        first(torch.zeros(1, 33, dtype=torch.int64))
    odd = ModelConfig(layers=1, hidden=12, heads=4, seq_len=8, vocab=16, positional="rotary")
    with pytest.raises(ModelError, match="even head size"):
        build_model(odd, seed=0)


def test_synthetic_data_is_a_function_of_its_key() -> None:
    data = SyntheticData(vocab=256, seq_len=32, micro_batch=2, seed=5)
    a = data.tokens(1, 0, 2)
    assert a.shape == (2, 33) and a.dtype == torch.int64 and int(a.max()) < 256
    assert torch.equal(a, data.tokens(1, 0, 2))
    assert not torch.equal(a, data.tokens(1, 1, 2)) and not torch.equal(a, data.tokens(2, 0, 2))
    batch = data.global_batch(1, replicas=2, micro_batches=3)
    assert torch.equal(batch[2 * 5:2 * 6], data.tokens(1, 1, 2))  # replica-major
    # learnable: about 90% of steps follow one rule (each token has one usual successor)
    big = torch.cat([data.tokens(0, 0, mb) for mb in range(64)])
    pairs = Counter(zip(big[:, :-1].reshape(-1).tolist(), big[:, 1:].reshape(-1).tolist(), strict=True))
    usual = Counter()
    for (x, _y), n in pairs.items():
        usual[x] = max(usual[x], n)
    assert 0.8 < sum(usual.values()) / sum(pairs.values()) < 0.97


# ------------------------------------------------------------------ equivalence in-process


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_run_local_dp1_equals_the_reference(tiny: Workload, tmp_path: Path, schedule: str) -> None:
    w = with_par(tiny, dp=1, schedule=schedule)
    par = w.parallelism
    sched = build_schedule(schedule, par.pp, par.num_micro_batches)
    work = RealWork(w, list(range(par.pp)), seed=0, optim=SGD)
    devices = {(0, r): Device(f"gpu{r}", tmp_path, mode="real") for r in range(par.pp)}
    for _ in range(3):
        timelines = run_local(sched, 1, devices, work)
        work.end_iteration()
    assert_equivalent(w, [work.state_dict()], work.losses, SGD)
    recs = timelines[(0, 0)]
    assert [r.kind for r in recs].count("forward") == par.num_micro_batches
    assert all(r.mode == "real" and r.end > r.start for r in recs)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_threads_dp2_equal_the_reference(tiny: Workload, tmp_path: Path, schedule: str) -> None:
    w = with_par(tiny, dp=2, schedule=schedule)
    res = train_in_process(w, str(tmp_path), iterations=3, optim=SGD)
    assert_equivalent(w, res.params, res.mean_losses(), SGD)
    assert all(torch.equal(res.params[0][n], res.params[1][n]) for n in res.params[0])  # replicas agree
    kinds = Counter(r.kind for r in Device("p1r0", tmp_path, mode="real").timeline())
    assert kinds == {"forward": 12, "backward": 12, "optimizer": 3}  # the step is device work too


def test_interleaved_and_adam_equal_the_reference(tiny: Workload, tmp_path: Path) -> None:
    w = with_par(tiny, schedule="interleaved-1f1b", chunks=2)  # 4 virtual stages on 2 ranks
    res = train_in_process(w, str(tmp_path), iterations=3, optim=ADAM)
    assert_equivalent(w, res.params, res.mean_losses(), ADAM)
    assert res.mean_losses()[-1] < res.mean_losses()[0] - 0.05  # the loss curve falls


def test_staggered_pipelines_and_late_sends_change_nothing(tiny: Workload, tmp_path: Path) -> None:
    """Temporal sharing in miniature: pipeline 1 starts later and its sends are held back."""

    class LateComm(LocalComm):
        def send(self, key, payload):  # noqa: ANN001
            if key.pipeline == 1:
                threading.Timer(0.02 if key.mb % 2 == 0 else 0.0, super().send, args=(key, payload)).start()
            else:
                super().send(key, payload)

    res = train_in_process(tiny, str(tmp_path), iterations=3, optim=SGD, offsets=[0.0, 0.03], comm=LateComm())
    assert_equivalent(tiny, res.params, res.mean_losses(), SGD)


# ------------------------------------------------------------------ the check can fail


def test_a_misrouted_micro_batch_is_caught(tiny: Workload, tmp_path: Path) -> None:
    """Delivering micro-batch 1's activations as micro-batch 0's (what a reordering bug
    would do) trains differently, far beyond the tolerance."""

    class SwapComm(LocalComm):
        def recv(self, key):  # noqa: ANN001
            if key.direction == "fwd" and key.mb in (0, 1):
                key = type(key)(key.pipeline, key.boundary, 1 - key.mb, key.direction)
            return super().recv(key)

    w = with_par(tiny, dp=1)
    res = train_in_process(w, str(tmp_path), iterations=3, optim=SGD, comm=SwapComm())
    diff = compare_params(res.params[0], train_reference(w, iterations=3, optim=SGD).params)
    assert not diff.ok and diff.max_abs > 100 * ATOL, diff.describe()


def test_skipping_the_dp_average_is_caught(tiny: Workload, tmp_path: Path) -> None:
    class NoAverage:
        def allreduce_mean(self, stage: int, flat: torch.Tensor) -> torch.Tensor:
            return flat

    works = [RealWork(tiny, [0, 1], dp_rank=d, grad_sync=NoAverage(), optim=SGD) for d in range(2)]
    sched = build_schedule("1f1b", 2, tiny.parallelism.num_micro_batches)
    for d, work in enumerate(works):
        for _ in range(2):
            run_local(sched, 1, {(0, 0): Device(f"a{d}", tmp_path, mode="real"),
                                 (0, 1): Device(f"b{d}", tmp_path, mode="real")}, work)
            work.end_iteration()
    ref = train_reference(tiny, iterations=2, optim=SGD).params
    assert not compare_params(works[0].state_dict(), ref).ok


def test_compare_params_reports_names_and_sizes() -> None:
    a = {"x": torch.zeros(3), "y": torch.ones(2)}
    assert compare_params(a, a).bitwise_equal
    near = compare_params({"x": torch.full((3,), 1e-7), "y": torch.ones(2)}, a)
    assert near.ok and not near.bitwise_equal and near.worst == "x"
    far = compare_params({"x": torch.full((3,), 1e-3), "y": torch.ones(2)}, a)
    assert not far.ok and "max |diff| 0.001 (in x)" in far.describe()
    assert "missing ['y']" in compare_params({"x": a["x"]}, a).describe()
    assert not compare_params({"x": torch.zeros(4), "y": a["y"]}, a).ok
    assert tolerance_for(SGD) == (RTOL, ATOL) and tolerance_for(ADAM)[1] == pytest.approx(0.05 * ADAM.lr)


# ------------------------------------------------------------------ DP averaging


def test_local_grad_group_averages_in_rank_order() -> None:
    group = LocalGradGroup(3, timeout_s=10)
    parts = [torch.randn(100, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    out: dict[int, torch.Tensor] = {}
    threads = [threading.Thread(target=lambda r=r: out.__setitem__(r, group.member(r).allreduce_mean(0, parts[r])))
               for r in (2, 0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    expect = (parts[0] + parts[1] + parts[2]) / 3
    assert all(torch.equal(out[r], expect) for r in range(3))
    assert torch.equal(ordered_mean(parts), expect)


def test_local_grad_group_says_who_is_missing() -> None:
    with pytest.raises(RealWorkError, match=r"stage 4 \(round 0\): replicas \[1\] did not arrive within 0.1 s"):
        LocalGradGroup(2, timeout_s=0.1).member(0).allreduce_mean(4, torch.zeros(2))
    with pytest.raises(RealWorkError, match=r"DP rank 2 is outside the group \(0..1\)"):
        LocalGradGroup(2).member(2)


def test_peer_grad_sync_over_atlas_channels() -> None:
    from atlas_transport.loopback import loopback_pair

    parts = [torch.randn(1000, generator=torch.Generator().manual_seed(i)) for i in range(2)]
    with loopback_pair(streams=2) as (a, b):
        syncs = [PeerGradSync(0, {1: a}), PeerGradSync(1, {0: b})]
        for scale in (1.0, 2.0):  # a second round reuses the tag
            out: dict[int, torch.Tensor] = {}

            def one(r: int, out: dict = out, scale: float = scale) -> None:
                out[r] = syncs[r].allreduce_mean(1, parts[r] * scale)

            threads = [threading.Thread(target=one, args=(r,)) for r in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            assert torch.equal(out[0], (parts[0] * scale + parts[1] * scale) / 2)
            assert torch.equal(out[0], out[1])


def test_peer_grad_sync_rejects_bad_groups_and_shapes() -> None:
    with pytest.raises(RealWorkError, match="listed among its own peers"):
        PeerGradSync(0, {0: object()})  # type: ignore[dict-item]
    with pytest.raises(RealWorkError, match=r"ranks 0..dp-1 besides this one \(0\); got \[2\]"):
        PeerGradSync(0, {2: object()})  # type: ignore[dict-item]

    class Wrong:
        def isend(self, tensor, tag):  # noqa: ANN001
            return self

        def wait(self, timeout=None):  # noqa: ANN001
            return None

        def recv(self, tag, *, timeout=None):  # noqa: ANN001
            return torch.zeros(3)

    with pytest.raises(RealWorkError, match=r"stage 1 from replica 1 is \(3,\).*expected \(5,\)"):
        PeerGradSync(0, {1: Wrong()}).allreduce_mean(1, torch.zeros(5))


# ------------------------------------------------------------------ misuse


def test_real_work_rejects_bad_setups(tiny: Workload) -> None:
    with pytest.raises(RealWorkError, match=r"stages \[2\]: give distinct stage ids in 0..1"):
        RealWork(tiny, [2], grad_sync=LocalGradGroup(2).member(0))
    with pytest.raises(RealWorkError, match=r"stages \[0, 0\]"):
        RealWork(tiny, [0, 0], grad_sync=LocalGradGroup(2).member(0))
    with pytest.raises(RealWorkError, match=r"dp_rank 2 is outside 0..1"):
        RealWork(tiny, [0], dp_rank=2)
    with pytest.raises(RealWorkError, match=r"parallelism.dp=2: pass grad_sync="):
        RealWork(tiny, [0])
    with pytest.raises(RealWorkError, match="use 'sgd' or 'adam'"):
        OptimConfig(kind="lamb")  # type: ignore[arg-type]
    with pytest.raises(RealWorkError, match="positive learning rate"):
        OptimConfig(lr=0)
    with pytest.raises(ValueError, match="use 'global' or 'accumulate'"):
        train_reference(tiny, mode="exact")  # type: ignore[arg-type]


def test_real_work_rejects_out_of_order_calls(tiny: Workload) -> None:
    w = with_par(tiny, dp=1)
    work = RealWork(w, [0, 1])
    with pytest.raises(RealWorkError, match="backward of micro-batch 0 on stage 1 before its forward"):
        work.backward(1, 0, None)
    with pytest.raises(RealWorkError, match="forward of micro-batch 0 on stage 1 got no activations"):
        work.forward(1, 0, None)
    with pytest.raises(RealWorkError, match="holds stages \\[0, 1\\], not stage 5"):
        work.forward(5, 0, None)
    with pytest.raises(RealWorkError, match="micro-batch 9 of stage 0: an iteration has 4"):
        work.forward(0, 9, None)
    act = work.forward(0, 0, None)
    assert act.shape == (2, 32, 64) and not act.requires_grad
    with pytest.raises(RealWorkError, match="ran twice"):
        work.forward(0, 0, None)
    with pytest.raises(RealWorkError, match=r"needs the output gradient \(2, 32, 64\) from stage 1, got NoneType"):
        work.backward(0, 0, None)
    with pytest.raises(RealWorkError, match="ends with forwards whose backward never ran"):
        work.end_iteration()
    with pytest.raises(RealWorkError, match="iteration 0: the last stage saw 0 of 4 micro-batches"):
        RealWork(w, [1]).end_iteration()


def test_in_process_failures_surface(tiny: Workload, tmp_path: Path) -> None:
    class Broken(LocalComm):
        def recv(self, key):  # noqa: ANN001
            raise RuntimeError("link down")

    t0 = time.time()
    with pytest.raises(ExecutorError, match="link down"):
        train_in_process(with_par(tiny, dp=1), str(tmp_path), iterations=1, comm=Broken())
    assert time.time() - t0 < 30
