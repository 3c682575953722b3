"""Safety policies as data (SPEC §6.2): a mode, deny lists, allow lists and per-tool rules.

A `SafetyPolicy` is plain configuration — build it in code, or load it from JSON/YAML with
`SafetyPolicy.model_validate(...)` / `SafetyPolicy.from_json(...)`. The `SafetyController` applies it to
every tool call. `SafetyPolicy.evaluate()` is the pure part of that decision (no person involved): it
says whether a call is blocked, runs on its own, or needs approval, and why.
"""

from __future__ import annotations

import fnmatch
import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .._risk import RiskLevel
from ._classifier import CommandRisk, classify_command

if TYPE_CHECKING:
    import regex

PATTERN_TIMEOUT = 0.25
"""Seconds one `deny_commands`/`allow_commands` pattern may take on one command. A pattern that
backtracks without end (`(a|aa)+$` on a long line of `a`) is stopped there: as a deny pattern the
command is refused, as an allow pattern it is not allowed — so a command crafted against a careless
pattern can neither hang the run nor slip through."""


class SafetyMode(StrEnum):
    """How cautious the controller is: the lowest risk level that needs a person's approval.

    - `strict`: MEDIUM and above need approval (only LOW runs on its own).
    - `balanced`: HIGH and above need approval (the default).
    - `permissive`: only CRITICAL needs approval.
    """

    STRICT = "strict"
    BALANCED = "balanced"
    PERMISSIVE = "permissive"

    @property
    def threshold(self) -> RiskLevel:
        """Calls at or above this risk need approval."""
        return _THRESHOLDS[self]


_THRESHOLDS = {
    SafetyMode.STRICT: RiskLevel.MEDIUM,
    SafetyMode.BALANCED: RiskLevel.HIGH,
    SafetyMode.PERMISSIVE: RiskLevel.CRITICAL,
}

AskSetting = Literal["default", "always", "never"]
Verdict = Literal["block", "auto", "ask"]


class ToolRule(BaseModel):
    """A per-tool override.

    Args:
        risk: a fixed risk for every call of the tool, replacing the tool's own rating.
        ask: `"always"` asks for approval whatever the risk; `"never"` runs the tool without asking
            (the deny lists and the critical-command block still apply); `"default"` follows the mode.
    """

    model_config = ConfigDict(extra="forbid")

    risk: RiskLevel | None = None
    ask: AskSetting = "default"


class SafetyPolicy(BaseModel):
    """What the safety controller allows, asks about, and refuses.

    The order of the checks for each call:

    1. blocked: the tool's name matches `deny_tools`, or its command matches `deny_commands`, or its
       command is rated CRITICAL by the classifier while `block_critical_commands` is on (the default).
       A blocked call is never run and nobody is asked — not even with `--yes`.
    2. runs on its own: the tool has the rule `ask="never"`, or its name matches `allow_tools`, or its
       whole command matches one of `allow_commands` (compound commands never match, see below), or
       its risk is below the mode's threshold — unless the tool's rule says `ask="always"`.
    3. otherwise a person is asked.

    Args:
        mode: `strict` (approval from MEDIUM), `balanced` (from HIGH, the default), `permissive` (CRITICAL only).
        deny_tools: tool names (shell-style globs: `"mcp_*"`) that are always refused.
        deny_commands: regular expressions searched in the command of command tools; a match is refused.
        block_critical_commands: refuse every command the classifier rates CRITICAL (`rm -rf /`, `mkfs`,
            `curl … | sh` …). On by default; turning it off makes such commands ask instead.
        allow_tools: tool names (globs) that run without approval.
        allow_commands: regular expressions a command must match *entirely* (`re.fullmatch`) to run
            without approval. Commands chaining or redirecting (`;`, `&&`, `|`, `>`, `$(…)`, backticks,
            newlines) never match, so `ls .*` cannot let `ls; rm -rf ~` through.
        tools: per-tool rules by tool name.
        command_tools: which tools run shell commands, and the name of the argument holding the command
            (the built-in `shell` and `ssh_execute` by default; add your own or MCP tools here).
    """

    model_config = ConfigDict(extra="forbid")

    mode: SafetyMode = SafetyMode.BALANCED
    deny_tools: list[str] = Field(default_factory=list)
    deny_commands: list[str] = Field(default_factory=list)
    block_critical_commands: bool = True
    allow_tools: list[str] = Field(default_factory=list)
    allow_commands: list[str] = Field(default_factory=list)
    tools: dict[str, ToolRule] = Field(default_factory=dict)
    command_tools: dict[str, str] = Field(
        default_factory=lambda: {"shell": "command", "ssh_execute": "command"}
    )

    @field_validator("deny_commands", "allow_commands")
    @classmethod
    def _valid_patterns(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            try:
                _compiled(pattern)
            except Exception as exc:  # regex.error, and the few it raises otherwise
                raise ValueError(f"invalid regular expression {pattern!r}: {exc}") from exc
        return patterns

    @classmethod
    def from_json(cls, data: str | bytes) -> SafetyPolicy:
        return cls.model_validate_json(data)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SafetyPolicy:
        """From decoded JSON/YAML (e.g. `yaml.safe_load(file)`)."""
        return cls.model_validate(data)

    # ------------------------------------------------------------------------------------ decisions

    def command_of(
        self, tool_name: str, arguments: dict[str, Any], command_argument: str | None = None
    ) -> str | None:
        """The shell command of a call of a command tool, or None.

        A tool is a command tool when `command_tools` names it, or when its risk function is a
        `ShellCommandRisk` (the built-in `shell` and `ssh_execute`, whatever they are named), which the
        controller passes as `command_argument`.
        """
        key = self.command_tools.get(tool_name) or command_argument
        value = arguments.get(key) if key is not None else None
        return value if isinstance(value, str) else None

    def evaluate(
        self,
        tool_name: str,
        arguments: dict[str, Any],
        risk: RiskLevel,
        *,
        command_argument: str | None = None,
        earlier: Iterable[str] = (),
        cwd: str | None = None,
    ) -> Evaluation:
        """Decide a call without a person: blocked, runs on its own, or needs approval — and why.

        For a command tool, `earlier` are the commands the run already ran with the same tool (and host),
        oldest first, and `cwd` the tool's working directory if known (see `classify_command`): running
        a file one of them downloaded is rated like downloading and running it in one command.
        """
        command = self.command_of(tool_name, arguments, command_argument)
        rated = classify_command(command, earlier=earlier, cwd=cwd) if command is not None else None
        risk = self._effective_risk(tool_name, risk, rated)
        reasons = list(rated.reasons) if rated is not None else []
        blocked = self._block_reason(tool_name, command, risk, rated)
        if blocked is not None:
            return Evaluation("block", risk, blocked, command, tuple(reasons))
        allowed = self._allow_reason(tool_name, command, risk)
        if allowed is not None:
            return Evaluation("auto", risk, allowed, command, tuple(reasons))
        why = f"{risk.value} risk needs approval in {self.mode.value} mode"
        if self._rule(tool_name).ask == "always":
            why = f"the policy asks for approval of every {tool_name} call"
        return Evaluation("ask", risk, why, command, tuple(reasons))

    def _rule(self, tool_name: str) -> ToolRule:
        return self.tools.get(tool_name) or _DEFAULT_RULE

    def _effective_risk(self, tool_name: str, risk: RiskLevel, rated: CommandRisk | None) -> RiskLevel:
        fixed = self._rule(tool_name).risk
        if fixed is not None:
            return fixed
        if rated is not None and rated.level > risk:
            return rated.level
        return risk

    def _block_reason(
        self, tool_name: str, command: str | None, risk: RiskLevel, rated: CommandRisk | None
    ) -> str | None:
        if _glob_match(tool_name, self.deny_tools):
            return f"the tool {tool_name} is on the policy's deny list"
        if command is None:
            return None
        for pattern in self.deny_commands:
            try:
                if _compiled(pattern).search(command, timeout=PATTERN_TIMEOUT):
                    return f"the command matches the deny pattern {pattern!r}"
            except TimeoutError:
                return (
                    f"the deny pattern {pattern!r} took longer than {PATTERN_TIMEOUT} s on the command, so it is"
                    " refused to be safe (the pattern backtracks too much: rewrite it with possessive"
                    " quantifiers such as `\\w++` or atomic groups `(?>…)`)"
                )
        if self.block_critical_commands and rated is not None and rated.level is RiskLevel.CRITICAL:
            return "the command is rated critical (destructive or system-wide) and is always refused"
        return None

    def _allow_reason(self, tool_name: str, command: str | None, risk: RiskLevel) -> str | None:
        rule = self._rule(tool_name)
        if rule.ask == "never":
            return f"the policy runs {tool_name} without asking"
        if rule.ask == "always":
            return None
        if _glob_match(tool_name, self.allow_tools):
            return f"the tool {tool_name} is on the policy's allow list"
        if command is not None and not _COMPOUND.search(command):
            for pattern in self.allow_commands:
                try:
                    if _compiled(pattern).fullmatch(command.strip(), timeout=PATTERN_TIMEOUT):
                        return f"the command matches the allow pattern {pattern!r}"
                except TimeoutError:
                    continue  # never allowed by a pattern that could not say
        if risk < self.mode.threshold:
            return f"{risk.value} risk is below the {self.mode.value} threshold ({self.mode.threshold.value})"
        return None


class ShellCommandRisk:
    """The risk function of a tool running shell commands: the classifier's rating of one argument.

    It also marks the tool as a command tool for the safety policy, so critical commands are blocked
    whatever the tool is called. A missing or non-string command is rated HIGH. `cwd` is the absolute
    working directory every command starts in, when the tool has a fixed one: the safety controller then
    compares the paths of a run's commands exactly (with cwd `/srv`, `bash x.sh` runs the file that an
    earlier `curl -o /srv/x.sh …` downloaded; without it, that is only possible, and asked about).
    """

    def __init__(self, argument: str = "command", *, cwd: str | None = None) -> None:
        self.argument = argument
        self.cwd = cwd

    def __call__(self, arguments: dict[str, Any]) -> RiskLevel:
        command = arguments.get(self.argument)
        if not isinstance(command, str):
            return RiskLevel.HIGH
        return classify_command(command).level

    def __repr__(self) -> str:
        cwd = f", cwd={self.cwd!r}" if self.cwd is not None else ""
        return f"ShellCommandRisk({self.argument!r}{cwd})"


command_risk = ShellCommandRisk("command")

_DEFAULT_RULE = ToolRule()


@functools.lru_cache(maxsize=256)
def _compiled(pattern: str) -> regex.Pattern[str]:
    """A policy pattern compiled by `regex` (the syntax of `re`, plus a timeout per match)."""
    import regex  # lazily: only policies with command patterns need it

    return regex.compile(pattern)


_COMPOUND = re.compile(r"[;&|`\n\r<>]|\$\(")


def _glob_match(name: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


@dataclass(frozen=True, slots=True)
class Evaluation:
    """The policy's verdict on a call: `block`, `auto` (runs) or `ask`, the effective risk, and why."""

    verdict: Verdict
    risk: RiskLevel
    reason: str
    command: str | None = None
    classifier_reasons: tuple[str, ...] = ()

    def explain(self) -> str:
        """The reason with the classifier's findings, as shown to the person and recorded."""
        if not self.classifier_reasons:
            return self.reason
        return f"{self.reason}; command: {'; '.join(self.classifier_reasons)}"
