"""The recorder `testbed launch --profile` installs in every rank: what the program
asks of torch.distributed, with wall-clock times, one JSON object per line in
``$TESTBED_PROFILE_DIR/rank-<RANK>.jsonl``.

Self-contained (the standard library; torch only once the program imports it): the
launch puts ``testbed/launch/profile_boot`` first on ``PYTHONPATH``, whose
``sitecustomize`` loads this file by path and calls `install()`. Nothing is imported
eagerly: an import hook patches ``torch.distributed.distributed_c10d`` as soon as it
is executed (before ``torch.distributed`` re-exports its functions, so the program,
``torch.distributed.pipelining`` and every library see the recording versions) and
``torch.nn.parallel.distributed`` (DDP).

What is recorded, per rank:

* every point-to-point operation (send, recv, isend, irecv, batch_isend_irecv) and
  collective of the Python API (all_reduce, broadcast, all_gather, reduce_scatter,
  barrier, ... and the object collectives through them): its bytes, its peer (a global
  rank), its group (global ranks, backend), when it was issued, when the program
  waited on it, and, for collectives, when it completed (its future's callback);
* DDP's gradient all-reduce: DDP's reducer calls the process group from C++, past
  the Python API, so a DDP without a communication hook of its own gets torch's
  documented equivalent of its built-in one (``default_hooks.allreduce_hook``: divide
  by the group size, all-reduce) at its first forward, which goes through the
  recording ``all_reduce``; those all-reduces are marked ``ddp`` (the reducer waits
  for them at the end of the backward pass);
* the groups (``new_group`` / ``init_process_group``): ranks and backend.

Calls made from C++ other than DDP's reducer (e.g. a custom C++ extension) are not
seen; `testbed.launch.profile` compares the recorded WAN bytes with the links'
counters and says how much of the traffic the profile accounts for.
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.machinery
import inspect
import json
import os
import sys
import threading
import time
from typing import Any

DIR_ENV = "TESTBED_PROFILE_DIR"
FORMAT = 1

_P2P = ("isend", "irecv", "send", "recv")
# collective -> (the argument whose tensor(s) give the bytes, the async flag's name)
_COLLECTIVES: dict[str, str] = {
    "all_reduce": "tensor", "all_reduce_coalesced": "tensors", "broadcast": "tensor", "reduce": "tensor",
    "all_gather": "tensor", "all_gather_into_tensor": "input_tensor", "all_gather_coalesced": "input_tensor_list",
    "reduce_scatter": "output", "reduce_scatter_tensor": "output", "all_to_all_single": "input",
    "all_to_all": "input_tensor_list", "barrier": "", "gather": "tensor", "scatter": "tensor",
}


def _now() -> float:
    return time.time()


def _cpu() -> float:
    """The calling thread's CPU seconds (compute between two records: CPU against wall)."""
    return time.thread_time()


class Recorder:
    """One rank's JSON lines, written by any thread (futures complete on the backend's)."""

    def __init__(self, directory: str, rank: str) -> None:
        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(directory, f"rank-{rank}.jsonl")
        self._fh = open(self.path, "a", buffering=1 << 16)  # noqa: SIM115 - closed at exit
        self._lock = threading.Lock()
        self._next = 0
        self._groups: dict[int, int] = {}  # id(ProcessGroup) -> group index
        self.local = threading.local()
        self.write({"ev": "start", "format": FORMAT, "t": _now(), "pid": os.getpid(), "argv": sys.argv,
                    "rank": int(rank) if rank.isdigit() else rank})
        atexit.register(self.close)

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":")) + "\n"
        with self._lock:
            if not self._fh.closed:
                self._fh.write(line)

    def new_id(self) -> int:
        with self._lock:
            self._next += 1
            return self._next

    def group_index(self, c10d: Any, group: Any) -> int:
        """The index of `group` (None: the default group) in this rank's ``group`` lines."""
        pg = group if group is not None else c10d._get_default_group()
        key = id(pg)
        with self._lock:
            index = self._groups.get(key)
            if index is not None:
                return index
            index = self._groups[key] = len(self._groups)
        try:
            ranks = list(c10d.get_process_group_ranks(pg))
        except Exception:  # noqa: BLE001 - a group torch cannot describe still gets recorded
            ranks = []
        try:
            backend = str(c10d.get_backend(pg))
        except Exception:  # noqa: BLE001
            backend = "unknown"
        self.write({"ev": "group", "group": index, "ranks": ranks, "backend": backend, "streams": _streams(pg)})
        return index

    def close(self) -> None:
        try:
            modules = program_modules()
        except Exception:  # noqa: BLE001 - the end line matters more
            modules = []
        with self._lock:
            if not self._fh.closed:
                if modules:
                    self._fh.write(json.dumps({"ev": "modules", "files": modules}) + "\n")
                self._fh.write(json.dumps({"ev": "end", "t": _now()}) + "\n")
                self._fh.close()


def program_modules(script: str | None = None) -> list[dict[str, str]]:
    """The program's own Python modules it imported: every module whose file lies in the
    folder of its script (``sys.argv[0]``) or below it, but not in an installed
    environment, with its sha256 (e.g. the examples' ``_common.py``): a change in one of
    them makes another program as much as a change in the script."""
    import hashlib

    script = script if script is not None else (sys.argv[0] if sys.argv else "")
    if not script or not os.path.isfile(script):
        return []
    here = os.path.dirname(os.path.abspath(script)) + os.sep
    prefixes = tuple({os.path.abspath(p) + os.sep for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)})
    out = {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if not path or not path.endswith(".py"):
            continue
        path = os.path.abspath(path)
        if not path.startswith(here) or path.startswith(prefixes) or "site-packages" in path:
            continue
        if path == os.path.abspath(script) or not os.path.isfile(path):
            continue
        with open(path, "rb") as fh:
            out[path] = hashlib.sha256(fh.read()).hexdigest()
    return [{"path": k, "sha256": v} for k, v in sorted(out.items())]


def _streams(pg: Any) -> int | None:
    """An atlas group's configured TCP streams per pair (None: not atlas, or its default)."""
    try:
        import torch

        backend = pg._get_backend(torch.device("cpu"))
        streams = getattr(getattr(backend, "options", None), "streams", None)
        return streams if isinstance(streams, int) else None
    except Exception:  # noqa: BLE001
        return None


_REC: Recorder | None = None


def _nbytes(value: Any) -> int:
    """Bytes of a tensor, or of every tensor in a (nested) list."""
    if value is None:
        return 0
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    try:
        return int(value.numel() * value.element_size())
    except AttributeError:
        return 0


def _work_class() -> type:
    import torch.distributed as dist

    class TimedWork(dist.distributed_c10d.Work):  # type: ignore[misc, name-defined]
        """The backend's work, with the program's waits on it recorded."""

        def __init__(self, inner: Any, ids: list[int]) -> None:
            super().__init__()
            self._inner, self._ids = inner, ids

        def wait(self, timeout: Any = None) -> bool:
            t0 = _now()
            try:
                return bool(self._inner.wait() if timeout is None else self._inner.wait(timeout))
            finally:
                rec = _REC
                if rec is not None:
                    t1 = _now()
                    for i in self._ids:
                        rec.write({"ev": "wait", "id": i, "t0": t0, "t1": t1, "c1": _cpu()})

        def is_completed(self) -> bool:
            return bool(self._inner.is_completed())

        def is_success(self) -> bool:
            return bool(self._inner.is_success())

        def exception(self) -> Any:
            return self._inner.exception()

        def result(self) -> Any:
            return self._inner.result()

        def source_rank(self) -> int:
            return int(self._inner.source_rank())

        def _source_rank(self) -> int:
            return int(self._inner._source_rank())

        def synchronize(self) -> None:
            self.wait()

        def get_future(self) -> Any:
            return self._inner.get_future()

        def __getattr__(self, name: str) -> Any:
            return getattr(self._inner, name)

    return TimedWork


_TimedWork: type | None = None


def _wrap_work(work: Any, ids: list[int]) -> Any:
    global _TimedWork
    if work is None:
        return None
    if _TimedWork is None:
        _TimedWork = _work_class()
    return _TimedWork(work, ids)


def _on_done(work: Any, ids: list[int]) -> None:
    """Record when a collective's work completes (its future's callback, on the backend's thread)."""
    try:
        fut = work.get_future()
    except Exception:  # noqa: BLE001 - a work without a future: the program's wait tells
        return

    def done(_f: Any) -> None:
        rec = _REC
        if rec is not None:
            t = _now()
            for i in ids:
                rec.write({"ev": "done", "id": i, "t": t})

    try:
        fut.add_done_callback(done)
    except Exception:  # noqa: BLE001
        return


def _bind(fn: Any) -> Any:
    sig = inspect.signature(fn)
    return lambda args, kwargs: sig.bind_partial(*args, **kwargs).arguments


def _p2p_wrapper(c10d: Any, name: str, orig: Any) -> Any:
    bind = _bind(orig)
    sending = name in ("isend", "send")
    blocking = name in ("send", "recv")

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        rec = _REC
        if rec is None or getattr(rec.local, "inside", False):
            return orig(*args, **kwargs)
        a = bind(args, kwargs)
        group = a.get("group")
        peer = a.get("dst" if sending else "src")
        group_peer = a.get("group_dst" if sending else "group_src")
        if peer is None and group_peer is not None:
            try:
                peer = c10d.get_global_rank(group if group is not None else c10d._get_default_group(), group_peer)
            except Exception:  # noqa: BLE001
                peer = None
        record = {"ev": "op", "id": rec.new_id(), "kind": "send" if sending else "recv", "op": name,
                  "bytes": _nbytes(a.get("tensor")), "peer": peer, "group": rec.group_index(c10d, group),
                  "tag": a.get("tag") or 0, "blocking": blocking, "t": _now(), "c": _cpu()}
        rec.local.inside = True
        try:
            out = orig(*args, **kwargs)
        finally:
            rec.local.inside = False
        record["t_end"] = _now()
        rec.write(record)
        if blocking:
            rec.write({"ev": "wait", "id": record["id"], "t0": record["t"], "t1": record["t_end"]})
            return out
        return _wrap_work(out, [record["id"]])

    wrapper.__wrapped__ = orig  # type: ignore[attr-defined]
    wrapper.__name__ = name
    wrapper.__doc__ = orig.__doc__
    return wrapper


def _batch_wrapper(c10d: Any, orig: Any) -> Any:
    def batch_isend_irecv(p2p_op_list: Any) -> Any:
        rec = _REC
        if rec is None or getattr(rec.local, "inside", False):
            return orig(p2p_op_list)
        t = _now()
        ids = []
        records = []
        for op in p2p_op_list:
            sending = getattr(op.op, "__name__", "") == "isend"
            group = op.group
            try:
                peer = int(op.peer)
            except Exception:  # noqa: BLE001
                peer = None
            records.append({"ev": "op", "id": rec.new_id(), "kind": "send" if sending else "recv",
                            "op": "batch_isend" if sending else "batch_irecv", "bytes": _nbytes(op.tensor),
                            "peer": peer, "group": rec.group_index(c10d, group), "tag": op.tag or 0,
                            "blocking": False, "t": t, "c": _cpu()})
            ids.append(records[-1]["id"])
        rec.local.inside = True
        try:
            works = orig(p2p_op_list)
        finally:
            rec.local.inside = False
        t_end = _now()
        for r in records:
            r["t_end"] = t_end
            rec.write(r)
        works = list(works or [])
        if len(works) == len(ids):
            return [_wrap_work(w, [i]) for w, i in zip(works, ids, strict=True)]
        return [_wrap_work(w, ids) for w in works]  # coalesced: each work stands for the whole batch

    batch_isend_irecv.__wrapped__ = orig  # type: ignore[attr-defined]
    batch_isend_irecv.__doc__ = orig.__doc__
    return batch_isend_irecv


def _collective_wrapper(c10d: Any, name: str, orig: Any) -> Any:
    bind = _bind(orig)
    arg = _COLLECTIVES[name]

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        rec = _REC
        if rec is None or getattr(rec.local, "inside", False):
            return orig(*args, **kwargs)
        a = bind(args, kwargs)
        group = a.get("group")
        async_op = bool(a.get("async_op", False))
        root = a.get("src", a.get("dst"))
        if root is None and a.get("group_src", a.get("group_dst")) is not None:
            try:
                root = c10d.get_global_rank(group if group is not None else c10d._get_default_group(),
                                            a.get("group_src", a.get("group_dst")))
            except Exception:  # noqa: BLE001
                root = None
        record = {"ev": "op", "id": rec.new_id(), "kind": "collective", "op": name,
                  "bytes": _nbytes(a.get(arg)) if arg else 0, "peer": root, "group": rec.group_index(c10d, group),
                  "tag": 0, "blocking": not async_op, "t": _now(), "c": _cpu()}
        ddp = getattr(rec.local, "ddp", False)
        if ddp:
            record["ddp"] = True
        rec.local.inside = True
        try:
            out = orig(*args, **kwargs)
        finally:
            rec.local.inside = False
        record["t_end"] = _now()
        rec.write(record)
        if not async_op:
            rec.write({"ev": "wait", "id": record["id"], "t0": record["t"], "t1": record["t_end"]})
            return out
        _on_done(out, [record["id"]])
        return _wrap_work(out, [record["id"]])

    wrapper.__wrapped__ = orig  # type: ignore[attr-defined]
    wrapper.__name__ = name
    wrapper.__doc__ = orig.__doc__
    return wrapper


def patch_c10d(c10d: Any) -> None:
    """Replace the module's functions by recording ones (before torch.distributed re-exports them)."""
    for name in _P2P:
        if hasattr(c10d, name):
            setattr(c10d, name, _p2p_wrapper(c10d, name, getattr(c10d, name)))
    if hasattr(c10d, "batch_isend_irecv"):
        c10d.batch_isend_irecv = _batch_wrapper(c10d, c10d.batch_isend_irecv)
    for name in _COLLECTIVES:
        if hasattr(c10d, name):
            setattr(c10d, name, _collective_wrapper(c10d, name, getattr(c10d, name)))


def patch_ddp(module: Any) -> None:
    """DDP: at its first forward, unless the program registered a hook of its own,
    torch's equivalent of the built-in all-reduce as a Python hook (recorded)."""
    ddp = getattr(module, "DistributedDataParallel", None)
    if ddp is None:
        return
    forward = ddp.forward

    def recorded_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not getattr(self, "_testbed_profiled", False):
            self._testbed_profiled = True
            if not getattr(self, "_comm_hooks", None) and _REC is not None:
                try:
                    self.register_comm_hook(self.process_group, _ddp_hook)
                except RuntimeError as exc:  # a built-in hook registered already: not seen
                    _REC.write({"ev": "note", "t": _now(), "text": f"DDP's all-reduce not recorded: {exc}"})
        return forward(self, *args, **kwargs)

    ddp.forward = recorded_forward


def _ddp_hook(process_group, bucket):  # noqa: ANN001, ANN201 - DDP checks the annotations: none
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    rec = _REC
    if rec is not None:
        rec.local.ddp = True
    try:
        return default_hooks.allreduce_hook(process_group, bucket)
    finally:
        if rec is not None:
            rec.local.ddp = False


_PATCHES = {"torch.distributed.distributed_c10d": patch_c10d, "torch.nn.parallel.distributed": patch_ddp}


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: Any, patch: Any) -> None:
        self._inner, self._patch = inner, patch

    def create_module(self, spec: Any) -> Any:
        return self._inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._inner.exec_module(module)
        try:
            self._patch(module)
        except Exception as exc:  # noqa: BLE001 - never break the program for the profile
            sys.stderr.write(f"testbed profile: could not patch {module.__name__}: {exc}\n")


class _Finder(importlib.abc.MetaPathFinder):
    """Wraps the loaders of the modules in `_PATCHES` so that they are patched once executed."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        patch = _PATCHES.get(name)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader, patch)
                return spec
        return None


def install() -> bool:
    """Start recording when ``TESTBED_PROFILE_DIR`` is set (idempotent); False otherwise."""
    global _REC
    directory = os.environ.get(DIR_ENV, "").strip()
    if not directory or _REC is not None:
        return _REC is not None
    rank = os.environ.get("RANK", str(os.getpid()))
    _REC = Recorder(directory, rank)
    if "torch.distributed.distributed_c10d" in sys.modules:  # imported before us: patch it now (late)
        patch_c10d(sys.modules["torch.distributed.distributed_c10d"])
    if "torch.nn.parallel.distributed" in sys.modules:
        patch_ddp(sys.modules["torch.nn.parallel.distributed"])
    sys.meta_path.insert(0, _Finder())
    return True
