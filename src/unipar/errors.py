"""Errors unipar raises. Each message states the rule, the values and a fix."""

from __future__ import annotations


class UniparError(Exception):
    """Base class of every error unipar raises on purpose."""


class ConfigError(UniparError, ValueError):
    """A job, plan or run setting breaks a rule; nothing was started or written."""


class ResourceError(UniparError):
    """The cluster cannot hold what the run asks for."""


class CheckpointError(UniparError):
    """A checkpoint is missing, incomplete or unreadable, or cannot be written."""


class UserCodeError(UniparError):
    """The user's model, dataset or loss function raised inside a worker."""


class TrainingFailedError(UniparError):
    """Workers kept dying: the run gave up after ``max_failures`` restarts."""


class TuningFailedError(UniparError):
    """No trial of a tuning experiment ended with a value of its metric."""


class UnsupportedPlanError(UniparError):
    """The runtime cannot apply this plan to this model."""
