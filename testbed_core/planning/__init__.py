"""Atlas's planning, one concept per module, all pure (no I/O):

- `placement`: where the pipeline stages go (the DC-selection heuristic, free GPUs,
  the strategies it is compared with), and the one enumeration of a placement's WAN
  crossings (`Placement.wan_boundaries`, `Placement.replica_pairs`);
- `search`: the network-aware placement search (candidates scored by a predictor);
- `wan_paths`: which WAN paths a placement's pipelines and DP rings cross, between which
  hosts, and the calibrated figures of each (`wan_uses`, `path_rates_of`);
- `streams`: the TCP streams per channel and the sharing a variant asks for, from its
  policies, the scenario's settings and the calibration;
- `calibrated`: the network the prediction sees from the calibration (rates, topology);
- `network`: the network model of the prediction (per-flow rate, WAN paths, `NetParams`);
- `path_load`: how busy a placement's other paths keep each path in a predicted iteration;
- `prediction`: one iteration simulated for a variant on a placement (`build_spec`,
  `allreduce_time`, `predict`, `choose_sharing`);
- `schedule`: the pipeline schedules the devices can hold (Atlas's schedule choice);
- `temporal`: the temporal bandwidth-sharing plan (one transfer at a time per WAN link).
"""
