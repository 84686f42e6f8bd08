"""Figures for the notes from a CUDA machine, written as one JSON file.

    python scripts/gpu_measure.py --out results.json            # everything (needs CUDA)
    python scripts/gpu_measure.py --out results.json --cpu-only  # what runs without a GPU

What it measures (each section is independent: a failure is recorded under its name
and the others still run):

* `matmul`: bf16 8192^3 matrix products, TFLOP/s from CUDA events (sanity figure
  against the datasheet's dense peak the compute model uses).
* `transport`: atlas_transport on loopback (one process, `loopback_pair`), goodput of
  CPU->CPU and CUDA->CUDA tensors of the same size and stream count, and their ratio
  (CUDA goes through pinned host memory both ways).
* `device`: a matmul through `testbed_runtime.device.Device(mode="real")`: recorded duration
  against the kernels' CUDA-event time.
* `prefill`: the BubbleTea scenario's model (Llama-3-8B, random weights) through the
  real engine for several prompt lengths, against what `testbed_core/compute_model.py`
  charges for an H200 at the configured efficiency; the implied efficiency is the
  roofline time at 100% over the measured time. Also the latency curve the agent
  would profile at start.
* `training`: the tiny workload trained in process on CUDA and on the CPU, the
  largest parameter difference.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import yaml  # noqa: E402

MIB = 1 << 20
DEV = "cuda"  # --dry-run-cpu sets "cpu": the same code paths, timed by the wall clock


class Span:
    """Seconds of GPU work between start() and stop() (CUDA events), or wall seconds on the CPU."""

    def start(self) -> Span:
        if DEV == "cuda":
            self.e0, self.e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.e0.record()
        self.t0 = time.perf_counter()
        return self

    def stop(self) -> Span:
        if DEV == "cuda":
            self.e1.record()
        self.t1 = time.perf_counter()
        return self

    def seconds(self) -> float:
        if DEV == "cuda":
            self.e1.synchronize()
            return self.e0.elapsed_time(self.e1) / 1e3
        return self.t1 - self.t0


def sync() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


def log(msg: str) -> None:
    print(f"[gpu_measure {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def environment() -> dict[str, Any]:
    env: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "cuda_available": torch.cuda.is_available()}
    try:
        import transformers

        env["transformers"] = transformers.__version__
    except ImportError as exc:
        env["transformers"] = f"missing: {exc}"
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update(gpu=p.name, sms=p.multi_processor_count, memory_gib=round(p.total_memory / 2**30, 1),
                   cuda=torch.version.cuda, tf32_matmul=torch.backends.cuda.matmul.allow_tf32)
    return env


# ------------------------------------------------------------------ matmul


def measure_matmul(n: int = 8192, warmup: int = 3, reps: int = 10) -> dict[str, Any]:
    a = torch.randn(n, n, device=DEV, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=DEV, dtype=torch.bfloat16)
    for _ in range(warmup):
        a @ b
    sync()
    times = []
    for _ in range(reps):
        span = Span().start()
        a @ b
        times.append(span.stop().seconds())
    flops = 2.0 * n ** 3
    from testbed_core.compute_model import gpu_spec

    peak = gpu_spec("H200").peak("bf16")
    med = statistics.median(times)
    return {"n": n, "dtype": "bf16", "median_s": med, "tflops_median": flops / med / 1e12,
            "tflops_best": flops / min(times) / 1e12, "datasheet_dense_tflops": peak / 1e12,
            "fraction_of_datasheet": flops / med / peak}


# ------------------------------------------------------------------ transport


def _goodput_once(a: Any, b: Any, x: torch.Tensor, tag: int, device: str | None) -> float:
    sync()
    t0 = time.perf_counter()
    h = a.isend(x, tag)
    y = b.recv(tag, device=device, timeout=120)
    h.wait(120)
    sync()
    dt = time.perf_counter() - t0
    if not torch.equal(y.view(torch.int16), x.view(torch.int16)):
        raise AssertionError(f"tag {tag}: received tensor differs from the one sent")
    return x.numel() * x.element_size() * 8 / dt / 1e9


def measure_transport(size_mib: int, streams: list[int], reps: int, cuda: bool) -> dict[str, Any]:
    from atlas_transport import TransportConfig
    from atlas_transport.loopback import loopback_pair

    n = size_mib * MIB // 2
    g = torch.Generator().manual_seed(1)
    host = torch.randn(n, generator=g).to(torch.bfloat16)
    dev = host.to(DEV) if cuda else None
    out: dict[str, Any] = {"size_mib": size_mib, "dtype": "bf16", "reps": reps, "by_streams": {}}
    tag = 1
    for s in streams:
        cfg = TransportConfig(streams=s, secret="gpu-measure", connect_timeout_s=10, idle_timeout_s=60)
        row: dict[str, Any] = {}
        with loopback_pair(cfg) as (a, b):
            cases = [("cpu_to_cpu", host, None)] + ([("cuda_to_cuda", dev, DEV)] if cuda else [])
            _goodput_once(a, b, host, tag, None)  # warm the sockets
            tag += 1
            samples: dict[str, list[float]] = {name: [] for name, _, _ in cases}
            for _ in range(reps):  # interleaved so drift hits both alike
                for name, x, d in cases:
                    samples[name].append(_goodput_once(a, b, x, tag, d))
                    tag += 1
            for name, vals in samples.items():
                row[name] = {"gbps_median": statistics.median(vals), "gbps_samples": vals}
        if cuda:
            row["cuda_over_cpu"] = row["cuda_to_cuda"]["gbps_median"] / row["cpu_to_cpu"]["gbps_median"]
        out["by_streams"][str(s)] = row
        log(f"transport {size_mib} MiB x{s} streams: " + ", ".join(
            f"{k} {v['gbps_median']:.2f} Gbit/s" for k, v in row.items() if isinstance(v, dict)))
    if cuda:  # the staging copies alone: device -> pinned host -> device
        pinned = torch.empty(host.shape, dtype=host.dtype, pin_memory=DEV == "cuda")
        sync()
        t0 = time.perf_counter()
        pinned.copy_(dev)
        t1 = time.perf_counter()
        back = pinned.to(DEV)
        sync()
        t2 = time.perf_counter()
        assert torch.equal(back.view(torch.int16), dev.view(torch.int16))
        nbytes = host.numel() * 2
        out["staging_copies"] = {"d2h_pinned_gbps": nbytes * 8 / (t1 - t0) / 1e9,
                                 "h2d_pinned_gbps": nbytes * 8 / (t2 - t1) / 1e9}
    return out


# ------------------------------------------------------------------ device


def measure_device(n: int = 8192) -> dict[str, Any]:
    from testbed_runtime.device import Device

    a = torch.randn(n, n, device=DEV, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=DEV, dtype=torch.bfloat16)
    (a @ b).sum().item()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        dev = Device("gpu0", tmp, mode="real")
        for reps in (1, 10, 50):
            span = Span()

            def work(reps: int = reps, span: Span = span) -> torch.Tensor:
                span.start()
                out = None
                for _ in range(reps):
                    out = a @ b
                span.stop()
                return out  # not synchronised: the Device must do it

            rec = dev.run("forward", "measure", fn=work, label=f"matmul x{reps}")
            kernels = span.seconds()
            rows.append({"matmuls": reps, "recorded_s": rec.duration, "cuda_event_s": kernels,
                         "recorded_minus_kernels_ms": (rec.duration - kernels) * 1e3,
                         "covers_kernels": rec.duration >= kernels})
            log(f"device real: {reps} matmuls recorded {rec.duration * 1e3:.2f} ms, kernels {kernels * 1e3:.2f} ms")
    return {"rows": rows, "all_cover": all(r["covers_kernels"] for r in rows)}


# ------------------------------------------------------------------ prefill


def measure_prefill(lengths: list[int], reps: int, efficiency: float | None,
                    model: dict[str, Any] | None = None) -> dict[str, Any]:
    from bubbletea_agent.engine import TransformersEngine, chunk_flops, compute_spec
    from bubbletea_agent.latency import DEFAULT_PROFILE_LENGTHS
    from bubbletea_agent.runtime import profile_on_device
    from testbed_core.compute_model import ComputeModel, gpu_spec, layer_params
    from testbed_core.contracts.bubbletea import PrefillModelSpec
    from testbed_runtime.device import Device

    scenario = yaml.safe_load((ROOT / "scenarios" / "atlas-2dc-bubbletea.yaml").read_text())
    model = model or scenario["bubbletea"]["model"]
    eff = efficiency if efficiency is not None else float(scenario["workload"]["gpu"]["efficiency"])
    spec = PrefillModelSpec(**model)
    sync()
    t0 = time.perf_counter()
    engine = TransformersEngine(spec, device=DEV)
    sync()
    build_s = time.perf_counter() - t0
    log(f"built {model} on {DEV} in {build_s:.1f} s ({spec.params() / 1e9:.2f} B parameters)")
    cm = ComputeModel(gpu_spec("H200"), dtype="bf16", efficiency=eff)
    peak = cm.gpu.peak("bf16")
    cm_spec = compute_spec(spec)
    weights = cm_spec.layers * layer_params(cm_spec) * cm_spec.dtype_bytes
    for n in lengths[:2]:
        engine.forward(n, None)  # warm-up: cuBLAS / SDPA kernel selection
    rows = []
    for n in lengths:
        times = []
        for _ in range(reps):
            w0 = time.perf_counter()
            span = Span().start()
            engine.forward(n, None)  # synchronises
            span.stop()
            times.append((time.perf_counter() - w0, span.seconds()))
        wall = statistics.median(t for t, _ in times)
        gpu = statistics.median(g for _, g in times)
        flops = chunk_flops(cm_spec, n, 0)
        ideal = max(flops / peak, weights / cm.gpu.memory_bandwidth)  # roofline at 100%
        predicted = cm.seconds(flops, bytes_moved=weights, op="prefill", tokens=n)
        rows.append({"tokens": n, "measured_wall_s": wall, "measured_cuda_s": gpu, "flops": flops,
                     "achieved_tflops": flops / wall / 1e12, "model_predicted_s": predicted,
                     "measured_over_predicted": wall / predicted, "implied_efficiency": ideal / wall,
                     "bound": "compute" if flops / peak >= weights / cm.gpu.memory_bandwidth else "memory"})
        log(f"prefill {n:5d} tokens: {wall * 1e3:8.2f} ms measured, {predicted * 1e3:8.2f} ms predicted "
            f"(H200 eff {eff}), implied efficiency {ideal / wall:.2f}, {flops / wall / 1e12:.0f} TFLOP/s")
    out: dict[str, Any] = {"model": model, "params": spec.params(), "build_s": build_s,
                           "gpu_model": "H200", "configured_efficiency": eff,
                           "weights_bytes": weights, "rows": rows}
    compute_rows = [r for r in rows if r["bound"] == "compute"]
    if compute_rows:
        out["implied_efficiency_compute_bound_median"] = statistics.median(
            r["implied_efficiency"] for r in compute_rows)
    with tempfile.TemporaryDirectory() as tmp:
        dev = Device("gpu0", tmp, mode="real")
        t0 = time.perf_counter()
        fitted = profile_on_device(dev, engine, "measure", list(DEFAULT_PROFILE_LENGTHS), repeats=3)
        prof_s = time.perf_counter() - t0
    preds = [fitted.predict(n) for n in (1, 16, 64, 256, 1024, 4096, 8192)]
    out["profiled_latency"] = {**fitted.to_json(), "describe": fitted.describe(), "profile_s": prof_s,
                               "monotone": all(x < y for x, y in zip(preds, preds[1:], strict=False))}
    log(f"profiled at agent start in {prof_s:.1f} s: {fitted.describe()}")
    del engine
    if DEV == "cuda":
        torch.cuda.empty_cache()
    return out


# ------------------------------------------------------------------ training


def measure_training() -> dict[str, Any]:
    from testbed.training.real_work import OptimConfig, train_in_process
    from testbed.training.reference import compare_params
    from testbed_core.workload import load_workload

    w = load_workload(ROOT / "scenarios" / "workloads" / "tiny.yaml")
    out: dict[str, Any] = {}
    for optim in (OptimConfig(kind="sgd", lr=0.5), OptimConfig(kind="adam", lr=3e-3)):
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            cpu = train_in_process(w, f"{tmp}/cpu", iterations=3, optim=optim, device="cpu")
            t1 = time.perf_counter()
            gpu = train_in_process(w, f"{tmp}/gpu", iterations=3, optim=optim, device=DEV)
            t2 = time.perf_counter()
        diffs = [compare_params(g, c, rtol=1e-4, atol=1e-6) for g, c in zip(gpu.params, cpu.params, strict=True)]
        out[optim.kind] = {
            "lr": optim.lr, "max_abs_diff": max(d.max_abs for d in diffs),
            "max_rel_diff": max(d.max_rel for d in diffs), "worst": diffs[0].worst,
            "within_rtol_1e-4_atol_1e-6": all(d.ok for d in diffs),
            "loss_cpu": cpu.mean_losses(), "loss_cuda": gpu.mean_losses(),
            "cpu_s": t1 - t0, "cuda_s": t2 - t1}
        log(f"training {optim.kind}: cuda vs cpu {diffs[0].describe()}")
    return out


# ------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "gpu_measure.json"))
    ap.add_argument("--cpu-only", action="store_true", help="only what runs without a GPU")
    ap.add_argument("--transport-mib", type=int, default=256)
    ap.add_argument("--streams", default="1,4")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--lengths", default="128,512,1024,2048,4096,8192")
    ap.add_argument("--efficiency", type=float, default=None,
                    help="compute model efficiency (default: the BubbleTea scenario's workload.gpu)")
    ap.add_argument("--model", default=None, help="prefill model as JSON PrefillModelSpec fields "
                    "(default: the BubbleTea scenario's)")
    ap.add_argument("--matmul-n", type=int, default=8192)
    ap.add_argument("--skip", default="", help="comma-separated sections to skip")
    ap.add_argument("--dry-run-cpu", action="store_true",
                    help="run every section with 'cuda' replaced by the CPU (checks the script, not the GPU)")
    a = ap.parse_args(argv)
    global DEV
    if a.dry_run_cpu:
        DEV = "cpu"
    cuda = (torch.cuda.is_available() or a.dry_run_cpu) and not a.cpu_only
    if not cuda:
        DEV = "cpu"
    result: dict[str, Any] = {"environment": environment(), "device": DEV, "errors": {}}
    if not cuda:
        log("no CUDA GPU here (or --cpu-only): measuring only CPU->CPU transport")
    skip = set(filter(None, a.skip.split(",")))
    sections = [("transport", lambda: measure_transport(a.transport_mib, [int(s) for s in a.streams.split(",")],
                                                        a.reps, cuda))]
    if cuda:
        sections = [("matmul", lambda: measure_matmul(a.matmul_n))] + sections + [
            ("device", lambda: measure_device(a.matmul_n)),
            ("prefill", lambda: measure_prefill([int(n) for n in a.lengths.split(",")], 5, a.efficiency,
                                                json.loads(a.model) if a.model else None)),
            ("training", measure_training),
        ]
    for name, fn in sections:
        if name in skip:
            continue
        t0 = time.perf_counter()
        try:
            result[name] = fn()
            log(f"{name}: done in {time.perf_counter() - t0:.1f} s")
        except Exception as exc:  # noqa: BLE001 - recorded; the other sections still run
            result["errors"][name] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
            log(f"{name}: FAILED: {type(exc).__name__}: {exc}")
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(result, indent=1))  # after each section: a timeout keeps the rest
    if "matmul" in result:
        log(f"matmul bf16 {result['matmul']['tflops_median']:.0f} TFLOP/s")
    log(f"wrote {a.out}; errors: {sorted(result['errors']) or 'none'}")
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
