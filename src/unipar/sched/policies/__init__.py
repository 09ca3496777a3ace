"""Scheduling policies: unipar's goodput policy and the baselines of the Pollux paper."""
