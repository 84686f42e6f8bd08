"""Your own program, predicted: the profile `testbed launch --profile` records
(`profile`: what each rank computed and communicated, per step) and its replay on
another network (`predict`: `testbed whatif --program DIR`)."""
