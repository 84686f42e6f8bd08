"""The engine's loop compiled with numba: the same steps as `engine.run_reference`, on arrays.

`engine.run` builds the step arrays and calls `run_steps`; the Python loop in
`engine.run_reference` is the readable twin, and the unit tests check both give the
same timelines. Compiled once per machine (numba caches the machine code next to this
file, in __pycache__). Compiled, the loop costs nanoseconds per op instead of the
interpreter's microseconds, which is what lets Atlas's stride search run the planner's
candidates at paper scale.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def _less(hk, hb, hs, i, j):  # pragma: no cover - compiled
    if hk[i] != hk[j]:
        return hk[i] < hk[j]
    if hb[i] != hb[j]:
        return hb[i] < hb[j]
    return hs[i] < hs[j]


@njit(cache=True)
def _swap(hk, hb, hs, hg, i, j):  # pragma: no cover - compiled
    hk[i], hk[j] = hk[j], hk[i]
    hb[i], hb[j] = hb[j], hb[i]
    hs[i], hs[j] = hs[j], hs[i]
    hg[i], hg[j] = hg[j], hg[i]


@njit(cache=True)
def run_steps(recv, dur, send, sendch, sec, lat, queued, rec,  # per (class, rank, step)
              route_class, offsets, ch_sec, ch_lat, ch_links,  # per pipeline; per (class, channel)
              transfers, channels, m2, links, record_wan, starts, wan):  # pragma: no cover - compiled
    """Run every worker; fill `starts` (workers x steps) and `wan` (rows of pipeline,
    transfer, start, end); return (number of wan rows, workers left unfinished)."""
    n_classes, p, n = recv.shape
    D = route_class.shape[0]
    W = D * p
    arrival = np.full(D * transfers, -1.0)
    waiting = np.full(D * transfers, -1, np.int64)
    chan_free = np.zeros(D * channels)
    link_free = np.zeros(max(links, 1))
    clock = np.empty(W)
    pos = np.zeros(W, np.int64)
    for w in range(W):
        clock[w] = offsets[w // p]
    stack = np.empty(W, np.int64)
    top = 0
    for w in range(W - 1, -1, -1):
        stack[top] = w
        top += 1
    cap = D * transfers + 1
    hk = np.empty(cap)
    hb = np.empty(cap)
    hs = np.empty(cap, np.int64)
    hg = np.empty(cap, np.int64)
    hn = 0
    seq = 0
    nw = 0
    maxl = ch_links.shape[2]
    while True:
        while top > 0:
            top -= 1
            w = stack[top]
            d = w // p
            r = w - d * p
            c = route_class[d]
            i = pos[w]
            t = clock[w]
            base = d * transfers
            cbase = d * channels
            while i < n:
                rt = recv[c, r, i]
                if rt >= 0:
                    a = arrival[base + rt]
                    if a < 0:
                        waiting[base + rt] = w
                        break
                    if a > t:
                        t = a
                starts[w, i] = t
                t += dur[c, r, i]
                sx = send[c, r, i]
                if sx >= 0:
                    if queued[c, r, i]:
                        k = hn
                        hk[k] = t
                        hb[k] = starts[w, i]
                        hs[k] = seq
                        hg[k] = base + sx
                        hn += 1
                        seq += 1
                        while k > 0:
                            parent = (k - 1) // 2
                            if _less(hk, hb, hs, k, parent):
                                _swap(hk, hb, hs, hg, k, parent)
                                k = parent
                            else:
                                break
                    else:
                        ci = cbase + sendch[c, r, i]
                        s0 = chan_free[ci]
                        if t > s0:
                            s0 = t
                        e = s0 + sec[c, r, i]
                        chan_free[ci] = e
                        g = base + sx
                        arrival[g] = e + lat[c, r, i]
                        if rec[c, r, i]:
                            wan[nw, 0] = d
                            wan[nw, 1] = sx
                            wan[nw, 2] = s0
                            wan[nw, 3] = e
                            nw += 1
                        v = waiting[g]
                        if v >= 0:
                            waiting[g] = -1
                            stack[top] = v
                            top += 1
                i += 1
            pos[w] = i
            clock[w] = t
        if hn == 0:
            break
        ready = hk[0]
        g = hg[0]
        hn -= 1
        if hn > 0:
            hk[0] = hk[hn]
            hb[0] = hb[hn]
            hs[0] = hs[hn]
            hg[0] = hg[hn]
            k = 0
            while True:
                left = 2 * k + 1
                if left >= hn:
                    break
                best = left
                if left + 1 < hn and _less(hk, hb, hs, left + 1, left):
                    best = left + 1
                if _less(hk, hb, hs, best, k):
                    _swap(hk, hb, hs, hg, best, k)
                    k = best
                else:
                    break
        d = g // transfers
        x = g - d * transfers
        y = x % 2 + (x // m2) * 2
        c = route_class[d]
        ci = d * channels + y
        s0 = chan_free[ci]
        if ready > s0:
            s0 = ready
        for j in range(maxl):
            lk = ch_links[c, y, j]
            if lk >= 0 and link_free[lk] > s0:
                s0 = link_free[lk]
        e = s0 + ch_sec[c, y]
        chan_free[ci] = e
        for j in range(maxl):
            lk = ch_links[c, y, j]
            if lk >= 0:
                link_free[lk] = e
        arrival[g] = e + ch_lat[c, y]
        if record_wan:
            wan[nw, 0] = d
            wan[nw, 1] = x
            wan[nw, 2] = s0
            wan[nw, 3] = e
            nw += 1
        v = waiting[g]
        if v >= 0:
            waiting[g] = -1
            stack[top] = v
            top += 1
    left_over = 0
    for w in range(W):
        if pos[w] < n:
            left_over += 1
    return nw, left_over
