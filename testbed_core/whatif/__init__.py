"""What-if at paper scale: the planner's prediction for thousands of GPUs, fast.

- `engine`: one iteration of many pipelines as max-plus recurrences with first-come
  links (`kernel`: the same loop compiled with numba);
- `predict`: `fast_predict`, the planner's model per variant (placement, sharing,
  Atlas's stride search, the all-reduce) on top of the engine;
- `prefill`: BubbleTea's prefill capacity in the predicted bubbles;
- `calibration`: efficiencies measured by a finished `testbed run`, applied to a what-if;
- `grid`: the grid of a what-if sweep (GPUs, DCs, RTT, bandwidth) as typed settings.
"""
