"""`python -m bubbletea_agent`: run an agent, a decode server, or a quick simulation.

    python -m bubbletea_agent job.json          (the scenario runner's job file: job.py, an AgentJob)
    python -m bubbletea_agent run --config agent.yaml
    python -m bubbletea_agent decode-server --port 7070 --log decode.jsonl
    python -m bubbletea_agent controller controller.json   (the prefill controller: controller/README.md)
    python -m bubbletea_agent simulate --rate 300 --period 1.0 --busy 0:0.3 --busy 0.5:0.3
"""

from __future__ import annotations

import json
import logging
import sys
import time

import click

from testbed_runtime.lifetime import watch_owner
from testbed_runtime.readiness import announce_ready


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="log every step decision")
def main(verbose: bool) -> None:
    """BubbleTea: prefill-as-a-service in the idle slots of pipeline training."""
    watch_owner()  # every command: ends promptly once the run that started it is gone (testbed_runtime/lifetime.py)
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)


@main.command("run")
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False),
              help="agent configuration (YAML or JSON; see bubbletea_agent/config.py)")
def run_cmd(config_path: str) -> None:
    """Run one agent next to a training worker until training ends."""
    from bubbletea_agent.config import AgentConfigError, load_config
    from bubbletea_agent.engine import EngineError
    from bubbletea_agent.requests import TraceError

    try:
        cfg = load_config(config_path)
        from bubbletea_agent.runtime import run

        summary = run(cfg)
    except (AgentConfigError, EngineError, TraceError) as exc:
        raise click.ClickException(str(exc)) from None
    keys = ("engine_mode", "arrived", "served", "rejected", "rejected_by_reason", "guard_violations")
    click.echo(json.dumps({k: summary.get(k) for k in keys}))


@main.command("decode-server")
@click.option("--host", default="0.0.0.0", show_default=True)
@click.option("--port", default=7070, show_default=True, type=int)
@click.option("--streams", default="4", show_default=True, help="streams per channel (or 'auto')")
@click.option("--log", "log_path", type=click.Path(dir_okay=False), help="JSONL of KV-cache arrivals")
@click.option("--duration", type=float, help="stop after this many seconds (default: until SIGTERM)")
@click.option("--max-cache-bytes", type=click.IntRange(min=0), default=0, show_default=True,
              help="refuse KV caches larger than this many bytes on the wire (0: any size)")
@click.option("--check-model", "check_model", help="the agents' prefill model (PrefillModelSpec JSON, e.g. "
              "'{\"preset\": \"tiny\"}'): run one decode step from every real cache and check its next token "
              "against the same model run in one process")
@click.option("--check-device", default="auto", show_default=True,
              help="torch device of the check model: the agents' kind (cuda or cpu: the same random weights)")
def decode_server_cmd(host: str, port: int, streams: str, log_path: str | None, duration: float | None,
                      max_cache_bytes: int, check_model: str | None, check_device: str) -> None:
    """Receive agents' KV caches over atlas_transport, check each (digest, size; with
    --check-model a decode step against the one-process reference) and acknowledge it.
    The shared secret comes from the ATLAS_SECRET environment variable."""
    import signal
    import threading

    from bubbletea_agent.kv_ship import DecodeServer

    checker = None
    if check_model is not None:
        from pydantic import ValidationError

        from bubbletea_agent.decode_check import DecodeChecker
        from bubbletea_agent.engine import EngineError
        from testbed_core.contracts.bubbletea import PrefillModelSpec

        try:
            spec = PrefillModelSpec.model_validate_json(check_model)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'model'}: {e['msg']}" for e in exc.errors())
            raise click.BadParameter(f"{check_model!r}: not a prefill model ({problems})",
                                     param_hint="--check-model") from None
        try:
            checker = DecodeChecker(spec, check_device)
        except EngineError as exc:
            raise click.ClickException(f"decode server --check-model: {exc}") from None
    try:
        server = DecodeServer.start(host, port, streams=int(streams) if streams.isdigit() else streams,
                                    log_path=log_path, keep_tensors=False, checker=checker,
                                    max_cache_bytes=max_cache_bytes)
    except Exception as exc:  # noqa: BLE001 - transport config / bind errors speak for themselves
        raise click.ClickException(f"decode server on {host}:{port}: {exc}") from None
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    click.echo(f"decode server listening on {host}:{server.port}", err=True)
    announce_ready(port=server.port)
    done.wait(duration)
    server.stop()
    checks = list(server.checks.values())
    click.echo(json.dumps({"received": len(server.received), "refused": [r.refused for r in server.refused],
                           "decode_checks": len(checks), "decode_checks_failed": sum(not c.ok for c in checks),
                           "errors": server.errors}))


def _span(text: str) -> tuple[float, float]:
    try:
        off, dur = (float(x) for x in text.split(":"))
    except ValueError:
        raise click.BadParameter(f"{text!r}: expected OFFSET:DURATION in seconds, e.g. 0.5:0.3") from None
    return off, dur


@main.command("simulate")
@click.option("--iterations", default=10, show_default=True)
@click.option("--period", default=1.0, show_default=True, help="iteration time, seconds")
@click.option("--busy", multiple=True, default=["0:0.3", "0.5:0.3"], show_default=True,
              help="training busy span OFFSET:DURATION within an iteration (repeatable)")
@click.option("--rate", default=200.0, show_default=True, help="requests per second")
@click.option("--tokens", default=256, show_default=True, help="median prompt length (lognormal)")
@click.option("--sigma", default=0.8, show_default=True)
@click.option("--deadline", default=5.0, show_default=True, help="seconds a request may wait")
@click.option("--model", "preset", default="llama-3-8b", show_default=True, help="model preset")
@click.option("--gpu", default="H100", show_default=True)
@click.option("--efficiency", default=0.5, show_default=True)
@click.option("--no-chunking", is_flag=True)
@click.option("--seed", default=0, show_default=True)
def simulate_cmd(iterations: int, period: float, busy: tuple[str, ...], rate: float, tokens: int,
                 sigma: float, deadline: float, preset: str, gpu: str, efficiency: float,
                 no_chunking: bool, seed: int) -> None:
    """What-if in virtual time: the real admission logic against a periodic schedule
    with the compute model's prefill times (no network, no root, seconds to run)."""
    from bubbletea_agent.admission import AdmissionConfig
    from bubbletea_agent.engine import compute_model_charge
    from bubbletea_agent.requests import LogNormalLength, PoissonSource
    from bubbletea_agent.sim import periodic_schedule, simulate_agent
    from testbed_core.compute_model import ComputeModel, gpu_spec
    from testbed_core.contracts.bubbletea import PrefillModelSpec

    spec = PrefillModelSpec(preset=preset)
    charge = compute_model_charge(spec, ComputeModel(gpu_spec(gpu), efficiency=efficiency))
    sched = periodic_schedule(time.time(), iterations, period, [_span(b) for b in busy])
    reqs = PoissonSource(rate_per_s=rate, lengths=LogNormalLength(median=tokens, sigma=sigma, max=8192),
                         seed=seed, duration_s=iterations * period, deadline_s=deadline).requests()
    res = simulate_agent(sched, reqs, charge, admission=AdmissionConfig(chunking=not no_chunking), spec=spec)
    m = res.metrics()
    click.echo(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in m.items()}, indent=1))


@main.command("controller")
@click.argument("job_path", type=click.Path(dir_okay=False))
def controller_cmd(job_path: str) -> None:
    """Run the cluster's prefill controller from its job file (a ControllerJob:
    testbed_core/contracts/prefill_service.py) until SIGTERM; API in
    bubbletea_agent/controller/README.md."""
    from bubbletea_agent.controller.auth import AuthError
    from bubbletea_agent.controller.server import run_job as run_controller
    from bubbletea_agent.requests import TraceError

    try:
        summary = run_controller(job_path)
    except (TraceError, AuthError) as exc:
        raise click.ClickException(str(exc)) from None
    keys = ("arrived", "served", "rejected", "rejected_by_reason", "refused_bodies", "unauthorized")
    click.echo(json.dumps({k: summary.get(k) for k in keys}))


@main.command("job")
@click.argument("job_path", type=click.Path(dir_okay=False))
def job_cmd(job_path: str) -> None:
    """Run one agent from a scenario runner's job file (an AgentJob: testbed_core/contracts/bubbletea.py)."""
    from bubbletea_agent.config import AgentConfigError
    from bubbletea_agent.engine import EngineError
    from bubbletea_agent.requests import TraceError

    try:
        from bubbletea_agent.job import run_job

        summary = run_job(job_path)
    except (AgentConfigError, EngineError, TraceError) as exc:
        raise click.ClickException(str(exc)) from None
    keys = ("engine_mode", "arrived", "served", "rejected", "rejected_by_reason", "guard_violations")
    click.echo(json.dumps({k: summary.get(k) for k in keys}))


def entry(argv: list[str] | None = None) -> None:
    """`python -m bubbletea_agent JOB.json` is the runner's form: route it to `job`."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] not in main.commands and not args[0].startswith("-") and args[0].endswith(".json"):
        args = ["job", *args]
    main.main(args=args, prog_name="python -m bubbletea_agent")


if __name__ == "__main__":
    entry()
