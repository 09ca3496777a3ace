"""Reaching a running Ray cluster: fail within seconds, saying what was tried.

``ray.init(address=...)`` retries an unreachable head for about a minute while its C++
client prints warnings. Before it, three probes, each with its own short deadline:
a TCP connection to the head's GCS port; the HTTP/2 handshake every gRPC server
answers (so another service on that port is told apart); then the cluster's Ray and
Python versions, read from its GCS, against this process's.

Ray 2.60's ``ray start --head`` turns token authentication on wherever a token exists
(``~/.ray/auth_token``, which any local ``ray.init()`` writes), but a driver that joins by
an explicit address sends no token unless ``RAY_AUTH_MODE=token`` is set in its process
(Ray's own ``address="auto"`` sets it). So, as ``address="auto"`` does, where the mode
is not set and Ray's loader has a token (``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or
``~/.ray/auth_token``), unipar turns token mode on for its own process and the processes
it starts (a cluster without authentication ignores the token); a cluster that still
refuses gets an error naming the file and variables to set.
"""

from __future__ import annotations

import contextlib
import os
import platform
import socket
from collections.abc import Iterator
from typing import Any

from unipar.errors import ConfigError, ResourceError

# Ray is imported inside the functions that talk to a cluster: the command line checks and
# probes an address (a socket and a handshake) before Ray, which takes seconds, loads.

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


def joins_a_cluster(address: str | None) -> bool:
    """Whether ``address`` names a running cluster to join (not ``None`` or ``"local"``,
    which start one)."""
    return bool(address) and address != "local"


def check_address(address: Any) -> str | None:
    """``None`` (start a local cluster), ``auto``, ``HOST:PORT`` or ``ray://HOST:PORT``."""
    if address is None:
        return None
    if isinstance(address, str) and address in ("auto", "local"):
        return address
    host, _, port = str(address).removeprefix("ray://").rpartition(":")
    if not isinstance(address, str) or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(
            f"address must be HOST:PORT of a Ray cluster's head (e.g. 10.0.0.5:6379), "
            f"'ray://HOST:PORT' or 'auto', but got {address!r}; leave it out to start a "
            "local cluster"
        )
    return address


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
    GCS's cluster metadata), or ``None`` where it does not say. A cluster that asks for
    a token gets the one Ray's loader holds (see the module's docstring)."""
    from ray.exceptions import AuthenticationError  # noqa: PLC0415 (heavy: Ray)

    _switch_to_token_auth()
    try:
        with _environment(RAY_py_gcs_connect_timeout_s=str(GCS_TIMEOUT_S)):
            return _read_cluster_metadata(address)
    except AuthenticationError:
        sent = os.environ.get(AUTH_MODE_VARIABLE, "").lower() == "token"
        raise ResourceError(_token_advice(address, sent=sent)) from None


@contextlib.contextmanager
def _environment(**variables: str) -> Iterator[None]:
    """``variables`` set in this process's environment (where not set already) for the
    duration, so that ``ray.init`` later runs with the user's own."""
    added = [name for name in variables if name not in os.environ]
    os.environ.update({name: variables[name] for name in added})
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


def _read_cluster_metadata(address: str) -> dict[str, Any] | None:
    from ray._common.usage.usage_lib import get_cluster_metadata  # noqa: PLC0415 (heavy: Ray)
    from ray._raylet import GcsClient  # noqa: PLC0415 (heavy: Ray)
    from ray.exceptions import AuthenticationError  # noqa: PLC0415 (heavy: Ray)

    try:
        return get_cluster_metadata(GcsClient(address=address.removeprefix("ray://")))
    except AuthenticationError:
        raise
    except Exception as error:
        raise ResourceError(
            f"the Ray cluster at {address} did not answer within {GCS_TIMEOUT_S} s "
            f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}); "
            "check that its head is up (`ray status` there)"
        ) from None


AUTH_MODE_VARIABLE = "RAY_AUTH_MODE"  # Ray's switch: "token" sends the token
TOKEN_FILE = "~/.ray/auth_token"  # where `ray start` and `ray get-auth-token` keep it


def _switch_to_token_auth() -> bool:
    """Token mode for this process and its children, where the mode is not set and Ray's
    loader holds a token (what ``ray.init(address="auto")`` does); whether it was switched
    on.
    An explicit ``RAY_AUTH_MODE`` is the user's word and is left as it is."""
    from ray._raylet import AuthenticationTokenLoader, Config  # noqa: PLC0415 (heavy: Ray)

    if os.environ.get(AUTH_MODE_VARIABLE) is not None:
        return False
    if not AuthenticationTokenLoader.instance().has_token(ignore_auth_mode=True):
        return False
    os.environ[AUTH_MODE_VARIABLE] = "token"
    Config.initialize("")  # Ray reads the mode from its config, refreshed from the env
    return True


def _token_advice(address: str, *, sent: bool) -> str:
    """What to set when the cluster at ``address`` refused this process."""
    copy = (
        f"copy the head's {TOKEN_FILE} (`ray get-auth-token` on the head prints it) to "
        f"{TOKEN_FILE} here, or set RAY_AUTH_TOKEN to it, or RAY_AUTH_TOKEN_PATH to a file "
        "holding it"
    )
    mode = os.environ.get(AUTH_MODE_VARIABLE)
    if not sent and mode is not None and mode.lower() != "token":
        return (
            f"the Ray cluster at {address} requires token authentication, but "
            f"{AUTH_MODE_VARIABLE}={mode} is set here; unset it (or set it to token), and "
            f"{copy} if this machine has no token"
        )
    if not sent:
        return (
            f"the Ray cluster at {address} requires token authentication, but this machine "
            f"has no token (no {TOKEN_FILE}, RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH); {copy}"
        )
    return (
        f"the Ray cluster at {address} refused this machine's token (from "
        f"{_token_source()}): it is not that cluster's; {copy}"
    )


def _token_source() -> str:
    if os.environ.get("RAY_AUTH_TOKEN"):
        return "RAY_AUTH_TOKEN"
    if path := os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return f"RAY_AUTH_TOKEN_PATH={path}"
    return TOKEN_FILE


def check_versions(address: str, cluster: dict[str, Any] | None) -> None:
    """Refuse a cluster of another Ray version, or another Python minor version (its
    workers unpickle this process's functions)."""
    import ray  # noqa: PLC0415 (heavy: Ray)

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
    from ray._private.services import canonicalize_bootstrap_address  # noqa: PLC0415 (heavy: Ray)

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
