"""Pollux's throughput and goodput models (Qiao et al., OSDI'21): pure numbers, shared by
the adaptive batch (:mod:`unipar.adapt`) and the cluster scheduler (:mod:`unipar.sched`)."""
