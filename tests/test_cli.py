"""Black-box tests of the `thinkloop` command line: the real CLI in a subprocess, with a scripted model.

Every test runs `python -m thinkloop.cli …` (those of the `thinkloop` script's start, the script itself)
with `THINKLOOP_HOME` in a temporary directory (so the default SQLite store is there) and
`--model script:FILE`. Approvals are tested with no terminal (stdin is
/dev/null) and at a terminal (a pseudo-terminal the CLI owns as its controlling terminal).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from thinkloop._events import event_from_json

CLI = [sys.executable, "-m", "thinkloop.cli"]
RUN_ID = re.compile(r"\b[0-9a-f]{32}\b")


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str

    def events(self) -> list[dict[str, Any]]:
        """The `--json` output: every stdout line must be one JSON event."""
        return [json.loads(line) for line in self.stdout.splitlines()]


class Cli:
    """Runs the CLI in `tmp_path` with its own THINKLOOP_HOME; writes script files."""

    def __init__(self, tmp_path: Path) -> None:
        self.dir = tmp_path
        self.home = tmp_path / "home"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("THINKLOOP_")}
        self.env.update(THINKLOOP_HOME=str(self.home), COLUMNS="200", NO_COLOR="1", TERM="dumb")

    def script(self, replies: list[dict[str, Any]], name: str = "script.json") -> str:
        (self.dir / name).write_text(json.dumps(replies), encoding="utf-8")
        return f"script:{name}"

    def __call__(self, *args: str, timeout: float = 120) -> Result:
        proc = subprocess.run(
            [*CLI, *args],
            cwd=self.dir,
            env=self.env,
            stdin=subprocess.DEVNULL,  # no terminal: approvals cannot be asked
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        return Result(proc.returncode, proc.stdout, proc.stderr)

    def popen(self, *args: str, **kwargs: Any) -> subprocess.Popen[str]:
        return subprocess.Popen([*CLI, *args], cwd=self.dir, env=self.env, text=True, **kwargs)


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return Cli(tmp_path)


def call(name: str, **args: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "args": args}]}


def text(reply: str) -> dict[str, Any]:
    return {"text": reply}


def done_result(result: Result) -> dict[str, Any]:
    events = result.events()
    assert events[-1]["type"] == "done", events[-1]
    return dict(events[-1]["result"])


def by_type(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == kind]


# =============================================================================================== run


def test_run_answers_with_the_calculator(cli: Cli) -> None:
    model = cli.script([call("calculator", expression="17*23"), text("17*23 = 391.")])
    r = cli("run", "What is 17*23?", "--model", model)
    assert r.code == 0, r.stderr
    lines = r.stdout.splitlines()
    first = RUN_ID.search(lines[0])
    assert first is not None and lines[0].startswith("run "), lines[0]
    assert "17*23 = 391." in r.stdout
    assert "stop reason final_answer" in r.stdout
    assert lines[-1].endswith(f"run {first.group()}")  # the same run id at the start and the end
    assert r.stdout.count("17*23 = 391.") == 1  # the streamed answer is not printed again after the panel


def test_learn_keeps_lessons_and_a_later_similar_run_gets_them_in_its_prompt(cli: Cli) -> None:
    model = cli.script([call("calculator", expression="17*23"), text("17*23 = 391.")])
    first = cli("run", "Multiply 17 by 23 with the calculator", "--model", model, "--learn", "--json")
    assert first.code == 0, first.stderr
    lessons = (cli.home / "lessons.jsonl").read_text().splitlines()
    assert len(lessons) == 1 and "calculator(expression)" in json.loads(lessons[0])["text"]
    second = cli("run", "Multiply 19 by 29 with the calculator", "--model", model, "--learn", "--json")
    assert second.code == 0, second.stderr
    state = done_result(second)["state"]
    assert state["metadata"]["lessons"] == [json.loads(lessons[0])["text"]]
    without = cli("run", "Multiply 19 by 29 with the calculator", "--model", model, "--json")
    assert done_result(without)["state"]["metadata"].get("lessons") is None  # no --learn: no experience


def test_trace_writes_the_runs_spans_as_json_lines(cli: Cli) -> None:
    model = cli.script([call("calculator", expression="17*23"), text("17*23 = 391.")])
    r = cli("run", "What is 17*23?", "--model", model, "--trace", "trace.jsonl")
    assert r.code == 0, r.stderr
    spans = [json.loads(line) for line in (cli.dir / "trace.jsonl").read_text().splitlines()]
    names = sorted(
        s["name"].split(" ")[0] + (" calculator" if "calculator" in s["name"] else "") for s in spans
    )
    assert names == ["chat", "chat", "execute_tool calculator", "invoke_agent"]
    run = next(s for s in spans if s["name"] == "invoke_agent agent")
    assert run["attributes"]["thinkloop.stop_reason"] == "final_answer"


def test_json_prints_every_event_as_one_json_line(cli: Cli) -> None:
    model = cli.script([call("calculator", expression="17*23"), text("17*23 = 391.")])
    r = cli("run", "What is 17*23?", "--model", model, "--json")
    assert r.code == 0, r.stderr
    events = r.events()
    types = [e["type"] for e in events]
    assert types[0] == "run_started" and types[-1] == "done"
    assert types.count("done") == 1
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert len({e["run_id"] for e in events}) == 1
    assert {"tool_call", "tool_result", "progress"} <= set(types)
    for line in r.stdout.splitlines():  # each line is a valid typed event
        assert event_from_json(line).type in types
    (result,) = by_type(events, "tool_result")
    assert result["output"] == "391" and result["success"] is True
    done = done_result(r)
    assert done["output"] == "17*23 = 391."
    assert done["stop_reason"] == "final_answer"
    assert done["state"]["run_id"] == events[0]["run_id"]


def test_live_view_renders_thoughts_calls_results_hints_and_the_answer(cli: Cli) -> None:
    model = cli.script(
        [
            {"text": "Let me compute 17*23 first.", **call("calculator", expression="17*23")},
            call("calculator", expression="391+1"),
            text("The answer is 392."),
        ]
    )
    r = cli("run", "compute", "--model", model, "--max-steps", "4")
    assert r.code == 0, r.stderr
    out = r.stdout
    assert "💭 Let me compute 17*23 first." in out
    assert out.count("Let me compute 17*23 first.") == 1  # the streamed thought is not shown twice
    assert '→ calculator({"expression": "17*23"}) low' in out
    assert "✓ 391" in out and "✓ 392" in out
    assert "⚑ hint (summarise): Checkpoint: you are halfway through your step budget" in out
    assert "╭" in out and " answer " in out and "│ The answer is 392. │" in out
    assert "stop reason final_answer · 3 steps · 2 tool calls" in out


# ======================================================================================== exit codes


def test_budget_stop_exits_3_with_the_best_effort_answer(cli: Cli) -> None:
    model = cli.script(
        [
            call("calculator", expression="1+1"),
            call("calculator", expression="2+2"),
            text("Best effort: 4."),  # the forced final answer after the step limit
        ]
    )
    r = cli("run", "keep going", "--model", model, "--max-steps", "2")
    assert r.code == 3, r.stdout + r.stderr
    assert "stopped: max_steps (best-effort answer)" in r.stdout
    assert "Best effort: 4." in r.stdout
    assert "The run reached the step limit of 2." in r.stdout
    assert "stop reason max_steps" in r.stdout


def test_budget_stop_in_json(cli: Cli) -> None:
    model = cli.script(
        [call("calculator", expression="1+1"), call("calculator", expression="2+2"), text("4")]
    )
    r = cli("run", "keep going", "--model", model, "--max-steps", "2", "--json")
    assert r.code == 3
    done = done_result(r)
    assert done["stop_reason"] == "max_steps" and done["forced_final"] is True and done["output"] == "4"


@pytest.mark.parametrize(
    ("replies", "args", "reason"),
    [
        ([call("calculator", expression="17*23"), text("391")], ["--max-tokens", "100"], "max_tokens"),
        (
            [call("shell", command="sleep 2"), text("late")],
            ["--tools", "shell", "--yes", "--timeout", "1"],
            "timeout",
        ),
        ([call("calculator", expression="1+1")] * 10 + [text("gave up")], [], "dangerous_loop"),
    ],
)
def test_other_limits_exit_3(cli: Cli, replies: list[dict[str, Any]], args: list[str], reason: str) -> None:
    r = cli("run", "x", "--model", cli.script(replies), *args, "--json")
    assert r.code == 3, r.stderr
    assert done_result(r)["stop_reason"] == reason


def test_model_error_exits_1(cli: Cli) -> None:
    model = cli.script([call("calculator", expression="1+1")])  # no reply left for step 2
    r = cli("run", "x", "--model", model)
    assert r.code == 1, r.stdout + r.stderr
    assert (
        "error: test: scripted reply failed: the script has 1 replies and reply 2 was asked for" in r.stdout
    )
    assert r.stdout.count("scripted reply failed") == 1  # shown once, not again under the panel
    assert "stop reason error" in r.stdout
    assert "Traceback" not in r.stdout + r.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tools", "foo"], "error: unknown built-in tool(s) foo: choose from shell, ssh_execute"),
        (["--model", "script:missing.json"], "error: script file 'missing.json' does not exist"),
        (["--model", "script:broken.json"], "error: script file 'broken.json' is not valid JSON"),
        (["--model", "script:object.json"], "must hold a JSON list of replies"),
        (["--model", "script:deep.json"], "error: script file 'deep.json' is nested too deeply to read"),
        (
            ["--model", "script:calls.json"],
            "error: a scripted reply's tool_calls must be a list of calls, not 5",
        ),
        (["--model", "nope:x"], "error: unknown model 'nope:x'"),
        (["--model", "script:adir"], "error: script file 'adir' is a directory, not a JSON file of replies"),
        (["--model", ""], "error: --model is empty (''): name a model"),
        (["--model", " "], "error: --model is empty (' '): name a model"),
        (["--store", "nope://x"], "error: unknown store URL 'nope://x'"),
        (["--timeout", "0"], "error: --timeout must be above 0, got 0"),
        (["--max-cost", "-1"], "error: --max-cost must be above 0, got -1"),
        (["--tools", "ssh_execute"], "error: ssh_execute needs hosts"),
        (["--tools", "ssh_execute", "--hosts", "missing-hosts.json"], "cannot read the hosts file"),
        (
            ["--tools", "ssh_execute", "--hosts", "bad-hosts.json"],
            "bad-hosts.json': web1.bogus: Extra inputs",
        ),
        (
            ["--tools", "ssh_execute", "--hosts", "deep.json"],
            "error: hosts file 'deep.json' is nested too deeply to read as JSON",
        ),
        (["--tools", "shell", "--workspace", "no/such/dir"], "does not exist"),
        (
            ["--trace", "adir"],
            "error: cannot write the trace file: Is a directory: 'adir'; give --trace a file",
        ),
        (["--trace", "no/such/dir/t.jsonl"], "cannot write the trace file: No such file or directory"),
    ],
)
def test_bad_options_exit_2_with_one_clear_line(cli: Cli, args: list[str], message: str) -> None:
    (cli.dir / "broken.json").write_text("[{", encoding="utf-8")
    (cli.dir / "object.json").write_text('{"text": "hi"}', encoding="utf-8")
    (cli.dir / "deep.json").write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    (cli.dir / "calls.json").write_text('[{"tool_calls": 5}]', encoding="utf-8")
    (cli.dir / "bad-hosts.json").write_text('{"web1": {"hostname": "h", "bogus": 1}}', encoding="utf-8")
    (cli.dir / "adir").mkdir()
    model = cli.script([text("unused")])
    r = cli("run", "x", "--model", model, *args)
    assert r.code == 2, r.stdout + r.stderr
    assert r.stdout == ""  # errors go to stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("error: ") and message in lines[0], lines[0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-steps", "0"], "Invalid value for '--max-steps'"),
        (["--max-tokens", "0"], "Invalid value for '--max-tokens'"),
        (["--safety", "reckless"], "Invalid value for '--safety'"),
        (["--mode", "telepathy"], "Invalid value for '--mode'"),
        (["--no-such-option"], "No such option: --no-such-option"),
        (["--timeout", "nan"], "Invalid value for '--timeout': nan is not a limit"),
        (["--timeout", "inf"], "Invalid value for '--timeout': inf is not a limit"),
        (["--max-cost", "nan"], "Invalid value for '--max-cost': nan is not a limit"),
    ],
)
def test_invalid_option_values_are_usage_errors(cli: Cli, args: list[str], message: str) -> None:
    r = cli("run", "x", "--model", cli.script([text("unused")]), *args)
    assert r.code == 2
    assert r.stdout == ""
    assert message in r.stderr and "Traceback" not in r.stderr
    assert any(message in line for line in r.stderr.splitlines())  # the message is on one line


def test_empty_goal_is_a_usage_error(cli: Cli) -> None:
    r = cli("run", "  ", "--model", cli.script([text("unused")]))
    assert r.code == 2
    assert r.stderr.strip() == "error: the goal must be a non-empty string, got '  '"


def run_with_stdin(cli: Cli, data: bytes, *args: str) -> Result:
    proc = subprocess.run(
        [*CLI, *args], cwd=cli.dir, env=cli.env, input=data, capture_output=True, timeout=120
    )
    return Result(proc.returncode, proc.stdout.decode(), proc.stderr.decode())


@pytest.mark.parametrize(
    ("args", "stdin", "message"),
    [
        (["run", "ab\udcffc"], b"", "error: the goal is not UTF-8 text (byte 0xff at character 3)"),
        (["run", "x", "--instructions", "\udce9t\udce9"], b"", "error: --instructions is not UTF-8 text"),
        (["run", "-"], b"caf\xe9", "error: the goal read from stdin is not UTF-8 text (byte 0xe9 at byte 4)"),
        (["run", "-"], b" \n", "error: the goal must be a non-empty string"),
        # as `submit` refuses it (PostgreSQL text cannot hold a NUL): `run` started the run
        (
            ["run", "-"],
            b"go\x00al",
            "error: the goal holds a NUL character (\\x00) at character 3 of 5, which a goal cannot hold "
            "(PostgreSQL text cannot store it): remove it from the goal, e.g. tr -d '\\000' < goal.txt | "
            "thinkloop run -",
        ),
        (["submit", "\udcff"], b"", "error: the goal is not UTF-8 text"),
    ],
)
def test_a_goal_that_is_not_utf8_text_is_a_usage_error(
    cli: Cli, args: list[str], stdin: bytes, message: str
) -> None:
    """Bytes that are not UTF-8 (on argv Python keeps them as surrogates) never reach the run."""
    r = run_with_stdin(
        cli, stdin, *args, *(["--model", cli.script([text("unused")])] if args[0] == "run" else [])
    )
    assert r.code == 2, r.stdout + r.stderr
    assert r.stdout == "" and "Traceback" not in r.stderr
    (line,) = [line for line in r.stderr.splitlines() if line.strip()]
    assert line.startswith(message), line
    assert cli("runs", "list", "--json").stdout == ""  # no run was started


def test_the_goal_can_come_from_stdin_however_long(cli: Cli) -> None:
    goal = "Summarise: " + "données 🎉 " * 100_000  # 1.3 MB: more than one argv string may hold
    r = run_with_stdin(cli, goal.encode(), "run", "-", "--model", cli.script([text("ok")]), "--json")
    assert r.code == 0, r.stderr
    assert r.events()[0]["goal"] == goal
    (saved,) = [json.loads(line) for line in cli("runs", "list", "--json").stdout.splitlines()]
    assert saved["goal"] == goal and saved["stop_reason"] == "final_answer"


def test_help_lists_the_commands_and_options(cli: Cli) -> None:
    top = cli("--help")
    assert top.code == 0 and " run " in top.stdout and " runs " in top.stdout
    run = cli("run", "--help")
    for option in ("--model", "--max-steps", "--tools", "--safety", "--yes", "--mcp", "--json", "--hosts"):
        assert option in run.stdout


@pytest.mark.parametrize(
    ("command", "store"),
    [
        (["run", "x", "--model", "script:script.json"], "file:///{dir}/a-file"),
        (["run", "x", "--model", "script:script.json"], "sqlite:///{dir}/a-file/runs.db"),
        (["runs", "list"], "sqlite:///{dir}/a-file/runs.db"),
        (["runs", "show", "0" * 32], "file:///{dir}/a-file"),
    ],
)
def test_a_store_path_of_the_wrong_kind_is_one_clear_error(cli: Cli, command: list[str], store: str) -> None:
    """An OS error no command expected (here from the store) is one line on stderr, never a traceback; a
    read-only command given a store under a file is a usage error (the store does not exist)."""
    cli.script([text("unused")])
    (cli.dir / "a-file").write_text("not a directory", encoding="utf-8")
    r = cli(*command, "--store", store.format(dir=cli.dir))
    assert r.code == (2 if command == ["runs", "list"] else 1), r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    (line,) = [line for line in r.stderr.splitlines() if line.strip()]
    assert line.startswith("error: ") and (
        "Not a directory" in line or "is a file, not a directory" in line
    ), line


# ========================================================================================= approvals


def shell_script(cli: Cli, command: str) -> str:
    return cli.script([call("shell", command=command), text("done")])


def test_without_a_terminal_a_risky_call_is_denied_and_the_model_is_told(cli: Cli) -> None:
    workspace = cli.dir / "ws"
    workspace.mkdir()
    model = shell_script(cli, "touch x")
    r = cli(
        "run", "x", "--model", model, "--tools", "shell", "--safety", "strict", "--workspace", "ws", "--json"
    )
    assert r.code == 0, r.stderr
    assert not (workspace / "x").exists()
    events = r.events()
    (approval,) = by_type(events, "approval_requested")
    assert approval["risk"] == "medium"
    (tool_call,) = by_type(events, "tool_call")
    assert tool_call["decision"] == "denied"
    (result,) = by_type(events, "tool_result")
    assert result["error_kind"] == "denied" and not result["success"]
    assert "was not run" in result["output"] and "--yes" in result["output"]
    messages = done_result(r)["state"]["messages"]
    told = [m["content"] for m in messages if m["role"] == "tool"]
    assert told == [result["output"]]  # the model saw the denial as the call's result


def test_without_a_terminal_a_high_risk_call_is_denied_in_balanced_mode(cli: Cli) -> None:
    target = cli.dir / "ws" / "somedir"
    target.mkdir(parents=True)
    (target / "keep.txt").write_text("keep", encoding="utf-8")
    model = shell_script(cli, "rm -rf *")  # HIGH ("rm -r somedir" is MEDIUM: it runs in balanced mode)
    r = cli("run", "x", "--model", model, "--tools", "shell", "--workspace", "ws", "--json")
    assert r.code == 0, r.stderr
    assert (target / "keep.txt").read_text(encoding="utf-8") == "keep"
    (tool_call,) = by_type(r.events(), "tool_call")
    assert tool_call["risk"] == "high" and tool_call["decision"] == "denied"


def test_yes_approves_risky_calls(cli: Cli) -> None:
    (cli.dir / "ws").mkdir()
    model = shell_script(cli, "touch x")
    r = cli(
        "run",
        "x",
        "--model",
        model,
        "--tools",
        "shell",
        "--safety",
        "strict",
        "--workspace",
        "ws",
        "--yes",
        "--json",
    )
    assert r.code == 0, r.stderr
    assert (cli.dir / "ws" / "x").exists()
    (tool_call,) = by_type(r.events(), "tool_call")
    assert tool_call["decision"] == "approved"
    (result,) = by_type(r.events(), "tool_result")
    assert result["success"] and json.loads(result["output"])["exit_code"] == 0


def test_yes_never_runs_a_blacklisted_command(cli: Cli) -> None:
    (cli.dir / "ws").mkdir()
    model = shell_script(cli, "rm -rf /")
    r = cli("run", "x", "--model", model, "--tools", "shell", "--workspace", "ws", "--yes", "--json")
    assert r.code == 0, r.stderr
    events = r.events()
    assert by_type(events, "approval_requested") == []  # nobody is even asked
    (tool_call,) = by_type(events, "tool_call")
    assert tool_call["risk"] == "critical" and tool_call["decision"] == "blocked"
    (result,) = by_type(events, "tool_result")
    assert result["error_kind"] == "denied" and result["output"].startswith("Blocked by the safety policy")
    approvals = done_result(r)["state"]["approvals"]
    assert [a["decision"] for a in approvals] == ["blocked"]


# ------------------------------------------------------------------------------ at a real terminal


class Terminal:
    """The CLI in a pseudo-terminal that is its controlling terminal (so Ctrl-C sends SIGINT)."""

    def __init__(self, cli: Cli, *args: str, stdout: Any = None, stderr: Any = None) -> None:
        """`stdout`, `stderr`: a file to redirect that stream to (`> out.txt`), else the terminal."""
        import pty

        self.master, slave = pty.openpty()
        env = {**cli.env, "TERM": "xterm", "COLUMNS": "200"}
        env.pop("NO_COLOR")
        self.proc = subprocess.Popen(
            [*CLI, *args],
            cwd=cli.dir,
            env=env,
            stdin=slave,
            stdout=slave if stdout is None else stdout,
            stderr=slave if stderr is None else stderr,
            start_new_session=True,
            preexec_fn=_take_terminal,
        )
        os.close(slave)
        self.output = b""

    def read_until(self, marker: bytes, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while marker not in self.output:
            ready, _, _ = select.select([self.master], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise AssertionError(f"{marker!r} did not appear; the terminal shows:\n{self.text}")
            if not self._read():
                raise AssertionError(f"the CLI ended before {marker!r}; the terminal shows:\n{self.text}")

    def _read(self) -> bool:
        try:
            chunk = os.read(self.master, 65536)
        except OSError:  # EIO: the child closed the terminal
            return False
        self.output += chunk
        return bool(chunk)

    def type(self, keys: str) -> None:
        os.write(self.master, keys.encode())

    def wait(self, timeout: float = 60) -> int:
        code = self.proc.wait(timeout=timeout)
        while select.select([self.master], [], [], 0)[0] and self._read():
            pass
        os.close(self.master)
        return code

    @property
    def text(self) -> str:
        plain = re.sub(rb"\x1b\[[0-9;?]*[A-Za-z]", b"", self.output)
        return plain.decode("utf-8", "replace").replace("\r", "")


def _take_terminal() -> None:
    import fcntl
    import termios

    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


@contextlib.contextmanager
def terminal(cli: Cli, *args: str, stdout: Any = None, stderr: Any = None) -> Iterator[Terminal]:
    term = Terminal(cli, *args, stdout=stdout, stderr=stderr)
    try:
        yield term
    finally:
        if term.proc.poll() is None:
            term.proc.kill()
            term.proc.wait()


@pytest.mark.parametrize(("answer", "runs"), [("y", True), ("n", False)])
def test_terminal_approval_prompt(cli: Cli, answer: str, runs: bool) -> None:
    (cli.dir / "ws").mkdir()
    model = shell_script(cli, "touch x")
    with terminal(
        cli, "run", "x", "--model", model, "--tools", "shell", "--safety", "strict", "--workspace", "ws"
    ) as t:
        t.read_until(b"Run it?")
        assert (cli.dir / "ws" / "x").exists() is False
        t.type(f"{answer}\n")
        t.read_until(b"stop reason")
        assert t.wait() == 0
    screen = t.text
    assert "? approval requested for shell" in screen
    assert "Approval needed — tool shell, risk medium" in screen and "command: touch x" in screen
    assert screen.index("? approval requested") < screen.index("Run it?")  # the event line comes first
    assert (cli.dir / "ws" / "x").exists() is runs
    assert ("medium · approved" if runs else "medium · denied") in screen


def test_with_stdout_in_a_file_the_approval_prompt_is_asked_on_the_terminal(cli: Cli) -> None:
    """`thinkloop run … > out.txt` (or `| tee log`, `| head`) at a terminal wrote the question into the file
    and waited for an answer to it: the person at the terminal saw nothing, and the run hung for ever."""
    (cli.dir / "ws").mkdir()
    model = shell_script(cli, "touch x")
    args = ["run", "x", "--model", model, "--tools", "shell", "--safety", "strict", "--workspace", "ws"]
    with (cli.dir / "out.txt").open("w") as out, terminal(cli, *args, stdout=out) as t:
        t.read_until(b"Run it?", timeout=30)  # on stderr, the terminal
        assert "Approval needed — tool shell, risk medium" in t.text and "command: touch x" in t.text
        t.type("y\n")
        assert t.wait() == 0
    assert (cli.dir / "ws" / "x").exists()
    view = (cli.dir / "out.txt").read_text()
    assert "? approval requested for shell" in view and "medium · approved" in view  # the live view
    assert "Run it?" not in view


def test_with_neither_stdout_nor_stderr_a_terminal_a_risky_call_is_denied_not_asked_unseen(cli: Cli) -> None:
    """Stdin at a terminal but both outputs redirected (`> out.txt 2>&1`): a question would not be seen, so
    the call is denied as with no terminal at all (the run went on waiting for an answer for ever)."""
    (cli.dir / "ws").mkdir()
    model = shell_script(cli, "touch x")
    args = ["run", "x", "--model", model, "--tools", "shell", "--safety", "strict", "--workspace", "ws"]
    with (cli.dir / "out.txt").open("w") as out, terminal(cli, *args, "--json", stdout=out, stderr=out) as t:
        assert t.wait(timeout=30) == 0
    assert not (cli.dir / "ws" / "x").exists()
    lines = (cli.dir / "out.txt").read_text().splitlines()
    assert not any("Run it?" in line for line in lines)
    (called,) = by_type([json.loads(line) for line in lines], "tool_call")
    assert called["decision"] == "denied"
    (result,) = by_type([json.loads(line) for line in lines], "tool_result")
    assert "nobody could be asked" in result["output"] and "--yes" in result["output"]


def test_ctrl_c_at_the_approval_prompt_interrupts_at_once_and_the_run_resumes(cli: Cli) -> None:
    (cli.dir / "ws").mkdir()
    model = shell_script(cli, "touch x")
    with terminal(
        cli, "run", "x", "--model", model, "--tools", "shell", "--safety", "strict", "--workspace", "ws"
    ) as t:
        t.read_until(b"Run it?")
        t.type("\x03")  # Ctrl-C: the terminal sends SIGINT; the prompt's read never returns
        assert t.wait(timeout=30) == 130  # and yet the CLI exits
    assert "interrupted: the run is saved; continue it with" in t.text
    assert not (cli.dir / "ws" / "x").exists()
    (saved,) = [json.loads(line) for line in cli("runs", "list", "--json").stdout.splitlines()]
    assert saved["status"] == "running" and saved["stop_reason"] is None  # unfinished: resumable
    resumed = cli("runs", "resume", saved["run_id"], "--yes", "--json", timeout=60)
    assert resumed.code == 0, resumed.stderr
    assert (cli.dir / "ws" / "x").exists()  # approved this time, and run once


# ============================================================================================ Ctrl-C


def test_sigint_during_a_slow_tool_exits_130_and_leaves_the_run_resumable(cli: Cli) -> None:
    code, events, err = interrupt_a_slow_run(cli, 1)
    assert code == 130, err
    run_id = events[0]["run_id"]
    assert f"interrupted: the run is saved; continue it with `thinkloop runs resume {run_id}`" in err
    assert by_type(events, "done") == [] and by_type(events, "tool_result") == []
    (saved,) = [json.loads(line) for line in cli("runs", "list", "--json").stdout.splitlines()]
    assert saved["run_id"] == run_id and saved["status"] == "running" and saved["stop_reason"] is None
    resumed = cli("runs", "resume", run_id, "--yes", "--json", timeout=60)
    assert resumed.code == 0, resumed.stderr
    assert done_result(resumed)["output"] == "finished"
    # the shell call was cut off mid-flight: not idempotent, so it is reported, never run again unseen
    (result,) = by_type(resumed.events(), "tool_result")
    assert not result["success"] and result["error_kind"] == "unknown_outcome", result


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_sigterm_and_sighup_save_the_run_resumable_and_stop_its_shell_command(
    cli: Cli, signum: signal.Signals, code: int
) -> None:
    """`kill PID` (a service manager, a container stopping) killed the CLI outright, leaving its `shell`
    command running and no word of how to continue the run."""
    exit_code, events, err = interrupt_a_slow_run(cli, 1, signum=signum)
    assert exit_code == code, err
    run_id = events[0]["run_id"]
    assert err.splitlines()[-1] == (
        f"interrupted ({signum.name}): the run is saved; continue it with `thinkloop runs resume {run_id}`"
    )
    command = events[-1]["call"]["arguments"]["command"]
    assert not process_running(command)  # stopped with the run, not left behind
    (saved,) = [json.loads(line) for line in cli("runs", "list", "--json").stdout.splitlines()]
    assert saved["run_id"] == run_id and saved["status"] == "running"
    resumed = cli("runs", "resume", run_id, "--yes", "--json", timeout=60)
    assert resumed.code == 0 and done_result(resumed)["output"] == "finished", resumed.stderr


def test_sigint_with_an_in_memory_store_cancels_the_run(cli: Cli) -> None:
    code, events, err = interrupt_a_slow_run(cli, 1, "--store", "memory:")
    assert code == 130, err
    assert err.splitlines()[-1] == "cancelled"  # nothing would outlive the process: no resume offered
    assert events[-1]["type"] == "done" and events[-1]["result"]["stop_reason"] == "cancelled"


def process_running(command: str) -> bool:
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):  # a process that ended meanwhile
            if command.encode() in cmdline.read_bytes():
                return True
    return False


def interrupt_a_slow_run(
    cli: Cli,
    times: int,
    *args: str,
    signum: int = signal.SIGINT,
    then: list[dict[str, Any]] | None = None,
    yes: bool = True,
) -> tuple[int, list[dict[str, Any]], str]:
    """Start a run whose shell tool sleeps (then the replies `then`, default "finished"), send `signum`
    `times` times at once; exit code, events, stderr. `yes`: the run approves risky calls."""
    command = f"sleep 30.{os.getpid()}{times}{len(args)}"  # a command line to find among the processes
    model = cli.script([call("shell", command=command), *(then or [text("finished")])])
    proc = cli.popen(
        "run", "x", "--model", model, "--tools", "shell", *(["--yes"] if yes else []), "--json", *args,
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline()]
        while '"tool_call"' not in lines[-1]:
            lines.append(proc.stdout.readline())
            assert lines[-1], "the CLI ended before calling the tool"
        while not process_running(command):
            assert proc.poll() is None, "the CLI ended before the command started"
            time.sleep(0.01)  # poll: the shell command is running once its process exists
        for _ in range(times):
            proc.send_signal(signum)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, [json.loads(line) for line in [*lines, *out.splitlines()]], err


def test_a_second_sigint_while_the_run_stops_still_saves_it_resumable(cli: Cli) -> None:
    code, events, err = interrupt_a_slow_run(cli, 2)
    assert code == 130, err  # not killed by the signal (-2) however the second one falls
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert err.splitlines()[-1].startswith("interrupted: the run is saved")
    (saved,) = [json.loads(line) for line in cli("runs", "list", "--json").stdout.splitlines()]
    assert saved["run_id"] == events[0]["run_id"] and saved["status"] == "running"


def test_a_third_sigint_quits_at_once_and_the_run_is_kept(cli: Cli) -> None:
    code, events, err = interrupt_a_slow_run(cli, 3)
    assert code == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    (saved,) = [json.loads(line) for line in cli("runs", "list", "--json").stdout.splitlines()]
    assert saved["run_id"] == events[0]["run_id"]
    assert saved["status"] == "running"  # interrupted and saved, or quit mid-save at its last checkpoint
    resumed = cli("runs", "resume", saved["run_id"], "--yes", "--json", timeout=60)
    assert resumed.code == 0, resumed.stderr
    assert done_result(resumed)["output"] == "finished"


# --------------------------------------------------------------- while the `thinkloop` script starts

SCRIPT = Path(sys.executable).parent / "thinkloop"  # the console script pip generated in this venv

# Put on PYTHONPATH as `sitecustomize`: when MODULE is imported while `thinkloop` is being imported, says
# so on stdout and waits there for the test's SIGINT (Python's own handler raises KeyboardInterrupt in it).
_HOLD_THE_IMPORT = """
import sys
import time


class _Hold:
    def find_spec(self, name, path=None, target=None):
        if name == {module!r} and "thinkloop" in sys.modules:
            sys.meta_path.remove(self)
            sys.stdout.write("importing " + name + "\\n")
            sys.stdout.flush()
            time.sleep(300)  # until the SIGINT
        return None


sys.meta_path.insert(0, _Hold())
"""


@pytest.mark.parametrize("module", ["pydantic", "typer"])  # under thinkloop/__init__, thinkloop/cli
def test_ctrl_c_while_the_script_imports_thinkloop_exits_130_quietly(cli: Cli, module: str) -> None:
    hook = cli.dir / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_HOLD_THE_IMPORT.format(module=module), encoding="utf-8")
    env = {**cli.env, "PYTHONPATH": str(hook)}
    proc = subprocess.Popen(
        [str(SCRIPT), "runs", "list"], cwd=cli.dir, env=env, text=True,
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == f"importing {module}\n"  # the import is held: no race
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert (proc.returncode, out, err) == (130, "", "cancelled\n")


# Put on PYTHONPATH as `sitecustomize`: the local model's weights are "assembled" for ever (a first use that
# takes minutes), reporting progress as the real assembly does, in a temporary file it removes when it stops.
_SLOW_WEIGHTS = """
import importlib.machinery
import os
import sys
import time
from pathlib import Path


def assemble(variant=None, progress=None):
    partial = Path(os.environ["PARTIAL_WEIGHTS"])
    partial.write_bytes(b"")
    sys.stderr.write("assembling\\n")
    sys.stderr.flush()
    try:
        while True:
            time.sleep(0.01)
            if progress is not None:
                progress("assemble", 1, 100)
    finally:
        partial.unlink()


class _Patch:
    def find_spec(self, name, path=None, target=None):
        if name != "thinkloop.models._local":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            module._import_llama = lambda: None
            module._weights.assemble = assemble

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Patch())
"""


def test_ctrl_c_while_the_local_model_loads_stops_the_loading_and_exits_130(cli: Cli) -> None:
    """The first use of the local model assembles its weights (a gigabyte) in a worker thread: Ctrl-C
    cancelled the command, and the process then waited for that thread — until the assembly ended."""
    hook = cli.dir / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_SLOW_WEIGHTS, encoding="utf-8")
    partial = cli.dir / "weights.partial"
    env = {**cli.env, "PYTHONPATH": str(hook), "PARTIAL_WEIGHTS": str(partial)}
    proc = subprocess.Popen(
        [*CLI, "run", "x", "--model", "local"], cwd=cli.dir, env=env, text=True,
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        assert proc.stderr.readline() == "assembling\n"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (proc.returncode, err) == (130, "cancelled\n"), err
    assert not partial.exists()  # the assembly stopped, and cleaned up after itself
    assert "answer" not in out


def test_the_script_runs_the_cli_through_its_entry_point(cli: Cli) -> None:
    assert "from _thinkloop_cli import main" in SCRIPT.read_text(encoding="utf-8"), (
        "the installed `thinkloop` script is stale: reinstall the package (pip install -e .)"
    )
    proc = subprocess.run(
        [str(SCRIPT), "--help"], cwd=cli.dir, env=cli.env, stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert " run " in proc.stdout and " runs " in proc.stdout
    bad = subprocess.run(
        [str(SCRIPT), "run"], cwd=cli.dir, env=cli.env, stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert bad.returncode == 2 and "missing argument" in bad.stderr.lower()  # exit codes pass through


def test_importing_thinkloop_and_its_cli_leaves_ctrl_c_to_python() -> None:
    """The script's Ctrl-C handling is in its entry point: a program using the library keeps Python's."""
    check = (
        "import signal, thinkloop, thinkloop.cli, _thinkloop_cli\n"
        "assert signal.getsignal(signal.SIGINT) is signal.default_int_handler\n"
    )
    proc = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


# =============================================================================================== MCP


@pytest.mark.skipif(
    importlib.util.find_spec("mcp_server_time") is None, reason="mcp-server-time is not installed"
)
def test_mcp_server_tools(cli: Cli) -> None:
    model = cli.script([call("get_current_time", timezone="UTC"), text("It is now.")])
    server = f"{sys.executable} -m mcp_server_time"
    r = cli("run", "What time is it?", "--model", model, "--tools", "", "--mcp", server, "--json")
    assert r.code == 0, r.stderr
    (result,) = by_type(r.events(), "tool_result")
    assert result["name"] == "get_current_time" and result["success"], result
    assert json.loads(result["output"])["timezone"] == "UTC"
    assert done_result(r)["output"] == "It is now."


def test_mcp_server_that_cannot_start(cli: Cli) -> None:
    r = cli("run", "x", "--model", cli.script([text("unused")]), "--mcp", "no-such-mcp-server-xyz")
    assert r.code == 1
    assert "cannot connect to MCP server" in r.stderr and "Traceback" not in r.stderr


# ============================================================================================== runs


def test_runs_list_show_and_export_after_a_run(cli: Cli) -> None:
    model = cli.script([call("calculator", expression="17*23"), text("17*23 = 391.")])
    run = cli("run", "What is 17*23?", "--model", model, "--json")
    assert run.code == 0
    run_id = run.events()[0]["run_id"]

    listed = cli("runs", "list", "--json")
    assert listed.code == 0
    (summary,) = [json.loads(line) for line in listed.stdout.splitlines()]
    assert summary["run_id"] == run_id and summary["status"] == "done"
    assert summary["stop_reason"] == "final_answer" and summary["tool_calls"] == 1

    shown = cli("runs", "show", run_id)
    assert shown.code == 0
    assert (
        "What is 17*23?" in shown.stdout and "17*23 = 391." in shown.stdout and "calculator" in shown.stdout
    )

    exported = cli("runs", "export", run_id)
    assert exported.code == 0
    data = json.loads(exported.stdout)
    assert data["state"]["run_id"] == run_id and data["state"]["answer"] == "17*23 = 391."
    cli_metadata = data["state"]["metadata"]["cli"]
    assert isinstance(cli_metadata.pop("pid"), int) and cli_metadata.pop("host")  # the process running it
    assert cli_metadata == {  # what `runs resume` rebuilds the agent from
        "tools": "calculator",
        "instructions": "",
        "workspace": str(cli.dir.resolve()),
        "safety": "balanced",
        "mcp": [],
        "hosts": None,
        "learn": False,
    }
    printed, saved = run.events(), data["events"]
    for events in (printed, saved):  # the live state's clock moves on between `done` and its checkpoint
        events[-1]["result"]["state"].pop("elapsed")
    assert saved == printed  # the saved event log is what --json printed

    missing = cli("runs", "show", "0" * 32)
    assert missing.code == 2 and "no run" in missing.stdout + missing.stderr


@pytest.mark.parametrize("command", ["show", "replay", "export", "resume"])
def test_runs_commands_refuse_unknown_and_malformed_ids_with_exit_2(cli: Cli, command: str) -> None:
    for run_id, message in [
        ("0" * 32, "no run '00000000000000000000000000000000' in "),
        ("../x", "invalid run id '../x'"),
        ("", "invalid run id ''"),
        ("x" * 5000, f"invalid run id '{'x' * 60}'… (5,000 characters)"),  # not echoed whole
    ]:
        r = cli("runs", command, run_id, *(["--json"] if command in ("replay", "resume") else []))
        assert r.code == 2, (run_id, r.stdout + r.stderr)
        assert r.stdout == ""  # errors go to stderr: with --json, stdout holds only JSON lines
        (line,) = [line for line in r.stderr.splitlines() if line.strip()]
        assert line.startswith("error: ") and message in line and len(line) < 300, line


@pytest.mark.parametrize(
    "args", [["--store", "nope://x"], ["--status", "finished"], ["--store", "sqlite:///{dir}/corrupt.db"]]
)
def test_runs_list_json_errors_go_to_stderr(cli: Cli, args: list[str]) -> None:
    (cli.dir / "corrupt.db").write_bytes(b"not a database" * 300)
    r = cli("runs", "list", "--json", *[a.format(dir=cli.dir) for a in args])
    assert r.code in (1, 2) and r.stdout == ""
    (line,) = [line for line in r.stderr.splitlines() if line.strip()]
    assert line.startswith("error: ")


def test_resuming_a_run_that_ended_is_a_usage_error(cli: Cli) -> None:
    run = cli("run", "x", "--model", cli.script([text("done")]), "--json")
    run_id = run.events()[0]["run_id"]
    r = cli("runs", "resume", run_id)
    assert r.code == 2, r.stdout + r.stderr
    assert r.stderr.strip() == (
        f"error: run '{run_id}' already ended (final_answer) and cannot be resumed: start a new run instead"
    )


def test_resuming_a_run_the_store_cannot_read_is_an_error_not_a_usage_error(cli: Cli) -> None:
    """A corrupt state (or a store failing: locked, read-only) ended `runs resume` with exit 2, the code of
    a usage mistake, where `runs show` said the same with 1: nothing the user typed was wrong."""
    import sqlite3

    run_id = cli("run", "x", "--model", cli.script([text("done")]), "--json").events()[0]["run_id"]
    with contextlib.closing(sqlite3.connect(cli.home / "thinkloop.db")) as db, db:
        db.execute("UPDATE runs SET state = '{broken' WHERE run_id = ?", (run_id,))
    shown, resumed = cli("runs", "show", run_id), cli("runs", "resume", run_id)
    assert (shown.code, resumed.code) == (1, 1), resumed.stderr
    assert resumed.stderr == shown.stderr and "corrupt run state" in resumed.stderr
    unknown = cli("runs", "resume", "f" * 32)
    assert unknown.code == 2 and unknown.stderr.startswith("error: no run 'fff"), unknown.stderr


def test_resuming_a_run_its_process_is_still_running_is_refused(cli: Cli) -> None:
    """`runs resume` of a run another `thinkloop run` was still running took it over: the tool call in
    flight was reported as of unknown outcome, both processes went on, and the first failed at its next
    checkpoint with "another writer appended first"."""
    model = cli.script([call("shell", command="sleep 2"), text("finished")])
    proc = cli.popen(
        "run", "x", "--model", model, "--tools", "shell", "--yes", "--json",
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())
        while '"tool_call"' not in proc.stdout.readline():
            assert proc.poll() is None, "the CLI ended before calling the tool"
        refused = cli("runs", "resume", first["run_id"], "--yes")
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert refused.code == 2, refused.stdout + refused.stderr
    assert refused.stderr.startswith(f"error: run '{first['run_id']}' is still running in process {proc.pid}")
    assert proc.returncode == 0, err  # the first process finished its run undisturbed
    assert json.loads(out.splitlines()[-1])["result"]["output"] == "finished"


def test_runs_show_of_an_unfinished_run_says_how_to_resume_it_or_which_process_runs_it(cli: Cli) -> None:
    """`runs show ID --store URL` said `resume it with: thinkloop runs resume ID`, without the store: that
    command looks in the default one and finds no run. It said so, too, of a run another process was
    running at that moment — which `runs resume` refuses."""
    store = f"sqlite:///{cli.dir / 'runs.db'}"
    command = f"sleep 30.{os.getpid()}7"
    model = cli.script([call("shell", command=command), text("finished")])
    proc = cli.popen(
        "run", "x", "--model", model, "--tools", "shell", "--yes", "--json", "--store", store,
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        run_id = json.loads(proc.stdout.readline())["run_id"]
        while '"tool_call"' not in proc.stdout.readline():
            assert proc.poll() is None, "the CLI ended before calling the tool"
        while not process_running(command):
            assert proc.poll() is None, "the CLI ended before the command started"
            time.sleep(0.01)  # the run is saved as running once its shell command runs
        running = cli("runs", "show", run_id, "--store", store)
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
        assert proc.returncode == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert running.code == 0, running.stderr
    assert running.stdout.splitlines()[-1].startswith(
        f"not finished: run '{run_id}' is still running in process {proc.pid} on this machine"
    )
    for command in ("show", "replay"):  # replay: the events stop short of `done`, and it says why
        hint = cli("runs", command, run_id, "--store", store).stdout.splitlines()[-1]
        assert hint == f"resume it with: thinkloop runs resume {run_id} --store {store}"
    replayed = cli("runs", "replay", run_id, "--store", store, "--json")
    assert [json.loads(line)["type"] for line in replayed.stdout.splitlines()][-1] == "tool_call"  # JSON only


@pytest.mark.parametrize("columns", ["20", "80", "200"])
def test_run_ids_are_never_cut_whatever_the_width(cli: Cli, columns: str) -> None:
    cli.env["COLUMNS"] = columns
    run = cli("run", "What is\n17*23?", "--model", cli.script([text("391")]))
    assert run.code == 0, run.stderr
    lines = run.stdout.splitlines()
    run_id = RUN_ID.search(lines[0])
    assert run_id is not None, run.stdout  # the first line holds the whole run id
    assert lines[-1].endswith(f"run {run_id.group()}")  # and so does the last
    listed = cli("runs", "list")
    assert listed.code == 0
    (line,) = [line for line in listed.stdout.splitlines() if run_id.group() in line]
    assert "done" in line and "What is 17*23?" in line  # one line: the goal's newline does not break it


@pytest.mark.parametrize("as_json", [False, True])
def test_a_closed_stdout_stops_the_printing_not_the_run(cli: Cli, as_json: bool) -> None:
    """`thinkloop run … | head -1`: no traceback, the run still finishes and is saved."""
    model = cli.script([call("shell", command="sleep 1"), text("finished")])
    args = ["run", "x", "--model", model, "--tools", "shell", "--yes", *(["--json"] if as_json else [])]
    proc = cli.popen(*args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        first = proc.stdout.readline()
        proc.stdout.close()  # like `head -1`: the reader goes away while the shell command sleeps
        err = proc.stderr.read()
        proc.stderr.close()
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert RUN_ID.search(first)
    assert code == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err
    runs = cli("runs", "list", "--json")
    (saved,) = [json.loads(line) for line in runs.stdout.splitlines()]
    assert saved["stop_reason"] == "final_answer"


@pytest.mark.parametrize(
    "command",
    [
        ["list"],
        ["list", "--json"],
        ["show", "ID"],
        ["replay", "ID"],
        ["replay", "ID", "--json"],
        ["export", "ID"],
    ],
)
def test_a_reader_that_left_ends_a_runs_command_quietly_with_0(cli: Cli, command: list[str]) -> None:
    """`thinkloop runs list | head -1` exited 1 without a word (click's and rich's closed-pipe handling):
    a reader that has read enough is no error, as with `git log | head -1`."""
    run = cli("run", "x", "--model", cli.script([call("calculator", expression="1+1"), text("2")]), "--json")
    run_id = run.events()[0]["run_id"]
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line: every write meets a closed pipe
    try:
        args = [*CLI, "runs", *[run_id if a == "ID" else a for a in command]]
        proc = subprocess.run(
            args, cwd=cli.dir, env=cli.env, stdin=subprocess.DEVNULL, stdout=write, stderr=subprocess.PIPE,
            text=True, timeout=120,
        )  # fmt: skip
    finally:
        os.close(write)
    assert (proc.returncode, proc.stderr) == (0, "")


# ======================================================================== hostile environment

FULL = Path("/dev/full")
needs_dev_full = pytest.mark.skipif(not FULL.exists(), reason="no /dev/full on this system")


def saved_runs(cli: Cli) -> list[dict[str, Any]]:
    return [json.loads(line) for line in cli("runs", "list", "--json").stdout.splitlines()]


@pytest.mark.parametrize("closed", [">&-", ">&- 2>&-", "<&- >&-"])
def test_closed_standard_streams_neither_abort_nor_lose_the_run(cli: Cli, closed: str) -> None:
    """`thinkloop run … >&-`: uvloop aborted the process (exit status 134) when a file took fd 1 or 2."""
    model = cli.script([call("calculator", expression="6*7"), text("42")])
    command = " ".join([*CLI, "run", "x", "--model", model, "--json"])
    proc = subprocess.run(
        ["sh", "-c", f"exec {command} {closed}"], cwd=cli.dir, env=cli.env, stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "Assertion" not in proc.stderr
    (saved,) = saved_runs(cli)
    assert saved["stop_reason"] == "final_answer"


@needs_dev_full
@pytest.mark.parametrize("as_json", [True, False], ids=["json", "live-view"])
def test_a_run_whose_stdout_is_a_full_disk_finishes_saved_and_says_so(cli: Cli, as_json: bool) -> None:
    """`> /dev/full`: the event sink raised into the run (a traceback, the sink dropped, exit 1 with no
    word of why); now the run goes on, is saved, and one line says the output is incomplete."""
    model = cli.script([call("calculator", expression="6*7"), text("42")])
    with FULL.open("w") as full:
        proc = subprocess.run(
            [*CLI, "run", "x", "--model", model, *(["--json"] if as_json else [])], cwd=cli.dir,
            env=cli.env, stdin=subprocess.DEVNULL, stdout=full, stderr=subprocess.PIPE, text=True,
            timeout=120,
        )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    (line,) = [line for line in proc.stderr.splitlines() if line.strip()]
    assert line.startswith("error: could not write the output to stdout (No space left on device)"), line
    (saved,) = saved_runs(cli)
    assert saved["stop_reason"] == "final_answer" and f"runs show {saved['run_id']}" in line


@needs_dev_full
@pytest.mark.parametrize("command", [["list"], ["list", "--json"], ["show", "ID"], ["export", "ID"]])
def test_runs_output_to_a_full_disk_is_one_clear_error(cli: Cli, command: list[str]) -> None:
    run_id = cli("run", "x", "--model", cli.script([text("ok")]), "--json").events()[0]["run_id"]
    with FULL.open("w") as full:
        proc = subprocess.run(
            [*CLI, "runs", *[run_id if a == "ID" else a for a in command]], cwd=cli.dir, env=cli.env,
            stdin=subprocess.DEVNULL, stdout=full, stderr=subprocess.PIPE, text=True, timeout=120,
        )  # fmt: skip
    assert proc.returncode == 1
    (line,) = [line for line in proc.stderr.splitlines() if line.strip()]
    assert line.startswith("error: could not write the output to stdout (No space left on device)"), line


def test_export_to_a_file_that_cannot_be_written_names_it(cli: Cli) -> None:
    run_id = cli("run", "x", "--model", cli.script([text("ok")]), "--json").events()[0]["run_id"]
    r = cli("runs", "export", run_id, "-o", str(cli.dir))
    assert r.code == 2 and "Traceback" not in r.stderr
    (line,) = [line for line in r.stderr.splitlines() if line.strip()]
    assert line.startswith(f"error: could not write run {run_id} to {str(cli.dir)!r}: Is a directory"), line


class Trickle(io.RawIOBase):
    """A raw stream taking at most 1,000 bytes a call, as a pipe or a socket may (a write cut short)."""

    def __init__(self) -> None:
        self.data = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        taken = bytes(b[:1000])
        self.data += taken
        return len(taken)


@pytest.mark.parametrize("name", ["stdout", "stderr"])
def test_unbuffered_output_is_written_whole(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Under `python -u` or PYTHONUNBUFFERED=1 (set in many container images) the text streams write
    straight to the raw file, and the rest of a write cut short was dropped: `thinkloop runs list --json
    | jq` read a JSON line cut in the middle, and the exit code was 0."""
    from thinkloop.cli._pipe import whole_writes

    raw = Trickle()
    unbuffered = io.TextIOWrapper(raw, encoding="utf-8", write_through=True)  # as under -u
    with monkeypatch.context() as patch:
        patch.setattr(sys, name, unbuffered)
        whole_writes()
        stream = getattr(sys, name)
    stream.write("é" * 500_000 + "\n")  # a line: written at once, as unbuffered output is
    assert raw.data == ("é" * 500_000 + "\n").encode()
    stream.write("no newline yet")
    stream.flush()
    assert raw.data.endswith(b"\nno newline yet")
    stream.detach()  # the raw stream is the test's own


UNICODE = "Grüße aus 東京 ✓ 🙂"


def run_bytes(cli: Cli, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [*CLI, *args], cwd=cli.dir, env=cli.env, stdin=subprocess.DEVNULL, capture_output=True, timeout=120
    )


@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
def test_output_in_an_encoding_other_than_utf8_shows_the_answer_and_keeps_every_character_in_json(
    cli: Cli, encoding: str
) -> None:
    """stdout in another encoding (a latin-1 locale, PYTHONIOENCODING=ascii): the live view's first `·`
    failed — `error: could not write the output to stdout ('ascii' codec can't encode …)`, exit 1 for a run
    that answered — and so did each JSON line holding a character the encoding lacks."""
    cli.env["PYTHONIOENCODING"] = encoding
    model = cli.script([call("calculator", expression="6*7"), text(UNICODE)])
    view = run_bytes(cli, "run", UNICODE, "--model", model)
    assert view.returncode == 0, view.stderr.decode()
    shown = view.stdout.decode(encoding)
    assert UNICODE.encode(encoding, "replace").decode(encoding) in shown  # what the encoding lacks is a ?
    assert "stop reason final_answer" in shown

    lines = run_bytes(cli, "run", UNICODE, "--model", model, "--json")
    assert lines.returncode == 0, lines.stderr.decode()
    events = [json.loads(line) for line in lines.stdout.decode("ascii").splitlines()]  # \u escapes: lossless
    assert events[0]["goal"] == UNICODE and events[-1]["result"]["output"] == UNICODE
    run_id = events[0]["run_id"]
    listed = run_bytes(cli, "runs", "list", "--json")
    assert [json.loads(line)["goal"] for line in listed.stdout.decode("ascii").splitlines()] == [UNICODE] * 2
    replayed = run_bytes(cli, "runs", "replay", run_id, "--json")
    assert [json.loads(line) for line in replayed.stdout.decode("ascii").splitlines()] == events
    exported = run_bytes(cli, "runs", "export", run_id)
    assert json.loads(exported.stdout.decode("ascii"))["state"]["answer"] == UNICODE
    for command in (["show", run_id], ["replay", run_id], ["list"]):
        human = run_bytes(cli, "runs", *command)
        assert human.returncode == 0 and human.stderr == b"", human.stderr.decode()
        assert UNICODE.encode(encoding, "replace").decode(encoding)[:9] in human.stdout.decode(encoding)


def test_columns_zero_still_prints_the_answer_and_the_errors(cli: Cli) -> None:
    """Rich took COLUMNS=0 as a width of 0 and printed nothing at all: no answer, no error, no help."""
    cli.env["COLUMNS"] = "0"
    r = cli("run", "x", "--model", cli.script([text("forty-two")]))
    assert r.code == 0 and "forty-two" in r.stdout, r.stdout + r.stderr
    bad = cli("run", "x", "--model", "nosuch")
    assert bad.code == 2 and bad.stderr.startswith("error: unknown model 'nosuch'"), bad.stderr
    assert "--model" in cli("run", "--help").stdout


@pytest.mark.parametrize("variable", ["THINKLOOP_EVENT_LOOP", "THINKLOOP_GC"])
def test_a_bad_loop_variable_is_one_line_without_a_warning(cli: Cli, variable: str) -> None:
    cli.env[variable] = "bogus"
    r = cli("run", "x", "--model", cli.script([text("unused")]))
    assert r.code == 2
    (line,) = [line for line in r.stderr.splitlines() if line.strip()]  # no "never awaited" warning
    assert line.startswith(f"error: {variable}='bogus'"), r.stderr


@pytest.mark.parametrize(
    ("variable", "args"),
    [("THINKLOOP_MODEL", ["run", "x"]), ("THINKLOOP_STORE", ["run", "x", "--model", "script:s.json"]),
     ("THINKLOOP_STORE", ["runs", "list"])],
)  # fmt: skip
def test_a_bad_default_from_the_environment_names_its_variable(
    cli: Cli, variable: str, args: list[str]
) -> None:
    cli.script([text("unused")], name="s.json")
    cli.env[variable] = "bogus"
    r = cli(*args)
    assert r.code == 2 and r.stdout == ""
    (line,) = [line for line in r.stderr.splitlines() if line.strip()]
    assert line.startswith("error: ") and f"${variable}='bogus'" in line, line


@pytest.mark.parametrize(("option", "value"), [("--max-cost", "0"), ("--max-cost", "-1"), ("--timeout", "0")])
def test_a_limit_of_zero_or_less_is_a_usage_error_in_the_options_terms(
    cli: Cli, option: str, value: str
) -> None:
    r = cli("run", "x", "--model", cli.script([text("unused")]), option, value)
    assert r.code == 2
    assert (
        r.stderr
        == f"error: {option} must be above 0, got {value}: give a positive number, or leave {option} out for no limit\n"
    )


def test_runs_list_takes_a_huge_limit_as_all(cli: Cli) -> None:
    cli("run", "x", "--model", cli.script([text("ok")]))
    r = cli("runs", "list", "--json", "--limit", str(10**25))
    assert r.code == 0, r.stderr  # was: "unexpected OverflowError … this is a bug"
    assert len(r.stdout.splitlines()) == 1


def test_runs_show_never_splits_the_run_id(cli: Cli) -> None:
    run_id = cli("run", "x", "--model", cli.script([text("ok")]), "--json").events()[0]["run_id"]
    cli.env["COLUMNS"] = "20"
    shown = cli("runs", "show", run_id)
    assert shown.code == 0 and run_id in shown.stdout, shown.stdout


def test_submit_checks_its_goal_queue_and_store_before_queuing(cli: Cli) -> None:
    """A NUL byte (PostgreSQL text cannot hold it), a queue that is not a PostgreSQL URL, and a bad
    --store of --wait are usage errors before the queue is touched (the job was queued, then the store
    failed; the others failed at the first query as if the server were down)."""
    nul = run_with_stdin(cli, b"a\x00b", "submit", "-", "--queue", "postgresql://nobody@127.0.0.1:1/db")
    assert nul.code == 2 and "NUL character (\\x00) at character 2 of 3" in nul.stderr, nul.stderr
    assert "tr -d '\\000' < goal.txt | thinkloop submit -" in nul.stderr
    for queue in ("bogus", "mysql://x/y"):
        r = cli("submit", "hi", "--queue", queue)
        assert r.code == 2 and "is not a PostgreSQL URL" in r.stderr, r.stderr
        w = cli("worker", "--queue", queue, "--until-idle", "--model", "script:none.json")
        assert w.code == 2 and "is not a PostgreSQL URL" in w.stderr, w.stderr
    unreachable = "postgresql://nobody@127.0.0.1:1/db"  # port 1: nothing listens
    r = cli("submit", "hi", "--queue", unreachable, "--wait", "--store", "bogus")
    assert r.code == 2 and r.stderr.startswith("error: unknown store URL 'bogus'"), r.stderr


# ============================================================================================== docs

_DOC_BLOCK = re.compile(r"<!-- cli example: ([^>]+?) -->\n```(?:json|bash)\n(.*?)```", re.DOTALL)


def test_the_examples_of_docs_cli_md_run(cli: Cli) -> None:
    """Each ```json block marked `<!-- cli example: NAME.json -->` is written to NAME.json; each ```bash
    block marked `<!-- cli example: exit N -->` runs (with `thinkloop` on the PATH) and exits with N."""
    doc = (Path(__file__).resolve().parent.parent / "docs" / "cli.md").read_text(encoding="utf-8")
    env = {**cli.env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{cli.env.get('PATH', '')}"}
    ran = 0
    for label, body in _DOC_BLOCK.findall(doc):
        if label.endswith(".json"):
            json.loads(body)
            (cli.dir / label).write_text(body, encoding="utf-8")
            continue
        expected = int(label.removeprefix("exit "))
        proc = subprocess.run(
            ["bash", "-o", "pipefail", "-c", body],
            cwd=cli.dir,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == expected, f"{body}\n{proc.stdout}\n{proc.stderr}"
        ran += 1
    assert ran >= 4
    assert (cli.dir / "report.txt").exists()  # the shell example's `touch report.txt` ran (--yes)


def test_control_sequences_from_a_run_are_shown_not_obeyed_by_the_terminal(cli: Cli) -> None:
    """A tool's output (a file it read), a model's answer and a goal may hold terminal control sequences:
    `ESC ] 52` writes the clipboard, `ESC [ 2J` clears the screen, U+202E reverses text. The live view,
    `runs show`, `runs replay` and `runs list` print them as escapes (before: passed to the terminal)."""
    (cli.dir / "evil.txt").write_text("safe\x1b]52;c;ZXZpbA==\x1b\\\x1b[2Jafter\n", encoding="utf-8")
    script = cli.script([call("read_file", path="evil.txt"), text("x\x1b]52;c;ZXZpbA==\x07y \u202eevil")])
    goal = "read\x1b[31mRED\x1b]0;title\x07it"
    run = cli("run", goal, "--model", script, "--tools", "files", "--workspace", str(cli.dir))
    assert run.code == 0, run.stderr
    run_id = json.loads(cli("runs", "list", "--json").stdout.splitlines()[0])["run_id"]
    for printed in (run, cli("runs", "show", run_id), cli("runs", "replay", run_id), cli("runs", "list")):
        output = printed.stdout + printed.stderr
        assert printed.code == 0 and "\x1b" not in output and "\x07" not in output and "\u202e" not in output
    shown = cli("runs", "show", run_id).stdout
    assert "\\x1b]52;c;ZXZpbA==\\x07y" in shown and "\\x1b[2Jafter" in shown and "\\u202eevil" in shown
    assert "read\\x1b[31mRED" in cli("runs", "list").stdout
    exported = json.loads(cli("runs", "export", run_id).stdout)  # the data itself is kept as it was
    assert exported["state"]["answer"] == "x\x1b]52;c;ZXZpbA==\x07y \u202eevil"


def test_printable_shows_control_characters_as_escapes_and_keeps_the_rest() -> None:
    from thinkloop.cli._console import printable

    assert printable("plain text, ünïcode 😀\n\tnext line") == "plain text, ünïcode 😀\n\tnext line"
    assert (
        printable("a\x1b[2Jb\rc\x00d\x7fe\x9bf\u202eg\u2066h")
        == "a\\x1b[2Jb\\x0dc\\x00d\\x7fe\\x9bf\\u202eg\\u2066h"
    )


def test_read_only_commands_refuse_a_store_that_does_not_exist_and_create_nothing(cli: Cli) -> None:
    """A mistyped --store used to be created (directories and an empty database), and `runs list` then
    said there were no runs; the default store, which the first run creates, still lists as empty."""
    missing = cli.dir / "typo" / "deep" / "runs.db"
    for args in (["list"], ["show", "0" * 32], ["replay", "0" * 32], ["export", "0" * 32]):
        result = cli("runs", *args, "--store", f"sqlite:///{missing}")
        assert result.code == 2, result
        assert f"error: no store at {missing}: nothing was ever saved there" in result.stderr
    result = cli("runs", "list", "--store", f"file:///{cli.dir / 'no-such-dir'}")
    assert result.code == 2 and "no store at" in result.stderr
    assert not (cli.dir / "typo").exists() and not (cli.dir / "no-such-dir").exists()
    empty = cli("runs", "list")  # the default store: not made yet, no runs
    assert empty.code == 0 and not empty.stderr


def test_sqlite_memory_url_keeps_the_store_in_memory_and_memory_takes_no_path(cli: Cli) -> None:
    script = cli.script([text("hello")])
    run = cli("run", "hi", "--model", script, "--store", "sqlite:///:memory:")
    assert run.code == 0 and "hello" in run.stdout
    assert not Path("/:memory:").exists() and not (cli.dir / ":memory:").exists()
    bad = cli("runs", "list", "--store", "memory:x")
    assert bad.code == 2 and "memory: takes nothing after the colon" in bad.stderr


def test_runs_resume_keeps_the_safety_mode_the_run_was_started_with(cli: Cli) -> None:
    # `--safety` defaulted to balanced on resume: a strict run's MEDIUM `rm` ran unasked after a resume.
    (cli.dir / "ws").mkdir()
    (cli.dir / "ws" / "precious.txt").write_text("keep")
    then = [call("shell", command="rm precious.txt"), text("finished")]
    code, events, err = interrupt_a_slow_run(
        cli, 1, "--safety", "strict", "--workspace", "ws", then=then, yes=False
    )
    assert code == 130, err
    run_id = events[0]["run_id"]
    resumed = cli("runs", "resume", run_id, "--json", timeout=60)
    assert resumed.code == 0, resumed.stderr
    calls = by_type(resumed.events(), "tool_call")
    assert [(c["call"]["arguments"]["command"], c["decision"]) for c in calls] == [
        ("rm precious.txt", "denied")
    ]
    assert (cli.dir / "ws" / "precious.txt").exists()
