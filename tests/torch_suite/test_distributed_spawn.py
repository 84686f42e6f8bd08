"""PyTorch's distributed test suite (`torch.testing._internal.distributed.distributed_test`)
run the way PyTorch's own `test/distributed/test_distributed_spawn.py` runs it for gloo,
with these additions:

- BACKEND=atlas imports `atlas_transport.torch` (which registers the backend) and declares
  atlas in `DistTestCases.backend_feature`, the sets through which torch's suite lets a
  third-party backend in (`ATLAS_FEATURES`);
- ATLAS_TORCH_SUITE_GATES_AS=gloo puts atlas in gloo's place (`GATES_AS` below);
- the ranks are forked from a forkserver that imported this module, unless
  ATLAS_TORCH_SUITE_START=spawn (`START_METHOD` below).

Not part of `make test`: this folder's conftest collects nothing unless
`scripts/torch_dist_suite.py` (`make torch-suite`) starts pytest on it with the
environment PyTorch's runner sets: BACKEND, WORLD_SIZE and TEMP_DIR (a folder holding
`barrier/` and `test_dir/`). Each test starts WORLD_SIZE rank processes; each of them has
this module imported (by the forkserver, or by itself when spawned), so the registration
and the declared features hold in every rank, as they must: torch's gates are decided when
`distributed_test` is imported."""

from __future__ import annotations

import os
import sys
from multiprocessing import parent_process
from multiprocessing.context import ForkServerProcess
from os import path

import torch
import torch.distributed as dist

torch.backends.cuda.matmul.allow_tf32 = False

# The features a backend declares to torch's suite (DistTestCases.backend_feature, "sets
# showing that something is implemented"), all of them claims atlas makes:
#   plugin   - a registered third-party backend: `require_backend_is_available` lets
#              it through where the test's allowed backends name it;
#   ddp      - DistributedDataParallel works on it;
#   subgroup - `new_group` / `new_subgroups` work on it;
#   gpu, cuda - it takes CUDA tensors (atlas stages them through host memory). The tests
#              these admit that need one GPU per rank still skip on a machine without.
# ATLAS_TORCH_SUITE_FEATURES overrides the list (comma separated; "" declares none).
ATLAS_FEATURES = ("plugin", "ddp", "subgroup", "gpu", "cuda")

_ALLOWED_BACKENDS = ("gloo", "nccl", "ucc", "atlas")


def _check_environment() -> str:
    missing = [v for v in ("BACKEND", "WORLD_SIZE", "TEMP_DIR") if v not in os.environ]
    if not missing and parent_process() is None and not path.exists(
            path.join(os.environ["TEMP_DIR"], "barrier")):
        missing = ["TEMP_DIR/barrier"]
    if missing:
        raise RuntimeError(
            f"{__file__}: missing environment {missing}. "
            f"BACKEND is one of {_ALLOWED_BACKENDS}, WORLD_SIZE an int >= 2, TEMP_DIR a "
            "folder holding barrier/ and test_dir/; scripts/torch_dist_suite.py sets all "
            "three (make torch-suite)")
    backend = os.environ["BACKEND"]
    if backend not in _ALLOWED_BACKENDS:
        raise RuntimeError(f"{__file__}: BACKEND={backend!r} is not one of {_ALLOWED_BACKENDS}")
    return backend


if not dist.is_available():
    print("Distributed not available, skipping tests", file=sys.stderr)
    sys.exit(0)

BACKEND = _check_environment()

if BACKEND == "atlas":
    from torch.testing._internal.common_distributed import DistTestCases

    import atlas_transport.torch  # noqa: F401  (registers backend "atlas")

    _features = os.environ.get("ATLAS_TORCH_SUITE_FEATURES")
    for _feature in (ATLAS_FEATURES if _features is None else [f for f in _features.split(",") if f]):
        if _feature not in DistTestCases.backend_feature:
            raise RuntimeError(f"ATLAS_TORCH_SUITE_FEATURES: {_feature!r} is not one of "
                               f"{sorted(DistTestCases.backend_feature)}")
        DistTestCases.backend_feature[_feature].add("atlas")

# ATLAS_TORCH_SUITE_GATES_AS=gloo (with BACKEND=atlas): atlas in gloo's place. The suite is
# imported with BACKEND=gloo, so its skip decorators (read at import) and the branches of
# the test bodies that look at BACKEND (`if BACKEND == "gloo": <the CPU variant>`) go as
# they go for gloo, and each rank turns every process group asked of "gloo"
# (init_process_group, new_group) into an atlas one. This runs on atlas exactly what gloo
# runs, including the tests torch keeps to gloo by name; it is not how torch runs the suite
# for a third-party backend, and the script reports it apart ("atlas-gloo-gates").
GATES_AS = os.environ.get("ATLAS_TORCH_SUITE_GATES_AS") or None
if GATES_AS is not None and (BACKEND != "atlas" or GATES_AS != "gloo"):
    raise RuntimeError(f"ATLAS_TORCH_SUITE_GATES_AS={GATES_AS!r} with BACKEND={BACKEND!r}: "
                       "only gloo's gates, and only for BACKEND=atlas")

# Imported after the features are declared: its skip decorators read them at import.
if GATES_AS is not None:
    os.environ["BACKEND"] = GATES_AS
try:
    import torch.testing._internal.distributed.distributed_test as _distributed_test  # noqa: E402
    from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
        DistributedTest,
        TestDistBackend,
    )
finally:
    os.environ["BACKEND"] = BACKEND


def _groups_of_gloo_on_atlas() -> None:
    """In a rank of the atlas-gloo-gates run: a process group asked of gloo is made on atlas."""
    import torch.distributed.distributed_c10d as c10d

    def on_atlas(fn):
        def wrapper(*args, **kwargs):
            if str(kwargs.get("backend") or "").lower() == "gloo":
                kwargs["backend"] = "atlas"
            result = fn(*args, **kwargs)
            if dist.get_backend() != "atlas":
                raise RuntimeError(f"atlas-gloo-gates: the default group is on "
                                   f"{dist.get_backend()}, not atlas")
            return result

        wrapper._atlas_in_gloo_place = True
        return wrapper

    for module in (dist, c10d):
        for name in ("init_process_group", "new_group"):
            if not getattr(getattr(module, name), "_atlas_in_gloo_place", False):
                setattr(module, name, on_atlas(getattr(module, name)))


# How the ranks start. "spawn" is PyTorch's way: each rank a new interpreter that imports
# torch and this module (5-10 s of CPU per rank on a shared 2-core machine, more than most
# tests take). "forkserver" (the default) gives the same thing once per run: one
# server process, started by multiprocessing, imports this module, and each rank is
# forked from it, a fresh process that never saw the pytest process's state. The
# parent's environment at the moment the ranks start (setUp sets TEMP_DIR and
# INIT_METHOD for each test) is handed to them, as spawn would inherit it.
START_METHOD = os.environ.get("ATLAS_TORCH_SUITE_START", "forkserver")
if START_METHOD not in ("spawn", "forkserver"):
    raise RuntimeError(f"ATLAS_TORCH_SUITE_START={START_METHOD!r}: use spawn or forkserver")


class _RankProcess(ForkServerProcess):
    """A rank forked from the server, given the parent's environment of the moment."""

    def __init__(self, *args, kwargs=None, **kw):
        super().__init__(*args, kwargs={**(kwargs or {}), "environ": dict(os.environ)}, **kw)


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()

    @classmethod
    def _run(cls, rank, test_name, file_name, pipe, environ=None, **kwargs):
        if environ is not None:  # forkserver: the parent's environment when it started us
            os.environ.clear()
            os.environ.update(environ)
            # what distributed_test read from the environment when a spawned rank imported it
            _distributed_test.INIT_METHOD = os.environ.get("INIT_METHOD", "env://")
        if GATES_AS is not None:
            _groups_of_gloo_on_atlas()
        if os.environ.get("ATLAS_TORCH_SUITE_SITE_PER_RANK") == "1":
            # every rank a site of its own: atlas's collectives cross its channels as
            # between DCs (atlas_transport/torch/topology.py reads ATLAS_SITE)
            os.environ["ATLAS_SITE"] = f"rank{rank}"
        super()._run(rank, test_name, file_name, pipe, **kwargs)

    if START_METHOD == "forkserver":

        def _spawn_processes(self) -> None:
            # Python 3.11's forkserver imports its preload before it applies the parent's
            # sys.path (and ignores an ImportError): this folder goes on PYTHONPATH, which
            # the server inherits, so that the preload does not fail silently.
            here = path.dirname(path.abspath(__file__))
            pythonpath = os.environ.get("PYTHONPATH", "")
            if here not in pythonpath.split(os.pathsep):
                os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (here, pythonpath) if p)
            torch.multiprocessing.get_context("forkserver").set_forkserver_preload([__name__])
            self._start_processes(_RankProcess)


# The class name PyTorch gives it (TestDistBackendWithSpawnGLOONoInitFile, ...), so that
# the node ids read as PyTorch's do. The children must find the class under the same name,
# but a test's setUp sets INIT_METHOD before it spawns them (initialize_temp_directories):
# the name is decided from the first import's INIT_METHOD, handed down in the environment.
_init_method = os.environ.setdefault("ATLAS_TORCH_SUITE_INIT_METHOD",
                                     os.environ.get("INIT_METHOD", "env://"))
_has_init_method = "NoInitFile" if _init_method == "env://" else ""
TestDistBackendWithSpawn.__name__ = f"TestDistBackendWithSpawn{BACKEND.upper()}{_has_init_method}"
TestDistBackendWithSpawn.__qualname__ = TestDistBackendWithSpawn.__name__
globals()[TestDistBackendWithSpawn.__name__] = TestDistBackendWithSpawn
del TestDistBackendWithSpawn
