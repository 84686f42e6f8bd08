"""`testbed doctor`: can this machine run the testbed, and with which delay backend?

Facts are gathered first (`gather`, I/O) and judged separately (`assess`, pure), so
the verdicts and their install hints are unit-tested without touching the machine.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import click
from pydantic import BaseModel

if TYPE_CHECKING:
    from testbed.emulation.kernel import KernelFeatures

APT = "apt-get install"
PIP_HINT = "make install (the venv with the pinned Python dependencies)"


@dataclass
class Check:
    name: str
    ok: bool
    essential: bool
    detail: str = ""
    fix: str = ""


@dataclass
class Facts:
    euid: int
    features: KernelFeatures | None  # None if the probe failed
    features_error: str = ""
    backend: str | None = None
    backend_error: str = ""
    tools: dict[str, str | None] = field(default_factory=dict)  # name -> path or None
    versions: dict[str, str | None] = field(default_factory=dict)  # name -> version or None
    libiperf: str | None = None
    libiperf_error: str = ""
    gpu: GpuInfo | None = None  # None: not probed


class GpuInfo(BaseModel):
    """What torch sees of CUDA (`error`: why torch could not be asked)."""

    torch: str | None = None
    available: bool
    devices: list[str] | None = None
    error: str | None = None


TOOLS = {  # binary -> (Debian package, essential, why)
    "mnexec": ("mininet", True, "Mininet's helper that runs node shells in namespaces"),
    "ifconfig": ("net-tools", True, "Mininet's node class requires it"),
    "ip": ("iproute2", True, "interface inspection"),
    "ping": ("iputils-ping", True, "RTT measurement in `topo check`"),
    "iperf3": ("iperf3", False, "the command-line iperf3 (the toolkit itself uses libiperf)"),
    "ethtool": ("ethtool", False, "offload inspection"),
}
PY_PACKAGES = {  # distribution -> essential
    "mininet": True, "pyroute2": True, "iperf3": True, "click": True, "pydantic": True, "torch": True,
}


def _version_of(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _deb_version(package: str) -> str | None:
    if shutil.which("dpkg-query") is None:
        return None
    out = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", package], capture_output=True, text=True)
    return out.stdout.strip() or None if out.returncode == 0 else None


def gather(probe_gpu: bool = True) -> Facts:
    from testbed.emulation.kernel import BackendError, choose_delay_backend, detect_features

    facts = Facts(euid=os.geteuid(), features=None)
    try:
        features = detect_features()
        facts.features = features
        try:
            facts.backend = choose_delay_backend(features)
        except BackendError as exc:
            facts.backend_error = str(exc)
    except Exception as exc:  # report it; doctor must not crash
        facts.features_error = str(exc)
    facts.tools = {name: shutil.which(name) for name in TOOLS}
    facts.versions = {dist: _version_of(dist) for dist in PY_PACKAGES}
    facts.versions["mininet (deb, mnexec)"] = _deb_version("mininet")
    if facts.tools.get("iperf3"):
        out = subprocess.run(["iperf3", "--version"], capture_output=True, text=True)
        facts.versions["iperf3 (binary)"] = (out.stdout.splitlines() or [""])[0].strip() or None
    try:
        import iperf3

        facts.libiperf = iperf3.IPerf3(role="c").iperf_version
    except Exception as exc:
        facts.libiperf_error = str(exc)
    if probe_gpu:
        facts.gpu = _gpu()
    return facts


def _gpu() -> GpuInfo:
    try:
        import torch
    except Exception as exc:
        return GpuInfo(available=False, error=f"torch not importable: {exc}")
    info = GpuInfo(torch=torch.__version__, available=bool(torch.cuda.is_available()))
    if info.available:
        info.devices = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info


def assess(facts: Facts) -> list[Check]:
    """Verdicts with what to install or do when something is missing."""
    checks = [Check("root", facts.euid == 0, True, "running as root" if facts.euid == 0 else
                    f"running as uid {facts.euid}", "" if facts.euid == 0 else "run as root (sudo)")]
    feats = facts.features
    if feats is None:
        checks.append(Check("kernel features", False, True, facts.features_error, "run as root (sudo) on Linux"))
    else:
        notes = feats.notes
        for key, label, essential in (("netns", "network namespaces", True), ("veth", "veth pairs", True),
                                      ("htb", "HTB qdisc (rate)", True), ("tbf", "TBF qdisc", False),
                                      ("netem", "netem qdisc (delay)", False),
                                      ("packet_vnet_hdr", "AF_PACKET + PACKET_VNET_HDR (relay)", False)):
            ok = bool(getattr(feats, key))
            fix = ""
            if not ok:
                fix = {"netns": "run as root (sudo)", "htb": "modprobe sch_htb",
                       "tbf": "modprobe sch_tbf",
                       "netem": "optional: the relay delay line replaces it (modprobe sch_netem to use it)",
                       }.get(key, "run as root (sudo) on a recent Linux kernel")
                if "not probed" in notes.get(key, "") or facts.euid != 0:
                    fix = "run as root (sudo)"
            checks.append(Check(label, ok, essential, "present" if ok else notes.get(key, "missing"), fix))
    checks.append(Check("delay backend", facts.backend is not None, True,
                        facts.backend or facts.backend_error,
                        "" if facts.backend else "see the netem/relay lines above"))
    tool_versions = {"mnexec": facts.versions.get("mininet (deb, mnexec)"),
                     "iperf3": facts.versions.get("iperf3 (binary)")}
    for name, (package, essential, why) in TOOLS.items():
        path = facts.tools.get(name)
        detail = path or f"missing ({why})"
        if path and tool_versions.get(name):
            detail += f" ({package} {tool_versions[name]})" if name == "mnexec" else f" ({tool_versions[name]})"
        checks.append(Check(name, path is not None, essential, detail, "" if path else f"{APT} {package}"))
    checks.append(Check("libiperf", facts.libiperf is not None, True, facts.libiperf or facts.libiperf_error,
                        "" if facts.libiperf else f"{APT} libiperf0"))
    for dist, essential in PY_PACKAGES.items():
        version = facts.versions.get(dist)
        fix = "" if version else ("pip install torch==2.13.0" if dist == "torch" else PIP_HINT)
        checks.append(Check(f"python: {dist}", version is not None, essential, version or "not installed", fix))
    gpu = facts.gpu
    if gpu is not None:
        detail = ", ".join(gpu.devices or []) if gpu.available else (
            gpu.error or "no CUDA device: compute is emulated on the CPU")
        checks.append(Check("GPU", gpu.available, False, detail, ""))
    return checks


@click.command()
@click.option("--json", "as_json", is_flag=True, help="print the findings as JSON")
def doctor(as_json: bool) -> None:
    """Check kernel features, tools and versions; say what to install."""
    facts = gather()
    checks = assess(facts)
    ok = all(c.ok for c in checks if c.essential)
    if as_json:
        click.echo(json.dumps({
            "ok": ok,
            "delay_backend": facts.backend,
            "kernel": facts.features.as_dict() if facts.features is not None else None,
            "versions": {**facts.versions, "libiperf": facts.libiperf},
            "gpu": facts.gpu.model_dump(exclude_none=True) if facts.gpu is not None else {},
            "checks": [asdict(c) for c in checks],
        }, indent=2))
    else:
        kernel = facts.features.kernel if facts.features is not None else "?"
        click.echo(f"testbed doctor: kernel {kernel}, Python {sys.version.split()[0]}")
        for c in checks:
            status = "ok" if c.ok else ("MISSING" if c.essential else "absent")
            line = f"  {status:8} {c.name:38} {c.detail}"
            if c.fix:
                line += f"\n  {'':8} {'':38} -> {c.fix}"
            click.echo(line)
        click.echo(f"delay backend that will be used: {facts.backend or 'none (see above)'}")
        click.echo("ready" if ok else "NOT READY: install/fix the MISSING items above")
    if not ok:
        sys.exit(1)
