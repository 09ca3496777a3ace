"""Hyperparameter tuning: unipar runs as Ray Tune trials (see :func:`unipar.tuning.api.tune`)."""
