"""BubbleTea: prefill-as-a-service in the idle slots of pipeline-parallel training."""
