"""The engine's loop compiled with numba: the same steps as `engine.run(..., reference=True)`, on arrays.

`engine.run` builds the step arrays and calls `run_steps`; the Python loop in
`engine.run(..., reference=True)` is the readable twin, and the unit tests check both give the
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
def _arrive(g, d, x, s0, e, latency, record, arrival, wan, nw, waiting, stack, top):  # pragma: no cover - compiled
    """Transfer `g` (pipeline `d`, transfer `x`) on the wire from `s0` to `e`: it
    arrives `latency` later, is recorded as a WAN transfer where `record`, and the
    worker waiting for it, if any, is ready to run again. Returns (nw, top)."""
    arrival[g] = e + latency
    if record:
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
    return nw, top


@njit(cache=True)
def _settle(todo, ntodo, in_todo, posted, noticed, issued, rel, left_at, held_w, held_i, held_t,
            arrival, chan_free, waiting, stack, top, wan, nw,
            route_class, sendch, sec, lat, rec, ch_lat, transfers, channels, m, p):  # pragma: no cover - compiled
    """Rendezvous (`engine.run(..., reference=True)`'s `notify` and `leave`): for each transfer in
    `todo`, compute its notice once its receive is posted and the way back is settled,
    and release its send if held; a released send may settle notices its sender owes.
    Returns (stack top, wan rows)."""
    m2 = 2 * m
    while ntodo > 0:
        ntodo -= 1
        h = todo[ntodo]
        in_todo[h] = False
        d = h // transfers
        x = h - d * transfers
        b = x // m2
        dirh = x % 2
        back = 1 - dirh
        c = route_class[d]
        base = d * transfers
        if noticed[h] < 0:
            if posted[h] < 0:
                continue
            t0 = posted[h]
            leaves = t0
            ready = True
            for k in range(m):
                g2 = base + (b * m + k) * 2 + back
                if issued[g2] < 0 or issued[g2] > t0:
                    continue
                if rel[g2] >= 0:
                    if rel[g2] <= t0 and left_at[g2] > leaves:
                        leaves = left_at[g2]
                    continue
                if posted[g2] >= 0 and posted[g2] + ch_lat[c, b * 2 + dirh] >= t0:
                    continue
                ready = False
                break
            if not ready:
                continue
            noticed[h] = leaves + ch_lat[c, b * 2 + back]
        hw = held_w[h]
        if hw < 0:
            continue
        held_w[h] = -1
        hr = hw - d * p
        hi = held_i[h]
        ci = d * channels + sendch[c, hr, hi]
        go = held_t[h]
        if noticed[h] > go:
            go = noticed[h]
        s0 = chan_free[ci]
        if go > s0:
            s0 = go
        e = s0 + sec[c, hr, hi]
        chan_free[ci] = e
        rel[h] = go
        left_at[h] = e
        nw, top = _arrive(h, d, x, s0, e, lat[c, hr, hi], rec[c, hr, hi], arrival, wan, nw, waiting, stack, top)
        for k in range(m):  # the notices its sender owes may have waited for it
            h2 = base + (b * m + k) * 2 + back
            if posted[h2] >= 0 and noticed[h2] < 0 and not in_todo[h2]:
                in_todo[h2] = True
                todo[ntodo] = h2
                ntodo += 1
    return top, nw


@njit(cache=True, nogil=True)  # a stride search runs several at once (whatif/predict.py)
def run_steps(recv, dur, send, sendch, sec, lat, queued, rec,  # per (class, rank, step)
              route_class, offsets, ch_sec, ch_lat, ch_links,  # per pipeline; per (class, channel)
              transfers, channels, m2, links, record_wan, rendezvous, starts,
              wan, rest, link_left, link_min_s, link_min_lat, link_hold, cutoff):  # pragma: no cover - compiled
    """Run every worker; fill `starts` (workers x steps) and `wan` (rows of pipeline,
    transfer, start, end); return (number of wan rows, workers left unfinished, stopped).
    `rendezvous`: a send waits for its receive (see `engine.run(..., reference=True)`).

    `cutoff`: stop (stopped = True, timelines incomplete) as soon as the makespan is
    known to reach it. Two lower bounds, both final when computed: a step that starts
    at t still has `rest[c, r, i]` seconds of its worker's compute to run; a queued
    transfer that ends at e on link k leaves `link_left[k]` transfers for that link,
    each at least `link_min_s[k]` on the wire after e, the last then at least
    `link_min_lat[k]` from its receiver (links are held one transfer at a time and
    decided in order, so every later one starts after e; a transfer holds link k
    `link_hold[k]` >= 1 times its wire time, so the bound stands)."""
    n_classes, p, n = recv.shape
    D = route_class.shape[0]
    W = D * p
    arrival = np.full(D * transfers, -1.0)
    # rendezvous: per transfer, its receive's post, its notice at the sender, its send's
    # issue, release and leaving its channel, the held send's worker, step and time
    # (one element each without rendezvous: at paper scale these would be hundreds of MB)
    nr = D * transfers if rendezvous else 1
    posted = np.full(nr, -1.0)
    noticed = np.full(nr, -1.0)
    issued = np.full(nr, -1.0)
    rel = np.full(nr, -1.0)
    left_at = np.zeros(nr)
    held_w = np.full(nr, -1, np.int64)
    held_i = np.zeros(nr, np.int64)
    held_t = np.zeros(nr)
    todo = np.empty(nr + 1, np.int64)
    in_todo = np.zeros(nr, np.bool_)
    m = m2 // 2
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
                    if a < 0 and rendezvous and posted[base + rt] < 0:
                        g = base + rt
                        posted[g] = t
                        # its notice, and those its sender owes (they may have waited to
                        # know when this send can leave: no earlier than this post)
                        nt = 0
                        rb = rt // m2
                        for k in range(m):
                            h2 = base + (rb * m + k) * 2 + 1 - rt % 2
                            if posted[h2] >= 0 and noticed[h2] < 0 and not in_todo[h2]:
                                in_todo[h2] = True
                                todo[nt] = h2
                                nt += 1
                        todo[nt] = g
                        in_todo[g] = True
                        top, nw = _settle(todo, nt + 1, in_todo, posted, noticed, issued, rel, left_at, held_w, held_i,
                                          held_t, arrival, chan_free, waiting, stack, top, wan, nw, route_class,
                                          sendch, sec, lat, rec, ch_lat, transfers, channels, m, p)
                        a = arrival[g]
                    if a < 0:
                        waiting[base + rt] = w
                        break
                    if a > t:
                        t = a
                starts[w, i] = t
                if t + rest[c, r, i] >= cutoff:
                    return nw, 0, True
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
                    elif rendezvous:  # held until its notice; released here if it came
                        g = base + sx
                        issued[g] = t
                        held_w[g] = w
                        held_i[g] = i
                        held_t[g] = t
                        todo[0] = g
                        in_todo[g] = True
                        top, nw = _settle(todo, 1, in_todo, posted, noticed, issued, rel, left_at, held_w, held_i,
                                          held_t, arrival, chan_free, waiting, stack, top, wan, nw, route_class,
                                          sendch, sec, lat, rec, ch_lat, transfers, channels, m, p)
                    else:
                        ci = cbase + sendch[c, r, i]
                        s0 = chan_free[ci]
                        if t > s0:
                            s0 = t
                        e = s0 + sec[c, r, i]
                        chan_free[ci] = e
                        nw, top = _arrive(base + sx, d, sx, s0, e, lat[c, r, i], rec[c, r, i], arrival, wan, nw,
                                          waiting, stack, top)
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
                link_free[lk] = s0 + ch_sec[c, y] * link_hold[lk]  # handed on after its hold; bytes arrive as they left
                link_left[lk] -= 1
                if e + link_left[lk] * link_min_s[lk] + link_min_lat[lk] >= cutoff:
                    return nw, 0, True
        nw, top = _arrive(g, d, x, s0, e, ch_lat[c, y], record_wan, arrival, wan, nw, waiting, stack, top)
    left_over = 0
    for w in range(W):
        if pos[w] < n:
            left_over += 1
    return nw, left_over, False
