"""Atlas: multi-connection tensor transport, DC placement planner and temporal
bandwidth-sharing scheduler."""
