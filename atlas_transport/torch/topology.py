"""Where the ranks of a group are: which ranks share a site (a DC, a LAN), so that
collectives cross the WAN once per shard instead of once per rank pair.

Two sources, in order:
- `ATLAS_SITE`: a label per rank (any string; ranks with the same label share a
  site). `testbed launch` sets it to the rank's DC; on real machines set it yourself.
- Measured round trips: when any rank of the group has no label, every rank times
  TCP connects to every peer's ping socket (the mesh's own) and publishes which
  peers are under `LAN_RTT_S`; two ranks share a site when either saw the other
  under it (connected components).

Every rank reads the same store keys and computes the same `Topology`, so
collectives pick the same algorithm on every rank."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

log = logging.getLogger("atlas_transport.torch")

SITE_ENV = "ATLAS_SITE"
_NO_LABEL = "\x00"  # what a rank without ATLAS_SITE publishes (labels are stripped text, never this)


def site_key(rank: int) -> str:
    return f"atlas/site/{rank}"


def lan_key(rank: int) -> str:
    return f"atlas/lan/{rank}"


@dataclass(frozen=True)
class Topology:
    """`sites`: the group's ranks partitioned by site; each site's ranks ascending,
    sites ordered by their lowest rank (the same on every rank)."""

    sites: tuple[tuple[int, ...], ...]

    @classmethod
    def flat(cls, size: int) -> Topology:
        return cls((tuple(range(size)),))

    @classmethod
    def from_labels(cls, labels: Sequence[str]) -> Topology:
        groups: dict[str, list[int]] = {}
        for rank, label in enumerate(labels):
            groups.setdefault(label, []).append(rank)
        return cls(tuple(sorted(tuple(g) for g in groups.values())))

    @classmethod
    def from_lan_rows(cls, rows: Sequence[Sequence[int]]) -> Topology:
        """rows[r]: the ranks rank r measured under LAN_RTT_S (either side suffices)."""
        parent = list(range(len(rows)))

        def find(a: int) -> int:
            while parent[a] != a:
                parent[a] = parent[parent[a]]
                a = parent[a]
            return a

        for r, peers in enumerate(rows):
            for p in peers:
                if 0 <= p < len(rows):
                    parent[find(p)] = find(r)
        groups: dict[int, list[int]] = {}
        for r in range(len(rows)):
            groups.setdefault(find(r), []).append(r)
        return cls(tuple(sorted(tuple(g) for g in groups.values())))

    @property
    def size(self) -> int:
        return sum(len(s) for s in self.sites)

    def site_of(self, rank: int) -> int:
        for i, s in enumerate(self.sites):
            if rank in s:
                return i
        raise ValueError(f"rank {rank} is in no site of {self.sites}")

    @property
    def uniform(self) -> bool:
        """Every site has the same number of ranks (what the hierarchical algorithms need)."""
        return len({len(s) for s in self.sites}) == 1

    def describe(self) -> str:
        return " | ".join(",".join(str(r) for r in s) for s in self.sites)


def _decode(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


def discover(store, rank: int, size: int, rtt: Callable[[int], float], lan_rtt_s: float,
             env: dict[str, str] | None = None) -> Topology:
    """The group's topology; collective over the group (every rank must call it, once).
    `rtt(peer)`: seconds of one round trip to `peer` (used only when a label is missing)."""
    env = dict(os.environ) if env is None else env
    label = env.get(SITE_ENV, "").strip()
    store.set(site_key(rank), label or _NO_LABEL)
    own = label or _NO_LABEL
    labels = [own if r == rank else _decode(store.get(site_key(r))) for r in range(size)]
    if _NO_LABEL not in labels:
        topo = Topology.from_labels(labels)
        log.info("atlas: rank %d: sites from %s: %s", rank, SITE_ENV, topo.describe())
        return topo
    peers = [p for p in range(size) if p != rank]
    with ThreadPoolExecutor(max_workers=min(16, max(1, len(peers)))) as pool:
        times = dict(zip(peers, pool.map(_safe(rtt), peers), strict=True))
    near = [p for p, t in times.items() if t < lan_rtt_s]
    store.set(lan_key(rank), ",".join(str(p) for p in near))
    rows = []
    for r in range(size):
        text = ",".join(str(p) for p in near) if r == rank else _decode(store.get(lan_key(r)))
        rows.append([int(p) for p in text.split(",") if p])
    topo = Topology.from_lan_rows(rows)
    log.info("atlas: rank %d: sites from round trips (under %.1f ms: %s): %s", rank, lan_rtt_s * 1e3,
             near, topo.describe())
    return topo


def _safe(rtt: Callable[[int], float]) -> Callable[[int], float]:
    def timed(peer: int) -> float:
        try:
            return rtt(peer)
        except OSError:
            return float("inf")  # unreachable for the probe: not on our LAN as far as we can tell
    return timed
