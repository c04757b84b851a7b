"""Waking a waiter the moment dispatch grants it a device, instead of at its next poll.

A wake-up is a hint, never the grant itself: the woken waiter reads its grant from the database, and a
waiter whose wake-up was lost, garbled or never sent still finds its lease at its next poll (which is
why polling stays, at ``PUSHED_POLL_S``). Each wake-up is addressed to one queue entry, so a release
wakes the one process it served, not every waiter of the pool (on a 2-core CI host, 24 waiters woken
per release cost more CPU than the release).

PostgreSQL: a NOTIFY channel per queue entry (``pg_queue_channel``), delivered by the server at commit.

SQLite (one host): a Unix datagram socket per waiter in Linux's abstract namespace, named after the
database file's (device, inode) and the queue id; after its COMMIT the releaser sends the queue id to
it. Abstract sockets need no directory, leave no file behind when a waiter is killed, and have no path
length limit; a send to a waiter that is not (or no longer) listening fails at once and is ignored.
Elsewhere than Linux, and when a socket cannot be bound, waiters poll as before.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
from collections.abc import Iterable
from pathlib import Path

from farm.db.base import Listener

log = logging.getLogger(__name__)

ABSTRACT_SOCKETS = sys.platform.startswith("linux")
# A datagram carries one queue id in ASCII; anything longer is not ours.
MAX_DATAGRAM = 32



class SocketAddresses:
    """The abstract socket names of one SQLite pool's waiters. The database file's (device, inode)
    identify the pool whatever path a process opened it by, and a pool file deleted and created anew
    gets new names (its queue ids start again from 1)."""

    def __init__(self, db_path: Path):
        self._db_path = db_path
        self._prefix: bytes | None = None

    def of(self, queue_id: int) -> bytes | None:
        """The address of queue entry ``queue_id``'s waiter; None if there is no wake-up here."""
        if not ABSTRACT_SOCKETS:
            return None
        if self._prefix is None:
            try:
                st = os.stat(self._db_path)
            except OSError:
                return None
            self._prefix = f"\0ptefarm-pool-{st.st_dev:x}-{st.st_ino:x}-q".encode()
        return self._prefix + str(int(queue_id)).encode()


class SocketListener(Listener):
    """The waiter's end: a datagram socket bound to its queue entry's address."""

    pushes = True

    def __init__(self, address: bytes, queue_id: int):
        self.queue_id = queue_id
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        try:
            self._sock.bind(address)
        except BaseException:
            self._sock.close()
            raise

    def wait(self, timeout: float) -> set[int]:
        self._sock.settimeout(max(timeout, 0.0))
        try:
            data = self._sock.recv(MAX_DATAGRAM)
        except (TimeoutError, BlockingIOError, InterruptedError):
            return set()
        try:
            return {int(data.decode("ascii"))}
        except (UnicodeDecodeError, ValueError):
            # Not a queue id (a stray sender): ignore it, the poll that follows finds out.
            log.debug("ignored a garbled pool wake-up: %r", data[:MAX_DATAGRAM])
            return set()

    def close(self) -> None:
        self._sock.close()


class SocketWaker:
    """The releaser's end: sends each granted queue id to its waiter's socket, never blocking (a full
    or missing receiver only loses a hint)."""

    def __init__(self, addresses: SocketAddresses):
        self._addresses = addresses
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()

    def listener(self, queue_id: int | None) -> Listener:
        address = None if queue_id is None else self._addresses.of(queue_id)
        if address is None:
            return Listener()
        try:
            return SocketListener(address, queue_id)
        except OSError as e:
            # Taken (a stray process squats the name) or not permitted: polling still finds the grant.
            log.debug("pool wake-up socket for queue entry %d unavailable (%s); polling", queue_id, e)
            return Listener()

    def wake(self, queue_ids: Iterable[int]) -> None:
        for queue_id in queue_ids:
            address = self._addresses.of(queue_id)
            if address is None:
                return
            try:
                self._socket().sendto(str(int(queue_id)).encode("ascii"), address)
            except OSError:
                pass  # nobody listening (yet, or any more), or its queue is full: it polls

    def _socket(self) -> socket.socket:
        with self._lock:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._sock.setblocking(False)
            return self._sock

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None
