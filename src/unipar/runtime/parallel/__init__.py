"""Apply a :class:`~unipar.plan.Plan` on one worker: parallelize (torchtitan's order), pipeline
stages, tensor/sequence/context parallel, recompute, data parallel, the distributed
optimizer, clipping and weight initialisation."""
