"""`testbed demo`: the mission's three results in one table and one figure.

On built-in defaults, in a few minutes on a 2-core machine:

1. **transport goodput** across the emulated WAN of the quickstart's topology
   (`topologies/2dc.yaml`): atlas on one TCP stream, atlas on N streams, and the
   link itself as iperf3 measures it with as many streams (`testbed.bench.transport`);
2. **iteration time** of the quickstart scenario's pipeline training under the
   baseline (one stream per WAN channel), multi-TCP and Atlas (`testbed.run.runner`);
3. **BubbleTea**: device utilization of the Atlas variant without and with
   prefill agents in its bubbles, and the training slowdown they cost.

The sub-results keep their own folders (`transport/`, `quickstart/`) next to
`demo.json`, `demo.csv`, `demo.txt` and the combined `demo.png`. Everything the
table shows is rebuilt from those folders alone by `load_rows` (no live system).

The package: rows.py makes the table's rows from the saved sub-results (pure),
figure.py draws demo.png from the rows, files.py writes and reads the demo folder,
run.py runs the sub-runs (with the configuration, prerequisites and progress).
"""

from __future__ import annotations

from testbed.demo.figure import plot
from testbed.demo.files import (
    CSV_FIELDS,
    DemoError,
    load_rows,
    subtitle,
    write_csv,
    write_json,
    write_outputs,
)
from testbed.demo.rows import (
    PAPER_UTILIZATION,
    RESULT_TITLES,
    SLOWDOWN_LIMIT,
    TARGET_LINK_FRACTION,
    TARGET_MULTI_SPEEDUP,
    Row,
    bubbletea_rows,
    build_rows,
    format_table,
    training_rows,
    transport_rows,
)
from testbed.demo.run import (
    DEFAULT,
    QUICK,
    DemoConfig,
    DemoOutcome,
    PlannedProgress,
    bubbletea_unavailable,
    default_out_dir,
    prerequisite_problems,
    probe_libiperf,
    probe_prerequisites,
    run_bench,
    run_demo,
)

__all__ = [
    "CSV_FIELDS", "DEFAULT", "PAPER_UTILIZATION", "QUICK", "RESULT_TITLES", "SLOWDOWN_LIMIT", "TARGET_LINK_FRACTION",
    "TARGET_MULTI_SPEEDUP", "DemoConfig", "DemoError", "DemoOutcome", "PlannedProgress", "Row", "bubbletea_rows",
    "build_rows", "bubbletea_unavailable", "default_out_dir", "format_table", "load_rows", "plot",
    "prerequisite_problems", "probe_libiperf", "probe_prerequisites", "run_bench", "run_demo", "subtitle",
    "training_rows", "transport_rows", "write_csv", "write_json", "write_outputs",
]
