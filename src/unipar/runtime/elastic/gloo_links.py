"""The TCP connections of this rank's gloo process group, and cutting them when its
gang breaks.

Why: when a peer dies mid-collective, gloo fails only the operations waiting on *that*
peer's connection. In a ring, the dead rank's left neighbour may have sent all its data
already and be waiting to receive from a survivor that has itself failed (it was
receiving from the dead rank). That survivor leaves the collective and destroys its
process group, but gloo's connections stay open as long as anything in the process
holds the group (``DistributedDataParallel`` does, past its own deletion, and a
survivor keeps its model for the next gang). The waiting neighbour then blocks until
the group's timeout (``collective_timeout_s``, 300 s by default). Shutting this rank's
connections down on a failed step makes every peer waiting on it fail at once, with
gloo's "connection closed by peer", as if this rank had died: the gang's survivors
all end their step within the poll interval.

How: the sockets the process opens while ``init_process_group`` runs include gloo's
listening socket; each rank publishes that port in the gang's store. A connection is
gloo's when one of its ends is a rank's listening port: a local end on ours (accepted
from a peer) or a remote end on a peer's (connected to it). A plan's device mesh adds a
gloo group per mesh dimension, each with a listening socket and connections of its own
(a survivor of an HSDP gang waited in its replica group's all-reduce for the whole
timeout, 30 s, while only the world group's connections were cut): so the record is
taken again once the gang is formed, over every socket opened since the first. Linux
only (``/proc``); elsewhere nothing is recorded and nothing is cut.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

import torch.distributed as dist

_PORT_KEY = "unipar/gloo_port/"
_TCP_TABLES = ("/proc/self/net/tcp", "/proc/self/net/tcp6")
_LISTEN = "0A"  # the TCP state "listen" in /proc/net/tcp


@dataclass(frozen=True)
class _Socket:
    inode: int
    local_port: int
    remote_port: int
    listening: bool


def socket_inodes() -> dict[int, int]:
    """This process's open sockets: inode -> file descriptor (empty off Linux)."""
    found: dict[int, int] = {}
    fds = Path("/proc/self/fd")
    if not fds.is_dir():
        return found
    for entry in fds.iterdir():
        try:
            target = os.readlink(entry)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            found[int(target[8:-1])] = int(entry.name)
    return found


def _tcp_sockets(inodes: set[int]) -> list[_Socket]:
    """The TCP sockets among ``inodes``, from the kernel's tables."""
    sockets = []
    for table in _TCP_TABLES:
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            inode = int(fields[9])
            if inode in inodes:
                sockets.append(_Socket(
                    inode,
                    local_port=int(fields[1].rsplit(":", 1)[1], 16),
                    remote_port=int(fields[2].rsplit(":", 1)[1], 16),
                    listening=fields[3] == _LISTEN,
                ))
    return sockets


class GlooLinks:
    """This rank's gloo connections (none recorded: nothing to cut)."""

    def __init__(self) -> None:
        self._inodes: frozenset[int] = frozenset()
        self._before: dict[int, int] | None = None  # the sockets before the first group
        self._records = 0

    def record(self, store: dist.Store, rank: int, world_size: int,
               before: dict[int, int]) -> None:
        """After ``init_process_group``: ``before`` is :func:`socket_inodes` taken just
        before it. Every rank of the gang calls this (it waits for the others' ports)."""
        self._before = before
        self._take(store, rank, world_size)

    def record_again(self, store: dist.Store, rank: int, world_size: int) -> None:
        """Once the gang is formed (its mesh's groups made): the connections of every
        group since :meth:`record`. Every rank of the gang calls this."""
        if self._before is not None:
            self._take(store, rank, world_size)

    def _take(self, store: dist.Store, rank: int, world_size: int) -> None:
        assert self._before is not None
        self._records += 1
        sockets = _tcp_sockets(set(socket_inodes()) - set(self._before))
        own = {s.local_port for s in sockets if s.listening}
        prefix = f"{_PORT_KEY}{self._records}/"
        store.set(f"{prefix}{rank}", ",".join(map(str, sorted(own))))
        peers: set[int] = set()
        for peer in range(world_size):
            if peer != rank:
                published = store.get(f"{prefix}{peer}").decode()
                if not published:  # a peer's ports unknown: none cut
                    return
                peers.update(int(port) for port in published.split(","))
        if not own:
            return
        self._inodes = frozenset(
            s.inode for s in sockets
            if not s.listening and (s.local_port in own or s.remote_port in peers)
        )

    def cut(self) -> int:
        """Shut the recorded connections down (both ways); how many were open."""
        open_now = socket_inodes()
        cut = 0
        for inode in self._inodes:
            fd = open_now.get(inode)
            if fd is None:
                continue
            try:
                link = socket.socket(fileno=os.dup(fd))
            except OSError:
                continue
            try:
                link.shutdown(socket.SHUT_RDWR)
                cut += 1
            except OSError:  # already closed by the peer
                pass
            finally:
                link.close()  # the duplicate only: gloo still owns its descriptor
        self._inodes = frozenset()
        return cut
