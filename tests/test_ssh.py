"""`ssh_execute` against a real OpenSSH server started on 127.0.0.1 with throw-away keys."""

from __future__ import annotations

import asyncio
import getpass
import json
import logging
import os
import re
import secrets
import socket
import subprocess
import time
import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from thinkloop import Agent, RiskLevel
from thinkloop._events import Event
from thinkloop.safety import SafetyController
from thinkloop.testing import ScriptedModel
from thinkloop.tools import ShellCommandError, SSHExecutor, SSHHost, SSHToolError, ssh_tool

asyncssh = pytest.importorskip("asyncssh", reason="ssh_execute needs the `ops` extra (asyncssh)")

SSHD = "/usr/sbin/sshd"
PASSWORD = "hunter2-Very-Secret-Pa55"

pytestmark = [
    pytest.mark.ssh,
    pytest.mark.skipif(
        not os.path.exists(SSHD),
        reason=f"{SSHD} is absent: install Debian's openssh-server to run these tests",
    ),
]


@dataclass
class Server:
    port: int
    client_key: Path
    known_hosts: Path
    wrong_known_hosts: Path
    stranger_key: Path
    user: str

    def host(self, **overrides: Any) -> SSHHost:
        fields: dict[str, Any] = {
            "hostname": "127.0.0.1",
            "port": self.port,
            "username": self.user,
            "client_keys": [str(self.client_key)],
            "known_hosts": str(self.known_hosts),
            "connect_timeout": 5.0,
        }
        return SSHHost(**(fields | overrides))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _write_key(path: Path) -> Any:
    key = asyncssh.generate_private_key("ssh-ed25519")
    key.write_private_key(str(path))
    path.chmod(0o600)
    return key


def _wait_listening(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30  # sshd starts in milliseconds, but a busy machine may take seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            err = process.stderr.read().decode() if process.stderr else ""
            pytest.fail(f"sshd exited with {process.returncode}: {err}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.01)
    pytest.fail("sshd did not start listening within 30 s")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    base = tmp_path_factory.mktemp("sshd")
    host_key = _write_key(base / "host_key")
    client = _write_key(base / "client_key")
    _write_key(base / "stranger_key")
    other_host = asyncssh.generate_private_key("ssh-ed25519")
    (base / "authorized_keys").write_text(client.export_public_key().decode())
    port = _free_port()
    entry = f"[127.0.0.1]:{port} "
    (base / "known_hosts").write_text(entry + host_key.export_public_key().decode())
    (base / "wrong_known_hosts").write_text(entry + other_host.export_public_key().decode())
    config = base / "sshd_config"
    config.write_text(
        "\n".join(
            [
                "ListenAddress 127.0.0.1",
                f"HostKey {base / 'host_key'}",
                f"AuthorizedKeysFile {base / 'authorized_keys'}",
                f"PidFile {base / 'sshd.pid'}",
                "StrictModes no",
                "UsePAM no",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "PermitRootLogin prohibit-password",
                "LogLevel ERROR",
                "",
            ]
        )
    )
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege separation directory
    process = subprocess.Popen(
        [SSHD, "-D", "-e", "-f", str(config), "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        _wait_listening(port, process)
        yield Server(
            port=port,
            client_key=base / "client_key",
            known_hosts=base / "known_hosts",
            wrong_known_hosts=base / "wrong_known_hosts",
            stranger_key=base / "stranger_key",
            user=getpass.getuser(),
        )
    finally:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stderr:
            process.stderr.close()


def _running(command_line: str) -> bool:
    """True if a live process (not a zombie) has `command_line` in its command line, after a grace period."""
    for _ in range(300):
        if not any(_is_live(proc) for proc in _processes_with(command_line)):
            return False
        time.sleep(0.01)  # SIGKILL delivery is asynchronous
    return True


def _processes_with(command_line: str) -> list[Path]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if (
                proc.name.isdigit()
                and command_line in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            ):
                found.append(proc)
        except OSError:
            continue
    return found


def _is_live(proc: Path) -> bool:
    try:
        return (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


async def run(executor_or_tool: Any, host: str, command: str) -> dict[str, Any]:
    if isinstance(executor_or_tool, SSHExecutor):
        return await executor_or_tool.execute(host, command)
    tool = executor_or_tool
    result = await tool.invoke(tool.validate({"host": host, "command": command}))
    assert isinstance(result, dict)
    return result


async def test_echo_exit_codes_and_stderr(server: Server) -> None:
    tool = ssh_tool({"lab": server.host()})
    ok = await run(tool, "lab", "echo hello from $(hostname >/dev/null && echo ssh)")
    assert ok["host"] == "lab"
    assert (ok["exit_code"], ok["stdout"], ok["stderr"], ok["timed_out"]) == (
        0,
        "hello from ssh\n",
        "",
        False,
    )
    assert ok["duration"] > 0
    failed = await run(tool, "lab", "echo bad >&2; exit 7")
    assert (failed["exit_code"], failed["stdout"], failed["stderr"]) == (7, "", "bad\n")
    quoted = await run(tool, "lab", """x=1; printf '%s|' "a b" 'c'"d" "$x" '$x' >&2""")
    assert quoted["stderr"] == "a b|cd|1|$x|"  # quoting and stderr reach the caller unaltered


async def test_timeout_kills_the_remote_command(server: Server) -> None:
    tool = ssh_tool({"lab": server.host()}, timeout=0.5)
    duration = f"{30 + secrets.randbelow(10**6) / 10**7:.7f}"  # a unique command line to look for
    result = await run(tool, "lab", f"echo started; sleep {duration}; echo never")
    assert result["timed_out"] is True and result["exit_code"] is None
    assert result["stdout"] in ("", "started\n")  # what came before the timeout is kept
    assert "[killed: timed out after 0.5 s]" in result["stderr"]
    assert not _running(f"sleep {duration}")  # the server is this machine: its processes are visible


async def test_output_is_truncated(server: Server) -> None:
    tool = ssh_tool({"lab": server.host()}, output_limit=500)
    result = await run(tool, "lab", "echo FIRST; seq 1 50000; echo LAST")
    assert len(result["stdout"]) <= 500
    assert result["stdout"].startswith("FIRST") and result["stdout"].rstrip().endswith("LAST")


async def test_unknown_host_is_a_clear_error(server: Server) -> None:
    executor = SSHExecutor({"lab": server.host(), "db": server.host()})
    with pytest.raises(SSHToolError, match=r"unknown host 'web9': the configured hosts are db, lab"):
        await executor.execute("web9", "uptime")


async def test_host_key_mismatch_is_refused(server: Server) -> None:
    executor = SSHExecutor({"lab": server.host(known_hosts=str(server.wrong_known_hosts))})
    with pytest.raises(SSHToolError, match="host key of lab .* is not trusted by known_hosts"):
        await executor.execute("lab", "touch /tmp/should-not-run")


@pytest.fixture
def empty_known_hosts(tmp_path: Path) -> Path:
    path = tmp_path / "known_hosts"
    path.write_text("")
    return path


async def test_a_host_missing_from_known_hosts_is_refused(server: Server, empty_known_hosts: Path) -> None:
    empty = empty_known_hosts
    executor = SSHExecutor({"lab": server.host(known_hosts=str(empty))})
    with pytest.raises(SSHToolError, match="refusing to connect"):
        await executor.execute("lab", "echo never")


async def test_host_checks_can_be_skipped_only_explicitly(server: Server) -> None:
    skipping = SSHExecutor(
        {"lab": server.host(known_hosts=str(server.wrong_known_hosts), verify_host_key=False)}
    )
    assert (await skipping.execute("lab", "echo trusted"))["stdout"] == "trusted\n"
    default = SSHHost(hostname="127.0.0.1").connect_options()
    assert "known_hosts" not in default  # asyncssh's default: check ~/.ssh/known_hosts
    assert server.host(verify_host_key=False).connect_options()["known_hosts"] is None


async def test_refused_connection_and_failed_authentication(server: Server) -> None:
    closed = SSHExecutor({"gone": server.host(port=_free_port())})
    with pytest.raises(SSHToolError, match=r"cannot connect to gone \(.*127.0.0.1:\d+\)"):
        await closed.execute("gone", "uptime")
    stranger = SSHExecutor({"lab": server.host(client_keys=[str(server.stranger_key)], password=PASSWORD)})
    with pytest.raises(SSHToolError, match="authentication to lab .* failed") as info:
        await stranger.execute("lab", "uptime")
    assert PASSWORD not in str(info.value)


async def test_pooled_connections_are_reused(server: Server) -> None:
    executor = SSHExecutor({"lab": server.host()}, reuse_connections=True)
    try:
        first = await executor.execute("lab", "echo $SSH_CONNECTION")
        second = await executor.execute("lab", "echo $SSH_CONNECTION")
        assert first["stdout"] == second["stdout"] != ""  # same client port: the same connection
    finally:
        await executor.aclose()


async def test_password_never_appears_in_events_results_state_or_logs(
    server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # asyncssh logs connections and authentication at debug level
    hosts = {
        "lab": server.host(password=PASSWORD),
        "locked": server.host(client_keys=[str(server.stranger_key)], password=PASSWORD),
    }
    tool = ssh_tool(hosts)
    assert PASSWORD not in repr(hosts["lab"]) and PASSWORD not in hosts["lab"].model_dump_json()
    assert PASSWORD not in json.dumps(tool.parameters) + tool.description
    model = ScriptedModel(
        [
            {"tool_calls": [{"name": "ssh_execute", "args": {"host": "lab", "command": "echo up"}}]},
            {"tool_calls": [{"name": "ssh_execute", "args": {"host": "locked", "command": "echo up"}}]},
            {"tool_calls": [{"name": "ssh_execute", "args": {"host": "lab", "command": "rm -rf /"}}]},
            "lab is up",
        ]
    )
    events: list[Event] = []
    agent = Agent(model, tools=[tool], safety=SafetyController("balanced"))
    result = await agent.run("is lab up?", on_event=events.append)
    everything = "\n".join(e.model_dump_json() for e in events) + result.state.to_json()
    assert PASSWORD not in everything
    assert "asyncssh" in {r.name.split(".")[0] for r in caplog.records}  # the logs were captured
    assert PASSWORD not in caplog.text
    observations = [m.content for m in result.state.messages if m.role == "tool"]
    assert json.loads(observations[0])["stdout"] == "up\n"
    assert "authentication to locked" in observations[1]
    assert observations[2].startswith("Blocked by the safety policy")
    risks = [(e.risk, e.decision) for e in events if e.type == "tool_call"]
    assert risks == [(RiskLevel.LOW, "auto"), (RiskLevel.LOW, "auto"), (RiskLevel.CRITICAL, "blocked")]


async def test_output_that_is_not_utf8_keeps_the_result(server: Server) -> None:
    # read as UTF-8 text, one invalid byte lost everything: exit_code None, stdout and stderr empty
    tool = ssh_tool({"lab": server.host()})
    result = await run(tool, "lab", r"printf 'ok \377\376 bytes\303'; printf 'err \377' >&2; exit 3")
    assert (result["exit_code"], result["timed_out"]) == (3, False)
    assert result["stdout"] == "ok \ufffd\ufffd bytes\ufffd" and result["stderr"] == "err \ufffd"


async def test_a_command_reading_stdin_gets_end_of_file(server: Server) -> None:
    # stdin was left open: `cat` (or any prompt) waited for input until the timeout killed it
    tool = ssh_tool({"lab": server.host()}, timeout=20)
    result = await run(tool, "lab", "cat; read answer || echo no input")
    assert (result["exit_code"], result["stdout"], result["timed_out"]) == (0, "no input\n", False)


async def test_a_huge_output_is_streamed_not_held_in_memory(server: Server) -> None:
    # the whole output was collected before truncation: GBs of output meant GBs of memory
    tool = ssh_tool({"lab": server.host()}, output_limit=1_000)
    tracemalloc.start()
    try:
        result = await run(
            tool, "lab", "echo FIRST; head -c 60000000 /dev/zero | tr '\\0' x; echo; echo LAST"
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result["exit_code"] == 0 and len(result["stdout"]) <= 1_000
    assert result["stdout"].startswith("FIRST\nxxx") and result["stdout"].endswith("xxx\nLAST\n")
    assert peak < 20_000_000  # 60 MB of output


async def test_a_background_job_holding_the_output_is_explained(server: Server) -> None:
    tool = ssh_tool({"lab": server.host()}, timeout=1)
    duration = f"{30 + secrets.randbelow(10**6) / 10**7:.7f}"
    result = await run(tool, "lab", f"sleep {duration} & echo started")
    assert result["timed_out"] is True and result["stdout"] == "started\n"
    assert "The shell had exited (code 0), but a background process kept its output open" in result["stderr"]
    assert not _running(f"sleep {duration}")


async def test_a_port_that_never_answers_times_out_with_a_reason(server: Server) -> None:
    with socket.socket() as silent:  # accepts connections (the backlog) but never speaks SSH
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        port = silent.getsockname()[1]
        executor = SSHExecutor({"mute": server.host(port=port, connect_timeout=0.5)})
        with pytest.raises(SSHToolError) as info:
            await executor.execute("mute", "uptime")
    # the message ended at "cannot connect to mute (…):" with nothing after it
    assert str(info.value).endswith(
        "no SSH handshake within 0.5 s (the host is down or unreachable, or the port is not an SSH server); "
        "check the address and port"
    )


async def test_parallel_calls_share_one_pooled_connection(server: Server) -> None:
    # each of the parallel calls (a plan's tasks on one host) opened a connection; the pool kept the
    # last one, and aclose() never closed the others
    executor = SSHExecutor({"lab": server.host()}, reuse_connections=True)
    try:
        results = await asyncio.gather(*(executor.execute("lab", "echo $SSH_CONNECTION") for _ in range(4)))
    finally:
        await executor.aclose()
    assert len({r["stdout"] for r in results}) == 1 and results[0]["stdout"] != ""


@pytest.mark.parametrize(
    ("command", "problem"),
    [
        ("echo a\x00b", "the command contains a NUL character"),  # the connection was lost
        ("echo \ud800", "invalid Unicode (a lone surrogate"),  # a raw UnicodeEncodeError
        ("   ", "the command is empty"),
        ("echo " + "x" * 200_000, "more than the 131,071 bytes the system accepts"),  # connection reset
        ("echo '" + "'" * 40_000 + "'", "once quoted for the remote shell, more than the 131,071 bytes"),
    ],
)
async def test_commands_that_cannot_run_are_refused_before_connecting(command: str, problem: str) -> None:
    executor = SSHExecutor({"nowhere": SSHHost(hostname="127.0.0.1", port=_free_port(), connect_timeout=0.5)})
    with pytest.raises(ShellCommandError, match=re.escape(problem)):  # not "cannot connect": checked first
        await executor.execute("nowhere", command)


def test_one_pooling_executor_used_from_several_threads_keeps_a_pool_per_event_loop(server: Server) -> None:
    """Two threads, each with its own event loop (`run_sync` in each), one executor reusing connections:
    a call on the second loop threw away the first loop's pool (and left its connection open), so the
    first loop's next call opened a new one."""
    import threading

    executor = SSHExecutor({"lab": server.host()}, reuse_connections=True)
    turn = {name: threading.Event() for name in ("a1", "b1")}
    seen: dict[str, list[str]] = {"a": [], "b": []}
    errors: list[BaseException] = []

    async def calls(name: str, wait_for: str | None, then: str, again_after: str | None) -> None:
        if wait_for is not None:
            await asyncio.to_thread(turn[wait_for].wait, 60)
        seen[name].append((await executor.execute("lab", "echo $SSH_CONNECTION"))["stdout"])
        turn[then].set()
        if again_after is not None:
            await asyncio.to_thread(turn[again_after].wait, 60)
        seen[name].append((await executor.execute("lab", "echo $SSH_CONNECTION"))["stdout"])

    def thread(*args: Any) -> None:
        try:
            asyncio.run(calls(*args))
        except BaseException as exc:
            errors.append(exc)

    # a: call, (b calls), call again; b: call, then again after a's second call
    first = threading.Thread(target=thread, args=("a", None, "a1", "b1"), daemon=True)
    second = threading.Thread(target=thread, args=("b", "a1", "b1", None), daemon=True)
    first.start()
    second.start()
    first.join(60)
    second.join(60)
    assert errors == [] and not first.is_alive() and not second.is_alive()
    assert len(set(seen["a"])) == 1 and len(set(seen["b"])) == 1  # each loop reused its own connection
    assert seen["a"][0] != seen["b"][0] != ""  # and the two loops did not share one
