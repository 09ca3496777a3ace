"""Scheduling policies: unipar's goodput policy and the baselines of the Pollux paper."""

from __future__ import annotations

import enum

from unipar.sched.policies.fifo import FifoPolicy
from unipar.sched.policies.goodput import pollux_policy, unipar_policy
from unipar.sched.policies.optimus import OptimusPolicy
from unipar.sched.policies.tiresias import TiresiasPolicy
from unipar.sched.policy import Policy


class PolicyName(enum.Enum):
    UNIPAR = "unipar"
    POLLUX = "pollux"
    TIRESIAS = "tiresias"
    OPTIMUS = "optimus"
    FIFO = "fifo"


def make_policy(name: PolicyName) -> Policy:
    """A fresh policy object of the given kind."""
    return {
        PolicyName.UNIPAR: unipar_policy,
        PolicyName.POLLUX: pollux_policy,
        PolicyName.TIRESIAS: TiresiasPolicy,
        PolicyName.OPTIMUS: OptimusPolicy,
        PolicyName.FIFO: FifoPolicy,
    }[name]()
