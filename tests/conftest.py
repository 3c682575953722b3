"""Shared test configuration. Keep it minimal; append, don't rewrite."""

from __future__ import annotations

import ipaddress
import signal
import socket
from collections.abc import Iterator
from typing import Any

import pytest

# ------------------------------------------------------------------------------- Ctrl-C in the children

# Started in the background by a non-interactive shell (`.ci/run &`), the tests inherit SIGINT ignored, and
# so would every program they start — whose Ctrl-C handling the CLI tests check. Python's own handler here
# (reset to the default in a child at exec) gives them the terminal's usual disposition.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# ----------------------------------------------------------------------------- no real network in tests


class NetworkBlockedError(ConnectionRefusedError):
    """Raised instead of opening a connection to anything but this machine."""


_LOCAL_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", socket.gethostname()}


def _is_local_host(host: object) -> bool:
    if host is None:
        return True
    if isinstance(host, bytes):
        host = host.decode()
    if not isinstance(host, str):
        return False
    if host in _LOCAL_NAMES or host.endswith(".localhost") or host in ("", "0.0.0.0", "::"):
        return True
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def _check_address(sock: socket.socket, address: Any) -> None:
    if sock.family in (socket.AF_INET, socket.AF_INET6) and not _is_local_host(address[0]):
        raise NetworkBlockedError(f"network access is blocked in tests: connection to {address!r} refused")


_real_connect = socket.socket.connect
_real_connect_ex = socket.socket.connect_ex
_real_getaddrinfo = socket.getaddrinfo


def _guarded_connect(self: socket.socket, address: Any) -> None:
    _check_address(self, address)
    _real_connect(self, address)


def _guarded_connect_ex(self: socket.socket, address: Any) -> int:
    _check_address(self, address)
    return _real_connect_ex(self, address)


def _guarded_getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
    if not _is_local_host(host):
        raise NetworkBlockedError(f"network access is blocked in tests: lookup of {host!r} refused")
    return _real_getaddrinfo(host, *args, **kwargs)


@pytest.fixture(autouse=True, scope="session")
def _block_network() -> Iterator[None]:
    """Tests talk to loopback only: connections and DNS lookups of other hosts are refused."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(socket.socket, "connect", _guarded_connect)
        patch.setattr(socket.socket, "connect_ex", _guarded_connect_ex)
        patch.setattr(socket, "getaddrinfo", _guarded_getaddrinfo)
        yield


# ------------------------------------------------------------------------------------ PostgreSQL

PG_DSN = "postgresql://postgres@127.0.0.1:5432/test"


def postgres_up() -> None:
    """The tests use the machine's PostgreSQL; when it is not answering, start it (never skip)."""
    import subprocess
    from pathlib import Path

    import psycopg

    try:
        psycopg.connect(PG_DSN, connect_timeout=3).close()
        return
    except psycopg.OperationalError:
        pass
    version = sorted(p.name for p in Path("/etc/postgresql").iterdir())[-1]
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "start"], check=False, timeout=60
    )
    psycopg.connect(PG_DSN, connect_timeout=10).close()


def private_schema(prefix: str) -> Iterator[str]:
    """A DSN whose search path is a new schema (created now, dropped with everything in it afterwards)."""
    import uuid

    import psycopg

    postgres_up()
    schema = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    yield f"{PG_DSN}?options=-csearch_path%3D{schema}"
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA {schema} CASCADE")


# ------------------------------------------------------------------- the local model's prompt cache


@pytest.fixture(scope="session", autouse=True)
def _private_prompt_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The local model's prompt cache of this test session (and of the CLIs it starts): the tests never
    evict the user's own entries (`THINKLOOP_PROMPT_CACHE`, unless the caller set it)."""
    import os
    import shutil

    if "THINKLOOP_PROMPT_CACHE" in os.environ:
        yield
        return
    path = tmp_path_factory.mktemp("prompt-cache")
    os.environ["THINKLOOP_PROMPT_CACHE"] = str(path)
    try:
        yield
    finally:
        del os.environ["THINKLOOP_PROMPT_CACHE"]
        shutil.rmtree(path, ignore_errors=True)


# ------------------------------------------------------------------------- a test session that ends


EXIT_WATCHDOG = 120.0  # seconds pytest may take to exit once the tests are done


def pytest_unconfigure(config: pytest.Config) -> None:
    """Once the tests are done, the process must exit: a thread the tests left behind that the interpreter
    joins at exit (a `ThreadPoolExecutor` worker, a non-daemon thread) would otherwise hold the run open
    until CI's timeout, with all tests passed. After `EXIT_WATCHDOG` seconds every thread's stack is
    written to stderr and the process exits with status 1, naming the culprit."""
    import faulthandler
    import sys

    stream = sys.__stderr__
    if stream is not None:
        faulthandler.dump_traceback_later(EXIT_WATCHDOG, exit=True, file=stream)
