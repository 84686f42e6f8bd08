"""Atlas's planning, one concept per module:

- `placement`: where the pipeline stages go (the DC-selection heuristic, free GPUs,
  the strategies it is compared with);
- `network`: the network model of the prediction (per-flow rate, WAN paths, `NetParams`);
- `prediction`: one iteration simulated for a variant on a placement (`build_spec`,
  `allreduce_time`, `predict`, `choose_sharing`);
- `temporal`: the temporal bandwidth-sharing plan (one transfer at a time per WAN link).
"""
