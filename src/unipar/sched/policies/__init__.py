"""Scheduling policies: unipar's goodput policies and the baselines of the Pollux and Sia
papers."""

from __future__ import annotations

import enum

from unipar.sched.policies.fifo import FifoPolicy
from unipar.sched.policies.goodput import pollux_policy, unipar_policy
from unipar.sched.policies.optimus import OptimusPolicy
from unipar.sched.policies.pollux_unaware import UnawarePolluxPolicy
from unipar.sched.policies.sia import SiaPolicy
from unipar.sched.policies.tiresias import TiresiasPolicy
from unipar.sched.policies.typed_goodput import TypedGoodputPolicy
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


class TypedPolicyName(enum.Enum):
    """Policies for clusters of several GPU types."""

    UNIPAR = "unipar"
    SIA = "sia"
    POLLUX = "pollux"  # heterogeneity-unaware, as Sia's authors ran it


def make_typed_policy(name: TypedPolicyName):
    """A fresh policy object for a cluster of several GPU types."""
    return {
        TypedPolicyName.UNIPAR: TypedGoodputPolicy,
        TypedPolicyName.SIA: SiaPolicy,
        TypedPolicyName.POLLUX: UnawarePolluxPolicy,
    }[name]()
