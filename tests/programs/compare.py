"""Compare two saved parameter files (``torch.save`` of name -> tensor).

    python compare.py got.pt want.pt [--rtol 2e-5]

Prints one JSON line: ``max_rel`` (the largest, over tensors, of max|got - want| /
max|want|), ``worst`` (that tensor's name) and ``elementwise_bad`` (how many elements
fail ``|got - want| <= rtol * |want| + atol``, atol = 1e-6 * max|want| of the tensor);
exits 1 when names, shapes or values differ beyond the tolerance.
"""

import argparse
import json
import sys

import torch


def compare(got: dict, want: dict, rtol: float = 2e-5) -> dict:
    if set(got) != set(want):
        return {"ok": False, "error": f"names differ: only in got {sorted(set(got) - set(want))}, "
                f"only in want {sorted(set(want) - set(got))}"}
    worst, max_rel, bad = "", 0.0, 0
    for name, w in want.items():
        g = got[name]
        if tuple(g.shape) != tuple(w.shape):
            return {"ok": False, "error": f"{name}: shape {tuple(g.shape)} != {tuple(w.shape)}"}
        g, w = g.double(), w.double()
        scale = w.abs().max().item() or 1.0
        rel = (g - w).abs().max().item() / scale
        bad += int(((g - w).abs() > rtol * w.abs() + 1e-6 * scale).sum())
        if rel > max_rel or not worst:
            worst, max_rel = name, rel
    return {"ok": max_rel <= rtol and bad == 0, "max_rel": max_rel, "worst": worst, "elementwise_bad": bad}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("got")
    p.add_argument("want")
    p.add_argument("--rtol", type=float, default=2e-5)
    a = p.parse_args()
    res = compare(torch.load(a.got), torch.load(a.want), a.rtol)
    print(json.dumps(res))
    sys.exit(0 if res["ok"] else 1)


if __name__ == "__main__":
    main()
