"""Reaching a running Ray cluster: fail within seconds, saying what was tried.

``ray.init(address=...)`` retries an unreachable head for about a minute while its C++
client prints warnings. Before it, three probes, each with its own short deadline:
a TCP connection to the head's GCS port; the HTTP/2 handshake every gRPC server
answers (so another service on that port is told apart); then the cluster's Ray and
Python versions, read from its GCS, against this process's.
"""

from __future__ import annotations

import os
import platform
import socket
from typing import Any

from unipar.errors import ResourceError

CONNECT_TIMEOUT_S = 3.0
HANDSHAKE_TIMEOUT_S = 3.0
GCS_TIMEOUT_S = 5

_START_ONE = (
    "start one on that machine with `ray start --head --port={port}` (it prints the address "
    "to pass), check the address, or leave out --address / address= to start a local cluster"
)
# HTTP/2 client preface and an empty SETTINGS frame (RFC 9113, sections 3.4 and 6.5).
_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
_SETTINGS = 4


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.removeprefix("ray://").rpartition(":")
    return host.strip("[]"), int(port)


def probe_head(address: str) -> None:
    """Raise :class:`ResourceError` unless a gRPC server answers at ``address``."""
    host, port = split_address(address)
    advice = _START_ONE.format(port=port)
    try:
        connection = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
    except OSError as error:
        reason = "timed out" if isinstance(error, TimeoutError) else error.strerror or error
        raise ResourceError(
            f"cannot reach a Ray cluster at {address}: a TCP connection to its head's port "
            f"failed ({reason}, within {CONNECT_TIMEOUT_S:g} s); {advice}"
        ) from None
    with connection:
        if address.startswith("ray://"):
            return  # Ray Client's server: Ray checks it from here
        connection.settimeout(HANDSHAKE_TIMEOUT_S)
        try:
            connection.sendall(_PREFACE)
            header = connection.recv(9)
        except OSError:
            header = b""
        if len(header) < 4 or header[3] != _SETTINGS:
            raise ResourceError(
                f"something listens at {address} but it is not a Ray cluster's head (no gRPC "
                f"answer within {HANDSHAKE_TIMEOUT_S:g} s); pass the head's GCS address "
                f"(`ray status` on the head prints it, default port 6379), or {advice}"
            )


def cluster_versions(address: str) -> dict[str, Any] | None:
    """The ``ray_version`` and ``python_version`` the cluster at ``address`` runs (its
    GCS's cluster metadata), or ``None`` where it does not say."""
    os.environ.setdefault("RAY_py_gcs_connect_timeout_s", str(GCS_TIMEOUT_S))
    os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "error")  # no C++ retry warnings
    from ray._common.usage.usage_lib import get_cluster_metadata
    from ray._raylet import GcsClient

    try:
        return get_cluster_metadata(GcsClient(address=address.removeprefix("ray://")))
    except Exception as error:
        raise ResourceError(
            f"the Ray cluster at {address} did not answer within {GCS_TIMEOUT_S} s "
            f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}); "
            "check that its head is up (`ray status` there)"
        ) from None


def check_versions(address: str, cluster: dict[str, Any] | None) -> None:
    """Refuse a cluster of another Ray version, or another Python minor version (its
    workers unpickle this process's functions)."""
    import ray

    if not cluster:
        return
    theirs_ray, theirs_python = cluster.get("ray_version"), cluster.get("python_version", "")
    ours_python = platform.python_version()
    # Ray's own rule: the same patch version unless told "minor".
    level = 2 if os.environ.get("RAY_DEFAULT_PYTHON_VERSION_MATCH_LEVEL") == "minor" else 3
    same_python = theirs_python.split(".")[:level] == ours_python.split(".")[:level]
    if theirs_ray != ray.__version__ or not same_python:
        raise ResourceError(
            f"the Ray cluster at {address} runs Ray {theirs_ray} on Python {theirs_python}, "
            f"but this process has Ray {ray.__version__} on Python {ours_python}; install "
            f"ray=={theirs_ray} (and Python {theirs_python}) here, or run unipar where the "
            "cluster's versions are installed"
        )


def resolve(address: str) -> str:
    """``auto``: the cluster ``ray start`` last started on this machine."""
    if address != "auto":
        return address
    from ray._private.services import canonicalize_bootstrap_address

    found = canonicalize_bootstrap_address("auto")
    if not found:
        raise ResourceError(
            "address='auto' found no Ray cluster started on this machine (`ray start --head` "
            "writes one); start one, pass its HOST:PORT, or leave out the address to start "
            "a local cluster"
        )
    return found


def check_cluster(address: str) -> str:
    """Every probe, in order; returns the address ``ray.init`` will connect to."""
    address = resolve(address)
    probe_head(address)
    if not address.startswith("ray://"):
        check_versions(address, cluster_versions(address))
    return address
