"""Shell-command risk classifier for the built-in `shell` and `ssh_execute` tools (SPEC §6).

`classify_command` reads a command line the way a POSIX shell would: a small pre-scanner extracts
`$(...)`, backticks, process substitutions and here-documents, decodes `$'...'` strings and `${IFS}`
tricks and protects quoted operators; `shlex` (punctuation-aware) then tokenises the result. The
line is split into simple commands (pipes, `;`, `&&`, `||`, `&`, subshells), launcher prefixes are
unwrapped (`sudo`, `env`, `nohup`, `timeout`, `xargs`, `busybox` ...), nested code is classified
recursively (`bash -c`, `eval`, `su -c`, substitutions, piped scripts, `ssh host cmd`) and every
simple command is rated with table-driven rules. The overall level is the maximum over everything.
Across the simple commands of a line, the files each one writes are remembered (downloaded, decoded or
literal text), so running one later is rated like piping it into the shell; endless loops that start a
background job on every pass are fork bombs; `find -exec`/`xargs` over a whole tree are recursive.
Given the run's earlier commands (`earlier=`), running a file one of them downloaded is rated the same way.
Options, settings and variables through which a command runs another one or writes a file (`sed 'e CMD'`,
`git -c core.pager=CMD`, `PAGER=CMD man`, `sort -o FILE`) are rated like running it or writing the file.

The classifier is conservative by design: unknown binaries are MEDIUM, input that cannot be parsed
is at least HIGH (`parsed=False`), and obfuscation that hides what will run is HIGH or CRITICAL.
"""

from __future__ import annotations

import base64
import binascii
import collections
import itertools
import posixpath
import re
import shlex
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import ClassVar

from .._risk import RiskLevel

__all__ = ["CommandRisk", "classify_command"]

LOW = RiskLevel.LOW
MEDIUM = RiskLevel.MEDIUM
HIGH = RiskLevel.HIGH
CRITICAL = RiskLevel.CRITICAL

Finding = tuple[RiskLevel, str]

_MAX_DEPTH = 8
_MAX_LENGTH = 100_000
_MAX_STAGES = 16  # the commands of a pipeline read together with the next one
_MAX_GROUP = 64  # the commands before a pipe fed by a group (`{ …; } | sh`) read as what it feeds


@dataclass(frozen=True)
class CommandRisk:
    """How risky one shell command line is.

    `reasons` are human-readable findings, most severe first. `parsed` is False when the command
    could not be parsed as shell syntax; the level is then at least HIGH.
    """

    level: RiskLevel
    reasons: tuple[str, ...]
    parsed: bool


class _ParseError(ValueError):
    """The command is not valid shell syntax (as far as this classifier can tell)."""


# ============================================================================ pre-scanner

_PUNCT = ";&|()<>"
_HIDE = str.maketrans({c: chr(0xE000 + i) for i, c in enumerate(_PUNCT)})
_UNHIDE = str.maketrans({chr(0xE000 + i): c for i, c in enumerate(_PUNCT)})
_SUB_OPEN = "\ue020"
_SUB_CLOSE = "\ue021"
_SUB_RE = re.compile(_SUB_OPEN + r"(\d+)" + _SUB_CLOSE)
_IFS_RE = re.compile(r"\$\{IFS[^}]*\}|\$IFS(?![A-Za-z0-9_])")
_FD_RE = re.compile(r"\d+(?=[<>])")
_HEREDOC_DELIM_RE = re.compile(r"[ \t]*((?:'[^']*'|\"[^\"]*\"|\\.|[^\s;&|()<>])+)")
_ANSI_ESC_RE = re.compile(r"\\(x[0-9a-fA-F]{1,2}|u[0-9a-fA-F]{1,4}|U[0-9a-fA-F]{1,8}|[0-7]{1,3}|c.|.)", re.S)
_ANSI_HIDING_RE = re.compile(r"\\(x|u|U|[0-7])")
_ANSI_SIMPLE = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b", "f": "\f"}
_COMMANDISH_RE = re.compile(r"[A-Za-z_][\w.-]*\s+[-/\w'\"]")
_WORD_BREAK = " \t\n;&|()<>"


def _ansi_unescape(match: re.Match[str]) -> str:
    esc = match.group(1)
    head = esc[0]
    if head in "xuU":
        return chr(min(int(esc[1:], 16), 0x10FFFF))
    if head.isdigit():
        return chr(int(esc, 8))
    if head == "c" and len(esc) == 2:
        return chr(ord(esc[1]) & 0x1F)
    return _ANSI_SIMPLE.get(esc, esc)


@dataclass
class _Sub:
    """Text lifted out of the command: a `$(...)`/backtick/`<(...)` body or a here-document."""

    text: str
    kind: str  # "command", "process" or "heredoc"


class _Scanner:
    """Rewrites a command line into something `shlex` can tokenise faithfully.

    Substitutions become placeholder words, quoted/escaped operator characters are hidden (so `";"`
    stays a word), `$'...'` strings are decoded, `${IFS}` becomes a space, comments are dropped and
    newlines become `;` where they separate commands.
    """

    _DISPATCH: ClassVar[dict[str, Callable[[_Scanner], bool]]] = {}

    def __init__(self, src: str, subs: list[_Sub], findings: list[Finding]) -> None:
        self.src = src
        self.pos = 0
        self.out: list[str] = []
        self.subs = subs
        self.findings = findings
        self.heredocs: list[tuple[str, bool, int]] = []

    def scan(self) -> str:
        while self.pos < len(self.src):
            self._step()
        return "".join(self.out)

    def _step(self) -> None:
        char = self.src[self.pos]
        handler = self._DISPATCH.get(char)
        if handler is not None and handler(self):
            return
        if char.isdigit() and self._at_word_start():
            fd = _FD_RE.match(self.src, self.pos)
            if fd:  # `2>file`: the descriptor number does not matter for the risk
                self.pos = fd.end()
                return
        self.out.append(char)
        self.pos += 1

    def _at_word_start(self) -> bool:
        return self.pos == 0 or self.src[self.pos - 1] in _WORD_BREAK

    def _placeholder(self, text: str, kind: str) -> str:
        self.subs.append(_Sub(text, kind))
        return f"{_SUB_OPEN}{len(self.subs) - 1}{_SUB_CLOSE}"

    def _escape(self) -> bool:
        nxt = self.src[self.pos + 1 : self.pos + 2]
        if not nxt:
            raise _ParseError("dangling backslash at the end of the command")
        if nxt == "\n":
            pass
        elif nxt in _PUNCT:
            self.out.append(nxt.translate(_HIDE))
        else:
            self.out.append("\\" + nxt)
        self.pos += 2
        return True

    def _single(self) -> bool:
        end = self.src.find("'", self.pos + 1)
        if end < 0:
            raise _ParseError("unbalanced single quote")
        self.out.append("'" + self.src[self.pos + 1 : end].translate(_HIDE) + "'")
        self.pos = end + 1
        return True

    def _double(self) -> bool:
        self.out.append('"')
        self.pos += 1
        while self.pos < len(self.src):
            char = self.src[self.pos]
            if char == '"':
                self.out.append('"')
                self.pos += 1
                return True
            self._double_char(char)
        raise _ParseError("unbalanced double quote")

    def _double_char(self, char: str) -> None:
        if char == "\\":
            nxt = self.src[self.pos + 1 : self.pos + 2]
            if nxt in ("$", "`", "\n"):
                self.out.append(nxt.strip("\n"))
                self.pos += 2
            elif nxt in ('"', "\\"):
                self.out.append("\\" + nxt)
                self.pos += 2
            else:
                self.out.append("\\")
                self.pos += 1
            return
        if char == "$" and self._dollar(in_double=True):
            return
        if char == "`":
            self._backtick()
            return
        self.out.append(char.translate(_HIDE))
        self.pos += 1

    def _dollar_top(self) -> bool:
        return self._dollar(in_double=False)

    def _dollar(self, in_double: bool) -> bool:
        src, pos = self.src, self.pos
        if src.startswith("$((", pos):
            end = self._match_paren(pos + 1)
            inner = src[pos + 3 : end - 1]
            self.out.append(self._placeholder(inner, "command") if _COMMANDISH_RE.search(inner) else "0")
            self.pos = end + 1
            return True
        if src.startswith("$(", pos):
            end = self._match_paren(pos + 1)
            self.out.append(self._placeholder(src[pos + 2 : end], "command"))
            self.pos = end + 1
            return True
        if src.startswith("$'", pos) and not in_double:
            self._ansi_c()
            return True
        ifs = _IFS_RE.match(src, pos)
        if ifs:
            self.findings.append((HIGH, f"uses {ifs.group(0)} to disguise word separators (obfuscation)"))
            self.out.append(" ")
            self.pos = ifs.end()
            return True
        return False

    def _skip_quoted(self, pos: int) -> int:
        quote = self.src[pos]
        pos += 1
        while pos < len(self.src):
            char = self.src[pos]
            if char == quote:
                return pos + 1
            pos += 2 if (char == "\\" and quote == '"') else 1
        raise _ParseError(f"unbalanced {quote} quote inside a substitution")

    def _match_paren(self, start: int) -> int:
        depth = 0
        pos = start
        while pos < len(self.src):
            char = self.src[pos]
            if char == "\\":
                pos += 2
                continue
            if char in "'\"":
                pos = self._skip_quoted(pos)
                continue
            depth += {"(": 1, ")": -1}.get(char, 0)
            if depth == 0:
                return pos
            pos += 1
        raise _ParseError("unbalanced parenthesis in a substitution")

    def _ansi_c(self) -> None:
        src = self.src
        start = end = self.pos + 2
        while end < len(src) and src[end] != "'":
            end += 2 if src[end] == "\\" else 1
        if end >= len(src):
            raise _ParseError("unbalanced $'...' quote")
        body = src[start:end]
        decoded = _ANSI_ESC_RE.sub(_ansi_unescape, body)
        if _ANSI_HIDING_RE.search(body):
            self.findings.append(
                (HIGH, f"ANSI-C quoted string $'{body}' hides its content (decodes to {decoded!r})")
            )
        self.out.append("'" + decoded.translate(_HIDE).replace("'", "'\\''") + "'")
        self.pos = end + 1

    def _backtick(self) -> bool:
        src = self.src
        end = self.pos + 1
        while end < len(src) and src[end] != "`":
            end += 2 if src[end] == "\\" else 1
        if end >= len(src):
            raise _ParseError("unbalanced backtick")
        inner = src[self.pos + 1 : end].replace("\\`", "`")
        self.out.append(self._placeholder(inner, "command"))
        self.pos = end + 1
        return True

    def _lt(self) -> bool:
        src, pos = self.src, self.pos
        if src.startswith("<(", pos):
            return self._procsub()
        if src.startswith("<<<", pos):
            self.out.append("<<<")
            self.pos += 3
            return True
        if src.startswith("<<", pos):
            self._heredoc()
            return True
        return False

    def _gt(self) -> bool:
        return self.src.startswith(">(", self.pos) and self._procsub()

    def _procsub(self) -> bool:
        end = self._match_paren(self.pos + 1)
        self.out.append(self._placeholder(self.src[self.pos + 2 : end], "process"))
        self.pos = end + 1
        return True

    def _heredoc(self) -> None:
        pos = self.pos + 2
        strip_tabs = self.src.startswith("-", pos)
        pos += strip_tabs
        match = _HEREDOC_DELIM_RE.match(self.src, pos)
        if not match:
            raise _ParseError("here-document without a delimiter")
        delimiter = re.sub(r"['\"\\]", "", match.group(1))
        placeholder = self._placeholder("", "heredoc")
        self.heredocs.append((delimiter, strip_tabs, len(self.subs) - 1))
        self.out.append("<< " + placeholder)
        self.pos = match.end()

    def _read_heredoc_bodies(self) -> None:
        while self.heredocs:
            delimiter, strip_tabs, index = self.heredocs.pop(0)
            lines: list[str] = []
            while self.pos < len(self.src):
                newline = self.src.find("\n", self.pos)
                end = len(self.src) if newline < 0 else newline
                line = self.src[self.pos : end]
                self.pos = min(end + 1, len(self.src))
                if (line.lstrip("\t") if strip_tabs else line) == delimiter:
                    break
                lines.append(line)
            self.subs[index] = _Sub("\n".join(lines), "heredoc")

    def _hash(self) -> bool:
        if not self._at_word_start():
            return False
        newline = self.src.find("\n", self.pos)
        self.pos = len(self.src) if newline < 0 else newline
        return True

    def _newline(self) -> bool:
        self.pos += 1
        self._read_heredoc_bodies()
        last = "".join(self.out[-8:]).rstrip(" \t")[-1:]
        self.out.append(" " if last in ("", ";", "|", "&", "(") else ";")
        return True


_Scanner._DISPATCH.update(
    {
        "\\": _Scanner._escape,
        "'": _Scanner._single,
        '"': _Scanner._double,
        "$": _Scanner._dollar_top,
        "`": _Scanner._backtick,
        "<": _Scanner._lt,
        ">": _Scanner._gt,
        "#": _Scanner._hash,
        "\n": _Scanner._newline,
    }
)


# ============================================================================ tokens and simple commands

_OPERATORS = (
    "&>>", "<<<", ";;&", "&&", "||", "|&", ";;", ">>", ">|", ">&", "<&", "<<", "<>", "&>",
    ";", "&", "|", "(", ")", "<", ">",
)  # fmt: skip
_REDIRECT_OPS = frozenset({">", ">>", ">|", "&>", "&>>", "<>", ">&", "<", "<&", "<<", "<<<"})
_PIPE_OPS = frozenset({"|", "|&"})


@dataclass(frozen=True)
class _Token:
    text: str
    op: bool


def _split_operators(token: str) -> list[str]:
    ops: list[str] = []
    pos = 0
    while pos < len(token):
        op = next(o for o in _OPERATORS if token.startswith(o, pos))
        ops.append(op)
        pos += len(op)
    return ops


def _tokenize(text: str) -> list[_Token]:
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = ""
    try:
        raw = list(lexer)
    except ValueError as exc:
        raise _ParseError(str(exc)) from exc
    tokens: list[_Token] = []
    for tok in raw:
        if tok and all(c in _PUNCT for c in tok):
            tokens.extend(_Token(op, True) for op in _split_operators(tok))
        else:
            tokens.append(_Token(tok.translate(_UNHIDE), False))
    return tokens


@dataclass
class _Simple:
    """One simple command: its words and redirections, and where it sits in its pipeline."""

    words: list[str] = field(default_factory=list)
    redirs: list[tuple[str, str]] = field(default_factory=list)
    pipeline: int = 0
    stage: int = 0


class _Builder:
    """Groups tokens into simple commands; parentheses only delimit, pipes chain stages."""

    def __init__(self) -> None:
        self.out: list[_Simple] = []
        self.cur = _Simple()
        self.redirect: str | None = None
        self.pipeline = 0
        self.stage = 0

    def build(self, tokens: list[_Token]) -> list[_Simple]:
        index = 0
        while index < len(tokens):
            tok = tokens[index]
            if not tok.op:
                self._word(tok.text)
            elif self.redirect is not None:
                raise _ParseError(f"missing target after {self.redirect!r}")
            elif tok.text in _REDIRECT_OPS:
                self.redirect = tok.text
            elif tok.text == "(" and self._function_definition(tokens, index):
                index += 1
            else:
                self._separator(tok.text)
            index += 1
        if self.redirect is not None:
            raise _ParseError(f"missing target after {self.redirect!r}")
        self._flush()
        return self.out

    def _word(self, text: str) -> None:
        if self.redirect is not None:
            self.cur.redirs.append((self.redirect, text))
            self.redirect = None
        else:
            self.cur.words.append(text)

    def _function_definition(self, tokens: list[_Token], index: int) -> bool:
        nxt = tokens[index + 1] if index + 1 < len(tokens) else None
        if len(self.cur.words) == 1 and nxt is not None and nxt.op and nxt.text == ")":
            self.cur = _Simple()  # `name() { body; }`: the body follows as ordinary commands
            return True
        return False

    def _separator(self, op: str) -> None:
        self._flush()
        if op in _PIPE_OPS:
            self.stage += 1
        elif op not in ("(", ")"):
            self.pipeline += 1
            self.stage = 0

    def _flush(self) -> None:
        if self.cur.words or self.cur.redirs:
            self.cur.pipeline, self.cur.stage = self.pipeline, self.stage
            self.out.append(self.cur)
        self.cur = _Simple()


# ============================================================================ helpers: words, options, paths


def _is_dynamic(word: str) -> bool:
    return "$" in word or _SUB_OPEN in word or "`" in word


def _show(text: str, limit: int = 80) -> str:
    shown = _SUB_RE.sub("$(…)", text).replace("\n", " ")
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"


_VERSIONED_RE = re.compile(r"^(python|pypy|pip|perl|ruby|php|node|lua|bash|zsh)[\d.]*$")
_NAME_ALIASES = {
    "nodejs": "node", "pypy": "python", "podman": "docker", "nerdctl": "docker", "oc": "kubectl",
    "tofu": "terraform", "terragrunt": "terraform", "gawk": "awk", "mawk": "awk", "nawk": "awk",
    "ncat": "nc", "netcat": "nc", "ip6tables": "iptables", "iptables-legacy": "iptables",
    "iptables-nft": "iptables", "ip6tables-legacy": "iptables", "ip6tables-nft": "iptables",
    "ebtables": "iptables", "arptables": "iptables", "killall": "pkill", "aptitude": "apt-get",
    "apt": "apt-get", "yum": "dnf", "microdnf": "dnf", "zypper": "dnf", "pip3": "pip", "pipx": "pip",
    "yarn": "npm", "pnpm": "npm", "bun": "npm", "gem": "npm", "cargo": "npm", "brew": "npm",
    "conda": "npm", "mamba": "npm", "composer": "npm", "poetry": "npm", "uv": "npm",
    "telinit": "init", "deluser": "userdel", "delgroup": "userdel", "groupdel": "userdel",
    "gdisk": "fdisk", "cfdisk": "fdisk", "sfdisk": "fdisk", "sgdisk": "fdisk", "parted": "fdisk",
    "runuser": "su", "sudoedit": "sudo", "ksh": "sh", "mksh": "sh", "dash": "sh", "ash": "sh",
    "csh": "sh", "tcsh": "sh", "fish": "sh", "bash": "sh", "zsh": "sh", "rbash": "sh",
}  # fmt: skip


def _normalize_name(word: str) -> str:
    name = word.rsplit("/", 1)[-1]
    name = _VERSIONED_RE.sub(r"\1", name)
    return _NAME_ALIASES.get(name, name)


@dataclass
class _Opts:
    """Parsed options: `flags` maps each option (short ones exploded) to its value or None."""

    flags: list[tuple[str, str | None]]
    operands: list[str]

    def has(self, *names: str) -> bool:
        return any(flag in names for flag, _ in self.flags)

    def value(self, *names: str) -> str | None:
        values = self.values(*names)
        return values[-1] if values else None

    def values(self, *names: str) -> list[str]:
        return [v for flag, v in self.flags if flag in names and v is not None]

    def letters(self) -> set[str]:
        return {flag[1:] for flag, _ in self.flags if len(flag) == 2}


def _parse_opts(args: list[str], with_arg: Iterable[str] = (), stop_at_operand: bool = False) -> _Opts:
    takes = frozenset(with_arg)
    opts = _Opts([], [])
    index = 0
    while index < len(args):
        arg = args[index]
        index += 1
        if arg == "--":
            opts.operands.extend(args[index:])
            break
        if not arg.startswith("-") or arg == "-":
            opts.operands.append(arg)
            if stop_at_operand:
                opts.operands.extend(args[index:])
                break
            continue
        index = _parse_one_option(arg, args, index, takes, opts)
    return opts


def _parse_one_option(arg: str, args: list[str], index: int, takes: frozenset[str], opts: _Opts) -> int:
    if arg.startswith("--"):
        name, eq, value = arg.partition("=")
        if eq:
            opts.flags.append((name, value))
        elif name in takes and index < len(args):
            opts.flags.append((name, args[index]))
            return index + 1
        else:
            opts.flags.append((name, None))
        return index
    for pos, letter in enumerate(arg[1:], start=1):
        flag = "-" + letter
        if flag in takes:
            rest = arg[pos + 1 :]
            if rest:
                opts.flags.append((flag, rest))
            elif index < len(args):
                opts.flags.append((flag, args[index]))
                return index + 1
            else:
                opts.flags.append((flag, None))
            return index
        opts.flags.append((flag, None))
    return index


def _gnu_long(arg: str, longs: Iterable[str]) -> str:
    """`arg` with a long option abbreviated as GNU getopt allows spelled out (`--out=F` is `--output=F`
    when no other of `longs` starts with `--out`). `longs` may be only some of a tool's options: a prefix
    that is ambiguous among all of them is refused by the tool, so reading it as one of them only errs
    towards a higher rating."""
    name, eq, value = arg.partition("=")
    if len(name) < 3 or not name.startswith("--") or name in longs:
        return arg
    matches = [option for option in longs if option.startswith(name)]
    return matches[0] + eq + value if len(matches) == 1 else arg


def _gnu_opts(args: list[str], longs: Iterable[str], with_arg: Iterable[str] = ()) -> _Opts:
    """`_parse_opts` of a GNU tool's arguments, its abbreviated long options spelled out (`_gnu_long`)."""
    end = args.index("--") if "--" in args else len(args)
    longs = tuple(longs)
    return _parse_opts([_gnu_long(arg, longs) for arg in args[:end]] + args[end:], with_arg)


@dataclass
class _Written:
    """A file the command line wrote before running it: fed by a download or a decoder, its text if known.

    `origin` is the earlier command (of the run, not of this line) that saved it, for files of `_Earlier`."""

    source: str | None
    text: str | None
    origin: str | None = None


class _Files:
    """The files a command line wrote so far (path -> `_Written`), looked up by path or, for a program
    saved into a `bin` directory and run by name, by that name — both in constant time: a scan of every
    file written, for every command, made a line of many writes quadratic (`:>0;:>1;…`, 15 s).

    `base` is what the run's earlier commands saved (`_Saved`), when this is what one more of them
    writes: a lookup this line cannot answer falls through to it and is recorded in `reads`, so that
    what the command saves can be reused while those entries stay the same (`_saves`)."""

    __slots__ = ("base", "by_name", "fetched", "local", "reads")

    def __init__(self, base: _Saved | None = None) -> None:
        self.fetched: str | None = (
            None  # the command that fetched a repository earlier on the line (`_fetched_run`)
        )
        self.local: dict[str, _Written] = {}
        self.by_name: dict[str, list[str]] = {}  # name -> its paths in a bin directory, first written first
        self.base = base
        self.reads: dict[str, _Written | None] = {}

    def __bool__(self) -> bool:  # with a base, every lookup is made (and recorded), even of an empty one
        return bool(self.local) or self.base is not None

    def get(self, path: str) -> _Written | None:
        if path in self.local:
            return self.local[path]
        return None if self.base is None else self._read(self.base, path)

    def __setitem__(self, path: str, written: _Written) -> None:
        if path not in self.local and posixpath.dirname(path) in _BIN_DIRS:
            self.by_name.setdefault(posixpath.basename(path), []).append(path)
        self.local[path] = written

    def program(self, name: str) -> str | None:
        """The first file written into a `bin` directory under `name` (the run's earlier ones first, in
        the order of their paths; then this line's, in the order written)."""
        base = self.base
        if base is not None:
            saved = sorted(path for path in _bin_paths(name) if self._read(base, path) is not None)
            if saved:
                return saved[0]
        return next((p for p in self.by_name.get(name, ()) if base is None or base.get(p) is None), None)

    def _read(self, base: _Saved, path: str) -> _Written | None:
        found = self.reads[path] = base.get(path)
        return found

    def changes(self) -> Iterator[tuple[str, _Written]]:
        """What this line wrote over its `base`: (path, what it holds now)."""
        base = self.base
        for path, written in self.local.items():
            if base is None or written is not base.get(path):
                yield path, written


@dataclass
class _Ctx:
    """What one classification shares: substitutions, nesting depth, the working directory, the files
    written so far on the line (`_Files`, so `curl x > a.sh; sh a.sh` is seen as one act), the
    paths that stand for every file under them (`find / -exec rm {} +` deletes the whole tree) and the
    files the run's earlier commands saved (`_Earlier`, read only when the line runs a file) and the
    variables set on the line (`_Variables`)."""

    subs: list[_Sub]
    depth: int = 0
    cwd: str | None = None
    files: _Files = field(default_factory=lambda: _Files())
    trees: set[str] = field(default_factory=set)
    earlier: _Earlier | None = None
    variables: _Variables = field(default_factory=lambda: _Variables())
    expanding: bool = False  # rating a command with the values of its variables (`_with_values`)

    def child(self) -> _Ctx:
        return _Ctx(
            self.subs,
            self.depth + 1,
            self.cwd,
            self.files,
            self.trees,
            self.earlier,
            self.variables,
            self.expanding,
        )


class _Variables:
    """The variables the line set to literal text (`D=/`, `export CMD='rm -rf /'`), by name, and how many
    characters their values may still add to the commands that use them (`_with_values`); and those it
    set from a download or a decoder (`X=$(echo … | base64 -d)`), by name, with that substitution's
    text: code run from one of them (`$X`, `eval "$X"`) cannot be read before it runs (`_fetch_findings`).
    Such a name is never forgotten (a value that may not be in effect never lowers a rating)."""

    __slots__ = ("budget", "payloads", "values")

    def __init__(self) -> None:
        self.values: dict[str, str] = {}
        self.payloads: dict[str, tuple[str, str]] = {}  # name: (payload kind, substitution text)
        self.budget = 4 * _MAX_LENGTH


_HOME_PREFIX_RE = re.compile(r"^(?:\$HOME|\$\{HOME(?::?[-=?][^}]*)?\}|~[A-Za-z0-9_.-]*)(?=/|$)")  # ${HOME:?}
_GLOB_ONLY_RE = re.compile(r"[.*?\[\]!{},^]*[*?][.*?\[\]!{},^]*")
_BLOCK_DEVICE_RE = re.compile(
    r"^/dev/(sd[a-z]|hd[a-z]|vd[a-z]|xvd[a-z]|nvme\d|mmcblk\d|md\d|dm-\d|loop\d|disk|mapper/|rdisk|"
    r"nbd\d|zram\d|sr\d|mem$|kmem$|port$|root$)"
)
_PATH_PREFIXES: tuple[tuple[str, str], ...] = (
    ("/dev/null", "null"), ("/dev/zero", "null"), ("/dev/stdout", "null"), ("/dev/stderr", "null"),
    ("/dev/stdin", "null"), ("/dev/tty", "null"), ("/dev/fd", "null"), ("/dev/pts", "null"),
    ("/dev/tcp", "net"), ("/dev/udp", "net"), ("/dev/shm", "tmp"), ("/dev", "dev"),
    ("/proc/sysrq-trigger", "core"), ("/proc", "kernel"), ("/sys", "kernel"),
    ("/etc", "etc"), ("/boot", "core"), ("/efi", "core"), ("/bin", "core"), ("/sbin", "core"),
    ("/lib", "core"), ("/lib32", "core"), ("/lib64", "core"), ("/libx32", "core"),
    ("/usr/local", "local"), ("/usr/bin", "core"), ("/usr/sbin", "core"), ("/usr/lib", "core"),
    ("/usr/lib32", "core"), ("/usr/lib64", "core"), ("/usr/libexec", "core"), ("/usr", "usr"),
    ("/tmp", "tmp"), ("/var/tmp", "tmp"), ("/var/spool/cron", "etc"), ("/var/lib/dpkg", "core"),
    ("/var/lib/rpm", "core"), ("/var", "var"), ("/run", "var"), ("/root", "homes"), ("/home", "homes"),
    ("/opt", "data"), ("/srv", "data"), ("/mnt", "data"), ("/media", "data"), ("/snap", "data"),
)  # fmt: skip
_SYSDIR_PARENTS = frozenset({"/", "/home", "/var", "/usr", "/usr/local", "/opt", "/srv", "/var/lib"})
_SYSTEM_KINDS = frozenset({"etc", "core", "usr", "var", "local", "homes", "data", "kernel"})
_SENSITIVE_FILES = frozenset(
    {
        "/etc/passwd", "/etc/shadow", "/etc/group", "/etc/gshadow", "/etc/sudoers", "/etc/sudoers.d",
        "/etc/pam.d", "/etc/ssh/sshd_config", "/etc/fstab", "/root/.ssh", "/root/.ssh/authorized_keys",
        "/bin/su", "/usr/bin/sudo", "/usr/bin/su", "/bin/sudo", "/bin/bash", "/bin/sh", "/usr/bin/passwd",
    }
)  # fmt: skip
_SECRET_RE = re.compile(
    r"^(/etc/(shadow|gshadow|sudoers)(-|\.d.*)?|/etc/ssl/private/.*|.*/\.ssh/id_[a-z0-9_]+|.*\.(pem|key)"
    r"|.*/\.aws/credentials|.*/\.kube/config|.*/\.netrc|.*/\.docker/config\.json)$"
)


_SECRET_NAME_RE = re.compile(  # a file (or directory) named so holds credentials, wherever it is
    r"\.env(?:\.(?!(?:example|sample|template|dist|defaults?)$)[\w.-]+)?|\.netrc|\.pgpass|\.git-credentials"
    r"|\.htpasswd|credentials(?:\.json)?|id_(?:rsa|dsa|ecdsa|ed25519)(?:_sk)?|.*\.(?:pem|key|p12|pfx|kdbx)"
    r"|\.ssh|\.aws|\.gnupg"
)


def _secret_file(raw: str, ctx: _Ctx) -> bool:
    """Whether `raw` names a file of credentials (`_SECRET_RE`, `_SECRET_NAME_RE`): a glob in its last
    part (`~/.ssh/id_*`) stands for what is in its directory."""
    path = _normalize_path(raw.split("=", 1)[-1] if raw.startswith("-") else raw, ctx.cwd).rstrip("/")
    name = posixpath.basename(path)
    if any(c in name for c in "*?["):
        path = posixpath.dirname(path)
        name = posixpath.basename(path)
    return bool(_SECRET_RE.match(path) or _SECRET_NAME_RE.fullmatch(name))


def _remote(operand: str) -> bool:
    """An scp/rsync operand on another machine: `[user@]host:path`, `scp://…`, `rsync://…`."""
    return re.match(
        r"^(?:[\w.@\[\]-]+:|(?:scp|sftp|rsync)://)", operand
    ) is not None and not operand.startswith("/")


def _exfiltration(tool: str, sources: list[str], dest: str, ctx: _Ctx) -> list[Finding]:
    """HIGH for copying a file of credentials to another machine (`scp /etc/shadow host:`)."""
    if not _remote(dest):
        return []
    return [
        (HIGH, f"{tool} copies the sensitive file '{source}' to '{_show(dest, 40)}' (exfiltration)")
        for source in sources
        if not _remote(source) and _secret_file(source, ctx)
    ][:1]


def _normalize_path(raw: str, cwd: str | None) -> str:
    path = _HOME_PREFIX_RE.sub("~", raw, count=1)
    if path.startswith("~"):
        rest = path[1:].lstrip("/")
        norm = posixpath.normpath(rest) if rest else "."
        if norm == ".":
            return "~"
        return "/home" if norm.startswith("..") else "~/" + norm
    if path.startswith("/"):
        return posixpath.normpath(re.sub(r"^/+", "/", path))
    if cwd is not None:
        return _normalize_path(posixpath.join(cwd, path), None)
    return posixpath.normpath(path) if path else "."


def _strip_glob(path: str) -> str:
    while True:
        head, tail = posixpath.split(path)
        if not _GLOB_ONLY_RE.fullmatch(tail):
            return path
        if not head:
            return "."
        path = head


def _home_dotfile(path: str) -> bool:
    parts = path.split("/")
    if path.startswith("/root/"):
        return parts[2].startswith(".")
    return len(parts) > 3 and parts[3].startswith(".")


def _path_kind(raw: str, ctx: _Ctx) -> tuple[str, str]:
    """Classify a path: ("root", "/"), ("etc", "/etc/x"), ("relative", "build") ..."""
    path = _strip_glob(_normalize_path(raw, ctx.cwd))
    if _is_dynamic(path):
        return "dynamic", path
    if path == "/":
        return "root", path
    if path == "~":
        return "home", path
    if path.startswith("~/"):
        return ("home_dot" if path[2:3] == "." else "homefile"), path
    if not path.startswith("/"):
        wide = path in (".", "..") or path.startswith("../")
        return ("cwd" if wide else "relative"), path
    if _BLOCK_DEVICE_RE.match(path):
        return "block", path
    for prefix, kind in _PATH_PREFIXES:
        if path == prefix or path.startswith(prefix + "/"):
            if kind == "homes" and _home_dotfile(path):
                return "home_dot", path
            return kind, path
    return "data", path


def _is_sysdir(path: str) -> bool:
    return posixpath.dirname(path) in _SYSDIR_PARENTS


_DELETE_RULES: dict[str, tuple[RiskLevel, RiskLevel, str]] = {
    "root": (CRITICAL, HIGH, "the root filesystem"),
    "home": (CRITICAL, HIGH, "the home directory"),
    "etc": (CRITICAL, HIGH, "system configuration"),
    "core": (CRITICAL, CRITICAL, "core system binaries, libraries or boot files"),
    "usr": (CRITICAL, HIGH, "system files under /usr"),
    "kernel": (HIGH, HIGH, "kernel interface files"),
    "block": (HIGH, HIGH, "a disk device node"),
    "dev": (HIGH, HIGH, "a device node"),
    "null": (HIGH, HIGH, "a standard device node"),
    "net": (HIGH, HIGH, "a device node"),
    "var": (HIGH, HIGH, "system data under /var"),
    "local": (HIGH, HIGH, "locally installed software"),
    "homes": (HIGH, MEDIUM, "user files"),
    "data": (HIGH, MEDIUM, "files outside the working directory"),
    "home_dot": (HIGH, HIGH, "shell/SSH configuration files"),
    "dynamic": (HIGH, MEDIUM, "a path computed at runtime (it may expand to '/')"),
    "cwd": (HIGH, MEDIUM, "everything in the current or parent directory"),
    "tmp": (MEDIUM, MEDIUM, "temporary files"),
    "relative": (HIGH, MEDIUM, "files in the working directory"),  # a recursive delete cannot be undone
    "homefile": (HIGH, MEDIUM, "files in the home directory"),
}

_WRITE_RULES: dict[str, tuple[RiskLevel, str]] = {
    "null": (LOW, "output is discarded or goes to the terminal"),
    "net": (HIGH, "sends data over a raw network socket"),
    "block": (CRITICAL, "overwrites a raw disk or memory device"),
    "dev": (HIGH, "writes to a device file"),
    "etc": (CRITICAL, "overwrites system configuration"),
    "core": (CRITICAL, "overwrites core system binaries, libraries, boot files or kernel triggers"),
    "usr": (CRITICAL, "overwrites system files under /usr"),
    "kernel": (HIGH, "changes kernel settings"),
    "root": (HIGH, "writes into the root directory"),
    "home": (HIGH, "writes over the home directory"),
    "var": (HIGH, "writes to system data under /var"),
    "local": (HIGH, "installs files under /usr/local"),
    "homes": (MEDIUM, "writes a file in a home directory"),
    "data": (MEDIUM, "writes a file outside the working directory"),
    "home_dot": (HIGH, "modifies a shell/SSH startup file (persistence)"),
    "dynamic": (MEDIUM, "writes to a path computed at runtime"),
    "tmp": (MEDIUM, "writes a temporary file"),
    "relative": (MEDIUM, "writes a file"),
    "cwd": (MEDIUM, "writes a file"),
    "homefile": (MEDIUM, "writes a file in the home directory"),
}


def _delete_risk(raw: str, ctx: _Ctx, recursive: bool) -> tuple[RiskLevel, str]:
    kind, path = _path_kind(raw, ctx)
    recursive = recursive or path in ctx.trees
    rec, flat, noun = _DELETE_RULES[kind]
    if kind in _SYSTEM_KINDS and recursive and _is_sysdir(path):
        rec, noun = CRITICAL, f"the system directory {path}"
    if path in _SENSITIVE_FILES:
        flat = CRITICAL
    verb = "recursive delete of" if recursive else "deletes"
    return (rec if recursive else flat), f"{verb} {noun}"


def _write_risk(raw: str, ctx: _Ctx) -> tuple[RiskLevel, str]:
    kind, _ = _path_kind(raw, ctx)
    return _WRITE_RULES[kind]


def _write_finding(label: str, target: str, ctx: _Ctx) -> Finding:
    level, what = _write_risk(target, ctx)
    return level, f"{label} '{_show(target)}': {what}"


# ============================================================================ commands


@dataclass
class _Cmd:
    """A simple command after prefixes were stripped: normalized name, raw name, arguments."""

    name: str
    raw: str
    args: list[str]
    redirs: list[tuple[str, str]]
    upstream: list[list[str]]  # argv of the earlier stages of its pipeline
    earlier: list[list[str]] = field(default_factory=list)  # argv of the commands before it (`_MAX_GROUP`)
    piped_input: str | None = None  # the here-document (or here-string) its pipeline's first command reads

    def label(self, limit: int = 60) -> str:
        return _show(" ".join([self.raw, *self.args]), limit)

    def with_argv(self, argv: list[str]) -> _Cmd:
        return _Cmd(
            _normalize_name(argv[0]),
            argv[0],
            argv[1:],
            self.redirs,
            self.upstream,
            piped_input=self.piped_input,
        )


_Handler = Callable[[_Cmd, _Ctx], list[Finding]]


def _nested(text: str, ctx: _Ctx, label: str) -> list[Finding]:
    """Classify code embedded in the command (`bash -c`, `eval`, substitutions ...)."""
    try:
        return _classify_text(text, ctx.child())
    except _ParseError as exc:
        return [(HIGH, f"could not parse the {label} {_show(text)!r} ({exc})")]


_FETCH_RE = re.compile(r"\b(curl|wget|fetch|aria2c|lwp-request|lwp-download|nc|ncat|socat|tftp|httpie)\b")
_DECODE_RE = re.compile(
    r"\bbase(64|32)\b[^|;&]*\s-(d|D|-decode)\b|\bxxd\b[^|;&]*\s-r|\bopenssl\b[^|;&]*\s-d\b|\buudecode\b"
    r"|\brev\b|\bgunzip\b|\bzcat\b|\bprintf\b[^|;&]*\\(x|[0-7]{3})"
)


def _payload_kind(text: str) -> str | None:
    if _FETCH_RE.search(text):
        return "downloaded content"
    if _DECODE_RE.search(text):
        return "a decoded payload"
    return None


def _payload_what(kind: str) -> str:
    return "remote code execution" if kind.startswith("downloaded") else "obfuscated code execution"


def _fetch_findings(text: str, ctx: _Ctx, label: str) -> list[Finding]:
    """CRITICAL when code to execute comes from a download or a decoder in a substitution, or from a
    variable the line set from one (`X=$(echo … | base64 -d); $X`)."""
    findings: list[Finding] = []
    for match in _SUB_RE.finditer(text):
        inner = ctx.subs[int(match.group(1))].text
        kind = _payload_kind(inner)
        if kind is not None:
            findings.append(
                (CRITICAL, f"{label} executes {kind} ($({_show(inner, 60)})): {_payload_what(kind)}")
            )
    payloads = ctx.variables.payloads
    if payloads and "$" in text:
        for match in _REFERENCE_RE.finditer(text):
            name = match[1] or match[2]
            if name in payloads:
                kind, inner = payloads[name]
                findings.append(
                    (CRITICAL, f"{label} executes {kind} (${name}, set from $({_show(inner, 60)})): "
                               f"{_payload_what(kind)}")
                )  # fmt: skip
    return findings


def _exec_text(text: str, ctx: _Ctx, label: str) -> list[Finding]:
    return _nested(text, ctx, label) + _fetch_findings(text, ctx, label)


# ---------------------------------------------------------------------------- static table


def _words(text: str) -> list[str]:
    return text.split()


def _group(level: RiskLevel, desc: str, names: str) -> dict[str, tuple[RiskLevel, str]]:
    return dict.fromkeys(names.split(), (level, desc))


_STATIC: dict[str, tuple[RiskLevel, str]] = {
    **_group(LOW, "read-only inspection", """
        ls ll la dir vdir cat tac nl less more most head tail grep egrep fgrep rg ag ack zgrep zcat
        bzcat xzcat zless ps pgrep pstree pidof df du uname whoami id groups uptime free w who last
        lastb lastlog users lsblk blkid lscpu lsmem lspci lsusb lsof lsmod lshw lsns lsipc vmstat
        iostat mpstat sar pidstat nproc arch printenv echo printf date cal stat file wc sort uniq cut
        tr jq yq column fold paste join comm diff cmp sdiff md5sum sha1sum sha224sum sha256sum
        sha384sum sha512sum b2sum cksum sum base64 base32 xxd od hexdump strings readlink realpath
        basename dirname pwd which whereis type hash true false test [ [[ sleep seq tree locate
        mlocate ss netstat traceroute traceroute6 tracepath mtr dig nslookup host whois getent htop
        btop atop iotop iftop nethogs glances man info apropos whatis help tldr ldd nm objdump
        readelf getfacl lsattr namei pv expr bc dc factor numfmt tput tty locale lsb_release
        dmidecode systemd-detect-virt systemd-analyze systemd-cgls systemd-cgtop top findmnt getconf
        shuf tsort expand unexpand fmt pr rev iconv lvs vgs pvs lvdisplay vgdisplay pvdisplay lvscan
        vgscan pvscan iptables-save arp ethtool iwconfig nstat ifstat dstat virt-what last
        kubectx kubens ctop sestatus getenforce aa-status ulimit watchman-status
        """),
    **_group(LOW, "shell builtin without side effects", """
        cd pushd popd dirs read wait jobs exit return break continue : let declare typeset local shift shopt
        unalias clear reset true logout fg bg disown umask caller enable
        """),
    **_group(MEDIUM, "creates or modifies files", """
        zip gzip gunzip bzip2 bunzip2 xz unxz 7z 7za zstd unzstd split csplit dos2unix unix2dos
        patch convert ffmpeg sqlite3 rename mktemp mkfifo mknod
        """),
    **_group(MEDIUM, "builds or runs project code", """
        make cmake ninja gcc g++ cc clang go rustc javac java mvn gradle npx pytest tox nox deno
        dotnet ansible ansible-playbook packer vagrant
        """),
    **_group(MEDIUM, "interactive program that can change anything", """
        vim vi nvim ex view vimdiff gvim gview gvimdiff rvim rview evim vim.basic vim.tiny nano emacs ed pico
        joe mc screen tmux mysql psql redis-cli mongo mongosh sqlcmd
        cqlsh ftp sftp telnet lftp gdb
        """),
    **_group(MEDIUM, "changes session or system state", """
        ssh-keygen ssh-copy-id ssh-add ssh-agent htpasswd logrotate at batch atrm wall logger mail
        sendmail mutt ldconfig update-alternatives update-ca-certificates tcpdump tshark nmap
        systemd-tmpfiles newgrp scp dpkg-reconfigure aws gcloud az gsutil s3cmd
        """),
    **_group(HIGH, "changes kernel modules or security settings", """
        insmod rmmod modprobe depmod setenforce auditctl setcap chattr aa-disable aa-complain
        """),
    **_group(HIGH, "changes disks, mounts or filesystems", """
        swapoff losetup fsck e2fsck resize2fs tune2fs xfs_repair xfs_growfs debugfs lvcreate lvextend
        lvresize lvreduce vgcreate vgextend vgreduce pvcreate pvmove pvresize quotaoff kpartx umount
        """),
    **_group(HIGH, "manages users, groups or privileges", """
        useradd adduser groupadd groupmod gpasswd chage visudo vipw vigr newusers chsh chfn
        """),
    **_group(HIGH, "changes the boot loader or kernel", """
        update-grub grub-install grub-mkconfig grub2-mkconfig grub2-install kexec update-initramfs
        dracut efibootmgr
        """),
    **_group(HIGH, "changes networking or traffic", "tc ifup brctl ovs-vsctl masscan hping3 arping"),
    **_group(HIGH, "restores firewall rules wholesale", "iptables-restore ip6tables-restore"),
    **_group(CRITICAL, "formats or erases a disk/volume", """
        mke2fs mkswap mkdosfs mkntfs newfs blkdiscard lvremove vgremove pvremove srm wipe
        """),
    **_group(CRITICAL, "powers off the machine", "halt poweroff"),
    **_group(CRITICAL, "deletes user accounts or groups", "userdel"),
    **_group(CRITICAL, "sets account passwords", "chpasswd"),
    **_group(CRITICAL, "kills every process on the system", "killall5"),
    **_group(CRITICAL, "takes the network interface down", "ifdown"),
}  # fmt: skip


def _static_finding(cmd: _Cmd) -> Finding:
    rule = _STATIC.get(cmd.name)
    if rule is not None:
        return rule[0], f"{cmd.name}: {rule[1]}"
    if cmd.name.startswith("mkfs"):
        return CRITICAL, f"{cmd.label()}: creates a filesystem (erases the device)"
    if cmd.name.startswith("fsck."):
        return HIGH, f"{cmd.name}: checks/repairs a filesystem"
    return MEDIUM, f"unknown command '{_show(cmd.raw)}': its effect cannot be assessed"


# ---------------------------------------------------------------------------- file handlers


def _h_rm(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    opts = _parse_opts(cmd.args)
    recursive = opts.has("-r", "-R", "--recursive")
    findings: list[Finding] = []
    if opts.has("--no-preserve-root"):
        findings.append((CRITICAL, "rm --no-preserve-root: disables the safeguard against deleting '/'"))
    flags = " ".join(a for a in cmd.args if a.startswith("-") and a != "--")
    label = f"rm {flags}".strip()
    for target in opts.operands or ([] if findings else [""]):
        if not target:
            findings.append((LOW, "rm without operands does nothing"))
            continue
        level, what = _delete_risk(target, ctx, recursive)
        findings.append((level, f"{label} on '{_show(target)}': {what}"))
    return findings


def _h_rmdir(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    findings: list[Finding] = [(LOW, "rmdir without operands")]
    for target in _parse_opts(cmd.args).operands:
        level, what = _delete_risk(target, ctx, recursive=False)
        findings.append((min(level, HIGH, key=lambda lv: lv.rank), f"rmdir '{_show(target)}': {what}"))
    return findings


def _h_shred(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    findings: list[Finding] = [(LOW, "shred without operands")]
    for target in _parse_opts(cmd.args, ("-n", "-s", "--iterations", "--size")).operands:
        kind, _ = _path_kind(target, ctx)
        if kind in ("block", "dev", "etc", "core", "usr", "root", "home", "var", "kernel"):
            findings.append(
                (CRITICAL, f"shred '{_show(target)}': irrecoverably destroys a device or system data")
            )
        else:
            findings.append((HIGH, f"shred '{_show(target)}': irrecoverably destroys the file"))
    return findings


def _h_truncate(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    findings: list[Finding] = []
    for target in _parse_opts(cmd.args, ("-s", "--size", "-r", "--reference")).operands:
        kind, _ = _path_kind(target, ctx)
        if kind in ("etc", "core", "usr", "block", "root", "home", "kernel", "homes"):
            level = CRITICAL if kind != "homes" else MEDIUM
        else:
            level = _write_risk(target, ctx)[0]
        findings.append((level, f"truncate '{_show(target)}': truncates the file"))
    return findings or [(LOW, "truncate without operands")]


def _h_tee(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    targets = _parse_opts(cmd.args, ("--output-error",)).operands
    return [_write_finding("tee", t, ctx) for t in targets] or [(LOW, "tee to standard output only")]


def _h_touch(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    targets = _parse_opts(cmd.args, ("-d", "-r", "-t", "--date", "--reference")).operands
    return [_write_finding(cmd.name, t, ctx) for t in targets] or [(LOW, f"{cmd.name} without operands")]


def _h_mkdir(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    findings: list[Finding] = [(LOW, "mkdir without operands")]
    for target in _parse_opts(cmd.args, ("-m", "--mode", "-Z", "--context")).operands:
        level, what = _write_risk(target, ctx)
        findings.append((max(min(level, HIGH, key=lambda lv: lv.rank), MEDIUM, key=lambda lv: lv.rank),
                         f"mkdir '{_show(target)}': creates a directory ({what})"))  # fmt: skip
    return findings


_COPY_WITH_ARG = (
    "-t",
    "--target-directory",
    "-S",
    "--suffix",
    "-m",
    "--mode",
    "-o",
    "--owner",
    "-g",
    "--group",
)


def _copy_dest(opts: _Opts) -> str | None:
    target = opts.value("-t", "--target-directory")
    if target is not None:
        return target
    return opts.operands[-1] if len(opts.operands) >= 2 else None


def _h_copy(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    """cp, install, ln: the risk is where they write."""
    opts = _parse_opts(cmd.args, _COPY_WITH_ARG)
    dest = _copy_dest(opts)
    if dest is None:
        return [(MEDIUM, f"{cmd.label()}: creates or copies files")]
    level, what = _write_risk(dest, ctx)
    return [(max(level, MEDIUM, key=lambda lv: lv.rank), f"{cmd.name} into '{_show(dest)}': {what}")]


def _h_mv(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    opts = _parse_opts(cmd.args, _COPY_WITH_ARG)
    dest = _copy_dest(opts)
    if dest is None:
        return [(MEDIUM, f"{cmd.label()}: moves files")]
    sources = opts.operands if opts.has("-t", "--target-directory") else opts.operands[:-1]
    findings = [_h_copy(cmd, ctx)[0]]
    for source in sources:
        kind, path = _path_kind(source, ctx)
        if kind in ("root", "home", "etc", "core", "usr") or (kind in _SYSTEM_KINDS and _is_sysdir(path)):
            findings.append((CRITICAL, f"mv '{_show(source)}': moves away {path} (breaks the system)"))
        elif kind in _SYSTEM_KINDS or kind in ("block", "dev", "null"):
            findings.append((HIGH, f"mv '{_show(source)}': moves a system file"))
    if _path_kind(dest, ctx)[0] == "null":
        findings.append((HIGH, f"mv into '{dest}': replaces a device node / discards the data"))
    return findings


def _h_dd(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    params = dict(arg.split("=", 1) for arg in cmd.args if "=" in arg)
    findings: list[Finding] = [(LOW, "dd writing to standard output")]
    source = params.get("if")
    if source is not None and _path_kind(source, ctx)[0] == "block":
        findings.append((MEDIUM, f"dd if={source}: reads a raw disk device"))
    if "of" in params:
        findings.append(_write_finding("dd of=", params["of"], ctx))
    return findings


def _h_wipefs(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    if _parse_opts(cmd.args).has("-n", "--no-act"):
        return [(MEDIUM, "wipefs --no-act: dry run")]
    return [(CRITICAL, f"{cmd.label()}: erases filesystem signatures (data becomes inaccessible)")]


_SETUID_RE = re.compile(r"^([0-7]?[4-7][0-7]{3}|.*\+[rwxX]*s.*)$")
_WORLD_WRITABLE_RE = re.compile(r"^([0-7]*[2367]|.*[oa]\+[rwxX]*w.*|\+?[rwxX]*w[rwxX]*)$")


def _perm_risk(raw: str, ctx: _Ctx, recursive: bool) -> tuple[RiskLevel, str]:
    kind, path = _path_kind(raw, ctx)
    recursive = recursive or path in ctx.trees
    if kind in ("root", "home"):
        return CRITICAL, f"changes ownership/permissions of {_DELETE_RULES[kind][2]}"
    if path in _SENSITIVE_FILES:
        return CRITICAL, "changes a security-sensitive file"
    if recursive and (kind in ("etc", "core", "usr") or (kind in _SYSTEM_KINDS and _is_sysdir(path))):
        return CRITICAL, "recursive change of a system directory"
    if kind in _SYSTEM_KINDS or kind in ("block", "dev", "null", "net"):
        return HIGH, "changes a system path"
    if recursive and kind == "dynamic":
        return HIGH, "recursive change of a path computed at runtime"
    return MEDIUM, "changes file permissions/ownership"


def _h_perms(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    """chmod, chown, chgrp: recursive or system-wide changes are dangerous."""
    args = [a for a in cmd.args if not (cmd.name == "chmod" and re.fullmatch(r"-[rwxXst]+", a))]
    modes = [a for a in cmd.args if a not in args]
    opts = _parse_opts(args, ("--reference",))
    recursive = opts.has("-R", "--recursive")
    operands = opts.operands if opts.has("--reference") or modes else opts.operands[1:]
    mode = (modes or opts.operands[:1] or [""])[0]
    findings: list[Finding] = [(LOW, f"{cmd.name} without operands")]
    for target in operands:
        level, what = _perm_risk(target, ctx, recursive)
        findings.append(
            (level, f"{cmd.name}{' -R' if recursive else ''} {mode} on '{_show(target)}': {what}")
        )
        findings += _made_executable(cmd, mode, target, ctx)
        system = level >= HIGH
        if cmd.name == "chmod" and _SETUID_RE.match(mode):
            findings.append(((CRITICAL if system else HIGH), f"chmod {mode}: sets the setuid/setgid bit"))
        if cmd.name == "chmod" and system and _WORLD_WRITABLE_RE.match(mode):
            findings.append(
                (CRITICAL, f"chmod {mode} on '{_show(target)}': makes system files world-writable")
            )
    return findings


def _h_setfacl(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    opts = _parse_opts(cmd.args, ("-m", "-M", "-x", "-X", "--modify", "--remove", "--set", "--set-file"))
    recursive = opts.has("-R", "--recursive")
    return [(MEDIUM, "setfacl")] + [
        (lv, f"setfacl on '{_show(t)}': {w}")
        for t in opts.operands
        for lv, w in [_perm_risk(t, ctx, recursive)]
    ]


_FIND_FILTERS = frozenset(
    {"-name", "-iname", "-path", "-ipath", "-regex", "-iregex", "-mtime", "-mmin", "-atime", "-amin",
     "-ctime", "-cmin", "-size", "-user", "-group", "-newer", "-wholename", "-iwholename", "-empty",
     "-perm", "-uid", "-gid", "-inum", "-samefile", "-links", "-lname", "-ilname"}
)  # fmt: skip
_FIND_EXEC = frozenset({"-exec", "-execdir", "-ok", "-okdir"})
_FIND_ANY = {"-name": "*", "-iname": "*", "-path": "*", "-ipath": "*", "-wholename": "*", "-iwholename": "*",
             "-regex": ".*", "-iregex": ".*"}  # fmt: skip  # a "filter" that every file passes


def _find_filtered(expr: list[str]) -> bool:
    """Whether a find expression selects some files only: `-name '*'` or `-regex '.*'` select them all."""
    return any(
        word in _FIND_FILTERS and _FIND_ANY.get(word, "\0") != value
        for word, value in itertools.zip_longest(expr, expr[1:], fillvalue="")
    )


_FIND_WRITE = frozenset({"-fprint", "-fprint0", "-fprintf", "-fls"})


def _find_parts(args: list[str]) -> tuple[list[str], list[str]]:
    index = 0
    while index < len(args) and args[index] in ("-H", "-L", "-P"):
        index += 1
    starts: list[str] = []
    while index < len(args) and not args[index].startswith(("-", "(", "!", ")")):
        starts.append(args[index])
        index += 1
    return (starts or ["."]), args[index:]


def _find_exec_commands(expr: list[str]) -> list[list[str]]:
    commands: list[list[str]] = []
    current: list[str] | None = None
    for word in expr:
        if current is None:
            if word in _FIND_EXEC:
                current = []
        elif word in (";", "+"):
            commands.append(current)
            current = None
        else:
            current.append(word)
    if current:
        commands.append(current)
    return [c for c in commands if c]


@contextmanager
def _tree(ctx: _Ctx, starts: list[str]) -> Iterator[None]:
    """While classifying a command applied to every file under `starts`, treat those paths as trees."""
    added = {_strip_glob(_normalize_path(s, ctx.cwd)) for s in starts} - ctx.trees
    ctx.trees |= added
    try:
        yield
    finally:
        ctx.trees -= added


def _h_find(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    starts, expr = _find_parts(cmd.args)
    filtered = _find_filtered(expr)
    findings: list[Finding] = [(LOW, "find: read-only search")]
    for start in starts:
        kind, _ = _path_kind(start, ctx)
        broad = kind in _SYSTEM_KINDS or kind in ("root", "home", "block", "dev")
        if "-delete" in expr:
            level, what = _delete_risk(start, ctx, recursive=True)
            if filtered:
                level = min(level, HIGH if broad else MEDIUM, key=lambda lv: lv.rank)
                what = f"deletes matching files under {start}"
            findings.append((level, f"find {_show(start)} -delete: {what}"))
        for argv in _find_exec_commands(expr):
            replaced = [w.replace("{}", "./FILE" if filtered else start) for w in argv]
            with _tree(ctx, [] if filtered else [start]):
                inner = _classify_argv(replaced, cmd, ctx)
            findings += inner
            if filtered and broad and max((lv for lv, _ in inner), default=LOW) >= MEDIUM:
                findings.append(
                    (HIGH, f"find {start} -exec {_show(argv[0])}: applies it to files across {start}")
                )
    for flag, value in zip(expr, expr[1:], strict=False):
        if flag in _FIND_WRITE:
            findings.append(_write_finding(f"find {flag}", value, ctx))
    return findings


# ---------------------------------------------------------------------------- sed scripts
# Without -i, sed only prints — unless its script runs commands (`e CMD`, `e` alone runs each line it
# reads, `s/RE/REPL/e` runs the edited line) or writes files (`w FILE`, `W FILE`, `s///w FILE`). The
# script is read as GNU sed reads it (addresses, blocks, text of a/i/c, labels, file names to the end of
# the line), so that `e` inside a replacement or a file name is not taken for a command.

_SED_LONG = (
    "--expression", "--file", "--in-place", "--line-length", "--sandbox", "--quiet", "--silent", "--debug",
    "--follow-symlinks", "--posix", "--regexp-extended", "--separate", "--unbuffered", "--null-data",
    "--zero-terminated", "--binary", "--help", "--version",
)  # fmt: skip
_SED_SIMPLE = frozenset("=dDgGhHnNpPxzF")  # commands without an argument
_SED_FLAGS = frozenset("gpiImM0123456789")  # flags of `s` besides `e` and `w FILE`
_SED_REF_RE = re.compile(r"\\.|&", re.S)
_SED_WHOLE_RE = re.compile(r"\^?\.\*\$?")  # a regular expression matching the whole line
_SHELL_VALUE_RE = re.compile(  # what the shell replaces: `${…}`, `$NAME`, `$1`, a substitution
    r"\$\{[^}]*\}|\$[A-Za-z_][A-Za-z0-9_]*|\$[0-9@*#?$!-]|" + _SUB_OPEN + r"\d+" + _SUB_CLOSE
)


@dataclass
class _SedArgs:
    """A sed command line: its script (the `-e` scripts, or the first operand), its script files (`-f`),
    its input files, and whether it edits them in place or runs sandboxed (`--sandbox`: no e/r/w)."""

    script: str | None
    files: list[str]
    inputs: list[str]
    in_place: bool
    sandbox: bool


def _sed_option(arg: str, args: list[str], index: int) -> tuple[str, str, int]:
    """The sed option `arg` as one name (`-e` for `--expression`, `-ne`, `-e…`), its value ("" if none),
    and where the arguments go on (after the value when it is the next one)."""
    following = args[index] if index < len(args) else ""
    if arg.startswith("--"):
        name, eq, value = _gnu_long(arg, _SED_LONG).partition("=")
        name = {"--expression": "-e", "--file": "-f", "--in-place": "-i", "--line-length": "-l"}.get(
            name, name
        )
        if name in ("-e", "-f", "-l") and not eq:
            return name, following, index + 1
        return name, value, index
    for pos, letter in enumerate(arg[1:], start=1):
        if letter == "i":  # `-i[SUFFIX]`: the rest is the suffix (`-ie` is -i with the suffix 'e')
            return "-i", "", index
        if letter in "efl":  # their value is the rest of the word, or the next one
            value = arg[pos + 1 :]
            return ("-" + letter, value, index) if value else ("-" + letter, following, index + 1)
    return arg, "", index


def _sed_args(args: list[str]) -> _SedArgs:
    scripts: list[str] = []
    parsed = _SedArgs(None, [], [], in_place=False, sandbox=False)
    index = 0
    while index < len(args):
        arg = args[index]
        index += 1
        if arg == "--":
            parsed.inputs += args[index:]
            break
        if not arg.startswith("-") or arg == "-":
            parsed.inputs.append(arg)
            continue
        name, value, index = _sed_option(arg, args, index)
        if name == "-e":
            scripts.append(value)
        elif name == "-f":
            parsed.files.append(value)
        parsed.in_place = parsed.in_place or name == "-i"
        parsed.sandbox = parsed.sandbox or name == "--sandbox"
    if not scripts and not parsed.files and parsed.inputs:
        scripts.append(parsed.inputs.pop(0))
    if scripts:  # joined as sed joins them: `-e 'a\' -e TEXT` is one command
        parsed.script = "\n".join(scripts)
    return parsed


@dataclass
class _SedActs:
    """What a sed script does besides editing text."""

    runs: list[str | None] = field(default_factory=list)  # `e CMD`; None for `e` alone (runs each line)
    substitutions: list[tuple[str, str]] = field(default_factory=list)  # `s/RE/REPL/e`: (RE, REPL)
    writes: list[str] = field(default_factory=list)  # `w FILE`, `W FILE`, `s///w FILE`


class _SedParser:
    """Reads a sed script for the commands it runs and the files it writes (`_SedActs`); raises
    `_ParseError` for what it cannot read. Lenient where sed is strict (a command not followed by a
    separator is read on), so what it finds is never less than what sed would run."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.acts = _SedActs()

    def parse(self) -> _SedActs:
        while True:
            self._skip(" \t\n;}")
            if self.pos >= len(self.text):
                return self.acts
            if self._peek() == "#":
                self._line()
                continue
            self._addresses()
            self._command()

    def _peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else "\0"

    def _next(self) -> str:
        if self.pos >= len(self.text):
            raise _ParseError("sed script ends where a command or a delimiter was expected")
        self.pos += 1
        return self.text[self.pos - 1]

    def _skip(self, chars: str) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in chars:
            self.pos += 1

    def _digits(self) -> None:
        while self._peek().isdigit():
            self.pos += 1

    def _line(self) -> str:
        """The rest of the line (a file name, the command of `e`), after the blanks it starts with."""
        self._skip(" \t")
        end = self.text.find("\n", self.pos)
        end = len(self.text) if end < 0 else end
        line, self.pos = self.text[self.pos : end], end + 1
        return line

    def _label(self) -> None:
        self._skip(" \t")
        while self.pos < len(self.text) and self.text[self.pos] not in " \t\n;}":
            self.pos += 1

    def _addresses(self) -> None:
        if self._address():
            self._skip(" \t")
            if self._peek() == ",":
                self.pos += 1
                self._skip(" \t")
                if self._peek() in ("+", "~"):
                    self.pos += 1
                    self._digits()
                elif not self._address():
                    raise _ParseError("sed address range without its end")
        self._skip(" \t")
        while self._peek() == "!":
            self.pos += 1
            self._skip(" \t")

    def _address(self) -> bool:
        char = self._peek()
        if char.isdigit():
            self._digits()
            if self._peek() == "~":
                self.pos += 1
                self._digits()
            return True
        if char == "$":
            self.pos += 1
            return True
        if char in ("/", "\\"):
            self.pos += 1
            self._part(self._next() if char == "\\" else "/", brackets=True)
            while self._peek() in ("I", "M"):
                self.pos += 1
            return True
        return False

    def _part(self, delimiter: str, brackets: bool) -> str:
        """A regular expression or a replacement, up to the (unescaped) delimiter; in a regular expression
        a bracket expression may hold the delimiter (`s/[/]/x/`)."""
        if delimiter in ("\n", "\\"):
            raise _ParseError(f"{delimiter!r} cannot delimit a sed expression")
        start = pos = self.pos
        text = self.text
        while pos < len(text):
            char = text[pos]
            if char == "\\":
                pos += 2
            elif char == delimiter:
                self.pos = pos + 1
                return text[start:pos]
            elif char == "\n":
                break
            elif char == "[" and brackets:
                pos = self._bracket(pos)
            else:
                pos += 1
        raise _ParseError("unterminated sed expression")

    def _bracket(self, pos: int) -> int:
        """Where the bracket expression starting at `pos` ends (`[^]/[:alpha:]]`)."""
        text = self.text
        pos += 1
        if text.startswith("^", pos):
            pos += 1
        if text.startswith("]", pos):
            pos += 1
        while pos < len(text) and text[pos] not in "]\n":
            if text[pos] == "[" and text[pos + 1 : pos + 2] in (":", "=", "."):
                end = text.find(text[pos + 1] + "]", pos + 2)
                pos = len(text) if end < 0 else end + 2
            else:
                pos += 1
        if not text.startswith("]", pos):
            raise _ParseError("unterminated bracket expression in a sed expression")
        return pos + 1

    def _command(self) -> None:
        char = self._next()
        if char == "{" or char in _SED_SIMPLE:
            return
        if char in "aic":
            self._text()
        elif char in ":btTv":
            self._label()
        elif char in "rRwW":
            name = self._line().strip()
            if char in "wW":
                self.acts.writes.append(name)
        elif char == "e":
            self.acts.runs.append(self._line().strip() or None)
        elif char == "s":
            self._substitute()
        elif char == "y":
            delimiter = self._next()
            self._part(delimiter, brackets=False)
            self._part(delimiter, brackets=False)
        elif char in "lLqQ":
            self._skip(" \t")
            self._digits()
        else:
            raise _ParseError(f"unknown sed command {char!r}")

    def _text(self) -> None:
        """The text of a/i/c: to the end of the line (`a text`, `a\\` and the next line); a line ending
        in a backslash goes on on the next one."""
        self._skip(" \t")
        if self._peek() == "\\":
            self.pos += 1
            if self._peek() == "\n":
                self.pos += 1
        while self.pos < len(self.text):
            line = self._line()
            if (len(line) - len(line.rstrip("\\"))) % 2 == 0:
                return

    def _substitute(self) -> None:
        delimiter = self._next()
        regex = self._part(delimiter, brackets=True)
        replacement = self._part(delimiter, brackets=False)
        runs = False
        while self._peek() in _SED_FLAGS or self._peek() in ("e", "w", " ", "\t"):  # sed skips blanks
            char = self._next()
            if char == "w":
                self.acts.writes.append(self._line().strip())
                break
            runs = runs or char == "e"
        if runs:
            self.acts.substitutions.append((regex, replacement))


def _sed_replaced(regex: str, replacement: str) -> tuple[str, bool]:
    """The command `s/regex/replacement/e` runs, as far as it is known, and whether all of it is: the
    part of the line read (`&`, `\\1`) stands as $SED_INPUT, and with a regular expression matching less
    than the whole line the rest of the line runs too."""
    refers = False

    def literal(match: re.Match[str]) -> str:
        nonlocal refers
        token = match[0]
        if token == "&" or token[1].isdigit():
            refers = True
            return "$SED_INPUT"
        if token[1] in "LUluE":  # case conversion
            return ""
        return "\n" if token[1] == "n" else token[1]

    command = _SED_REF_RE.sub(literal, replacement)
    return command, not refers and _SED_WHOLE_RE.fullmatch(regex) is not None


def _sed_runs_input(cmd: _Cmd, ctx: _Ctx, inputs: list[str], label: str) -> list[Finding]:
    """`e` alone or `s///e`: every line sed reads runs as a shell command — rated like `sh FILE` for
    each file it reads, or like `… | sh` for what it is given to read."""
    findings: list[Finding] = [(HIGH, f"{label}: runs the lines it reads as shell commands")]
    for source in inputs or ["-"]:
        if source not in ("-", "/dev/stdin"):
            findings += _run_script(cmd, source, ctx, shell=True)
        elif cmd.upstream or any(op in ("<", "<<", "<<<") for op, _ in cmd.redirs):
            findings += _stdin_program(cmd, ctx, shell=True)
    return findings


def _sed_acts(script: str) -> _SedActs:
    """What `script` does (`_SedParser`). The shell's `$` is sed's last line too (`'$d'`): a script that
    cannot be read with its variables and substitutions as they are (`"${N}d"`, `"$(echo 1)e …"`) is
    read with each of them standing for a line number."""
    try:
        return _SedParser(script).parse()
    except _ParseError:
        if not _is_dynamic(script):
            raise
        return _SedParser(_SHELL_VALUE_RE.sub("1", script)).parse()


def _sed_script_findings(script: str, cmd: _Cmd, ctx: _Ctx, inputs: list[str], label: str) -> list[Finding]:
    try:
        acts = _sed_acts(script)
    except _ParseError as exc:
        return [(HIGH, f"could not parse the {label} script {_show(script)!r} ({exc}): it may run commands "
                       "or write files")]  # fmt: skip
    findings = [_write_finding(f"{label} w writes", target, ctx) for target in acts.writes]
    for text in acts.runs:
        if text is None:
            findings += _sed_runs_input(cmd, ctx, inputs, f"{label} e")
        else:
            findings += _exec_text(text, ctx, f"{label} e command")
    for regex, replacement in acts.substitutions:
        command, whole = _sed_replaced(regex, replacement)
        if command.strip():
            findings += _exec_text(command, ctx, f"{label} s///e command")
        if not whole:
            findings += _sed_runs_input(cmd, ctx, inputs, f"{label} s///e")
    return findings


def _sed_script_file(path: str, cmd: _Cmd, ctx: _Ctx) -> tuple[str | None, list[Finding]]:
    """The text of a `sed -f` script when this line wrote it or gives it on standard input (None when not
    known), and findings for where it comes from."""
    if path in ("-", "/dev/stdin"):
        text = _input_text(cmd.redirs, ctx)
        if text is None and cmd.upstream:
            text = _literal_payload(cmd.upstream, ctx, cmd.piped_input)
            kind = next((k for argv in cmd.upstream if (k := _stage_source(argv, ctx)) is not None), None)
            if kind is not None:
                return text, [(HIGH, f"sed -f -: runs a sed script of {kind} (it can run commands)")]
        return text, []
    written = _written(path, ctx)
    if written is None:
        return None, []
    if written.source is not None:
        return written.text, [(HIGH, f"sed -f '{_show(path)}': runs a sed script saved from {written.source} "
                                     "(it can run commands)")]  # fmt: skip
    return written.text, []


def _h_sed(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    parsed = _sed_args(cmd.args)
    findings: list[Finding] = [(LOW, "sed: prints edited text (no in-place edit)")]
    if parsed.in_place:
        findings = [_write_finding("sed -i on", f, ctx) for f in parsed.inputs] or [
            (MEDIUM, "sed -i: edits files in place")
        ]
    if parsed.sandbox:  # sed refuses a script with e, r or w
        return findings
    if parsed.script is not None:
        findings += _sed_script_findings(parsed.script, cmd, ctx, parsed.inputs, "sed")
    for path in parsed.files:
        text, found = _sed_script_file(path, cmd, ctx)
        findings += found
        if text is not None:
            findings += _sed_script_findings(text, cmd, ctx, parsed.inputs, f"sed -f '{_show(path)}'")
        else:
            findings.append((MEDIUM, f"sed -f '{_show(path)}': runs a sed script file (it can run commands or "
                                     "write files; not analysed)"))  # fmt: skip
    return findings


def _sed_writes(args: list[str]) -> list[str]:
    """The files a sed command line's script writes (`w FILE`), for `_record_writes`."""
    script = _sed_args(args).script
    if script is None or "w" not in script.lower():
        return []
    try:
        return _sed_acts(script).writes
    except _ParseError:
        return []


_AWK_DANGER_RE = re.compile(r"\bsystem\s*\(|\|\s*getline|\|\s*\"")
_AWK_OUTPUT_RE = re.compile(  # `print … > FILE`, `printf … >> FILE`: FILE a string or an expression
    r"\bprintf?\b(?P<args>(?:\"(?:[^\"\\\n]|\\.)*\"|[^;{}\n|\">]){0,400}?)>>?(?!=)\s*"
    r"(?P<target>\"(?:[^\"\\\n]|\\.)*\"|[^\s;}]+)"
)


_AWK_REGEX_AFTER = frozenset("(,~!{;&|\n")  # a `/` after these (or first) starts a regular expression


def _awk_code(program: str) -> str:
    """`program` with its strings, regular-expression literals and comments emptied, so that a `|` left
    is a pipe. A `/` starts a regular expression where awk reads one (first, or after one of
    `_AWK_REGEX_AFTER`), otherwise it divides; an unterminated string or expression ends at the end of
    its line. Each character is read at most twice: linear."""
    out: list[str] = []
    index, end, before = 0, len(program), ""
    while index < end:
        char = program[index]
        if char == '"' or (char == "/" and (before == "" or before in _AWK_REGEX_AFTER)):
            stop = index + 1
            while stop < end and program[stop] not in (char, "\n"):
                stop += 2 if program[stop] == "\\" else 1
            if char == '"' or (stop < end and program[stop] == "/"):
                out.append(char * 2)
                index, before = stop + 1, char
                continue
        elif char == "#":
            while index < end and program[index] != "\n":
                index += 1
            continue
        out.append(char)
        if not char.isspace() or char == "\n":
            before = char
        index += 1
    return "".join(out)


_AWK_PIPE_RE = re.compile(r"(?<!\|)\|(?!\|)")  # `print … | CMD`, `CMD | getline`, gawk's `|&`


def _awk_writes(program: str, ctx: _Ctx) -> list[Finding]:
    """The files an awk program's `print > FILE` writes, rated like any write; a FILE awk computes
    (`print > $2`, `print > f`) is a path computed at runtime. A `>` inside parentheses compares."""
    findings: list[Finding] = []
    for match in _AWK_OUTPUT_RE.finditer(program):
        if match["args"].count("(") > match["args"].count(")"):
            continue
        target = match["target"]
        if target.startswith('"'):
            findings.append(_write_finding("awk print >", target[1:-1].replace('\\"', '"'), ctx))
        else:
            level, what = _WRITE_RULES["dynamic"]
            findings.append((level, f"awk print > {_show(target, 40)}: {what}"))
    return findings


def _h_awk(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    opts = _parse_opts(cmd.args, ("-f", "-v", "-F", "-i", "--include", "-e", "--source", "-l", "--load"))
    program = opts.value("-e", "--source") or (opts.operands[0] if opts.operands else "")
    findings: list[Finding] = [(LOW, "awk: text processing")]
    if _AWK_DANGER_RE.search(program):
        findings.append((HIGH, f"awk program runs commands or writes files: {_show(program)!r}"))
        findings += _shell_calls(program, ctx, "awk")
    elif "|" in program and _AWK_PIPE_RE.search(_awk_code(program)):
        findings.append((HIGH, f"awk program pipes to or from a command: {_show(program)!r}"))
    if ">" in program:
        findings += _awk_writes(program, ctx)
    if opts.has("-l", "--load") or re.search(r"@load\b", program):
        findings.append((HIGH, "awk loads an extension (a shared library runs in awk)"))
    if "inplace" in opts.values("-i", "--include"):
        files = opts.operands[1:]
        findings += [_write_finding("awk -i inplace on", f, ctx) for f in files]
    if opts.has("-f"):
        findings.append((MEDIUM, "awk -f: runs an awk script file"))
    return findings


_TAR_RUNS = ("-I", "--use-compress-program", "--to-command", "-F", "--info-script", "--new-volume-script",
             "--rsh-command", "--checkpoint-action")  # fmt: skip  # options whose value is a command tar runs
_TAR_LONG = ("--file", "--directory", "--exclude-from", "--extract", "--get", "--create", "--append", "--update",
             "--checkpoint", *(option for option in _TAR_RUNS if option.startswith("--")))  # fmt: skip


def _h_tar(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    args = list(cmd.args)
    if args and re.fullmatch(r"[A-Za-z]+", args[0]):
        args[0] = "-" + args[0]  # old-style `tar xzf`
    opts = _gnu_opts(
        args, _TAR_LONG, ("-f", "--file", "-C", "--directory", "-T", "-X", "--exclude-from", *_TAR_RUNS)
    )
    letters = opts.letters()
    findings: list[Finding] = []
    if any(
        flag.startswith(("--checkpoint-action", "--to-command", "--use-compress-program"))
        for flag, _ in opts.flags
    ):
        findings.append((HIGH, f"{cmd.label()}: runs arbitrary commands through tar options"))
    for flag, value in opts.flags:
        if flag == "--checkpoint-action" and value is not None:
            value = value[5:] if value.startswith("exec=") else None
        if flag in _TAR_RUNS and value:
            findings += _exec_text(value, ctx, f"tar {flag}")
    if "x" in letters or opts.has("--extract", "--get"):
        target = opts.value("-C", "--directory") or "."
        level, what = _write_risk(target, ctx)
        findings.append((max(level, MEDIUM, key=lambda lv: lv.rank), f"tar extract into '{target}': {what}"))
    elif "c" in letters or "r" in letters or "u" in letters or opts.has("--create", "--append"):
        archive = opts.value("-f", "--file")
        findings.append(_write_finding("tar archive", archive, ctx) if archive else (LOW, "tar to stdout"))
    return findings or [(LOW, "tar: lists an archive")]


# ---------------------------------------------------------------------------- options that write or run
# A tool that reads (`sort`, `uniq`, `man` …) can write a file through an option or an operand (`sort -o
# FILE`, `uniq IN OUT`) or run a program (`man -P CMD`, `sort --compress-program=PROG`): that is rated
# like writing the file (`cp x FILE`, `> FILE`) or running the program.


@dataclass(frozen=True)
class _Outputs:
    """How a tool writes files or runs programs through its options or operands."""

    longs: tuple[str, ...] = ()  # its long options (so that GNU abbreviations are read as them)
    with_arg: tuple[str, ...] = ()  # its options that take a value
    writes: tuple[str, ...] = ()  # options naming a file it writes (`sort -o FILE`)
    operand: int | None = None  # the operand naming the file it writes (`uniq IN OUT`)
    runs: tuple[str, ...] = ()  # options naming a program it runs (`sdiff --diff-program=PROG A B`)
    shell: tuple[str, ...] = ()  # options holding a command it gives a shell (`man -P CMD`)


_OUTPUTS: dict[str, _Outputs] = {
    "sort": _Outputs(
        longs=("--ignore-leading-blanks", "--dictionary-order", "--ignore-case", "--general-numeric-sort",
               "--ignore-nonprinting", "--month-sort", "--human-numeric-sort", "--numeric-sort", "--random-sort",
               "--random-source", "--reverse", "--sort", "--version-sort", "--batch-size", "--check",
               "--compress-program", "--debug", "--files0-from", "--key", "--merge", "--output", "--stable",
               "--buffer-size", "--field-separator", "--temporary-directory", "--unique", "--parallel",
               "--zero-terminated", "--help", "--version"),
        with_arg=("-k", "--key", "-t", "--field-separator", "-o", "--output", "-S", "--buffer-size", "-T",
                  "--temporary-directory", "--parallel", "--batch-size", "--compress-program", "--files0-from",
                  "--random-source", "--sort"),
        writes=("-o", "--output"),
        runs=("--compress-program",),
    ),
    "shuf": _Outputs(
        longs=("--echo", "--input-range", "--head-count", "--output", "--random-source", "--repeat",
               "--zero-terminated", "--help", "--version"),
        with_arg=("-i", "--input-range", "-n", "--head-count", "-o", "--output", "--random-source"),
        writes=("-o", "--output"),
    ),
    "uniq": _Outputs(
        longs=("--count", "--repeated", "--all-repeated", "--skip-fields", "--group", "--ignore-case",
               "--skip-chars", "--unique", "--zero-terminated", "--check-chars", "--help", "--version"),
        with_arg=("-f", "--skip-fields", "-s", "--skip-chars", "-w", "--check-chars"),
        operand=1,
    ),
    "diff": _Outputs(longs=("--output",), with_arg=("--output",), writes=("--output",)),
    "sdiff": _Outputs(
        longs=("--output", "--ignore-case", "--ignore-tab-expansion", "--ignore-trailing-space",
               "--ignore-space-change", "--ignore-all-space", "--ignore-blank-lines", "--ignore-matching-lines",
               "--strip-trailing-cr", "--text", "--width", "--left-column", "--suppress-common-lines",
               "--expand-tabs", "--tabsize", "--minimal", "--speed-large-files", "--diff-program", "--help",
               "--version"),
        with_arg=("-o", "--output", "-w", "--width", "-I", "--ignore-matching-lines", "--tabsize",
                  "--diff-program"),
        writes=("-o", "--output"),
        runs=("--diff-program",),
    ),
    "iconv": _Outputs(
        longs=("--from-code", "--to-code", "--list", "--output", "--silent", "--verbose", "--help", "--usage",
               "--version"),
        with_arg=("-f", "--from-code", "-t", "--to-code", "-o", "--output"),
        writes=("-o", "--output"),
    ),
    "info": _Outputs(
        longs=("--all", "--apropos", "--directory", "--dribble", "--file", "--help", "--index-search",
               "--init-file", "--location", "--node", "--output", "--raw-escapes", "--restore", "--show-options",
               "--speech-friendly", "--strict-node-location", "--subnodes", "--variable", "--version",
               "--vi-keys"),
        with_arg=("-d", "--directory", "-f", "--file", "-n", "--node", "-o", "--output", "-k", "--apropos",
                  "--index-search", "--init-file", "--dribble", "--restore", "-v", "--variable"),
        writes=("-o", "--output", "--dribble"),
    ),
    "tree": _Outputs(
        with_arg=("-L", "-P", "-I", "-o", "-H", "-T", "--charset", "--filelimit", "--timefmt", "--sort"),
        writes=("-o",),
    ),
    "less": _Outputs(
        longs=("--log-file", "--LOG-FILE", "--lesskey-file", "--long-prompt", "--pattern", "--prompt", "--tag",
               "--tag-file", "--tabs", "--shift", "--window"),
        with_arg=("-o", "-O", "--log-file", "--LOG-FILE", "-b", "-h", "-j", "-k", "-p", "-P", "-t", "-T", "-x",
                  "-y", "-z", "--lesskey-file", "--pattern", "--prompt", "--tag", "--tag-file", "--tabs",
                  "--shift", "--window"),
        writes=("-o", "-O", "--log-file", "--LOG-FILE"),
    ),
    "iptables-save": _Outputs(
        with_arg=("-f", "--file", "-t", "--table", "-M", "--modprobe"),
        writes=("-f", "--file"),
        runs=("-M", "--modprobe"),
    ),
    "pv": _Outputs(
        with_arg=("-o", "--output", "-L", "--rate-limit", "-s", "--size", "-i", "--interval", "-w", "--width",
                  "-H", "--height", "-N", "--name", "-B", "--buffer-size", "-d", "--watchfd", "-R", "--remote",
                  "-P", "--pidfile", "-F", "--format"),
        writes=("-o", "--output", "-P", "--pidfile"),
    ),
    "atop": _Outputs(with_arg=("-w", "-r"), writes=("-w",)),
    "dstat": _Outputs(with_arg=("--output",), writes=("--output",)),
    "dmidecode": _Outputs(
        with_arg=("-d", "--dev-mem", "-s", "--string", "-t", "--type", "-H", "--handle", "--dump-bin",
                  "--from-dump"),
        writes=("--dump-bin",),
    ),
    "rg": _Outputs(
        with_arg=("-e", "--regexp", "-f", "--file", "-g", "--glob", "--iglob", "-t", "--type", "-T", "--type-not",
                  "--type-add", "--type-clear", "-A", "--after-context", "-B", "--before-context", "-C",
                  "--context", "-m", "--max-count", "-j", "--threads", "-M", "--max-columns", "-r", "--replace",
                  "-E", "--encoding", "--pre", "--pre-glob", "-d", "--max-depth", "--max-filesize", "--color",
                  "--colors", "--sort", "--sortr", "--path-separator", "--context-separator", "--ignore-file",
                  "--engine", "--hostname-bin", "--hyperlink-format"),
        runs=("--pre", "--hostname-bin"),
    ),
    "man": _Outputs(
        longs=("--config-file", "--debug", "--default", "--warnings", "--whatis", "--apropos",
               "--global-apropos", "--local-file", "--where", "--path", "--location", "--where-cat",
               "--location-cat", "--catman", "--recode", "--locale", "--systems", "--manpath", "--sections",
               "--extension", "--ignore-case", "--match-case", "--regex", "--wildcard", "--names-only", "--all",
               "--update", "--no-subpages", "--pager", "--prompt", "--ascii", "--encoding", "--no-hyphenation",
               "--no-justification", "--preprocessor", "--troff", "--troff-device", "--html", "--gxditview",
               "--ditroff", "--help", "--usage", "--version"),
        with_arg=("-C", "--config-file", "-R", "--recode", "-L", "--locale", "-m", "--systems", "-M",
                  "--manpath", "-S", "-s", "--sections", "-e", "--extension", "-P", "--pager", "-r", "--prompt",
                  "-E", "--encoding", "-p", "--preprocessor"),
        shell=("-P", "--pager", "--html"),  # `--html=BROWSER` (`-HBROWSER`: `_h_man`)
    ),
}  # fmt: skip


def _outputs_written(rule: _Outputs, opts: _Opts) -> list[str]:
    written = [target for target in opts.values(*rule.writes) if target != "-"]
    if rule.operand is not None and len(opts.operands) > rule.operand and opts.operands[rule.operand] != "-":
        written.append(opts.operands[rule.operand])
    return written


def _h_outputs(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    rule = _OUTPUTS[cmd.name]
    opts = _gnu_opts(cmd.args, rule.longs, rule.with_arg)
    findings = [_static_finding(cmd)]
    findings += [_write_finding(f"{cmd.name} writes", target, ctx) for target in _outputs_written(rule, opts)]
    for program in opts.values(*rule.runs):  # given the operands (`sdiff --diff-program=rm a b`)
        findings += _classify_argv([program, *opts.operands], cmd, ctx)
    for code in opts.values(*rule.shell):
        findings += _exec_text(code, ctx, f"{cmd.name} runs")
    return findings


def _h_man(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    """man: `-P CMD`/`--pager=CMD` and `-HBROWSER`/`--html=BROWSER` are run by a shell."""
    browsers = [arg[2:] for arg in cmd.args if arg.startswith("-H") and len(arg) > 2]
    return _h_outputs(cmd, ctx) + [f for b in browsers for f in _exec_text(b, ctx, "man -H runs")]


def _xxd_output(args: list[str]) -> str | None:
    """The file `xxd [OPTIONS] [IN [OUT]]` writes: OUT. Its options are `-l 16`, `-len 16` or `-l16`."""
    operands: list[str] = []
    index = 0
    while index < len(args):
        arg = args[index]
        index += 1
        if arg.startswith("-") and len(arg) > 1:
            if arg[1] in "cglosnR" and (len(arg) == 2 or arg[2:].isalpha()):
                index += 1  # the value is the next word
            continue
        operands.append(arg)
    return operands[1] if len(operands) > 1 and operands[1] != "-" else None


def _h_xxd(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    target = _xxd_output(cmd.args)
    return [_static_finding(cmd)] + ([_write_finding("xxd writes", target, ctx)] if target else [])


_SPLIT_LONG = ("--suffix-length", "--additional-suffix", "--bytes", "--line-bytes", "--lines", "--number",
               "--separator", "--filter", "--numeric-suffixes", "--hex-suffixes", "--elide-empty-files",
               "--unbuffered", "--verbose", "--help", "--version")  # fmt: skip
_SPLIT_WITH_ARG = ("-a", "--suffix-length", "--additional-suffix", "-b", "--bytes", "-C", "--line-bytes", "-l",
                   "--lines", "-n", "--number", "-t", "--separator", "--filter")  # fmt: skip
_CSPLIT_LONG = ("--suffix-format", "--prefix", "--keep-files", "--suppress-matched", "--digits", "--quiet",
                "--silent", "--elide-empty-files", "--help", "--version")  # fmt: skip


def _split_outputs(name: str, args: list[str]) -> tuple[list[str], list[str]]:
    """The first file split/csplit writes (PREFIX + its first suffix: `split IN ~/.bashrc` writes
    ~/.bashrcaa) and the commands `split --filter=CMD` gives its pieces to instead."""
    if name == "split":
        opts = _gnu_opts(args, _SPLIT_LONG, _SPLIT_WITH_ARG)
        filters = opts.values("--filter")
        prefix = opts.operands[1] if len(opts.operands) > 1 else "x"
        return ([] if filters else [prefix + "aa"]), filters
    opts = _gnu_opts(args, _CSPLIT_LONG, ("-b", "--suffix-format", "-f", "--prefix", "-n", "--digits"))
    return [(opts.value("-f", "--prefix") or "xx") + "00"], []


def _h_split(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    written, filters = _split_outputs(cmd.name, cmd.args)
    findings = [_static_finding(cmd)] + [_write_finding(f"{cmd.name} writes", t, ctx) for t in written]
    return findings + [f for code in filters for f in _exec_text(code, ctx, "split --filter")]


_DC_SHELL_RE = re.compile(r"!(?![<>=])([^\n]*)")  # `!CMD` runs the rest of the line; `!<r` compares


def _h_dc(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    """dc runs the rest of a line after `!` as a shell command: in its -e programs, in a literal program
    piped into it, and (not read) in program files or a downloaded program piped into it."""
    opts = _gnu_opts(cmd.args, ("--expression", "--file", "--help", "--version"),
                     ("-e", "--expression", "-f", "--file"))  # fmt: skip
    programs = opts.values("-e", "--expression")
    piped = _input_text(cmd.redirs, ctx)
    if piped is None and cmd.upstream:
        piped = _literal_payload(cmd.upstream, ctx, cmd.piped_input)
    findings = [_static_finding(cmd)]
    for program in [*programs, *([piped] if piped else [])]:
        for match in _DC_SHELL_RE.finditer(program):
            findings += _exec_text(match[1], ctx, "dc !") or [(LOW, "dc ! with an empty command")]
    if opts.has("-f", "--file") or opts.operands:
        findings.append((MEDIUM, f"{cmd.label()}: runs dc program files (their ! lines run shell commands)"))
    kind = next((k for argv in cmd.upstream if (k := _stage_source(argv, ctx)) is not None), None)
    if kind is not None:
        findings.append((HIGH, f"pipes {kind} into dc: its ! lines run shell commands"))
    return findings


_LESS_VALUED = frozenset("bhjkpPtTxyz#")  # options toggled at less's `-` prompt that then ask for a value
_LESS_LONG_VALUED = frozenset({"log-file", "LOG-FILE", "pattern", "prompt", "tag", "tag-file", "tabs", "shift",
                               "window", "jump-target", "lesskey-file"})  # fmt: skip


def _less_line(text: str, start: int) -> tuple[str, int]:
    """The text from `start` up to the end of the line (what a less prompt reads), and where the next
    command starts."""
    stop = start
    while stop < len(text) and text[stop] not in "\n\r":
        stop += 1
    return text[start:stop], stop + 1


def _less_commands(text: str, ctx: _Ctx, label: str) -> list[Finding]:
    """Findings for the less commands of `text` (`less +CMD`, `++CMD`, `+CMD` in $LESS), read as less
    reads keys: `!CMD` and `#CMD` give CMD to a shell, `|mCMD` pipes to CMD, `s FILE` and `-o FILE`
    write FILE, `v` runs the editor; a search (`/PAT`, `?PAT`, `&PAT`) reads up to the end of the
    line, so that `+/a!b` is a search. A command less reads otherwise is one key (`G`, `F`, `50`…):
    reading a key as a command of its own never lowers a rating. Each character is read once."""
    findings: list[Finding] = []
    index = 0
    while index < len(text):
        char = text[index]
        if char in "/?&":
            _, index = _less_line(text, index + 1)
        elif char == ":":  # `:e FILE` and `:t TAG` read a line, `:n`, `:p`, `:x`, `:d` … are two keys
            index = _less_line(text, index + 2)[1] if text[index + 1 : index + 2] in ("e", "t") else index + 2
        elif char in "!#|":
            command, index = _less_line(text, index + (2 if char == "|" else 1))
            findings += _exec_text(command, ctx, f"{label} {char}") or [
                (HIGH, f"{label} {char}: opens a shell")
            ]
        elif char == "s":
            name, index = _less_line(text, index + 1)
            if name.strip():
                findings.append(_write_finding(f"{label} s writes", name.strip(), ctx))
        elif char == "v":
            findings.append((MEDIUM, f"{label} v: runs the editor ($VISUAL, $EDITOR)"))
            index += 1
        elif char == "-":
            index = _less_option(text, index + 1, ctx, label, findings)
        else:
            index += 1
    return findings


def _less_option(text: str, index: int, ctx: _Ctx, label: str, findings: list[Finding]) -> int:
    """Read the option less's `-` command changes at `text[index]` (`-o FILE`, `--log-file` NL FILE,
    `-S` …): add the findings of a log file it writes, and return where the next command starts."""
    if text[index : index + 1] == "-":
        name, index = _less_line(text, index + 1)
        if name.strip() in _LESS_LONG_VALUED:
            value, index = _less_line(text, index)
            if name.strip().lower() == "log-file" and value.strip():
                findings.append(_write_finding(f"{label} --{name.strip()}", value.strip(), ctx))
        return index
    letter = text[index : index + 1]
    if letter in ("o", "O"):
        value, index = _less_line(text, index + 1)
        if value.strip():
            findings.append(_write_finding(f"{label} -{letter} writes", value.strip(), ctx))
        return index
    if letter and letter in _LESS_VALUED:
        return _less_line(text, index + 1)[1]
    return index + 1


def _less_env_commands(value: str, ctx: _Ctx) -> list[Finding]:
    """The `+CMD` options of $LESS: each runs to the next `$` (which ends a string option there)."""
    findings: list[Finding] = []
    for match in re.finditer(r"(?:^|(?<=\s))\++([^$]*)", value):
        findings += _less_commands(match[1], ctx, "LESS +")
    return findings


def _h_less(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    findings = _h_outputs(cmd, ctx)
    rule = _OUTPUTS["less"]
    skip = False
    for index, arg in enumerate(cmd.args):
        if skip:
            skip = False
        elif arg == "--":
            break
        elif arg.startswith("+"):
            findings += _less_commands(arg[2:] if arg.startswith("++") else arg[1:], ctx, "less +")
        else:
            skip = arg in rule.with_arg
            findings += _lesskey_option(cmd, index, ctx)
    return findings


_LESSKEY_OPTIONS = {"-k": "LESSKEYIN", "--lesskey-file": "LESSKEYIN", "--lesskey-src": "LESSKEYIN",
                    "--lesskey-content": "LESSKEY_CONTENT"}  # fmt: skip
_LESSKEY_VARIABLES = frozenset(
    {"LESSKEY", "LESSKEYIN", "LESSKEY_SYSTEM", "LESSKEYIN_SYSTEM", "LESSKEY_CONTENT"}
)
_LESSKEY_ENV_RE = re.compile(r"^[ \t]*(LESSOPEN|LESSCLOSE|LESS)[ \t]*=[ \t]*(.*)$", re.M)


def _lesskey_option(cmd: _Cmd, index: int, ctx: _Ctx) -> list[Finding]:
    """`less -k FILE`, `--lesskey-src=FILE`, `--lesskey-content=TEXT`: rated like the variables
    (`_lesskey_findings`)."""
    arg = cmd.args[index]
    option, equals, value = arg.partition("=")
    if not equals:
        if arg.startswith("-k") and len(arg) > 2 and not arg.startswith("--"):
            option, value = "-k", arg[2:]
        elif index + 1 < len(cmd.args):
            value = cmd.args[index + 1]
        else:
            return []
    variable = _LESSKEY_OPTIONS.get(option)
    return [] if variable is None else _lesskey_findings(variable, value, ctx, f"less {option}")


def _lesskey_findings(name: str, value: str, ctx: _Ctx, label: str = "") -> list[Finding]:
    """A lesskey file's `#env` section sets less's variables, LESSOPEN (a command less runs) among
    them: a file the line or the run saved is rated (`_known_script`), another one is `medium`; given
    text (LESSKEY_CONTENT), its LESSOPEN/LESSCLOSE/LESS settings are rated like the variables."""
    if name == "LESSKEY_CONTENT":
        findings: list[Finding] = []
        for match in _LESSKEY_ENV_RE.finditer(value):
            findings += _variable_command_findings(match[1], match[2].strip(), ctx)
        return findings
    if not value.strip():
        return []
    lesskey = _Cmd("less", "less", [value], [], [])
    known = _known_script(lesskey, value, ctx, shell=None)
    return known or [
        (MEDIUM, f"{label or name} {_show(value, 40)}: less reads settings from this lesskey file, which can set "
                 "LESSOPEN (a command less runs; contents not analysed)")
    ]  # fmt: skip


_VIM_NAMES = frozenset(
    _words("vim vi nvim ex view vimdiff gvim gview gvimdiff rvim rview evim vim.basic vim.tiny")
)
_VIM_WITH_ARG = frozenset(_words("-u -U -i -T -w -W -s -t -q -S -r -V --servername --startuptime --listen"))
_VIM_EX = frozenset({"-c", "--cmd", "--remote-send", "--remote-expr"})  # their value is an Ex command
_VIM_BANG_RE = re.compile(  # `:!CMD`, `:r !CMD`, `:w !CMD`, `:%!CMD`, `silent !CMD`, `exe "!CMD"`
    r"\"!(?P<dq>[^\"\n]*)|'!(?P<sq>[^'\n]*)"
    r"|(?:^|(?<=[\s|:%.$,;<>\d]))(?:(?:r|read|w|write)[ \t]*)?!(?P<cmd>[^\n]*)"
)
_VIM_CALL_RE = re.compile(  # a function running a command, given it as a literal or not
    r"\b(?:system|systemlist|job_start|jobstart|termopen|term_start)\s*\(\s*"
    r"(?:\"(?P<dq>[^\"\n]*)\"|'(?P<sq>[^'\n]*)'|(?P<other>))"
)
_VIM_TERMINAL_RE = re.compile(
    r"(?:^|(?<=[\s|:]))ter(?:m(?:i(?:n(?:a(?:l)?)?)?)?)?!?(?:\s+\+\+\w+)*\s+(?P<cmd>[^\n]*)"
)
_VIM_CODE_RE = re.compile(
    r"(?:^|(?<=[\s|:]))(?P<lang>py(?:thon)?3?|pyx|pythonx|py3?do|pyxdo|lua|luado|perl|perldo|ruby|rubydo"
    r"|mz(?:scheme)?|tcl|tcldo)\s+(?P<code>[^\n]*)"
)
_VIM_EXECUTE_RE = re.compile(r"(?:^|(?<=[\s|:]))exe(?:c|cu|cut|cute)?\s+(?P<expr>[^\n|]*)")
_VIM_LITERAL_RE = re.compile(r"\"(?:[^\"\\\n]|\\.)*\"|'[^'\n]*'")


def _vim_ex_findings(text: str, ctx: _Ctx, label: str) -> list[Finding]:
    """Findings for the shell commands of a vim Ex command line: `!CMD` forms, `system("CMD")` and the
    like, `:terminal CMD`, `:py`/`:lua`/`:perl`/`:ruby` code; `:execute` of anything but literals is
    `high` (the command is built at runtime). Each is one regular-expression pass: linear."""
    findings: list[Finding] = []
    for match in _VIM_BANG_RE.finditer(text):
        command = next(g for g in (match["dq"], match["sq"], match["cmd"]) if g is not None)
        findings += _exec_text(command, ctx, f"{label} !")
    for match in _VIM_CALL_RE.finditer(text):
        if match["other"] is not None:
            findings.append((HIGH, f"{label} runs a command built at runtime: {_show(match[0])!r}"))
        else:
            findings += _exec_text(match["dq"] if match["dq"] is not None else match["sq"], ctx, label)
    for match in _VIM_TERMINAL_RE.finditer(text):
        findings += _exec_text(match["cmd"], ctx, f"{label} :terminal")
    for match in _VIM_CODE_RE.finditer(text):
        findings += _code_findings(match["code"], ctx, f"{label} :{match['lang']}")
    for match in _VIM_EXECUTE_RE.finditer(text):
        if _VIM_LITERAL_RE.sub("", match["expr"]).replace(".", "").strip():
            findings.append((HIGH, f"{label}: :execute builds an Ex command at runtime: {_show(match[0])!r}"))
    return findings


def _h_vim(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    """vi/vim/nvim/ex/view: the Ex commands of `-c CMD`, `+CMD`, `--cmd CMD` (and of a server's
    `--remote-send KEYS`/`--remote-expr EXPR`) can run shell commands: those are rated
    (`_vim_ex_findings`); vim itself stays what it is (an interactive program)."""
    findings = [_static_finding(cmd)]
    index = 0
    while index < len(cmd.args):
        arg = cmd.args[index]
        index += 1
        if arg == "--":
            break
        if arg in _VIM_EX and index < len(cmd.args):
            text = cmd.args[index]
            index += 1
            if arg == "--remote-send":
                text = re.sub(r"<(?:CR|Enter|Return|NL)>", "\n", text, flags=re.I)
            findings += _vim_ex_findings(text, ctx, f"{cmd.name} {arg}")
        elif arg.startswith("+") and len(arg) > 1:
            findings += _vim_ex_findings(arg[1:], ctx, f"{cmd.name} +")
        elif arg in ("-S", "-u") and index < len(cmd.args) and cmd.args[index] not in ("NONE", "NORC"):
            findings += _vim_script(cmd, f"{cmd.name} {arg}", cmd.args[index], ctx)
            index += 1
        elif arg in _VIM_WITH_ARG:
            index += 1
    return findings


def _vim_script(cmd: _Cmd, label: str, script: str, ctx: _Ctx) -> list[Finding]:
    """`vim -S FILE`/`-u FILE` sources a Vim script, whose Ex commands can run anything: the Ex commands
    of a script the line wrote are rated, and one the run downloaded is `critical`."""
    shown = _show(script)
    written = _written(script, ctx)
    if written is not None and written.source is None:
        body = _vim_ex_findings(written.text, ctx, f"{label} '{shown}'") if written.text else []
        return [(MEDIUM, f"{label} sources '{shown}', written earlier in this command"), *body]
    known = _known_script(cmd, script, ctx, shell=None)
    return known or [(MEDIUM, f"{label} sources the Vim script '{shown}' (contents not analysed)")]


_EMACS_EVAL = ("--eval", "-eval", "--execute", "-execute")
_ELISP_CALL_RE = re.compile(
    r"\((?P<fn>shell-command(?:-to-string|-on-region)?|async-shell-command|call-process-shell-command"
    r"|start-process-shell-command|start-file-process-shell-command|process-file-shell-command"
    r"|call-process(?:-region)?|process-lines|start-process|start-file-process|make-process|process-file"
    r"|compile|executable-find-and-run)\b(?P<args>[^()]*)"
)
_ELISP_STRING_RE = re.compile(r"\"((?:[^\"\\]|\\.)*)\"")


def _elisp_findings(code: str, ctx: _Ctx, label: str) -> list[Finding]:
    """Emacs Lisp run by `--eval`: inline code (`_code_findings`), and the commands its shell and
    process functions are given as literals (a shell function's strings are command lines, a process
    function's the program and its arguments)."""
    findings = _code_findings(code, ctx, label)
    for match in _ELISP_CALL_RE.finditer(code):
        literals = [m[1].replace('\\"', '"') for m in _ELISP_STRING_RE.finditer(match["args"])]
        if "shell" in match["fn"] or match["fn"] == "compile":
            for text in literals:
                findings += _exec_text(text, ctx, f"{label} ({match['fn']})")
            if not literals:
                findings.append((HIGH, f"{label} runs a shell command built at runtime ({match['fn']})"))
        else:
            findings.append((HIGH, f"{label} runs a program ({match['fn']} {_show(match['args'], 40)})"))
            for start in range(min(len(literals), 3)):  # `start-process NAME BUFFER PROGRAM ARGS`
                findings += _classify_argv(literals[start:], _Cmd("emacs", "emacs", [], [], []), ctx)
    return findings


def _h_emacs(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    findings = [_static_finding(cmd)]
    for index, arg in enumerate(cmd.args):
        name, eq, value = arg.partition("=")
        if name in _EMACS_EVAL:
            code = value if eq else (cmd.args[index + 1] if index + 1 < len(cmd.args) else "")
            findings += _elisp_findings(code, ctx, "emacs --eval")
    return findings


_YQ_IN_PLACE = frozenset({"-i", "--inplace", "--in-place"})


def _h_yq(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    """yq -i EXPRESSION FILE…: edits the files in place."""
    if not _YQ_IN_PLACE & set(cmd.args):
        return [_static_finding(cmd)]
    words = [a for a in cmd.args if not a.startswith("-")]
    if words[:1] and words[0] in ("e", "eval", "ea", "eval-all"):
        words = words[1:]
    files = words[1:] if not any(a.startswith(("--expression", "--from-file")) for a in cmd.args) else words
    return [_write_finding("yq -i edits", f, ctx) for f in files] or [(MEDIUM, "yq -i: edits files in place")]


def _output_files(argv: list[str]) -> list[str]:
    """The files a command writes through its options or operands (`sort -o F`, `uniq IN OUT`, `sed 'w
    F'`), for `_record_writes`."""
    name, args = _normalize_name(argv[0]), argv[1:]
    if name == "sed":
        return _sed_writes(args)
    if name in ("split", "csplit"):
        return _split_outputs(name, args)[0]
    if name == "xxd":
        target = _xxd_output(args)
        return [target] if target else []
    rule = _OUTPUTS.get(name)
    return _outputs_written(rule, _gnu_opts(args, rule.longs, rule.with_arg)) if rule is not None else []


def _h_scp(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    *sources, dest = _parse_opts(cmd.args, _SCP_WITH_ARG).operands or [""]
    return [_static_finding(cmd), *_exfiltration("scp", sources, dest, ctx)]


def _h_rsync(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    opts = _parse_opts(cmd.args, ("-e", "--rsh", "--exclude", "--include", "--filter", "-f", "--rsync-path"))
    if len(opts.operands) < 2:
        return [(LOW, "rsync: lists files")]
    dest = opts.operands[-1]
    remote = re.match(r"^[\w.@-]+:", dest) is not None
    findings: list[Finding] = [(MEDIUM, f"rsync into '{_show(dest)}': copies files")]
    findings += _exfiltration("rsync", opts.operands[:-1], dest, ctx)
    if not remote:
        findings.append(_write_finding("rsync into", dest, ctx))
    if any(flag.startswith("--delete") for flag, _ in opts.flags) or opts.has("--remove-source-files"):
        kind, path = ("relative", dest) if remote else _path_kind(dest, ctx)
        critical = kind in ("root", "home", "etc", "core", "usr") or (
            kind in _SYSTEM_KINDS and _is_sysdir(path)
        )
        findings.append(
            (
                (CRITICAL if critical else HIGH),
                f"rsync --delete into '{dest}': deletes files at the destination",
            )
        )
    return findings


# ---------------------------------------------------------------------------- processes and services

_CRITICAL_PROCESSES = frozenset(
    {"sshd", "systemd", "init", "dbus-daemon", "dbus", "systemd-journald", "systemd-logind", "networkmanager",
     "systemd-networkd", "kubelet", "containerd", "dockerd", "sshd:", "agetty", "login"}
)  # fmt: skip
_KILL_SIGNALS = frozenset({"9", "KILL", "SIGKILL"})


def _parse_kill(args: list[str]) -> tuple[str, list[str], bool]:
    signal = "TERM"
    pids: list[str] = []
    index = 0
    while index < len(args):
        arg = args[index]
        index += 1
        if arg in ("-l", "-L", "--list", "--table"):
            return signal, [], True
        if arg in ("-s", "-n", "--signal") and index < len(args):
            signal, index = args[index], index + 1
        elif arg == "--":
            pids.extend(args[index:])
            break
        elif arg.startswith("-") and not pids and signal == "TERM" and len(arg) > 1:
            signal = arg[1:]
        else:
            pids.append(arg)
    return signal.upper().removeprefix("SIG"), pids, False


def _h_kill(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    signal, pids, listing = _parse_kill(cmd.args)
    if listing or signal == "0":
        return [(LOW, "kill: lists signals / checks a process exists")]
    strong = signal in _KILL_SIGNALS
    findings: list[Finding] = [(LOW, "kill without a PID")]
    for pid in pids:
        if pid == "-1":
            findings.append((CRITICAL, f"kill -{signal} -1: signals every process (all processes when root)"))
        elif pid == "1":
            findings.append((CRITICAL, f"kill -{signal} 1: signals init/systemd (PID 1)"))
        elif pid == "0" or pid.startswith("-"):
            findings.append((HIGH, f"kill -{signal} {pid}: signals a whole process group"))
        else:
            what = "force-kills" if strong else "signals"
            findings.append(((HIGH if strong else MEDIUM), f"kill -{signal} {_show(pid)}: {what} a process"))
    return findings


def _h_pkill(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    opts = _parse_opts(cmd.args, ("-u", "-U", "-g", "-G", "-P", "-t", "-F", "-s", "--signal", "-o", "-y"))
    if opts.has("-l", "--list"):
        return [(LOW, f"{cmd.name} -l: lists signals")]
    findings: list[Finding] = [(HIGH, f"{cmd.label()}: kills every process matching a name/pattern")]
    if "root" in opts.values("-u", "-U") or any(p in (".", ".*", "") for p in opts.operands):
        findings.append((CRITICAL, f"{cmd.label()}: kills all root processes / every process"))
    for name in opts.operands:
        if name.lower() in _CRITICAL_PROCESSES:
            findings.append((CRITICAL, f"{cmd.name} {name}: kills a critical system process"))
    return findings


_SYSTEMCTL_WITH_ARG = (
    "-H", "--host", "-M", "--machine", "-t", "--type", "--state", "-p", "--property", "-n", "--lines",
    "-o", "--output", "-s", "--signal", "--kill-who", "--root", "--what", "--job-mode",
)  # fmt: skip
_SYSTEMCTL: dict[str, RiskLevel] = {
    **dict.fromkeys(
        _words("status show cat list-units list-unit-files list-sockets list-timers list-jobs list-dependencies "
        "list-machines list-automounts list-paths is-active is-enabled is-failed is-system-running "
        "get-default help show-environment --version --help"), LOW),
    **dict.fromkeys(
        _words("start enable reload daemon-reload reset-failed edit set-property unmask preset preset-all revert "
        "add-wants add-requires link try-reload-or-restart reenable"), MEDIUM),
    **dict.fromkeys(
        _words("restart stop try-restart reload-or-restart condrestart kill disable mask set-default isolate "
        "daemon-reexec set-environment unset-environment import-environment freeze thaw clean reboot "
        "kexec soft-reboot switch-root"), HIGH),
    **dict.fromkeys(_words("poweroff halt emergency rescue suspend hibernate hybrid-sleep suspend-then-hibernate"), CRITICAL),
}  # fmt: skip
_CRITICAL_UNITS = frozenset(
    {"ssh", "sshd", "networking", "network", "networkmanager", "systemd-networkd", "dbus", "systemd-journald",
     "systemd-logind", "systemd-resolved", "wpa_supplicant", "getty@tty1", "serial-getty@ttys0",
     "rescue.target", "emergency.target", "poweroff.target", "halt.target", "rescue", "emergency",
     "poweroff", "halt", "runlevel0.target", "runlevel1.target"}
)  # fmt: skip
_STOPPING = frozenset({"stop", "disable", "mask", "kill", "isolate"})


def _unit_name(unit: str) -> str:
    lowered = unit.lower()
    return (
        lowered.removesuffix(".service")
        if not lowered.endswith(".target") or lowered in _CRITICAL_UNITS
        else lowered
    )


def _service_action(tool: str, action: str, units: list[str], level: RiskLevel) -> list[Finding]:
    findings: list[Finding] = [
        (level, f"{tool} {action} {' '.join(units)}".strip() + f": {_ACTION_NOTES[level]}")
    ]
    if action in _STOPPING:
        for unit in units:
            if _unit_name(unit) in _CRITICAL_UNITS:
                findings.append(
                    (CRITICAL, f"{tool} {action} {unit}: can cut remote access or take the system down")
                )
    return findings


_ACTION_NOTES = {
    LOW: "read-only status query",
    MEDIUM: "changes service state",
    HIGH: "stops/restarts services or changes how the system runs (outage risk)",
    CRITICAL: "powers off or drops the system to single-user mode",
}


def _h_systemctl(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    opts = _parse_opts(cmd.args, _SYSTEMCTL_WITH_ARG)
    if not opts.operands:
        return [(LOW, "systemctl: lists units")]
    action, units = opts.operands[0], opts.operands[1:]
    return _service_action("systemctl", action, units, _SYSTEMCTL.get(action, MEDIUM))


_SERVICE_ACTIONS = {"status": LOW, "start": MEDIUM, "reload": MEDIUM, "force-reload": MEDIUM}


def _h_service(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    opts = _parse_opts(cmd.args)
    if opts.has("--status-all") or len(opts.operands) < 2:
        return [(LOW, "service: lists services")]
    unit, action = opts.operands[0], opts.operands[1]
    return _service_action("service", action, [unit], _SERVICE_ACTIONS.get(action, HIGH))


def _flag_rule(flags: Mapping[str, Finding], default: Finding) -> _Handler:
    """A handler rating a command by the most severe of its matching flags."""

    def handler(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
        matched = [flags[a.partition("=")[0]] for a in cmd.args if a.partition("=")[0] in flags]
        return matched or [default]

    return handler


_h_journalctl = _flag_rule(
    {f: (MEDIUM, f"journalctl {f}: deletes or rotates logs") for f in (
        "--vacuum-size", "--vacuum-time", "--vacuum-files", "--rotate", "--flush", "--relinquish-var",
        "--setup-keys", "--sync")},
    (LOW, "journalctl: reads logs"),
)  # fmt: skip
_h_dmesg = _flag_rule(
    {f: (MEDIUM, f"dmesg {f}: clears or reconfigures the kernel log") for f in (
        "-c", "-C", "--clear", "--read-clear", "-D", "-E", "--console-off", "--console-on", "-n", "--console-level")},
    (LOW, "dmesg: reads the kernel log"),
)  # fmt: skip
_h_ping = _flag_rule({"-f": (HIGH, "ping -f: flood ping")}, (LOW, "ping: network check"))
_h_history = _flag_rule(
    {f: (MEDIUM, f"history {f}: rewrites/clears the shell history") for f in ("-c", "-d", "-w", "-a", "-r", "-n", "-cw")},
    (LOW, "history: shows the shell history"),
)  # fmt: skip
_h_passwd = _flag_rule(
    {f: (LOW, "passwd: shows account status") for f in ("-S", "--status")},
    (CRITICAL, "passwd: changes/locks account passwords"),
)
_h_crontab = _flag_rule(
    {"-l": (LOW, "crontab -l: lists cron jobs"), "-e": (MEDIUM, "crontab -e: edits cron jobs"),
     "-r": (CRITICAL, "crontab -r: deletes all cron jobs"), "-ir": (CRITICAL, "crontab -ir: deletes all cron jobs"),
     "-ri": (CRITICAL, "crontab -ri: deletes all cron jobs")},
    (HIGH, "crontab: replaces the whole crontab"),
)  # fmt: skip
_h_badblocks = _flag_rule(
    {"-w": (CRITICAL, "badblocks -w: destructive write test (erases the disk)"),
     "-n": (HIGH, "badblocks -n: non-destructive read-write test")},
    (MEDIUM, "badblocks: read-only disk scan"),
)  # fmt: skip
_h_hdparm = _flag_rule(
    {f: (CRITICAL, f"hdparm {f}: erases or corrupts disk data") for f in (
        "--security-erase", "--security-erase-enhanced", "--trim-sector-ranges", "--write-sector",
        "--make-bad-sector", "--fwdownload", "--dco-restore")}
    | {f: (LOW, "hdparm: reads disk information") for f in ("-I", "-i", "-t", "-T", "-g")},
    (HIGH, "hdparm: changes disk settings"),
)  # fmt: skip
_h_swapon = _flag_rule(
    {"--show": (LOW, "swapon --show"), "-s": (LOW, "swapon -s")}, (MEDIUM, "swapon: enables swap")
)
_h_reboot = _flag_rule(
    {f: (CRITICAL, f"reboot {f}: forced reboot or power off") for f in ("-f", "--force", "-p", "--poweroff", "--halt", "-ff")},
    (HIGH, "reboot: reboots the machine (outage)"),
)  # fmt: skip
_h_shutdown = _flag_rule(
    {"-r": (HIGH, "shutdown -r: reboots the machine (outage)"), "--reboot": (HIGH, "shutdown --reboot: reboots"),
     "-c": (MEDIUM, "shutdown -c: cancels a pending shutdown"), "-k": (LOW, "shutdown -k: only warns users")},
    (CRITICAL, "shutdown: powers off the machine"),
)  # fmt: skip
_h_sysctl = _flag_rule(
    {
        f: (HIGH, f"sysctl {f}: changes kernel parameters")
        for f in ("-w", "--write", "-p", "--load", "--system")
    },
    (LOW, "sysctl: reads kernel parameters"),
)


def _h_sysctl_full(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    if any("=" in a and not a.startswith("-") for a in cmd.args):
        return [(HIGH, f"{cmd.label()}: changes kernel parameters")]
    return _h_sysctl(cmd, ctx)


def _h_init(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    level = {"0": CRITICAL, "1": CRITICAL, "s": CRITICAL, "S": CRITICAL, "6": HIGH, "q": MEDIUM, "Q": MEDIUM}
    runlevel = cmd.args[0] if cmd.args else ""
    return [
        (
            level.get(runlevel, HIGH),
            f"{cmd.name} {runlevel}: changes the runlevel (0 halts, 1 is single-user, 6 reboots)",
        )
    ]


def _h_hostname(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    opts = _parse_opts(cmd.args, ("-F", "--file"))
    if opts.operands or opts.has("-F", "--file", "-b", "--boot"):
        return [(HIGH, f"{cmd.label()}: changes the hostname")]
    return [(LOW, "hostname: shows the hostname")]


def _h_date(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    opts = _parse_opts(cmd.args, ("-d", "--date", "-f", "--file", "-r", "--reference", "-I"))
    if opts.has("-s", "--set") or any(re.fullmatch(r"\d{4,12}(\.\d\d)?", o) for o in opts.operands):
        return [(HIGH, f"{cmd.label()}: changes the system clock")]
    return [(LOW, "date: shows the date")]


def _h_hwclock(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    read_only = not cmd.args or any(a in ("-r", "--show", "--get", "-V", "--version") for a in cmd.args)
    return (
        [(LOW, "hwclock: reads the clock")]
        if read_only
        else [(HIGH, f"{cmd.label()}: sets the hardware clock")]
    )


# ---------------------------------------------------------------------------- subcommand tables


def _levels(**groups: str) -> dict[str, RiskLevel]:
    table: dict[str, RiskLevel] = {}
    for level_name, names in groups.items():
        table.update(dict.fromkeys(names.split(), RiskLevel(level_name)))
    return table


def _subcommand_finding(tool: str, sub: str, table: Mapping[str, RiskLevel], default: RiskLevel) -> Finding:
    level = table.get(sub, default)
    shown = sub.replace("-", " ", 1) if sub.split("-", 1)[0] in _GROUP_WORDS else sub
    return level, f"{tool} {shown}: {_SUB_NOTES[level]}"


_GROUP_WORDS = frozenset({"container", "image", "network", "volume", "system", "compose", "builder", "buildx", "node",
                          "service", "stack", "swarm", "plugin", "context", "secret", "config", "trust", "manifest",
                          "rollout", "certificate", "repo", "dependency", "state", "workspace"})  # fmt: skip


_SUB_NOTES = {
    LOW: "read-only",
    MEDIUM: "changes state",
    HIGH: "disruptive or destructive change",
    CRITICAL: "destroys data or infrastructure",
}

_GIT = _levels(
    low="status log diff show blame describe rev-parse ls-files ls-remote ls-tree shortlog grep fetch "
    "cat-file rev-list whatchanged version help count-objects fsck check-ignore name-rev for-each-ref "
    "show-ref show-branch reflog var --version --help cherry range-diff merge-base verify-commit verify-tag",
    medium="add commit pull merge rebase checkout switch restore cherry-pick revert init clone mv rm apply am "
    "submodule notes bisect push stash tag branch config remote worktree gc sparse-checkout lfs archive "
    "format-patch commit-tree mktag mktree",
    high="filter-branch filter-repo prune update-ref replace",
)
_GIT_LIST_FORMS = frozenset({"branch", "tag", "remote", "config", "stash", "worktree", "notes", "submodule"})
_GIT_LIST_WORDS = frozenset(
    {"-a", "-r", "-v", "-vv", "-l", "--list", "list", "show", "--get", "--get-all", "--show-current", "-n",
     "get-url", "--global", "--local", "--system", "--all", "--remotes", "--merged", "--no-merged", "--contains",
     "--sort", "status", "--get-regexp", "--show-origin"}
)  # fmt: skip
_GIT_CONFIG_READ = frozenset({"--get", "--get-all", "--get-regexp", "--list", "-l", "--get-urlmatch"})
_GIT_DANGER: dict[str, tuple[frozenset[str], str]] = {
    "push": (frozenset({"-f", "--force", "--force-with-lease", "--force-if-includes", "--mirror", "--delete",
                        "-d", "--prune"}), "force/destructive push rewrites or deletes remote history"),
    "reset": (frozenset({"--hard", "--merge", "--keep"}), "discards uncommitted work"),
    "clean": (frozenset({"-f", "--force"}), "permanently deletes untracked files"),
    "branch": (frozenset({"-D", "--delete", "-M", "-f", "--force"}), "force-deletes or overwrites branches"),
    "checkout": (frozenset({"-f", "--force", ".", "-B"}), "discards local changes"),
    "restore": (frozenset({".", "--worktree", "-W"}), "discards local changes"),
    "stash": (frozenset({"drop", "clear"}), "deletes stashed work"),
    "reflog": (frozenset({"expire", "delete"}), "deletes reflog history (makes lost commits unrecoverable)"),
    "tag": (frozenset({"-d", "--delete", "-f", "--force"}), "deletes or moves tags"),
    "gc": (frozenset({"--prune=now", "--prune=all"}), "permanently prunes unreachable objects"),
    "submodule": (frozenset({"deinit"}), "removes submodule working trees"),
}  # fmt: skip


_GIT_WITH_ARG = ("-C", "-c", "--git-dir", "--work-tree", "--namespace", "--config-env", "--super-prefix",
                 "--attr-source", "--list-cmds")  # fmt: skip  # `--exec-path` takes its value only as `=DIR`
# Settings whose value is a command git runs (through a shell, most of them): `git -c core.pager=CMD log`,
# `git config core.fsmonitor CMD` (then every `git status` runs it), `alias.x='!CMD'`, `credential.helper`.
_GIT_RUNS_RE = re.compile(
    r"core\.(?:pager|editor|askpass|sshcommand|gitproxy|fsmonitor|alternaterefscommand)|sequence\.editor"
    r"|diff\.external|interactive\.difffilter|imap\.tunnel|uploadpack\.packobjectshook|gpg\.(?:.+\.)?program"
    r"|gpg\.ssh\.defaultkeycommand|pager\..+|credential\.(?:.+\.)?helper|submodule\..+\.update"
    r"|(?:diff|merge|filter|difftool|mergetool|man|browser|guitool|trailer)\..+\."
    r"(?:command|cmd|textconv|driver|clean|smudge|process|path)"
    r"|remote\..+\.(?:uploadpack|receivepack)|sendemail\.(?:.+\.)?(?:sendmailcmd|smtpserver|tocmd|cccmd|headercmd)"
)
_GIT_BOOLEAN = frozenset({"", "true", "false", "yes", "no", "on", "off", "1", "0"})
_GIT_CREDENTIAL_HELPERS = frozenset({"store", "cache", "osxkeychain", "manager", "manager-core", "libsecret",
                                     "wincred", "gnome-keyring"})  # fmt: skip


def _git_setting_findings(key: str, value: str, ctx: _Ctx, label: str) -> list[Finding]:
    """A git setting (`git -c KEY=VALUE`, `git config KEY VALUE`) whose value is a command git runs, rated
    like running it; a file of settings or a directory of hooks it loads is HIGH."""
    name = key.strip().lower()
    shown = f"{label} {key}={_show(value, 40)}"
    if name == "include.path" or (name.startswith("includeif.") and name.endswith(".path")):
        return [(HIGH, f"{shown}: loads git settings from that file (they can run commands)")]
    if name == "core.hookspath":
        if _path_kind(value, ctx)[0] == "null":
            return [(LOW, f"{shown}: disables the repository's hooks")]
        return [(HIGH, f"{shown}: runs the hooks in that directory")]
    command = _git_setting_command(name, value)
    if command is None:
        return []
    return _exec_text(command, ctx, shown) or [(LOW, f"{shown}: an empty command")]


def _git_setting_command(name: str, value: str) -> str | None:
    """The command git runs for the setting `name` (in lower case) = `value`; None if it runs none."""
    if name.startswith("alias.") or (name.startswith("submodule.") and name.endswith(".update")):
        # `!CMD` runs CMD; any other alias stands for git's commands (`_git_alias`), an update for a mode
        return value.removeprefix("!") if value.startswith("!") or _is_dynamic(value) else None
    if not _GIT_RUNS_RE.fullmatch(name):
        return None
    if name.startswith("pager.") or name == "core.fsmonitor":
        return None if value.strip().lower() in _GIT_BOOLEAN else value
    if name.endswith(".helper"):
        helper = value.split(None, 1)[0] if value.strip() else ""
        if value.startswith("!"):
            return value[1:]
        if not helper or helper in _GIT_CREDENTIAL_HELPERS:
            return None
        return value if "/" in helper else f"git-credential-{value}"
    if name.startswith("sendemail.") and name.endswith("smtpserver"):
        return value if value.startswith("/") else None  # a host name; a path is a program run as sendmail
    return value


def _git_settings(opts: _Opts) -> list[tuple[str, str]]:
    """The settings of `git -c KEY=VALUE` (`-c KEY` alone is true) and `--config-env=KEY=VAR` ($VAR)."""
    settings = [(k, v if eq else "true") for k, eq, v in (s.partition("=") for s in opts.values("-c"))]
    return settings + [(k, "$" + v) for k, _, v in (s.partition("=") for s in opts.values("--config-env"))]


# Options of git's commands that run a command (`git fetch --upload-pack=CMD`, `git rebase -x CMD`, `git
# grep -OCMD`) or write a file (`git log --output=FILE`), by command; `*` are those of every command.
_GIT_OPTIONS: dict[str, dict[str, str]] = {
    "*": {"--upload-pack": "run", "--receive-pack": "run", "--exec": "run", "--output": "write",
          "--sendmail-cmd": "run", "--to-cmd": "run", "--cc-cmd": "run", "--header-cmd": "run"},
    "difftool": {"--extcmd": "run"},
    "grep": {"--open-files-in-pager": "run"},
    "format-patch": {"--output-directory": "write"},
    "filter-branch": dict.fromkeys(
        ("--env-filter", "--tree-filter", "--index-filter", "--parent-filter", "--msg-filter", "--commit-filter",
         "--tag-name-filter"), "run"),
}  # fmt: skip
_GIT_SHORT: dict[str, dict[str, str]] = {  # the short options of those, and the letters taking another value
    "clone": {"u": "--upload-pack", **dict.fromkeys("bocj", "")},
    "rebase": {"x": "--exec", **dict.fromkeys("sXC", "")},
    "difftool": {"x": "--extcmd", **dict.fromkeys("ty", "")},
    "grep": {"O": "--open-files-in-pager", **dict.fromkeys("efABCm", "")},
    "archive": {"o": "--output"},
    "format-patch": {"o": "--output-directory", **dict.fromkeys("vn", "")},
}
_GIT_OPTIONAL = frozenset({"--open-files-in-pager"})  # `-O` alone opens the files in the configured pager


def _git_long(name: str, options: Mapping[str, str]) -> str | None:
    """The long option of `options` that `name` is, or abbreviates (git takes unambiguous prefixes)."""
    if name in options:
        return name
    return next((o for o in options if len(name) >= 5 and o.startswith(name)), None)


def _git_short(cluster: str, shorts: Mapping[str, str]) -> tuple[str, str] | None:
    """The option of `shorts` in a cluster of short options (`-ix CMD`, `-xCMD`) and what follows it."""
    for pos, letter in enumerate(cluster):
        option = shorts.get(letter)
        if option is not None:  # one of ours, or a letter whose value is the rest (`-Xours`)
            return (option, cluster[pos + 1 :]) if option else None
    return None


def _git_options(sub: str, rest: list[str]) -> list[tuple[str, str, str]]:
    """(option, its value, "run" or "write") for the options of `git SUB` that run a command or write."""
    options = {**_GIT_OPTIONS["*"], **_GIT_OPTIONS.get(sub, {})}
    found: list[tuple[str, str, str]] = []
    index = 0
    while index < len(rest):
        word = rest[index]
        index += 1
        if word == "--":
            break
        if word.startswith("--"):
            name, eq, value = word.partition("=")
            option = _git_long(name, options)
        elif word.startswith("-") and (short := _git_short(word[1:], _GIT_SHORT.get(sub, {}))) is not None:
            option, value = short
            eq = "=" if value else ""
        else:
            continue
        if option is None:
            continue
        if not eq and option not in _GIT_OPTIONAL and index < len(rest):
            value, index = rest[index], index + 1
        if value:
            found.append((option, value, options[option]))
    return found


def _git_ext_command(url: str) -> list[str]:
    """The argv of an `ext::CMD ARGS` URL (git runs it as the transport): `% ` is a space, `%%` a `%`."""
    words = re.split(r"(?<!%) ", url)
    table = {"% ": " ", "%%": "%", "%s": "git-upload-pack", "%S": "upload-pack"}
    return [re.sub(r"%[ %sS]", lambda m: table[m[0]], w) for w in words if w]


def _git_runs(sub: str, rest: list[str], cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    """What `git SUB REST` runs or writes through its options and arguments (`_GIT_OPTIONS`, `git bisect
    run CMD`, `git submodule foreach CMD`, `git config KEY CMD`, an `ext::CMD` URL)."""
    findings: list[Finding] = []
    for option, value, kind in _git_options(sub, rest):
        if kind == "write":
            findings.append(_write_finding(f"git {sub} {option}", value, ctx))
        else:
            findings += _exec_text(value, ctx, f"git {sub} {option}") or [(LOW, f"git {sub} {option}: empty")]
    operands = [w for w in rest if not w.startswith("-")]
    if sub == "bisect" and operands[:1] == ["run"] and len(rest) > rest.index("run") + 1:
        findings += _classify_argv(rest[rest.index("run") + 1 :], cmd, ctx)
    if sub == "submodule" and operands[:1] == ["foreach"]:
        after = rest[rest.index("foreach") + 1 :]
        findings += _exec_text(" ".join(w for w in after if w not in ("--recursive", "-q", "--quiet")), ctx,
                               "git submodule foreach")  # fmt: skip
    if sub == "config":
        opts = _parse_opts(rest, ("-f", "--file", "--blob", "--type", "--default", "--comment", "--value"))
        words = opts.operands[1:] if opts.operands[:1] == ["set"] else opts.operands
        if len(words) >= 2:
            findings += _git_setting_findings(words[0], words[1], ctx, "git config")
    for word in rest:
        if word.startswith("ext::"):
            findings += _classify_argv(_git_ext_command(word[5:]) or [""], cmd, ctx)
            findings.append((HIGH, f"git {sub} {_show(word, 40)}: runs a command as its transport"))
    return findings


def _git_alias(sub: str, settings: list[tuple[str, str]]) -> str | None:
    """The value of the alias `git -c alias.SUB=…` defines for `sub` (the last one), if any."""
    values = [v for k, v in settings if k.lower() == f"alias.{sub.lower()}"]
    return values[-1] if values else None


def _h_git(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    opts = _parse_opts(cmd.args, _GIT_WITH_ARG, stop_at_operand=True)
    settings = _git_settings(opts)
    findings = [f for key, value in settings for f in _git_setting_findings(key, value, ctx, "git -c")]
    exec_path = opts.value("--exec-path")
    if exec_path and _path_kind(exec_path, ctx)[0] != "core":
        findings.append(
            (HIGH, f"git --exec-path={_show(exec_path)}: runs git's commands from that directory")
        )
    if not opts.operands:
        return findings + [(LOW, "git: shows help/version")]
    sub, rest = opts.operands[0], opts.operands[1:]
    alias = _git_alias(sub, settings)
    if alias is not None and alias.startswith("!"):  # `sh -c 'CMD "$@"'` with the arguments
        return findings + _exec_text(" ".join([alias[1:], *map(shlex.quote, rest)]), ctx, f"git alias {sub}")
    if alias is not None and not _is_dynamic(alias):
        try:
            words = shlex.split(alias)
        except ValueError:
            return findings + [(HIGH, f"could not parse the git alias {sub}={_show(alias)!r}")]
        if words:  # `git -c alias.st='push --force' st`: the command it stands for
            head = cmd.args[: len(cmd.args) - len(opts.operands)]
            return findings + _classify_argv(["git", *head, *words, *rest], cmd, ctx)
    return findings + _git_runs(sub, rest, cmd, ctx) + _git_subcommand(sub, rest, ctx)


def _git_subcommand(sub: str, rest: list[str], ctx: _Ctx) -> list[Finding]:
    words: set[str] = set()
    for word in rest:
        if re.fullmatch(r"-[a-zA-Z]{2,}", word):
            words.update("-" + letter for letter in word[1:])
        words.add(word)
    danger = _GIT_DANGER.get(sub)
    if danger is not None and (
        words & danger[0] or (sub == "push" and any(w.startswith(("+", ":")) for w in rest))
    ):
        return [(HIGH, f"git {sub} {' '.join(sorted(words & danger[0]))}".rstrip() + f": {danger[1]}")]
    listing = all(w in _GIT_LIST_WORDS or w.startswith("--format") for w in rest)
    if sub in _GIT_LIST_FORMS and (listing or (sub == "config" and words & _GIT_CONFIG_READ)):
        return [(LOW, f"git {sub}: lists/reads")]
    if sub == "clean" and words & {"-n", "--dry-run"}:
        return [(LOW, "git clean -n: dry run")]
    if sub in ("clone", "pull", "fetch") and ctx.files.fetched is None:
        ctx.files.fetched = f"git {sub}"
    return [_subcommand_finding("git", sub, _GIT, MEDIUM)]


_DOCKER_GLOBAL_WITH_ARG = ("-H", "--host", "--context", "-c", "--config", "-l", "--log-level", "-f", "--file", "-p",
                           "--project-name", "--project-directory", "--env-file", "--profile")  # fmt: skip
_DOCKER = _levels(
    low="ps images logs inspect stats top version info port diff history events search container-ls "
    "image-ls network-ls network-inspect volume-ls volume-inspect system-df system-info context-ls "
    "compose-ps compose-logs compose-config compose-top compose-images compose-version compose-ls "
    "buildx-ls node-ls service-ls service-ps service-logs stack-ls stack-ps manifest-inspect login --version",
    medium="restart start pull build run exec cp tag push create commit pause unpause update attach rename "
    "compose-up compose-restart compose-pull compose-build compose-start compose-run compose-exec "
    "compose-create image-prune network-create volume-create buildx-build builder-prune network-connect "
    "network-disconnect save load import export logout context-use",
    high="stop kill rm rmi compose-down compose-rm compose-stop compose-kill system-prune container-prune "
    "volume-prune volume-rm network-rm network-prune swarm-leave node-rm service-rm stack-rm plugin-rm "
    "secret-rm config-rm swarm-init",
)
_DOCKER_GROUPS = frozenset({"container", "image", "network", "volume", "system", "compose", "builder", "buildx",
                            "node", "service", "stack", "swarm", "plugin", "context", "secret", "config",
                            "trust", "manifest"})  # fmt: skip
_DOCKER_ALIASES = {"container-ls": "ps", "container-list": "ps", "image-list": "image-ls", "image-rm": "rmi",
                   "container-rm": "rm", "container-stop": "stop", "container-kill": "kill",
                   "container-restart": "restart", "container-start": "start", "container-run": "run",
                   "container-exec": "exec", "container-logs": "logs", "container-inspect": "inspect",
                   "image-pull": "pull", "image-build": "build", "image-inspect": "inspect", "image-push": "push",
                   "container-create": "create", "network-list": "network-ls", "volume-list": "volume-ls"}  # fmt: skip
_DOCKER_RUN_WITH_ARG = (
    "-v", "--volume", "-e", "--env", "-p", "--publish", "--name", "-w", "--workdir", "-u", "--user",
    "--entrypoint", "--network", "--net", "-m", "--memory", "--cpus", "-l", "--label", "--mount", "--env-file",
    "--restart", "--hostname", "-h", "--add-host", "--log-driver", "--log-opt", "--device", "--cap-add",
    "--cap-drop", "--security-opt", "--ulimit", "--tmpfs", "--pid", "--ipc", "--platform", "--gpus",
    "--shm-size", "--dns", "--link", "--volumes-from", "--health-cmd", "--stop-signal", "-a", "--attach",
    "--cidfile", "--cgroupns", "--runtime", "--userns", "--uts", "--detach-keys", "--memory-swap", "--cpuset-cpus",
    "--label-file", "--expose", "--stop-timeout", "--pull", "--init-path", "--sysctl", "--group-add",
)  # fmt: skip
_HOST_MOUNT_RE = re.compile(
    r"^(type=bind,)?(source=|src=)?(/|/etc|/boot|/root|/usr|/bin|/sbin|/lib|/var|/proc|/sys|/dev|/var/run/docker\.sock|/run/docker\.sock)(:|,|$)"
)
_ISOLATION_BREAKS = re.compile(r"^(--privileged|--(pid|net|network|ipc|userns|uts)=host|--cap-add=(all|sys_admin|sys_ptrace|sys_module|net_admin|dac_read_search)|--security-opt=(apparmor|seccomp|label)[=:](unconfined|disable)|--device=.*)$", re.I)  # fmt: skip


def _docker_run(cmd: _Cmd, ctx: _Ctx, rest: list[str]) -> list[Finding]:
    opts = _parse_opts(rest, _DOCKER_RUN_WITH_ARG, stop_at_operand=True)
    findings: list[Finding] = [(MEDIUM, "docker run: starts a container")]
    for flag, value in opts.flags:
        if value is not None and flag in ("-v", "--volume", "--mount") and _HOST_MOUNT_RE.match(value):
            root = value.split(":")[0].removeprefix("type=bind,").split("=")[-1] in ("/",)
            findings.append(
                ((CRITICAL if root else HIGH), f"docker run {flag} {value}: mounts a sensitive host path")
            )
        joined = f"{flag}={value}" if value is not None else flag
        if _ISOLATION_BREAKS.match(joined):
            findings.append((HIGH, f"docker run {joined}: weakens container isolation (host access)"))
    if len(opts.operands) > 1:
        findings += _classify_argv(opts.operands[1:], cmd, ctx)
    return findings


def _docker_exec(cmd: _Cmd, ctx: _Ctx, rest: list[str]) -> list[Finding]:
    opts = _parse_opts(rest, ("-e", "--env", "--env-file", "-u", "--user", "-w", "--workdir", "--detach-keys"),
                       stop_at_operand=True)  # fmt: skip
    findings: list[Finding] = [(MEDIUM, "docker exec: runs a command in a container")]
    if opts.has("--privileged"):
        findings.append((HIGH, "docker exec --privileged: runs with host-level privileges"))
    if len(opts.operands) > 1:
        findings += _classify_argv(opts.operands[1:], cmd, ctx)
    return findings


def _docker_key(operands: list[str], compose: bool) -> tuple[str, list[str]]:
    if compose:
        return ("compose-" + operands[0] if operands else "compose-ps"), operands[1:]
    first = operands[0]
    if first in _DOCKER_GROUPS and len(operands) > 1:
        key = f"{first}-{operands[1]}"
        return _DOCKER_ALIASES.get(key, key), operands[2:]
    return first, operands[1:]


def _h_docker(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    opts = _parse_opts(cmd.args, _DOCKER_GLOBAL_WITH_ARG, stop_at_operand=True)
    compose = cmd.name == "docker-compose"
    if not opts.operands and not compose:
        return [(LOW, "docker: shows help/version")]
    key, rest = _docker_key(opts.operands, compose)
    if key in ("run", "create", "container-create"):
        return _docker_run(cmd, ctx, rest)
    if key in ("exec", "compose-exec", "compose-run"):
        return _docker_exec(cmd, ctx, rest)
    finding = _subcommand_finding(cmd.name, key, _DOCKER, MEDIUM)
    if key == "system-prune" and any(a in ("--volumes", "-a", "--all") for a in rest):
        return [
            finding,
            (HIGH, "docker system prune --volumes/--all: deletes images and volumes (data loss)"),
        ]
    return [finding]


_KUBECTL_WITH_ARG = ("-n", "--namespace", "--context", "--cluster", "--user", "--kubeconfig", "-s", "--server",
                     "--token", "-l", "--selector", "-o", "--output", "-f", "--filename", "-c", "--container",
                     "--field-selector", "--as", "--as-group", "--request-timeout", "-L", "--label-columns",
                     "--sort-by", "--since", "--tail", "--timeout", "-k", "--kustomize", "--type", "--image",
                     "--replicas", "--port", "--grace-period", "--template")  # fmt: skip
_KUBECTL = _levels(
    low="get describe logs top explain version cluster-info api-resources api-versions diff auth events wait "
    "completion kustomize config-view config-get-contexts config-current-context config-get-clusters "
    "config-get-users rollout-status rollout-history plugin-list",
    medium="apply create patch label annotate scale autoscale expose set edit cp port-forward run rollout "
    "rollout-restart rollout-pause rollout-resume rollout-undo cordon uncordon attach proxy debug exec "
    "config-use-context config-set-context config-set-cluster config-set-credentials replace",
    high="delete drain taint certificate certificate-approve certificate-deny config-delete-context",
)
_KUBECTL_TWO_WORD = frozenset({"config", "rollout", "certificate", "plugin"})
_KUBE_CRITICAL_KINDS = re.compile(
    r"^(ns|namespaces?|nodes?|no|pv|persistentvolumes?|pvc|persistentvolumeclaims?|crds?|"
    r"customresourcedefinitions?|clusterroles?|clusterrolebindings?|all|storageclass(es)?|sc)(/.*)?$"
)  # fmt: skip


def _h_kubectl(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    opts = _parse_opts(cmd.args, _KUBECTL_WITH_ARG)
    if not opts.operands:
        return [(LOW, "kubectl: shows help")]
    sub, rest = opts.operands[0], opts.operands[1:]
    key = f"{sub}-{rest[0]}" if sub in _KUBECTL_TWO_WORD and rest else sub
    findings = [_subcommand_finding("kubectl", key, _KUBECTL, MEDIUM)]
    if sub == "delete" and (
        opts.has("--all", "-A", "--all-namespaces") or any(_KUBE_CRITICAL_KINDS.match(r) for r in rest[:1])
    ):
        findings.append((CRITICAL, f"{cmd.label()}: deletes namespaces, nodes, volumes or everything"))
    if sub == "replace" and opts.has("--force"):
        findings.append((HIGH, "kubectl replace --force: deletes and recreates resources"))
    if sub == "exec" and "--" in cmd.args:
        findings += _classify_argv(cmd.args[cmd.args.index("--") + 1 :], cmd, ctx)
    return findings


_HELM = _levels(
    low="list ls status get history template show search lint version env repo-list dependency-list verify",
    medium="install upgrade rollback repo-add repo-update repo-remove pull package push dependency "
    "dependency-update dependency-build plugin",
    high="uninstall delete del un",
)
_TERRAFORM = _levels(
    low="plan show validate fmt output version providers graph state-list state-show console workspace-list "
    "workspace-show -version --version -help",
    medium="init import refresh workspace-select workspace-new get login logout test",
    high="apply taint untaint state-rm state-mv state-push state-replace-provider force-unlock workspace-delete",
    critical="destroy",
)


def _two_level(
    tool: str, table: Mapping[str, RiskLevel], default: RiskLevel, groups: Iterable[str]
) -> _Handler:
    group_set = frozenset(groups)

    def handler(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
        opts = _parse_opts(
            cmd.args, ("-n", "--namespace", "--kube-context", "-chdir", "--var", "-var-file", "-f")
        )
        if not opts.operands:
            return [(LOW, f"{tool}: shows help")]
        sub, rest = opts.operands[0], opts.operands[1:]
        key = f"{sub}-{rest[0]}" if sub in group_set and rest else sub
        findings = [_subcommand_finding(tool, key, table, default)]
        if tool == "terraform" and any(a in ("-destroy", "--destroy") for a in cmd.args):
            findings.append((CRITICAL, "terraform -destroy: destroys all managed infrastructure"))
        return findings

    return handler


_h_helm = _two_level("helm", _HELM, MEDIUM, ("repo", "dependency"))
_h_terraform = _two_level("terraform", _TERRAFORM, MEDIUM, ("state", "workspace"))

_PKG_READ = frozenset(
    _words(
        "list search show info policy depends rdepends changelog madison check-update repolist provides whatprovides "
        "freeze check ls outdated view audit help version --version -v -V showpkg stats why explain doctor history "
        "deplist repoquery files contents home docs bugs prefix root bin whoami ping inspect fund dump showsrc "
        "list-installed pkgnames config query"
    )
)
_PKG_INSTALL = frozenset(
    _words(
        "install add reinstall download ci i in localinstall makecache refresh build run test exec link init create "
        "sync lock publish pack rebuild dedupe prune clean autoclean cache hold unhold mark source build-dep fix "
        "-S -Sy update"
    )
)
_PKG_UPGRADE = frozenset(
    _words("upgrade dist-upgrade full-upgrade distro-sync dup up upgrade-minimal -Syu -Su")
)
_PKG_REMOVE = frozenset(_words("remove purge autoremove erase del uninstall rm un r -R -Rs -Rns -Rdd"))
_CRITICAL_PACKAGE_RE = re.compile(
    r"^(libc6|glibc|libc-bin|systemd|systemd-sysv|openssh-server|openssh|sudo|coreutils|bash|dash|apt|dpkg|rpm|"
    r"yum|dnf|linux-image.*|kernel.*|grub.*|util-linux|login|passwd|base-files|init|libpam.*|python3|perl-base|"
    r"libssl.*|openssl|ca-certificates|network-manager|netplan\.io|ifupdown|iproute2|\*)$"
)
_PKG_WITH_ARG = ("-o", "-c", "-t", "--target-release", "--option", "--config", "-r", "--requirement", "-i",
                 "--index-url", "--extra-index-url", "-e", "--editable", "--root", "--installroot", "--prefix")  # fmt: skip


def _h_package(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    system = cmd.name in ("apt-get", "dnf", "apk", "snap", "flatpak", "pacman", "emerge", "port", "pkg")
    args = cmd.args
    if cmd.name == "pacman" and args and re.fullmatch(r"-[A-Za-z]+", args[0]):
        sub = "-" + "".join(c for c in args[0][1:] if c.isupper() or c in "uy")
        return [_pkg_finding(cmd, sub, args[1:], system)]
    opts = _parse_opts(args, _PKG_WITH_ARG)
    if not opts.operands:
        return [(LOW, f"{cmd.name}: shows help/version")]
    return [_pkg_finding(cmd, opts.operands[0], opts.operands[1:], system)]


def _pkg_finding(cmd: _Cmd, sub: str, packages: list[str], system: bool) -> Finding:
    if sub in _PKG_READ:
        return LOW, f"{cmd.name} {sub}: read-only package query"
    if sub in _PKG_REMOVE:
        if system and any(_CRITICAL_PACKAGE_RE.match(p) for p in packages):
            return CRITICAL, f"{cmd.name} {sub} {' '.join(packages)}: removes packages the system depends on"
        return (HIGH if system else MEDIUM), f"{cmd.name} {sub}: removes packages"
    upgrade = sub in _PKG_UPGRADE or (sub == "update" and cmd.name == "dnf")
    if upgrade:
        return (HIGH if system else MEDIUM), f"{cmd.name} {sub}: upgrades installed packages"
    if sub in _PKG_INSTALL:
        return MEDIUM, f"{cmd.name} {sub}: installs packages or refreshes metadata"
    return MEDIUM, f"{cmd.name} {sub}: package operation"


def _h_dpkg(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    opts = _parse_opts(cmd.args)
    if opts.has("-r", "-P", "--remove", "--purge"):
        critical = any(_CRITICAL_PACKAGE_RE.match(p) for p in opts.operands)
        return [((CRITICAL if critical else HIGH), f"{cmd.label()}: removes packages")]
    if opts.has("-i", "--install", "--configure", "--unpack", "-a", "--set-selections", "--clear-selections"):
        return [(MEDIUM, f"{cmd.label()}: installs/configures packages")]
    return [(LOW, f"{cmd.name}: read-only package query")]


def _h_rpm(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    opts = _parse_opts(cmd.args)
    if opts.has("-e", "--erase"):
        critical = any(_CRITICAL_PACKAGE_RE.match(p) for p in opts.operands) or opts.has("--nodeps")
        return [((CRITICAL if critical else HIGH), f"{cmd.label()}: removes packages")]
    if opts.has("-i", "-U", "-F", "--install", "--upgrade", "--freshen", "--rebuilddb", "--import"):
        return [(MEDIUM, f"{cmd.label()}: installs packages")]
    return [(LOW, "rpm: read-only package query")]


# ---------------------------------------------------------------------------- firewall and network


def _h_iptables(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    long_map = {"--flush": "F", "--delete-chain": "X", "--policy": "P", "--append": "A", "--insert": "I",
                "--delete": "D", "--replace": "R", "--new-chain": "N", "--rename-chain": "E", "--zero": "Z"}  # fmt: skip
    commands: set[str] = set()
    for arg in cmd.args:
        if arg.startswith("--"):
            commands.add(long_map.get(arg, ""))
        elif arg.startswith("-"):
            commands.update(c for c in arg[1:] if c.isupper())
    if commands & {"F", "X"}:
        return [(CRITICAL, f"{cmd.label()}: flushes/deletes firewall rules")]
    if "P" in commands:
        deny = any(a.upper() in ("DROP", "REJECT") for a in cmd.args)
        what = "default-deny policy can lock out remote access" if deny else "changes a default policy"
        return [((CRITICAL if deny else HIGH), f"{cmd.label()}: {what}")]
    if commands & set("AIDRNEZ"):
        return [(HIGH, f"{cmd.label()}: changes firewall rules")]
    return [(LOW, "iptables: lists rules")]


def _h_nft_full(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    words = [a for a in cmd.args if not a.startswith("-")]
    verb = words[0] if words else ""
    if verb == "flush":
        return [(CRITICAL, f"{cmd.label()}: flushes firewall rules")]
    if verb in ("list", "monitor", "describe") or (not words and not cmd.args):
        return [(LOW, "nft: lists rules")]
    return [(HIGH, f"{cmd.label()}: changes firewall rules")]


_UFW = _levels(low="status show app version", critical="disable reset")


def _h_ufw(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    words = [a for a in cmd.args if not a.startswith("-")]
    if not words:
        return [(LOW, "ufw: shows help")]
    level = _UFW.get(words[0], HIGH)
    notes = {LOW: "read-only", HIGH: "changes firewall rules (can lock out remote access)",
             CRITICAL: "turns the firewall off or wipes its rules"}  # fmt: skip
    return [(level, f"ufw {words[0]}: {notes.get(level, '')}")]


def _h_firewall_cmd(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    findings: list[Finding] = [(LOW, "firewall-cmd: read-only query")]
    for arg in cmd.args:
        name = arg.partition("=")[0]
        if name == "--panic-on":
            findings.append((CRITICAL, "firewall-cmd --panic-on: drops all network traffic"))
        elif name.startswith(
            ("--add", "--remove", "--set", "--change", "--new", "--delete", "--direct", "--load")
        ):
            findings.append((HIGH, f"firewall-cmd {name}: changes firewall rules"))
        elif name in ("--reload", "--complete-reload", "--runtime-to-permanent"):
            findings.append((MEDIUM, f"firewall-cmd {name}: reloads firewall rules"))
    return findings


_IP_CHANGE = frozenset({"add", "append", "change", "chg", "replace", "set", "del", "delete", "flush", "prepend",
                        "restore", "exec", "attach", "detach", "save"})  # fmt: skip


def _h_ip(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    opts = _parse_opts(cmd.args, ("-n", "-netns", "-f", "-family", "-b", "-batch", "-rc", "-l", "-loops"))
    words = opts.operands
    action = words[1] if len(words) > 1 else "show"
    cuts = (
        "down" in words
        or action == "flush"
        or (action in ("del", "delete") and ("default" in words or words[0].startswith("a")))
    )
    if cuts:
        return [(CRITICAL, f"{cmd.label()}: can cut network connectivity (including this session)")]
    if action in _IP_CHANGE:
        return [(HIGH, f"{cmd.label()}: changes network configuration")]
    return [(LOW, "ip: shows network configuration")]


def _h_ifconfig(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    words = [a for a in cmd.args if a not in ("-a", "-s", "-v")]
    if "down" in words:
        return [(CRITICAL, f"{cmd.label()}: takes a network interface down")]
    if len(words) > 1:
        return [(HIGH, f"{cmd.label()}: changes network configuration")]
    return [(LOW, f"{cmd.name}: shows network configuration")]


def _h_route(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    words = [a for a in cmd.args if not a.startswith("-")]
    if words and words[0] in ("del", "delete") and "default" in words:
        return [(CRITICAL, f"{cmd.label()}: deletes the default route")]
    if words and words[0] in ("add", "del", "delete", "flush"):
        return [(HIGH, f"{cmd.label()}: changes routing")]
    return [(LOW, "route: shows routes")]


def _h_nmcli(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    words = set(cmd.args)
    if words & {"down", "delete", "off", "disconnect"}:
        return [(CRITICAL, f"{cmd.label()}: can cut network connectivity")]
    if words & {"modify", "add", "up", "connect", "reload", "on", "import", "edit", "set"}:
        return [(HIGH, f"{cmd.label()}: changes network configuration")]
    return [(LOW, "nmcli: shows network state")]


def _h_mount(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    opts = _parse_opts(cmd.args, ("-t", "--types", "-o", "--options", "-O", "-L", "-U"))
    if not opts.operands and not opts.has("-a", "--all", "-o", "--options"):
        return [(LOW, "mount: lists mounts")]
    return [(HIGH, f"{cmd.label()}: mounts or remounts a filesystem")]


_CURL_WITH_ARG = (
    "-o", "--output", "-d", "--data", "--data-raw", "--data-binary", "--data-urlencode", "--data-ascii", "-F",
    "--form", "-T", "--upload-file", "-X", "--request", "-H", "--header", "-u", "--user", "-A", "--user-agent",
    "-e", "--referer", "-b", "--cookie", "-c", "--cookie-jar", "-K", "--config", "-m", "--max-time",
    "--connect-timeout", "-w", "--write-out", "-x", "--proxy", "--retry", "-r", "--range", "--cacert", "--cert",
    "--key", "-E", "-D", "--dump-header", "--resolve", "--url", "-Y", "-y", "-z", "-C", "--limit-rate",
    "--output-dir", "--unix-socket", "--json", "--retry-delay", "--retry-max-time", "--interface",
)  # fmt: skip
_CURL_DATA = ("-d", "--data", "--data-raw", "--data-binary", "--data-urlencode", "--data-ascii", "-F", "--form",
              "-T", "--upload-file", "--json")  # fmt: skip


def _h_curl(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    opts = _parse_opts(cmd.args, _CURL_WITH_ARG)
    findings: list[Finding] = [(LOW, "curl: fetches a URL to standard output")]
    for target in opts.values("-o", "--output", "-c", "--cookie-jar", "-D", "--dump-header"):
        if target != "-":
            findings.append(_write_finding("curl writes", target, ctx))
    if opts.has("-O", "--remote-name", "--remote-name-all", "-J"):
        findings.append(_write_finding("curl -O saves into", opts.value("--output-dir") or ".", ctx))
    method = (opts.value("-X", "--request") or "").upper()
    if method in ("POST", "PUT", "PATCH", "DELETE") or opts.has(*_CURL_DATA):
        findings.append((MEDIUM, f"curl {method or 'with data'}: sends a state-changing request"))
    for value in opts.values(*_CURL_DATA):
        path = value.split("@", 1)[1] if "@" in value else (value if opts.has("-T", "--upload-file") else "")
        if path and _secret_file(path, ctx):
            findings.append((HIGH, f"curl uploads the sensitive file '{path}' (exfiltration)"))
    if opts.has("-K", "--config"):
        findings.append((MEDIUM, "curl -K: reads options from a config file"))
    return findings


_WGET_WITH_ARG = ("-O", "--output-document", "-o", "--output-file", "-P", "--directory-prefix", "-a",
                  "--append-output", "-i", "--input-file", "--post-data", "--post-file", "--method", "-U",
                  "--user-agent", "--header", "-t", "--tries", "-T", "--timeout", "--user", "--password", "-e",
                  "--execute")  # fmt: skip


def _h_wget(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    opts = _parse_opts(cmd.args, _WGET_WITH_ARG)
    if opts.has("--spider"):
        return [(LOW, "wget --spider: checks a URL")]
    findings: list[Finding] = []
    document = opts.value("-O", "--output-document")
    if document == "-":
        findings.append((LOW, "wget -O-: fetches a URL to standard output"))
    else:
        findings.append(
            _write_finding("wget saves into", document or opts.value("-P", "--directory-prefix") or ".", ctx)
        )
    for log in opts.values("-o", "--output-file", "-a", "--append-output"):
        findings.append(_write_finding("wget log", log, ctx))
    if opts.has("--post-data", "--post-file", "--method"):
        findings.append((MEDIUM, "wget: sends a state-changing request"))
    return findings


def _h_nc(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    opts = _parse_opts(
        cmd.args, ("-e", "-c", "--exec", "--sh-exec", "--lua-exec", "-p", "-s", "-w", "-i", "-q", "-x")
    )
    if opts.has("-e", "-c", "--exec", "--sh-exec", "--lua-exec"):
        return [(CRITICAL, f"{cmd.label()}: binds a shell to a network socket (reverse/bind shell)")]
    if opts.has("-l", "--listen"):
        return [(MEDIUM, f"{cmd.label()}: opens a listening socket")]
    if opts.has("-z"):
        return [(LOW, "nc -z: port check")]
    return [(MEDIUM, f"{cmd.label()}: opens a raw network connection")]


def _h_socat(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    if any(re.search(r"\b(exec|system):", a, re.I) for a in cmd.args):
        return [(CRITICAL, f"{cmd.label()}: connects a program/shell to a socket (reverse/bind shell)")]
    return [(MEDIUM, f"{cmd.label()}: relays network traffic")]


_SSH_WITH_ARG = ("-b", "-c", "-D", "-E", "-e", "-F", "-I", "-i", "-J", "-L", "-l", "-m", "-O", "-o", "-p", "-Q",
                 "-R", "-S", "-W", "-w", "-B", "-P")  # fmt: skip


def _h_ssh(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    opts = _parse_opts(cmd.args, _SSH_WITH_ARG, stop_at_operand=True)
    findings: list[Finding] = []
    for option in opts.values("-o"):
        key, _, value = option.partition("=")
        if key.strip().lower() in ("proxycommand", "localcommand", "permitlocalcommand") and value:
            findings += _nested(value, ctx, f"ssh -o {key}")
    if not opts.operands:
        return findings + [(LOW, "ssh: shows usage")]
    host, remote = opts.operands[0], opts.operands[1:]
    if not remote:
        return findings + [(MEDIUM, f"ssh {host}: opens an interactive remote session")]
    return (
        findings
        + [(LOW, f"ssh {host}: runs a remote command")]
        + _exec_text(" ".join(remote), ctx, f"remote command on {host}")
    )


def _h_openssl(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    sub = cmd.args[0] if cmd.args else ""
    read = {"x509", "s_client", "version", "verify", "asn1parse", "ciphers", "list", "dgst", "speed", "crl",
            "rand", "errstr", "s_time", "sess_id", "help", "ocsp", "base64", "enc", "prime", "sha256", "md5"}  # fmt: skip
    findings: list[Finding] = [
        (
            LOW if sub in read else MEDIUM,
            f"openssl {sub}: {'read-only' if sub in read else 'creates keys/certificates'}",
        )
    ]
    if "-out" in cmd.args[:-1]:
        findings.append(_write_finding("openssl -out", cmd.args[cmd.args.index("-out") + 1], ctx))
    return findings


# ---------------------------------------------------------------------------- disks, users, misc


def _h_fdisk(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    listing = {"-l", "--list", "-L", "print", "-p", "--print", "-s", "--show-size", "-v", "--version", "--help", "-d",
               "--dump", "-V", "--verify"}  # fmt: skip
    if any(a in listing for a in cmd.args) and not any(
        a in ("rm", "mklabel", "mkpart", "--zap-all", "-Z", "-o", "resizepart") for a in cmd.args
    ):
        return [(LOW, f"{cmd.name}: lists partitions")]
    return [(CRITICAL, f"{cmd.label()}: repartitions a disk (data loss)")]


_SUBCOMMAND_RULES: dict[str, tuple[dict[str, RiskLevel], RiskLevel, str]] = {
    "zfs": (
        _levels(low="list get status iostat holds diff version", critical="destroy", high="rollback"),
        HIGH,
        "zfs",
    ),
    "zpool": (
        _levels(
            low="status list iostat history get version",
            critical="destroy labelclear",
            high="export offline detach remove split create add attach replace clear",
        ),
        HIGH,
        "zpool",
    ),  # fmt: skip
    "cryptsetup": (
        _levels(
            low="status luksDump isLuks luksUUID tcryptDump benchmark",
            critical="luksFormat erase luksErase luksKillSlot reencrypt",
        ),
        HIGH,
        "cryptsetup",
    ),  # fmt: skip
    "dmsetup": (
        _levels(low="ls info status table deps version targets", critical="remove_all wipe_table remove"),
        HIGH,
        "dmsetup",
    ),
    "timedatectl": (
        _levels(low="status show list-timezones timesync-status show-timesync"),
        HIGH,
        "timedatectl",
    ),
    "hostnamectl": (_levels(low="status"), HIGH, "hostnamectl"),
    "loginctl": (
        _levels(
            low="list-sessions list-users list-seats show-session show-user session-status user-status",
            high="terminate-session terminate-user kill-session kill-user",
        ),
        MEDIUM,
        "loginctl",
    ),  # fmt: skip
    "virsh": (
        _levels(
            low="list dominfo domstate nodeinfo version net-list pool-list vol-list dumpxml",
            critical="undefine destroy vol-delete pool-delete pool-destroy",
        ),
        HIGH,
        "virsh",
    ),  # fmt: skip
}


def _h_subcommand(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    table, default, tool = _SUBCOMMAND_RULES[cmd.name]
    words = [a for a in cmd.args if not a.startswith("-")]
    if not words:
        return [(LOW, f"{tool}: shows status/help")]
    return [_subcommand_finding(tool, words[0], table, default)]


def _h_mdadm(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    opts = _parse_opts(cmd.args)
    if opts.has("--zero-superblock", "--create", "-C", "--grow", "-G"):
        return [(CRITICAL, f"{cmd.label()}: rewrites RAID metadata (data loss)")]
    if opts.has("--detail", "-D", "--examine", "-E", "--query", "-Q", "--detail-platform"):
        return [(LOW, "mdadm: shows RAID status")]
    return [(HIGH, f"{cmd.label()}: changes a RAID array")]


_PRIVILEGED_GROUPS = frozenset(
    {"sudo", "wheel", "root", "admin", "adm", "docker", "lxd", "disk", "shadow", "0"}
)


def _h_usermod(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    opts = _parse_opts(cmd.args, ("-G", "--groups", "-g", "--gid", "-u", "--uid", "-s", "--shell", "-d", "--home",
                                  "-e", "--expiredate", "-l", "--login", "-p", "--password", "-c", "--comment"))  # fmt: skip
    groups = {g for value in opts.values("-G", "--groups", "-g", "--gid") for g in value.split(",")}
    findings: list[Finding] = [(HIGH, f"{cmd.label()}: changes a user account")]
    if groups & _PRIVILEGED_GROUPS or "0" in opts.values("-u", "--uid"):
        findings.append((CRITICAL, f"{cmd.label()}: grants administrative privileges"))
    if "root" in opts.operands and (
        opts.has("-L", "--lock", "-p", "--password", "-e", "--expiredate", "-s", "--shell")
    ):
        findings.append((CRITICAL, f"{cmd.label()}: locks or changes the root account"))
    return findings


def _h_useradd(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    return [
        (max(level, HIGH, key=lambda lv: lv.rank), text.replace("changes", "creates"))
        for level, text in _h_usermod(cmd, ctx)
    ]


def _h_export(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    return [(LOW, f"{cmd.name}: sets shell variables"), *_assignments_findings(cmd.args, ctx)]


def _h_unset(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    if any(a in ("HISTFILE", "HISTSIZE", "HISTFILESIZE") for a in cmd.args):
        return [(MEDIUM, f"{cmd.label()}: disables shell history")]
    return [(LOW, "unset: removes shell variables")]


def _h_set(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    if "history" in cmd.args and "+o" in cmd.args:
        return [(MEDIUM, "set +o history: disables shell history")]
    return [(LOW, "set: sets shell options")]


def _h_alias(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    defs = [a for a in cmd.args if "=" in a]
    if defs:
        return [(MEDIUM, f"alias {_show(defs[0])}: redefines a command")] + _nested(
            defs[0].split("=", 1)[1], ctx, "alias body"
        )
    return [(LOW, "alias: lists aliases")]


def _h_hash(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    """`hash -p PATH NAME` makes NAME run PATH from then on (`hash -p /tmp/x ls; ls` runs /tmp/x)."""
    opts = _parse_opts(cmd.args, ("-p",))
    path = opts.value("-p")
    if path is not None:
        names = ", ".join(opts.operands) or "a command"
        return [(HIGH, f"hash -p {_show(path)}: makes {_show(names)} run '{_show(path)}' from then on")]
    return [(LOW, "hash: read-only inspection")]


def _h_enable(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    """`enable -f LIB NAME` loads a builtin from a shared library (its code runs in the shell, and NAME
    runs it from then on)."""
    opts = _parse_opts(cmd.args, ("-f",))
    if opts.has("-f"):
        return [(HIGH, f"{cmd.label()}: loads a builtin from a shared library")]
    return [(LOW, "enable: shell builtin without side effects")]


def _h_trap(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    """`trap ACTION SIGNAL…`: the shell runs ACTION on the signal (at exit for EXIT, before every command
    for DEBUG): ACTION is rated as a command line. `trap '' SIG`, `trap - SIG`, `trap -p` and `trap -l`
    change or show no command."""
    args = cmd.args[1:] if cmd.args[:1] == ["--"] else cmd.args
    if not args or args[0] in ("-p", "-l", "-P") or re.fullmatch(r"-|\d+", args[0]) or len(args) == 1:
        return [(LOW, "trap: resets or lists signal handlers")]
    return _exec_text(args[0], ctx, "trap action") or [(LOW, "trap: ignores signals")]


def _h_cd(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    operands = _parse_opts(cmd.args).operands
    target = operands[0] if operands else ("~" if cmd.name == "cd" else "-")  # pushd alone swaps
    if target == "-" or _is_dynamic(target) or cmd.name == "popd" or re.fullmatch(r"[+-]\d+", target):
        ctx.cwd = None  # the directory stack's: not known
    else:
        ctx.cwd = _normalize_path(target, ctx.cwd)
    return [(LOW, f"{cmd.name}: changes the working directory")]


_SU_WITH_ARG = ("-c", "--command", "-s", "--shell", "-g", "--group", "-G", "--supp-group", "-u", "-w",
                "--whitelist-environment", "--session-command")  # fmt: skip


def _h_su(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    opts = _parse_opts(cmd.args, _SU_WITH_ARG)
    code = opts.value("-c", "--command", "--session-command")
    if code is not None:
        return _exec_text(code, ctx, f"{cmd.name} -c")
    operands = [o for o in opts.operands if o != "-"]
    if cmd.raw.rsplit("/", 1)[-1] == "runuser" and opts.has("-u") and operands:  # `runuser -u U CMD ARGS`
        return _classify_argv(_parse_opts(cmd.args, _SU_WITH_ARG, stop_at_operand=True).operands, cmd, ctx)
    user = opts.value("-u") or (operands[0] if operands else "root")
    return [(HIGH, f"{cmd.name} {user}: opens a shell as {user}")]


# ---------------------------------------------------------------------------- code execution

_SHELL_CODE_FLAGS: dict[str, tuple[str, ...]] = {
    "python": ("-c",), "perl": ("-e", "-E"), "ruby": ("-e",), "node": ("-e", "--eval", "-p", "--print"),
    "php": ("-r",), "lua": ("-e",), "Rscript": ("-e",), "pwsh": ("-c", "-command", "-Command"),
    "powershell": ("-c", "-command", "-Command"), "osascript": ("-e",), "tclsh": (),
}  # fmt: skip
_VERSION_FLAGS = frozenset({"--version", "-V", "-v", "--help", "-h", "-version"})
_CODE_RULES: tuple[tuple[re.Pattern[str], RiskLevel, str], ...] = (
    (re.compile(r"fork\s*(\(\s*\))?\s*(while|until)\s*(\(\s*)?(fork|1|true|!\s*0)\b|while\s*[(\s]*(1|true|True)[)\s]*[:{]?[^}\n]*\bfork\b|"
                r"for\s*\(\s*;\s*;\s*\)\s*\{?[^}]*\bfork\b|"
                # Python's body on lines of its own (a few lines looked at: linear in the code's length)
                r"while[ \t(]*(1|True)[ \t)]*:[ \t]*\r?\n(?:[ \t][^\n]*\n){0,8}?[ \t][^\n]*\bfork\b"),
     CRITICAL, "fork bomb (spawns processes forever)"),
    (re.compile(r"(b64decode|base64|unhexlify|fromhex|decode\(\s*['\"](hex|base64)).*\b(exec|eval|system)\b|"
                r"\b(exec|eval|system)\s*\(.*(b64decode|unhexlify|fromhex|base64)"), CRITICAL, "executes an encoded payload"),
    (re.compile(r"open\(\s*['\"](/etc/|/boot/|/dev/sd|/dev/nvme|/proc/sysrq)[^'\"]*['\"]\s*,\s*['\"][wa]"), CRITICAL,
     "overwrites a system file"),
    (re.compile(r"\b(os\.system|os\.popen|subprocess|commands\.getoutput|pty\.spawn|os\.exec\w*|os\.spawn\w*|"
                r"child_process|execSync|spawnSync|shell_exec|passthru|proc_open|Runtime\.getRuntime)\b"), HIGH,
     "spawns shell commands"),
    (re.compile(r"\b(system|exec|popen|spawn|qx)\s*[({]|`[^`]+`"), HIGH, "runs shell commands"),
    (re.compile(r"\b(shutil\.rmtree|os\.remove|os\.unlink|os\.rmdir|os\.removedirs|unlink|rmtree|rm_rf|rm_r|"
                r"FileUtils\.rm\w*|fs\.rm\w*|fs\.unlink\w*|File\.delete)\b"), HIGH, "deletes files"),
    (re.compile(r"\bsocket\b|\bIO::Socket|\bTCPSocket\b|\bnet\.connect\b"), HIGH, "opens network sockets"),
    (re.compile(r"\b(eval|exec|compile)\s*\(|__import__\s*\("), HIGH, "evaluates dynamically built code"),
    (re.compile(r"\b(os\.kill|os\.killpg|signal\.SIGKILL|process\.kill)\b|\bkill\s+-?9"), HIGH, "kills processes"),
    (re.compile(r"\b(os\.chmod|os\.chown|os\.setuid|chmod|chown|setuid)\b"), HIGH, "changes permissions or privileges"),
    (re.compile(r"open\([^)]*,\s*['\"][wax]|write_text|write_bytes|File\.write|fs\.writeFile"), MEDIUM, "writes files"),
)  # fmt: skip
_CODE_SHELL_CALL_RE = re.compile(
    r"\b(?:system|popen|getoutput|getstatusoutput|check_output|check_call|call|run|Popen|exec|execSync|spawnSync|"
    r"shell_exec|passthru|qx)\s*[({]\s*[rbuf]?(['\"])(?P<cmd>.+?)(?<!\\)\1"
)
_CODE_SHELL_LIST_RE = re.compile(r"\[\s*((?:[rbu]?['\"][^'\"]*['\"]\s*,\s*)+[rbu]?['\"][^'\"]*['\"])\s*\]")
_CODE_BACKTICK_RE = re.compile(r"`(?P<cmd>[^`]+)`")
_CODE_DELETE_RE: tuple[tuple[re.Pattern[str], bool], ...] = (
    (re.compile(r"(?:rmtree|rm_rf|rm_r|removedirs|rmSync|rmdirSync)\s*\(\s*[rbuf]?(['\"])(?P<path>[^'\"]+)\1"), True),
    (re.compile(r"(?:os\.remove|os\.unlink|\bunlink|unlinkSync)\s*\(\s*[rbuf]?(['\"])(?P<path>[^'\"]+)\1"), False),
)  # fmt: skip


def _shell_calls(code: str, ctx: _Ctx, label: str) -> list[Finding]:
    findings: list[Finding] = []
    commands = [m.group("cmd") for m in _CODE_SHELL_CALL_RE.finditer(code)]
    commands += [m.group("cmd") for m in _CODE_BACKTICK_RE.finditer(code)]
    for match in _CODE_SHELL_LIST_RE.finditer(code):
        commands.append(" ".join(shlex.quote(w) for w in re.findall(r"['\"]([^'\"]*)['\"]", match.group(1))))
    for command in commands:
        findings += _nested(command.replace("\\'", "'").replace('\\"', '"'), ctx, f"{label} shell call")
    return findings


_CODE_FORK_RE = re.compile(r"(?<!['\"\w])fork(?:pty)?\b(?!['\"])")  # a call, not the name 'fork' as a string
_CODE_LOOP_RE = re.compile(r"\b(?:for|foreach|while|until|loop|times|each|map|repeat|upto|downto)\b")
_CODE_ENDLESS_RE = re.compile(  # an iterator or loop that never ends
    r"\biter\s*\(\s*\w+\s*,|\bcount\s*\(\s*\)|\bcycle\s*\(|\brepeat\s*\(\s*[^,()]*\)|\bloop\s*(?:\{|do\b)"
    r"|\bwhile[\s(]*(?:1|true|True)\b|\bfor\s*\(\s*;\s*;\s*\)"
)
_CODE_HEADER_RE = re.compile(r"[ \t]*(?:for|while|async[ \t]+for)\b[^\n]*:[ \t]*(?:#[^\n]*)?")  # Python's


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def _fork_loop(code: str) -> RiskLevel | None:
    """A fork in a loop or comprehension (`[os.fork() for _ in range(50)]`, `10.times { fork }`, `for …:`
    with `os.fork()` in its body): each child goes on looping, so the processes double at every pass —
    HIGH; CRITICAL when the loop never ends (`iter(int, 1)`, `itertools.count()`, `loop { fork }`).
    Read a line at a time, with the (at most 8) lines before it of a Python loop's header: linear."""
    lines = code.splitlines()
    level: RiskLevel | None = None
    for number, line in enumerate(lines):
        if "fork" not in line or not _CODE_FORK_RE.search(line):
            continue
        headers = [line] if _CODE_LOOP_RE.search(line) else []
        indent = _indent(line)
        for before in reversed(lines[max(number - 8, 0) : number]):
            if before.strip() and _indent(before) < indent:
                indent = _indent(before)
                if _CODE_HEADER_RE.fullmatch(before):
                    headers.append(before)
        if any(_CODE_ENDLESS_RE.search(header) for header in headers):
            return CRITICAL
        if headers:
            level = HIGH
    return level


def _code_findings(code: str, ctx: _Ctx, label: str) -> list[Finding]:
    findings: list[Finding] = [(MEDIUM, f"{label} runs inline code that cannot be fully analysed")]
    findings += _fetch_findings(code, ctx, label)
    fork_loop = _fork_loop(code) if "fork" in code else None
    if fork_loop is CRITICAL:
        findings.append((CRITICAL, f"{label}: fork bomb (spawns processes forever)"))
    elif fork_loop is not None:
        findings.append((fork_loop, f"{label}: forks in a loop (every child loops on: the processes double)"))
    for pattern, level, what in _CODE_RULES:
        if pattern.search(code):
            findings.append((level, f"{label}: {what}"))
    findings += _shell_calls(code, ctx, label)
    for pattern, recursive in _CODE_DELETE_RE:
        for match in pattern.finditer(code):
            level, what = _delete_risk(match.group("path"), ctx, recursive)
            findings.append((level, f"{label} deletes '{match.group('path')}': {what}"))
    return findings


def _heredoc_body(cmd: _Cmd, ctx: _Ctx) -> str | None:
    return _input_text(cmd.redirs, ctx)


def _input_text(redirs: list[tuple[str, str]], ctx: _Ctx) -> str | None:
    """The text of a here-document or here-string given as standard input, if any."""
    for op, target in redirs:
        if op in ("<<", "<<<"):
            match = _SUB_RE.fullmatch(target)
            if op == "<<" and match:
                return ctx.subs[int(match.group(1))].text
            return target
    return None


_DOWNLOADERS = frozenset({"curl", "wget", "fetch", "aria2c", "lwp-request", "lwp-download", "http", "https", "nc",
                          "socat", "tftp", "ftp", "httpie", "xh", "invoke-webrequest", "iwr", "scp", "aws", "gsutil"})  # fmt: skip


def _stage_kind(argv: list[str]) -> str | None:
    if not argv:
        return None
    if _normalize_name(argv[0]) in _DOWNLOADERS:
        return "downloaded content"
    text = " ".join(argv)
    return "a decoded payload" if _DECODE_RE.search(text) else None


def _echo_text(argv: list[str]) -> str:
    if argv[0] == "printf":
        return _printf_text([w for w in argv[1:] if w != "--"])
    words = [w for w in argv[1:] if not re.fullmatch(r"-[neE]+", w)]
    text = " ".join(words)
    return _ANSI_ESC_RE.sub(_ansi_unescape, text) if "-e" in argv else text


_CONVERSION_RE = re.compile(r"%%|%[-#0 +']*\d*(?:\.\d*)?[sbdiouxXcfeEgGaA]")


def _printf_text(args: list[str]) -> str:
    """What `printf FORMAT ARGS…` prints: its escapes decoded, each conversion (`%s`, `%d` …) given the
    next argument; the format is used again while arguments are left (`printf '%s ' a b`)."""
    if not args:
        return ""
    form, rest = _ANSI_ESC_RE.sub(_ansi_unescape, args[0]), args[1:]
    out, used = [], 0

    def convert(match: re.Match[str]) -> str:
        nonlocal used
        if match[0] == "%%":
            return "%"
        used += 1
        return rest[used - 1] if used <= len(rest) else ""

    while True:
        before = used
        out.append(_CONVERSION_RE.sub(convert, form))
        if used >= len(rest) or used == before:
            return "".join(out)


def _decode_base64(text: str) -> str | None:
    try:
        raw = base64.b64decode(re.sub(r"\s", "", text) + "==", validate=False)
    except (binascii.Error, ValueError):
        return None
    decoded = raw.decode("utf-8", "replace")
    return decoded if decoded.isprintable() or "\n" in decoded else None


def _literal_payload(stages: list[list[str]], ctx: _Ctx, stdin: str | None = None) -> str | None:
    """Simulate `echo ... | base64 -d | rev` (or `cat` of a file written earlier, or of `stdin`: the
    here-document the first stage reads) to classify the payload."""
    text: str | None = None
    for position, argv in enumerate(stages):
        name = _normalize_name(argv[0]) if argv else ""
        if position == 0 and stdin is not None and name == "cat" and all(a == "-" for a in argv[1:]):
            text = stdin
        elif name in ("echo", "printf"):
            text = _echo_text([name, *argv[1:]])
        elif name == "cat" and len(argv) == 2 and (written := _written(argv[1], ctx)) is not None:
            text = written.text
        elif text is not None and name in ("base64", "openssl") and _DECODE_RE.search(" ".join(argv)):
            text = _decode_base64(text)
        elif text is not None and name == "rev":
            text = "\n".join(line[::-1] for line in text.split("\n"))
        else:
            text = None
    return text


def _piped_program(cmd: _Cmd, ctx: _Ctx, shell: bool) -> list[Finding]:
    upstream = " | ".join(_show(" ".join(argv), 40) for argv in cmd.earlier + cmd.upstream if argv)
    findings: list[Finding] = []
    for argv in cmd.upstream + cmd.earlier:
        kind = _stage_source(argv, ctx)
        if kind is not None:
            what = "remote code execution" if kind.startswith("downloaded") else "obfuscated code execution"
            findings.append((CRITICAL, f"pipes {kind} ('{upstream}') into {_show(cmd.raw)}: {what}"))
            break
    else:
        findings += _earlier_piped(cmd, ctx) or [
            (HIGH, f"pipes generated data ('{upstream}') into {_show(cmd.raw)}: executes it as code")
        ]
    payload = _literal_payload(cmd.upstream, ctx, cmd.piped_input)
    if payload:
        findings += _nested(payload, ctx, "piped script") if shell else _code_findings(payload, ctx, cmd.name)
    return findings


def _stdin_program(cmd: _Cmd, ctx: _Ctx, shell: bool) -> list[Finding]:
    body = _heredoc_body(cmd, ctx)
    if body is not None:
        label = f"{cmd.name} here-document"
        return _exec_text(body, ctx, label) if shell else _code_findings(body, ctx, label)
    for op, target in cmd.redirs:
        if op == "<":
            return _run_script(cmd, target, ctx, shell)
    if cmd.upstream:
        return _piped_program(cmd, ctx, shell)
    if any(op in (">&", "&>", ">", "<>") and _path_kind(t, ctx)[0] == "net" for op, t in cmd.redirs):
        return [(CRITICAL, f"{cmd.name} with its I/O on a network socket: reverse shell")]
    return [(MEDIUM, f"starts an interactive {cmd.name}")]


def _run_script(cmd: _Cmd, script: str, ctx: _Ctx, shell: bool) -> list[Finding]:
    if script in ("-", "/dev/stdin"):
        return _stdin_program(
            _Cmd(
                cmd.name,
                cmd.raw,
                [],
                [r for r in cmd.redirs if r[0] != "<"],
                cmd.upstream,
                cmd.earlier,
                cmd.piped_input,
            ),
            ctx,
            shell,
        )
    known = _known_script(cmd, script, ctx, shell)
    if known is not None:
        return known
    return [(MEDIUM, f"{cmd.name} runs the script '{_show(script)}' (contents not analysed)")]


def _known_script(cmd: _Cmd, script: str, ctx: _Ctx, shell: bool | None) -> list[Finding] | None:
    """Findings for running `script` when something is known of it: a download or decoder in its name
    (`$(curl …)`), or the line or the run saved it (`_written_script`). None when nothing is."""
    findings = _fetch_findings(script, ctx, f"{cmd.name} script")
    written = _written_script(cmd, script, ctx, shell)
    if written is not None:
        return findings + written
    return findings or None


def _parse_shell_args(args: list[str]) -> tuple[str | None, list[str], bool]:
    code_mode = reads_stdin = False
    index = 0
    while index < len(args):
        arg = args[index]
        if arg == "--" or not arg.startswith(("-", "+")) or arg in ("-", "+"):
            index += arg == "--"
            break
        index += 1
        if arg in ("-o", "+o", "-O", "+O", "--rcfile", "--init-file"):
            index += 1
        elif not arg.startswith("--"):
            code_mode = code_mode or "c" in arg
            reads_stdin = reads_stdin or "s" in arg
    operands = args[index:]
    if code_mode:
        return (operands[0] if operands else ""), operands[1:], reads_stdin
    return None, operands, reads_stdin


_PLAIN_ARG_RE = re.compile(r"[\w./~*?@%+=:,-]+")
_POSITIONAL_RE = re.compile(r"\$(?:\{([1-9@*])\}|([1-9@*]))")


def _bind_positional(code: str, args: list[str]) -> str:
    """`sh -c 'rm -rf "$1"' sh /`: put plain arguments in place of $1…$9, $@ and $* (others stay dynamic)."""
    params = args[1:]

    def value(match: re.Match[str]) -> str:
        key = match.group(1) or match.group(2)
        chosen = params if key in "@*" else params[int(key) - 1 : int(key)]
        if not chosen or not all(_PLAIN_ARG_RE.fullmatch(p) for p in chosen):
            return match.group(0)
        return " ".join(chosen)

    return _POSITIONAL_RE.sub(value, code) if params else code


def _shell_startup_files(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    """Findings for the startup files a shell is told to source first: `--rcfile FILE`, `--init-file
    FILE` (a file the line or the run saved; other files are the interactive shell's risk)."""
    findings: list[Finding] = []
    for option, value in zip(cmd.args, cmd.args[1:], strict=False):
        if option in ("--rcfile", "--init-file"):
            findings += _known_script(cmd, value, ctx, shell=True) or []
        elif not option.startswith(("-", "+")):
            break
    return findings


def _h_shell(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    startup = _shell_startup_files(cmd, ctx) if "--rcfile" in cmd.args or "--init-file" in cmd.args else []
    return startup + _shell_body(cmd, ctx)


def _shell_body(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    code, operands, reads_stdin = _parse_shell_args(cmd.args)
    if code is not None:
        code = _bind_positional(code, operands)
        return _exec_text(code, ctx, f"{cmd.name} -c") or [(LOW, f"{cmd.name} -c with empty code")]
    if operands and not reads_stdin:
        return _run_script(cmd, operands[0], ctx, shell=True)
    return _stdin_program(cmd, ctx, shell=True)


def _h_source(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    if not cmd.args:
        return [(LOW, f"{cmd.name} without a file")]
    return _run_script(cmd, cmd.args[0], ctx, shell=True)


def _h_eval(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    text = " ".join(cmd.args)
    findings = _exec_text(text, ctx, "eval")
    if _is_dynamic(text):
        findings.append((HIGH, f"eval of dynamically generated code: {_show(text)!r}"))
    return findings or [(LOW, "eval of nothing")]


def _interp_code(cmd: _Cmd) -> tuple[str | None, int]:
    flags = _SHELL_CODE_FLAGS.get(cmd.name, ())
    for index, arg in enumerate(cmd.args):
        cluster_code = cmd.name in ("perl", "ruby") and re.fullmatch(r"-[a-zA-Z0-9.]*[eE]", arg)
        if (arg in flags or cluster_code) and index + 1 < len(cmd.args):
            return cmd.args[index + 1], index + 2
        if not arg.startswith("-"):
            return None, index
    return None, len(cmd.args)


def _h_interp(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    if cmd.args and all(a in _VERSION_FLAGS for a in cmd.args):
        return [(LOW, f"{cmd.name}: shows its version")]
    if cmd.name == "python" and "-m" in cmd.args[:-1]:
        return _python_module(cmd, ctx)
    code, after = _interp_code(cmd)
    if code is not None:
        findings = _code_findings(code, ctx, cmd.name)
        if any(re.fullmatch(r"-[a-zA-Z]*i[^ ]*", a) for a in cmd.args[:after]):
            findings += [_write_finding(f"{cmd.name} -i edits", f, ctx) for f in cmd.args[after:]]
        return findings
    if after < len(cmd.args) and cmd.args[after] != "-":
        return _run_script(cmd, cmd.args[after], ctx, shell=False)
    return _stdin_program(cmd, ctx, shell=False)


_PYTHON_MODULES = {"json.tool": LOW, "pip": MEDIUM, "http.server": MEDIUM, "venv": MEDIUM, "pytest": MEDIUM,
                   "site": LOW, "platform": LOW, "sysconfig": LOW, "timeit": LOW, "this": LOW, "calendar": LOW}  # fmt: skip


def _python_module(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    index = cmd.args.index("-m")
    module = cmd.args[index + 1]
    if module == "pip":
        return _h_package(_Cmd("pip", "pip", cmd.args[index + 2 :], cmd.redirs, cmd.upstream), ctx)
    level = _PYTHON_MODULES.get(module, MEDIUM)
    return [(level, f"python -m {module}: {'read-only helper' if level == LOW else 'runs a Python module'}")]


# ---------------------------------------------------------------------------- files written, then run
# `curl x > a.sh; sh a.sh` is `curl x | sh` in two steps, `echo 'rm -rf /' > a.sh; sh a.sh` is
# `echo 'rm -rf /' | sh`: what a command writes is remembered (`_Ctx.files`) for the commands after it.

_WRITE_OPS = frozenset({">", ">>", ">|", "&>", "&>>"})
_BIN_DIRS = frozenset({"/usr/local/bin", "/usr/local/sbin", "/usr/bin", "/usr/sbin", "/bin", "/sbin",
                       "~/.local/bin", "~/bin"})  # fmt: skip
_SCP_WITH_ARG = ("-P", "-i", "-o", "-F", "-l", "-c", "-J", "-S", "-D", "-X")
_CODE_SHEBANG_RE = re.compile(r"#![^\n]*\b(python|pypy|perl|ruby|node|php|lua)")


def _bin_paths(name: str) -> Iterator[str]:
    return (f"{folder}/{name}" for folder in _BIN_DIRS)


def _written(raw: str, ctx: _Ctx) -> _Written | None:
    return ctx.files.get(_normalize_path(raw, ctx.cwd)) if ctx.files else None


def _written_program(raw: str, ctx: _Ctx) -> str | None:
    """The path of a file written earlier on the line that `raw`, as a command name, runs."""
    if not ctx.files:
        return None
    if "/" in raw:
        return raw if _written(raw, ctx) is not None else None
    return ctx.files.program(raw) if raw else None


def _runs_itself(text: str, script: str) -> bool:
    name = re.escape(posixpath.basename(script))
    call = rf"(?:^|[;&|(\s])(?:\S*/)?(?:\$0|\$\{{0\}}|{name})(?![\w.-])[^;&|\n]*"
    return re.search(rf"{call}(?:&(?!&)|\|(?!\|)).*{call}", text, re.S) is not None


def _written_script(cmd: _Cmd, script: str, ctx: _Ctx, shell: bool | None) -> list[Finding] | None:
    """Findings for running a file the line wrote earlier (None when it did not write it)."""
    written = _written(script, ctx)
    if written is None:
        return _earlier_script(cmd, script, ctx)
    shown = _show(script)
    runs = f"runs '{shown}'" if cmd.raw == script else f"{_show(cmd.raw)} runs '{shown}'"
    findings: list[Finding] = [(MEDIUM, f"{runs}, written earlier in this command")]
    if written.source is not None:
        what = (
            "remote code execution"
            if written.source.startswith("downloaded")
            else "obfuscated code execution"
        )
        findings.append((CRITICAL, f"{runs}, saved from {written.source} earlier in this command: {what}"))
    if written.text:
        if _runs_itself(written.text, script):
            findings.append((CRITICAL, f"fork bomb: the script '{shown}' starts copies of itself"))
        code = not shell if shell is not None else bool(_CODE_SHEBANG_RE.match(written.text))
        label = f"the script '{shown}'"
        findings += _code_findings(written.text, ctx, label) if code else _exec_text(written.text, ctx, label)
    return findings


def _stage_source(argv: list[str], ctx: _Ctx) -> str | None:
    """'downloaded content' or 'a decoded payload' when a pipeline stage outputs one, else None."""
    kind = _stage_kind(argv)
    if kind is None and ctx.files:
        kind = next((w.source for a in argv[1:] if (w := _written(a, ctx)) is not None and w.source), None)
    return kind


def _url_name(url: str) -> str:
    path = url.split("://", 1)[-1].split("?", 1)[0].split("#", 1)[0]
    return posixpath.basename(path.partition("/")[2])


def _download_targets(argv: list[str]) -> list[str]:
    """The files a downloader saves into: curl -o/-O, wget's -O or its default name, scp's destination."""
    name = _normalize_name(argv[0])
    if name == "curl":
        opts = _parse_opts(argv[1:], _CURL_WITH_ARG)
        targets = [v for v in opts.values("-o", "--output") if v != "-"]
        if opts.has("-O", "--remote-name", "--remote-name-all"):
            folder = opts.value("--output-dir") or ""
            urls = [*opts.operands, *opts.values("--url")]
            targets += [posixpath.join(folder, n) for n in map(_url_name, urls) if n]
        return targets
    if name == "wget":
        opts = _parse_opts(argv[1:], _WGET_WITH_ARG)
        document = opts.value("-O", "--output-document")
        if document is not None:
            return [] if document == "-" else [document]
        folder = opts.value("-P", "--directory-prefix") or ""
        return [posixpath.join(folder, _url_name(u) or "index.html") for u in opts.operands]
    if name == "scp":
        *sources, dest = _parse_opts(argv[1:], _SCP_WITH_ARG).operands or [""]
        if dest in (".", "..") or dest.endswith("/"):
            return [posixpath.join(dest, posixpath.basename(s.split(":", 1)[-1])) for s in sources]
        return [dest] if sources else []
    return []


def _output_text(stages: list[list[str]], redirs: list[tuple[str, str]], ctx: _Ctx) -> str | None:
    """The text a pipeline writes, when it is literal: `echo ...`, `cat <<EOF`, `echo ... | base64 -d`."""
    last = stages[-1]
    name = _normalize_name(last[0])
    if len(stages) == 1 and (name == "tee" or (name == "cat" and all(a == "-" for a in last[1:]))):
        body = _input_text(redirs, ctx)
        if body is not None:
            return body
    return _literal_payload(stages, ctx)


def _remember(ctx: _Ctx, raw: str, op: str, written: _Written) -> None:
    if ctx.expanding and written.source is None:
        return  # a value may not be in effect: what it writes may only raise a later rating
    path = _normalize_path(raw, ctx.cwd)
    before = ctx.files.get(path)
    if op in (">>", "&>>") and before is not None:
        texts = [t for t in (before.text, written.text) if t]
        written = _Written(before.source or written.source, "\n".join(texts) or None)
    ctx.files[path] = written


def _copy_written(argv: list[str], ctx: _Ctx) -> None:
    """`cp a.sh b.sh`, `mv a.sh bin/`: the copy carries what is known of the original."""
    opts = _parse_opts(argv[1:], _COPY_WITH_ARG)
    dest = _copy_dest(opts)
    sources = opts.operands if opts.has("-t", "--target-directory") else opts.operands[:-1]
    for source in sources:
        written = _written(source, ctx)
        if dest is not None and written is not None:
            _remember(ctx, dest, ">", written)
            _remember(ctx, posixpath.join(dest, posixpath.basename(source)), ">", written)


def _record_writes(simple: _Simple, argv: list[str], upstream: list[list[str]], ctx: _Ctx) -> None:
    """Remember the files this command writes, for a later command on the line that runs one of them."""
    if not argv:
        return
    stages = [*[s for s in upstream if s], argv]
    source = next((k for stage in stages if (k := _stage_source(stage, ctx)) is not None), None)
    text = _output_text(stages, simple.redirs, ctx)
    targets = [(op, t) for op, t in simple.redirs if op in _WRITE_OPS]
    name = _normalize_name(argv[0])
    if name == "tee":
        opts = _parse_opts(argv[1:], ("--output-error",))
        targets += [(">>" if opts.has("-a", "--append") else ">", t) for t in opts.operands]
    for target in _download_targets(argv) if name in _DOWNLOADERS else []:
        _remember(ctx, target, ">", _Written("downloaded content", None))
    targets += [(">", t) for t in _output_files(argv)]
    for op, target in targets:
        _remember(ctx, target, op, _Written(source, text))
    if name in ("cp", "mv", "install", "ln"):
        _copy_written(argv, ctx)


# ---------------------------------------------------------------------------- files saved by earlier commands
# A run's shell calls are rated one at a time: `curl -o x.sh URL` in one call and `bash x.sh` in the next
# would each look like a plain download and a plain script. `classify_command(..., earlier=...)` is given
# the run's earlier commands; when the command rated runs a file, they are read (once, and only then) for
# the files they saved from a download or a decoder, and running one is rated as if both were one line.

_DOWNLOADER_WORDS = "|".join(sorted(map(re.escape, _DOWNLOADERS)))
_SAVES_RE = re.compile(rf">|\$'|\b(?:tee|cp|mv|install|ln|{_DOWNLOADER_WORDS})\b")
_QUOTING_RE = re.compile(r"[\"'\\]")


class _Saved:
    """What a run's earlier commands saved from a download or a decoder: path -> `_Written`, in the order
    saved (a path saved again keeps its place; one dropped and saved again goes last), indexed so that
    a path is found in constant time, and a relative one that may be the same file as a saved absolute
    one (or the reverse) without a scan of them all."""

    __slots__ = ("_by_name", "_files", "_order", "_next")

    def __init__(self) -> None:
        self._files: dict[str, _Written] = {}
        self._order: dict[str, int] = {}  # path -> when it was saved
        self._by_name: dict[str, set[str]] = {}  # name -> the absolute paths saved under it
        self._next = 0

    def __bool__(self) -> bool:
        return bool(self._files)

    def get(self, path: str) -> _Written | None:
        return self._files.get(path)

    def save(self, path: str, written: _Written) -> None:
        if path not in self._files:
            self._order[path] = self._next
            self._next += 1
            if path.startswith("/"):
                self._by_name.setdefault(posixpath.basename(path), set()).add(path)
        self._files[path] = written

    def drop(self, path: str) -> None:
        if self._files.pop(path, None) is not None:
            del self._order[path]
            if path.startswith("/"):
                self._by_name[posixpath.basename(path)].discard(path)

    def maybe_same(self, path: str) -> str | None:
        """The first saved path that may name the same file as `path` when the working directory is not
        known: a relative one that an absolute `path` ends with, or an absolute one ending with a
        relative `path`."""
        if path.startswith("/"):
            candidates = [path[i + 1 :] for i, char in enumerate(path) if char == "/"]
            shorts = [c for c in candidates if c in self._files and not c.startswith(("/", "~", ".."))]
            return min(shorts, key=self._order.__getitem__, default=None)
        if path.startswith(("~", "..")):
            return None
        tail = "/" + path
        fulls = [c for c in self._by_name.get(posixpath.basename(path), ()) if c.endswith(tail)]
        return min(fulls, key=self._order.__getitem__, default=None)


class _Earlier:
    """The files a run's earlier commands saved from a download or a decoder (`_Saved`).

    `commands` are read the first time a file is looked up, so rating a command that runs no file costs
    nothing; each one costs about its own length (what it saves is remembered across checks, `_saves`),
    so a check is linear in the run's length. `cwd` is the working directory every command starts in,
    when known (absolute): relative and absolute paths are then compared exactly; without it, `x.sh`
    and `/srv/x.sh` *may* be the same file.
    """

    def __init__(self, commands: Iterable[str], cwd: str | None) -> None:
        self._commands: Iterable[str] | None = commands
        self.cwd = _normalize_path(cwd, None) if cwd and cwd.startswith("/") else None
        self._files = _Saved()

    def files(self) -> _Saved:
        if self._commands is not None:
            commands, self._commands = self._commands, None
            for command in commands:
                if isinstance(command, str):
                    _read_saves(command, self._files, self.cwd)
        return self._files

    def find(self, path: str) -> tuple[str, _Written, bool] | None:
        """The saved file `path` (normalized) names: (its path, what saved it, whether surely the same)."""
        if self.cwd is not None and not path.startswith(("/", "~")):
            path = _normalize_path(path, self.cwd)
        files = self.files()
        written = files.get(path)
        if written is not None:
            return path, written, True
        if self.cwd is not None or not files:
            return None
        saved = files.maybe_same(path)  # the working directory is not known
        found = files.get(saved) if saved is not None else None
        return (saved, found, False) if saved is not None and found is not None else None


def _read_saves(command: str, files: _Saved, cwd: str | None) -> None:
    """Add what one earlier command saved from a download or a decoder to `files` (labelled with the
    command); a file it overwrote with other content, or could have, is dropped."""
    if len(command) > _MAX_LENGTH or not _SAVES_RE.search(_QUOTING_RE.sub("", command)):
        return  # nothing in it writes a file
    for path, source, origin in _saves(command, cwd, files):
        if source is None:
            files.drop(path)
        else:
            files.save(path, _Written(source, None, origin or command))


_Reads = tuple[tuple[str, "_Written | None"], ...]
_SavedBy = tuple[tuple[str, str | None, str], ...]
_SAVES_KEPT = 8192
_saves_kept: collections.OrderedDict[tuple[str, str | None], tuple[_Reads, _SavedBy]] = (
    collections.OrderedDict()
)
_saves_lock = threading.Lock()


def _saves(command: str, cwd: str | None, saved: _Saved) -> _SavedBy:
    """The files `command` writes, given the files saved before it: (path, source or None when not
    saved from a download or a decoder, origin or "" for this command).

    Remembered: a run's checks read the same earlier commands again and again. What a command saves
    depends only on the saved files it looked up (`cp a.sh b.sh` on what a.sh was), so a remembered
    answer is reused while those entries are the same — not, as before, only while *every* file saved
    before it was (which rebuilt the whole list for each command: quadratic in the run's length)."""
    key = (command, cwd)
    with _saves_lock:
        kept = _saves_kept.get(key)
        if kept is not None:
            _saves_kept.move_to_end(key)
    if kept is not None and all(saved.get(path) == written for path, written in kept[0]):
        return kept[1]
    files = _Files(saved)
    try:
        _classify_text(command, _Ctx([], cwd=cwd, files=files))
    except Exception:  # unparseable (it was rated high then): nothing is known of what it saved
        result: _SavedBy = ()
    else:
        result = tuple((path, w.source, w.origin or "") for path, w in files.changes())
    with _saves_lock:
        _saves_kept[key] = (tuple(files.reads.items()), result)
        _saves_kept.move_to_end(key)
        while len(_saves_kept) > _SAVES_KEPT:
            _saves_kept.popitem(last=False)
    return result


def _earlier_file(raw: str, ctx: _Ctx) -> tuple[str, _Written, bool] | None:
    if ctx.earlier is None or not raw or raw.startswith("-") or _is_dynamic(raw):
        return None
    return ctx.earlier.find(_normalize_path(raw, ctx.cwd))


def _saved_by(written: _Written) -> str:
    return f"saved from {written.source} by an earlier command of this run ('{_show(written.origin or '', 120)}')"


def _danger(written: _Written) -> str:
    downloaded = (written.source or "").startswith("downloaded")
    return "remote code execution" if downloaded else "obfuscated code execution"


def _earlier_script(cmd: _Cmd, script: str, ctx: _Ctx) -> list[Finding] | None:
    """Findings for running a file an earlier command of the run saved (None when none did)."""
    found = _earlier_file(script, ctx)
    if found is None:
        return None
    path, written, same = found
    shown = _show(script)
    runs = f"runs '{shown}'" if cmd.raw == script else f"{_show(cmd.raw)} runs '{shown}'"
    if same:
        return [(CRITICAL, f"{runs}, {_saved_by(written)}: {_danger(written)}")]
    return [
        (HIGH, f"{runs}, which may be '{_show(path)}' {_saved_by(written)} (the working directory is not "
               f"known): possible {_danger(written)}")
    ]  # fmt: skip


def _earlier_piped(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    """`cat x.sh | sh` where an earlier command of the run saved x.sh."""
    for argv in cmd.upstream + cmd.earlier:
        for arg in argv[1:]:
            found = _earlier_file(arg, ctx)
            if found is not None and found[2]:
                what = f"pipes '{_show(arg)}', {_saved_by(found[1])}, into {_show(cmd.raw)}"
                return [(CRITICAL, f"{what}: {_danger(found[1])}")]
    return []


_ADDS_EXEC_RE = re.compile(r"[+=][rwXst]*x")


def _made_executable(cmd: _Cmd, mode: str, target: str, ctx: _Ctx) -> list[Finding]:
    """`chmod +x` of a downloaded or decoded file (on this line or by an earlier command): HIGH, since
    it gets the file ready to run (running it is CRITICAL)."""
    if cmd.name != "chmod":
        return []
    adds = int(mode, 8) & 0o111 if re.fullmatch(r"[0-7]{1,4}", mode) else _ADDS_EXEC_RE.search(mode)
    if not adds:
        return []
    written = _written(target, ctx)
    if written is not None:
        saved = f"saved from {written.source} earlier in this command" if written.source else None
    else:
        found = _earlier_file(target, ctx)
        written, saved = (found[1], _saved_by(found[1])) if found and found[2] else (None, None)
    if written is None or saved is None:
        return []
    return [(HIGH, f"chmod {mode} makes '{_show(target)}' executable, {saved}: it can then be run")]


# ---------------------------------------------------------------------------- launchers


@dataclass(frozen=True)
class _Wrapper:
    """A launcher that runs another command (`sudo cmd`, `timeout 5 cmd` ...)."""

    with_arg: frozenset[str] = frozenset()
    positional: int = 0
    level: RiskLevel = LOW
    note: str = ""
    alone: RiskLevel = LOW


_SUDO_WITH_ARG = frozenset({"-u", "--user", "-g", "--group", "-h", "--host", "-p", "--prompt", "-C", "--close-from",
                            "-D", "--chdir", "-r", "--role", "-t", "--type", "-U", "--other-user", "-T",
                            "--command-timeout"})  # fmt: skip
_WRAPPERS: dict[str, _Wrapper] = {
    "sudo": _Wrapper(_SUDO_WITH_ARG),
    "doas": _Wrapper(frozenset({"-u", "-C"})),
    "pkexec": _Wrapper(frozenset({"--user"})),
    "run0": _Wrapper(frozenset({"--user", "-u", "--unit", "--property"})),
    "nohup": _Wrapper(), "setsid": _Wrapper(), "unbuffer": _Wrapper(), "chronic": _Wrapper(),
    "torsocks": _Wrapper(), "catchsegv": _Wrapper(), "fakeroot": _Wrapper(), "caffeinate": _Wrapper(),
    "proxychains": _Wrapper(frozenset({"-f"})), "proxychains4": _Wrapper(frozenset({"-f"})),
    "timeout": _Wrapper(frozenset({"-s", "--signal", "-k", "--kill-after"}), positional=1),
    "nice": _Wrapper(frozenset({"-n", "--adjustment"})),
    "ionice": _Wrapper(frozenset({"-c", "--class", "-n", "--classdata", "-t"})),
    "stdbuf": _Wrapper(frozenset({"-i", "-o", "-e", "--input", "--output", "--error"})),
    "time": _Wrapper(frozenset({"-f", "--format", "-o", "--output"})),
    "command": _Wrapper(), "builtin": _Wrapper(), "exec": _Wrapper(frozenset({"-a"})), "noglob": _Wrapper(),
    "taskset": _Wrapper(positional=1), "chrt": _Wrapper(positional=1),
    "flock": _Wrapper(frozenset({"-w", "--timeout", "-E", "--conflict-exit-code"}), positional=1),
    "busybox": _Wrapper(), "toybox": _Wrapper(),
    "chroot": _Wrapper(frozenset({"--userspec", "--groups"}), positional=1, level=HIGH, note="inside a chroot", alone=HIGH),
    "nsenter": _Wrapper(frozenset({"-t", "--target", "-S", "-G", "--setuid", "--setgid"}), level=HIGH,
                        note="inside another process's namespaces", alone=HIGH),  # fmt: skip
    "strace": _Wrapper(frozenset({"-o", "-e", "-p", "-s", "-u", "-E", "-P"}), level=MEDIUM, note="under a tracer"),
    "ltrace": _Wrapper(frozenset({"-o", "-e", "-p", "-s", "-u"}), level=MEDIUM, note="under a tracer"),
    "systemd-run": _Wrapper(frozenset({"-u", "--unit", "-p", "--property", "--on-calendar", "--on-active", "-M",
                                       "--description", "--slice"}), level=MEDIUM, note="as a transient unit"),  # fmt: skip
    "firejail": _Wrapper(), "sg": _Wrapper(positional=1),
}  # fmt: skip
_SHELL_WRAPPERS = frozenset({"flock", "sg"})  # `flock FILE -c CMD`, `sg GROUP [-c] CMD`: a shell runs CMD
_ROOT_SHELL_FLAGS = frozenset({"-i", "-s", "--login", "--shell"})


def _split_wrapper(args: list[str], wrapper: _Wrapper) -> tuple[list[str], list[str]]:
    """Return (wrapper options, wrapped argv)."""
    index = 0
    flags: list[str] = []
    while index < len(args) and args[index].startswith("-") and args[index] != "-":
        arg = args[index]
        index += 1
        if arg == "--":
            break
        if arg.startswith("--") or len(arg) == 2:
            flags.append(arg)
            if arg in wrapper.with_arg:
                index += 1
            continue
        for pos, letter in enumerate(arg[1:], start=1):  # a cluster: `sudo -iu root`, `strace -fo FILE`
            flags.append("-" + letter)
            if "-" + letter in wrapper.with_arg:
                index += 0 if arg[pos + 1 :] else 1  # its value: the rest of the word, or the next one
                break
    index += wrapper.positional
    return flags, args[index:]


def _unwrap(cmd: _Cmd, wrapper: _Wrapper, ctx: _Ctx) -> list[Finding]:
    flags, inner = _split_wrapper(cmd.args, wrapper)
    if cmd.name == "command" and any(f in ("-v", "-V") for f in flags):
        return [(LOW, "command -v: looks up a command")]
    if not inner:
        if cmd.name in ("sudo", "doas", "run0") and _ROOT_SHELL_FLAGS & set(flags):
            return [(HIGH, f"{cmd.label()}: opens an interactive root shell")]
        return [(wrapper.alone, f"{cmd.name} without a command")]
    if cmd.name in ("sudo", "doas", "run0") and _ROOT_SHELL_FLAGS & set(flags):
        # `sudo -s CMD`/`-i CMD` give CMD to the shell's -c: its text is a command line (sudo escapes
        # its arguments' metacharacters first; rated as a command line all the same, never lower)
        return _exec_text(" ".join(inner), ctx, f"{cmd.name} -s") + _classify_argv(inner, cmd, ctx)
    if cmd.name in _SHELL_WRAPPERS and (cmd.name == "sg" or inner[0] in ("-c", "--command")):
        code = inner[1:] if inner[0] in ("-c", "--command") else inner
        return _exec_text(" ".join(code), ctx, f"{cmd.name} -c") or [(LOW, f"{cmd.name} -c with empty code")]
    findings = _classify_argv(inner, cmd, ctx)
    if wrapper.level > LOW:
        findings.append((wrapper.level, f"{cmd.name}: runs '{_show(inner[0])}' {wrapper.note}"))
    return findings


_SCRIPT_LONG = (
    "--append", "--command", "--echo", "--return", "--flush", "--force", "--log-io", "--log-in", "--log-out",
    "--log-timing", "--logging-format", "--output-limit", "--quiet", "--timing", "--help", "--version",
)  # fmt: skip
_SCRIPT_WITH_ARG = ("-c", "--command", "-E", "--echo", "-B", "--log-io", "-I", "--log-in", "-O", "--log-out",
                    "-T", "--log-timing", "-m", "--logging-format", "-o", "--output-limit")  # fmt: skip
_SCRIPT_LOGS = ("-B", "--log-io", "-I", "--log-in", "-O", "--log-out", "-T", "--log-timing", "--timing")


def _h_script(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    """`script [-c CMD] [FILE]`: a shell runs CMD (without -c, what script reads: `… | script`) while the
    session is written to FILE (./typescript by default) and the log files of its options. BSD's
    `script [FILE [CMD ARGS]]` runs the command after the file."""
    opts = _gnu_opts(cmd.args, _SCRIPT_LONG, _SCRIPT_WITH_ARG)
    logs = [*opts.operands[:1], *opts.values(*_SCRIPT_LOGS)] or ["typescript"]
    findings = [_write_finding("script records the session in", log, ctx) for log in logs]
    code = opts.value("-c", "--command")
    if code is not None:
        return findings + (_exec_text(code, ctx, "script -c") or [(LOW, "script -c with empty code")])
    command = _parse_opts(cmd.args, _SCRIPT_WITH_ARG, stop_at_operand=True).operands[1:]
    if command:
        return findings + _classify_argv(command, cmd, ctx)
    return findings + _stdin_program(cmd, ctx, shell=True)


_ENV_LONG = (
    "--ignore-environment", "--null", "--unset", "--chdir", "--split-string", "--block-signal",
    "--default-signal", "--ignore-signal", "--list-signal-handling", "--debug", "--help", "--version",
)  # fmt: skip


def _env_option(args: collections.deque[str]) -> str | None:
    """Take the option at the front of `args` (and its value) off; the string of `-S STRING`, `-SSTRING`,
    `-iS STRING` or `--split-string=STRING`, None for any other option."""
    arg = args.popleft()
    if arg.startswith("--"):
        name, eq, value = _gnu_long(arg, _ENV_LONG).partition("=")
        if name in ("--split-string", "--unset", "--chdir") and not eq:
            value = args.popleft() if args else ""
        return value if name == "--split-string" else None
    for pos, letter in enumerate(arg[1:], start=1):
        if letter in "SuC":  # their value is the rest of the word, or the next one
            value = arg[pos + 1 :] or (args.popleft() if args else "")
            return value if letter == "S" else None
    return None


def _h_env(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    """env [OPTIONS] [NAME=VALUE]… [COMMAND [ARGS]]. `-S STRING` splits the string into words (quotes and
    backslashes as in a shell) and reads them as its next arguments (`env -S'-i rm -rf ~'` runs `rm -rf
    ~`); the first such string, with the arguments after it, is rated as a shell's command line too (`env
    -S 'curl … | sh'`): a rating never rests on env not running a shell."""
    args = collections.deque(cmd.args)
    assigned: list[str] = []
    findings: list[Finding] = []
    first = True
    while args:
        arg = args[0]
        if arg.startswith("-") and arg != "-":
            split = _env_option(args)
            if split is None:
                continue
            findings += _exec_text(" ".join([split, *args]) if first else split, ctx, "env -S")
            first = False
            try:
                args.extendleft(reversed(shlex.split(split)))
            except ValueError as exc:
                findings.append((HIGH, f"could not parse the env -S string {_show(split)!r} ({exc})"))
        elif _ASSIGNMENT_RE.match(arg):
            assigned.append(args.popleft())
        else:
            break
    findings = _assignments_findings(assigned, ctx) + findings
    if not args:
        return findings + [(LOW, "env: prints the environment")]
    return findings + _classify_argv(list(args), cmd, ctx)


def _h_watch(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    _, inner = _split_wrapper(cmd.args, _Wrapper(frozenset({"-n", "--interval", "-q", "--equexit", "-d"})))
    if not inner:
        return [(LOW, "watch without a command")]
    return _exec_text(" ".join(inner), ctx, "watch command")


_XARGS_WITH_ARG = frozenset({"-a", "--arg-file", "-d", "--delimiter", "-E", "--eof", "-I", "--replace", "-L",
                             "--max-lines", "-n", "--max-args", "-P", "--max-procs", "-s", "--max-chars",
                             "--process-slot-var"})  # fmt: skip


def _xargs_feeder(cmd: _Cmd, ctx: _Ctx) -> list[str] | None:
    """The argv of what feeds xargs: the stage before it, a here-string, or `< <(command)`."""
    for op, target in cmd.redirs:
        if op == "<<<":
            return ["echo", target]
        match = _SUB_RE.fullmatch(target) if op == "<" else None
        if match and ctx.subs[int(match.group(1))].kind == "process":
            text = ctx.subs[int(match.group(1))].text
            return None if any(c in text for c in ";&|") else _words(text)
    return cmd.upstream[-1] if cmd.upstream and cmd.upstream[-1] else None


def _xargs_input(argv: list[str] | None) -> tuple[list[str] | None, bool]:
    """The items xargs gets, and whether each stands for every file under it (an unfiltered `find`)."""
    if not argv:
        return None, False
    name = _normalize_name(argv[0])
    if name == "find":
        starts, expr = _find_parts(argv[1:])
        return starts, not _find_filtered(expr)
    if name in ("echo", "printf", "ls"):
        return [a for a in argv[1:] if not a.startswith("-")] or None, False
    return None, False


def _h_xargs(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    flags, inner = _split_wrapper(cmd.args, _Wrapper(_XARGS_WITH_ARG))
    inner = inner or ["echo"]
    found, tree = _xargs_input(_xargs_feeder(cmd, ctx))
    items = found or ["$XARGS_INPUT"]
    replace = next((cmd.args[i + 1] for i, a in enumerate(cmd.args[:-1]) if a in ("-I", "--replace")), None)
    if replace is None and any(f.startswith("-I") and len(f) > 2 for f in flags):
        replace = next(f[2:] for f in flags if f.startswith("-I") and len(f) > 2)
    argv = [w.replace(replace, items[0]) for w in inner] if replace else [*inner, *items]
    with _tree(ctx, items if tree else []):
        return _classify_argv(argv, _Cmd(cmd.name, cmd.raw, [], cmd.redirs, []), ctx)


# ---------------------------------------------------------------------------- dispatch

_HANDLERS: dict[str, _Handler] = {
    "scp": _h_scp,
    "rm": _h_rm, "unlink": _h_rm, "rmdir": _h_rmdir, "shred": _h_shred, "truncate": _h_truncate, "tee": _h_tee,
    "touch": _h_touch, "mkdir": _h_mkdir, "cp": _h_copy, "install": _h_copy, "ln": _h_copy, "mv": _h_mv,
    "dd": _h_dd, "wipefs": _h_wipefs, "chmod": _h_perms, "chown": _h_perms, "chgrp": _h_perms,
    "setfacl": _h_setfacl, "find": _h_find, "sed": _h_sed, "awk": _h_awk, "tar": _h_tar, "rsync": _h_rsync,
    "kill": _h_kill, "pkill": _h_pkill, "systemctl": _h_systemctl, "service": _h_service,
    "journalctl": _h_journalctl, "dmesg": _h_dmesg, "ping": _h_ping, "ping6": _h_ping, "history": _h_history,
    "passwd": _h_passwd, "crontab": _h_crontab, "badblocks": _h_badblocks, "hdparm": _h_hdparm,
    "swapon": _h_swapon, "reboot": _h_reboot, "shutdown": _h_shutdown, "sysctl": _h_sysctl_full, "init": _h_init,
    "hostname": _h_hostname, "date": _h_date, "hwclock": _h_hwclock, "git": _h_git, "docker": _h_docker,
    "docker-compose": _h_docker, "kubectl": _h_kubectl, "helm": _h_helm, "terraform": _h_terraform,
    "apt-get": _h_package, "apt-cache": lambda c, x: [(LOW, "apt-cache: read-only package query")],
    "dnf": _h_package, "apk": _h_package, "snap": _h_package, "flatpak": _h_package, "pacman": _h_package,
    "pip": _h_package, "npm": _h_package, "dpkg": _h_dpkg, "rpm": _h_rpm, "iptables": _h_iptables,
    "nft": _h_nft_full, "ufw": _h_ufw, "firewall-cmd": _h_firewall_cmd, "ip": _h_ip, "ifconfig": _h_ifconfig,
    "route": _h_route, "nmcli": _h_nmcli, "mount": _h_mount, "curl": _h_curl, "wget": _h_wget, "nc": _h_nc,
    "socat": _h_socat, "ssh": _h_ssh, "openssl": _h_openssl, "fdisk": _h_fdisk, "mdadm": _h_mdadm,
    "usermod": _h_usermod, "useradd": _h_useradd, "adduser": _h_useradd, "export": _h_export,
    "declare": _h_export, "typeset": _h_export, "readonly": _h_export, "local": _h_export, "unset": _h_unset,
    "hash": _h_hash, "enable": _h_enable, "trap": _h_trap,
    "set": _h_set, "alias": _h_alias, "cd": _h_cd, "pushd": _h_cd, "popd": _h_cd, "su": _h_su, "sh": _h_shell, "source": _h_source,
    ".": _h_source, "eval": _h_eval, "env": _h_env, "watch": _h_watch, "xargs": _h_xargs, "script": _h_script,
    "man": _h_man, "xxd": _h_xxd, "split": _h_split, "csplit": _h_split, "dc": _h_dc, "yq": _h_yq,
    **dict.fromkeys(_OUTPUTS.keys() - {"man", "less"}, _h_outputs), "less": _h_less,
    **dict.fromkeys(_VIM_NAMES, _h_vim), "emacs": _h_emacs,
    **dict.fromkeys(_SHELL_CODE_FLAGS, _h_interp),
    **dict.fromkeys(_SUBCOMMAND_RULES, _h_subcommand),
}  # fmt: skip

_ASSIGNMENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\[[^\]]*\])?\+?=")
_RISKY_VARIABLES: dict[str, Finding] = {
    "LD_PRELOAD": (HIGH, "sets LD_PRELOAD: injects a library into every program"),
    "LD_LIBRARY_PATH": (MEDIUM, "sets LD_LIBRARY_PATH: changes which libraries programs load"),
    "LD_AUDIT": (HIGH, "sets LD_AUDIT: injects a library into every program"),
    "PROMPT_COMMAND": (HIGH, "sets PROMPT_COMMAND: runs code at every prompt"),
    "BASH_ENV": (HIGH, "sets BASH_ENV: runs code in every non-interactive shell"),
    "IFS": (HIGH, "redefines IFS: changes how the shell splits words (obfuscation)"),
    "PATH": (MEDIUM, "changes PATH: changes which binaries run"),
    "HISTFILE": (MEDIUM, "changes HISTFILE: hides or redirects shell history"),
    "HISTSIZE": (MEDIUM, "changes HISTSIZE: can disable shell history"),
    "HISTFILESIZE": (MEDIUM, "changes HISTFILESIZE: can disable shell history"),
}
_KEYWORDS = frozenset(
    {"if", "then", "else", "elif", "do", "while", "until", "!", "{", "}", "fi", "done", "esac", "coproc"}
)


# Variables holding a command that programs run: `PAGER=CMD man ls`, `GIT_SSH_COMMAND=CMD git fetch`,
# `export EDITOR=CMD`. Setting one is rated like running its command.
_COMMAND_VARIABLES = frozenset(
    {"PAGER", "MANPAGER", "GIT_PAGER", "SYSTEMD_PAGER", "EDITOR", "VISUAL", "GIT_EDITOR", "GIT_SEQUENCE_EDITOR",
     "SUDO_EDITOR", "GIT_SSH_COMMAND", "GIT_SSH", "GIT_ASKPASS", "SSH_ASKPASS", "SUDO_ASKPASS",
     "GIT_EXTERNAL_DIFF", "GIT_PROXY_COMMAND", "LESSOPEN", "LESSCLOSE", "RSYNC_RSH", "PROMPT_COMMAND"}
)  # fmt: skip
_GIT_CONFIG_KEY_RE = re.compile(r"GIT_CONFIG_KEY_(\d+)")


def _assignment_findings(word: str) -> list[Finding]:
    name = re.split(r"[+=\[]", word, maxsplit=1)[0]
    rule = _RISKY_VARIABLES.get(name)
    return [rule] if rule is not None else []


def _variable_command_findings(name: str, value: str, ctx: _Ctx) -> list[Finding]:
    """The command a variable set to `value` makes programs run (`_COMMAND_VARIABLES`), the `+CMD`
    options of $LESS, and the file $BASH_ENV makes every non-interactive bash source first."""
    if name in _COMMAND_VARIABLES and value.strip():
        command = value.lstrip("|-").replace("%s", "FILE") if name.startswith("LESS") else value
        return _exec_text(command, ctx, f"{name}={_show(value, 40)}")
    if name == "LESS" and "+" in value:
        return _less_env_commands(value, ctx)
    if name == "BASH_ENV" and value.strip():
        return _h_source(_Cmd("BASH_ENV", "BASH_ENV", [value], [], []), ctx)
    if name in _LESSKEY_VARIABLES:
        return _lesskey_findings(name, value, ctx)
    if name in _PRELOAD_VARIABLES and value.strip():
        return _preload_findings(name, value, ctx)
    if name == "ENV" and value.strip():  # an interactive sh sources it; `ENV=production` is no file
        return _known_script(_Cmd("ENV", "ENV", [value], [], []), value, ctx, shell=True) or []
    if name in _PROMPT_VARIABLES and ("$(" in value or "`" in value):
        return _prompt_findings(name, value, ctx)
    return []


# Variables that make every later run of an interpreter load code first: the files they name.
_PRELOAD_VARIABLES = {
    "NODE_OPTIONS": "node",
    "PYTHONSTARTUP": "python -i",
    "RUBYOPT": "ruby",
    "PERL5OPT": "perl",
}
_PRELOAD_OPTIONS = {  # the options of each variable that load a file or module
    "NODE_OPTIONS": re.compile(
        r"(?:^|\s)(?:--require|-r|--import|--loader|--experimental-loader)(?:=|\s+)(?P<file>[^\s=]+)"
    ),
    "RUBYOPT": re.compile(r"(?:^|\s)-r\s*(?P<file>\S+)"),
    "PERL5OPT": re.compile(r"(?:^|\s)-[Mm]-?(?P<file>[\w:]+)"),
}


def _preload_findings(name: str, value: str, ctx: _Ctx) -> list[Finding]:
    """`NODE_OPTIONS='--require F'`, `RUBYOPT=-rF`, `PERL5OPT=-MMod`, `PYTHONSTARTUP=F`: the code loaded
    is rated like running its file (`_known_script`: a file the run saved), otherwise `medium`."""
    if name == "PYTHONSTARTUP":
        files = [value.strip()]
    else:
        files = [match["file"] for match in _PRELOAD_OPTIONS[name].finditer(value)]
    findings: list[Finding] = []
    for file in files:
        program = _PRELOAD_VARIABLES[name]
        known = _known_script(_Cmd(program, program, [file], [], []), file, ctx, shell=False)
        findings += known or [
            (MEDIUM, f"{name}={_show(value, 40)}: every {program} loads '{_show(file)}' first (not analysed)")
        ]
    return findings


# The shell expands these (command substitutions included) each time it shows them: PS0/PS1/PS2 at an
# interactive prompt, PS3 at `select`, PS4 before every traced command (`bash -x`, `set -x`).
_PROMPT_VARIABLES = frozenset({"PS0", "PS1", "PS2", "PS3", "PS4"})


def _prompt_findings(name: str, value: str, ctx: _Ctx) -> list[Finding]:
    """The commands substituted in a prompt's value (`PS4='$(CMD)'`), rated as if they ran: the prompt
    is expanded like a double-quoted string."""
    quoted = '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return [f for f in _exec_text(f": {quoted}", ctx, f"{name} prompt") if not f[1].startswith(":: ")]


def _assignments_findings(words: list[str], ctx: _Ctx | None) -> list[Finding]:
    """Findings for the assignments among `words` (set together: `A=1 B=2 cmd`, `export A=1 B=2`): risky
    variables (`_RISKY_VARIABLES`) and, given the context to classify them in, the commands of
    `_COMMAND_VARIABLES` and the git settings of GIT_CONFIG_PARAMETERS and GIT_CONFIG_KEY_n/VALUE_n."""
    findings: list[Finding] = []
    values: dict[str, str] = {}
    for word in words:
        if _ASSIGNMENT_RE.match(word):
            findings += _assignment_findings(word)
            name, _, value = word.partition("=")
            values[name] = value
    if ctx is None:
        return findings
    for name, value in values.items():
        findings += _variable_command_findings(name, value, ctx)
    settings: list[tuple[str, str]] = []
    if "GIT_CONFIG_PARAMETERS" in values:  # `'core.pager'='CMD' …`
        try:
            pairs = shlex.split(values["GIT_CONFIG_PARAMETERS"])
        except ValueError:
            pairs = []
            findings.append(
                (HIGH, "GIT_CONFIG_PARAMETERS cannot be parsed (its git settings can run commands)")
            )
        settings += [(k, v) for k, _, v in (pair.partition("=") for pair in pairs)]
    for name, key in values.items():
        match = _GIT_CONFIG_KEY_RE.fullmatch(name)
        if match is not None:
            settings.append((key, values.get(f"GIT_CONFIG_VALUE_{match[1]}", "")))
    for key, value in settings:
        findings += _git_setting_findings(key, value, ctx, "git setting from the environment:")
    return findings


def _strip_prefix_words(words: list[str], ctx: _Ctx | None = None) -> tuple[list[str], list[Finding]]:
    """`words` without the keywords and assignments before the command, and findings for the assignments
    (`_assignments_findings`; those of variables holding commands only given `ctx`)."""
    index = 0
    while index < len(words):
        word = words[index]
        if word in _KEYWORDS:
            index += 1
        elif word == "function":
            index += 2
        elif word in ("for", "select", "case", "in"):
            return [], _assignments_findings(words[:index], ctx)
        elif _ASSIGNMENT_RE.match(word):
            index += 1
        else:
            break
    return words[index:], _assignments_findings(words[:index], ctx)


def _core_argv(words: list[str]) -> list[str]:
    """The argv that actually runs, after keywords, assignments and launchers (for pipeline analysis)."""
    argv, _ = _strip_prefix_words(words)
    for _ in range(8):
        if not argv:
            return argv
        wrapper = _WRAPPERS.get(_normalize_name(argv[0]))
        if wrapper is None:
            return argv
        argv = _split_wrapper(argv[1:], wrapper)[1]
    return argv


def _dynamic_command(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    findings: list[Finding] = [
        (HIGH, f"command name is computed at runtime ('{_show(cmd.raw)}'): the binary cannot be determined")
    ]
    findings += _fetch_findings(cmd.raw, ctx, "the command")
    words = _printed_words(cmd.raw, ctx) if _SUB_OPEN in cmd.raw else None  # `$x` alone prints nothing
    if words:
        findings += _classify_argv([*words, *cmd.args], cmd, ctx)
    return findings


_OPERATOR_TOKEN_RE = re.compile(r"[();<>|&]+")


def _printed_words(raw: str, ctx: _Ctx) -> list[str] | None:
    """The words a command name made of literal `echo`/`printf` substitutions runs: `$(printf 'rm -rf /')`
    runs `rm -rf /` (its output, split into words). None when a part of it is not such a substitution."""
    parts = _SUB_RE.split(raw)  # text, sub index, text, …
    printed = []
    for position, part in enumerate(parts):
        if position % 2 == 0:
            printed.append(part)
            continue
        text = _printed(ctx.subs[int(part)])
        if text is None:
            return None
        printed.append(text)
    return "".join(printed).split()


def _printed(sub: _Sub) -> str | None:
    if sub.kind != "command" or _is_dynamic(sub.text):
        return None
    try:
        lexer = shlex.shlex(sub.text, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        argv = list(lexer)
    except ValueError:
        return None
    if (
        not argv
        or _normalize_name(argv[0]) not in ("echo", "printf")
        or any(_OPERATOR_TOKEN_RE.fullmatch(word) for word in argv)
    ):
        return None
    return _echo_text([_normalize_name(argv[0]), *argv[1:]])


def _secret_access(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    for arg in cmd.args:
        if "/" in arg and _SECRET_RE.match(_normalize_path(arg, ctx.cwd)):
            return [(MEDIUM, f"{cmd.name} accesses the sensitive file '{arg}' (credentials)")]
    return []


_PROJECT_INSTALLERS = frozenset(
    {"pip", "uv", "poetry", "pdm", "npm", "yarn", "pnpm", "bundle", "gem", "cargo"}
)
_LOCAL_PATH_RE = re.compile(r"(?:\.{1,2}|~)(?:/.*)?|/.*|[\w.-]+/.*|.*\.(?:whl|tar\.gz|zip|gem)")


def _runs_project_code(cmd: _Cmd) -> bool:
    """Whether `cmd` runs the code of the directory it is in, or of a local path: a build or an install
    from it (`make install`, `pip install .`, `npm install`), a script by path (`./install.sh`, `sh
    setup.sh`, `python setup.py install`). `pip install requests` (from the index) is not."""
    name, args = cmd.name, cmd.args
    if name == "python" and args[:2] == ["-m", "pip"]:
        name, args = "pip", args[2:]
    if "/" in cmd.raw and not cmd.raw.startswith(("/usr/", "/bin/", "/sbin/")):
        return True  # `./install.sh`, `repo/bin/setup`
    if _STATIC.get(name, (None, ""))[1] == "builds or runs project code":
        return True  # `make install`, `cmake --build .`, `pytest` (conftest.py runs)
    if name in _SHELL_CODE_FLAGS or name in ("sh", "bash", "zsh", "dash", "ksh", "source", "."):
        operands = [a for a in args if not a.startswith("-")]
        return bool(operands) and not any(a in ("-c", "-e", "-E", "-r", "--eval") for a in args)
    if name in _PROJECT_INSTALLERS and args and args[0] in ("install", "i", "ci", "add", "build", "run"):
        packages = [a for a in args[1:] if not a.startswith("-")]
        return (
            not packages
            or "-e" in args
            or "--editable" in args
            or any(_LOCAL_PATH_RE.fullmatch(a) for a in packages)
        )
    return False


def _fetched_run(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    """HIGH for running the code of a repository fetched earlier on the line (`git clone URL && cd repo &&
    make install`): code from the network, run unread, as `curl … | sh` runs it (that is CRITICAL: there
    the code is run as it arrives, here a person is asked)."""
    if ctx.files.fetched is None or not _runs_project_code(cmd):
        return []
    return [(HIGH, f"{_show(' '.join([cmd.raw, *cmd.args]), 60)!r} runs code fetched by '{ctx.files.fetched}' "
                   "earlier in this command, unread")]  # fmt: skip


def _classify_cmd(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    if ctx.files.fetched is not None:
        fetched = _fetched_run(cmd, ctx)
        if fetched:
            return fetched + _classify_cmd_unfetched(cmd, ctx)
    return _classify_cmd_unfetched(cmd, ctx)


def _classify_cmd_unfetched(cmd: _Cmd, ctx: _Ctx) -> list[Finding]:
    if _is_dynamic(cmd.raw):
        return _dynamic_command(cmd, ctx)
    program = _written_program(cmd.raw, ctx)
    if program is not None:
        return _written_script(cmd, program, ctx, None) or []
    ran = _earlier_script(cmd, cmd.raw, ctx) if "/" in cmd.raw else None
    if ran is not None:
        return ran
    if cmd.raw not in ("[", "[[") and any(c in cmd.raw for c in "*?["):
        return [(HIGH, f"command name '{cmd.raw}' is a glob pattern: the binary cannot be determined")]
    wrapper = _WRAPPERS.get(cmd.name)
    if wrapper is not None:
        return _unwrap(cmd, wrapper, ctx)
    handler = _HANDLERS.get(cmd.name)
    findings = handler(cmd, ctx) if handler is not None else [_static_finding(cmd)]
    return findings + _secret_access(cmd, ctx)


def _classify_argv(argv: list[str], parent: _Cmd, ctx: _Ctx) -> list[Finding]:
    """Classify a command given as a word list (after a launcher, in `find -exec`, `docker run` ...)."""
    words, findings = _strip_prefix_words(argv, ctx)
    if not words:
        return findings
    if ctx.depth > _MAX_DEPTH * 4:
        return findings + [(HIGH, "command nesting is too deep to analyse")]
    ctx.depth += 1
    try:
        return findings + _classify_cmd(parent.with_argv(words), ctx)
    finally:
        ctx.depth -= 1


def _redirect_findings(redirs: list[tuple[str, str]], ctx: _Ctx) -> list[Finding]:
    findings: list[Finding] = []
    for op, target in redirs:
        if op in ("<", "<&", "<<", "<<<"):
            continue
        if op in (">&", "<&") and re.fullmatch(r"\d+-?|-", target):
            continue
        findings.append(_write_finding(f"redirection '{op}' to", target, ctx))
    return findings


def _classify_simple(
    simple: _Simple, simples: list[_Simple], argvs: list[list[str]], index: int, ctx: _Ctx
) -> list[Finding]:
    """Rate `simples[index]` with the commands before it in its pipeline (a pipeline's commands are
    consecutive): at most `_MAX_STAGES` of them, so that a long command line is not read again for each
    of its commands (`a|a|…` of 2,000 stages took 10 s, `ls;ls;…` quadratic time too). A group piped
    into it (`{ curl …; } | sh`, `done | sh`) is read as the `_MAX_GROUP` commands before it: all of the
    line's were, for each such pipe (`{ :;}|sh;` 4,000 times took 26 s); piping a group's output into
    a shell is HIGH anyway, what is read can only make it CRITICAL."""
    findings = _redirect_findings(simple.redirs, ctx)
    words, prefix_findings = _strip_prefix_words(simple.words, ctx)
    findings += prefix_findings
    if not words:
        return findings
    first = index
    while first > 0 and index - first < _MAX_STAGES and simples[first - 1].pipeline == simple.pipeline:
        first -= 1
    if first > 0 and simples[first - 1].pipeline == simple.pipeline:  # fail closed: not read together
        findings.append((HIGH, f"a pipeline of more than {_MAX_STAGES} commands is too long to analyse"))
    upstream = [argvs[i] for i in range(first, index) if simples[i].stage < simple.stage]
    cmd = _Cmd(_normalize_name(words[0]), words[0], words[1:], simple.redirs, upstream)
    if upstream and simples[first].stage == 0:  # `cat <<EOF | sh`: what the pipeline starts with
        cmd.piped_input = _input_text(simples[first].redirs, ctx)
    if any(not argv for argv in upstream):  # `{ curl ...; } | sh`: a group feeds the pipe
        cmd.earlier = argvs[max(index - _MAX_GROUP, 0) : index]
    findings += _classify_cmd(cmd, ctx)
    _record_writes(simple, _core_argv(words), upstream, ctx)
    return findings


_FUNCTION_RE = re.compile(  # a name starts where no name character is before it: each run of them is
    # tried once (from every position, a long word such as 100,000 backslashes took minutes)
    r"(?:function\s+)?(?<![^\s(){};|&<>'\"$`])(?P<name>[^\s(){};|&<>'\"$`]+)\s*\(\s*\)\s*\{(?P<body>.*?)\}"
    r"|function\s+(?P<name2>[^\s(){};|&<>'\"$`]+)\s*\{(?P<body2>.*?)\}",
    re.S,
)


def _fork_bomb(text: str) -> str | None:
    for match in _FUNCTION_RE.finditer(text):
        name = match.group("name") or match.group("name2") or ""
        body = match.group("body") or match.group("body2") or ""
        call = rf"(?<![\w.:-]){re.escape(name)}(?![\w.:-])"
        if re.search(rf"{call}\s*\|&?\s*{call}|{call}\s*&(?!&)", body):
            return name
    return None


_LOOP_RE = re.compile(
    r"(?:^|[;&|({}]|\b(?:do|then|else)\b)\s*"
    r"(?:(?P<kw>while|until)\s+(?P<cond>[^;&|]*?)|for\s*\(\(\s*[^;]*;\s*;[^)]*\)\))\s*;?\s*do\b(?P<body>.*?)\bdone\b",
    re.S,
)
_ALWAYS = {
    "while": re.compile(
        r"(?:/usr)?(?:/bin/)?true|:|!\s*(?:/usr)?(?:/bin/)?false|test\s+1|\[\[?\s*(?:1|true|yes)\s*\]\]?"
        r"|\(\(\s*[1-9]\d*\s*\)\)|sleep\s+[\d.]+[smhd]?"
    ),
    "until": re.compile(r"(?:/usr)?(?:/bin/)?false|!\s*(?:(?:/usr)?(?:/bin/)?true|:)|\(\(\s*0\s*\)\)"),
}
_BACKGROUND_RE = re.compile(r"(?<![&><|])&(?![&>])")


def _endless_spawner(scanned: str) -> str | None:
    """An endless loop that starts a background job on every pass (`while true; do x & done`)."""
    for match in _LOOP_RE.finditer(scanned):
        kw, cond, body = match.group("kw"), (match.group("cond") or "").strip(), match.group("body")
        endless = kw is None or bool(_ALWAYS[kw].fullmatch(cond))
        if endless and _BACKGROUND_RE.search(body) and not re.search(r"(?<![\w-])(wait|kill)(?![\w-])", body):
            return f"{kw} {cond}" if kw else "for ((;;))"
    return None


def _classify_text(text: str, ctx: _Ctx) -> list[Finding]:
    if ctx.depth > _MAX_DEPTH:
        return [(HIGH, "command nesting is too deep to analyse")]
    findings: list[Finding] = []
    first_sub = len(ctx.subs)
    scanned = _Scanner(text, ctx.subs, findings).scan()
    new_subs = list(ctx.subs[first_sub:])
    bomb = _fork_bomb(text)
    if bomb is not None:
        findings.append(
            (CRITICAL, f"fork bomb: function '{bomb}' spawns copies of itself until the system hangs")
        )
    loop = _endless_spawner(scanned)
    if loop is not None:
        findings.append(
            (CRITICAL, f"fork bomb: the endless loop '{_show(loop, 40)}' starts a background process on every "
                       "pass, until the system runs out of processes")
        )  # fmt: skip
    simples = _Builder().build(_tokenize(scanned))
    for sub in new_subs:
        if sub.kind != "heredoc":
            findings += _nested(sub.text, ctx, "substitution")
    argvs = [_core_argv(s.words) for s in simples]  # each command's, once
    for index, simple in enumerate(simples):
        findings += _classify_simple(simple, simples, argvs, index, ctx)
        findings += _rated_again(simple, simples, argvs, index, ctx)
        _set_variables(simple.words, ctx)
    return findings


# ---------------------------------------------------------------------------- variables set on the line
# `F=/etc/passwd; echo x >> $F` is `echo x >> /etc/passwd`, `CMD='rm -rf /'; $CMD` is `rm -rf /`: a command
# using a variable the line set to literal text is rated once more with its value, quoted (one word) and
# unquoted (split into words). Both ratings count, so a value that may not be in effect (set in a
# subshell, on one branch of `||`) never lowers one: the command keeps its rating without it, the
# working directory is not changed by a `cd $D`, and only downloaded or decoded content is remembered
# from what it writes.

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_SET_RE = re.compile(rf"({_NAME})=(.*)", re.S)
_REFERENCE_RE = re.compile(rf"\$(?:\{{({_NAME})(?:(?::?[-=?+])[^}}]*)?\}}|({_NAME}))")
_DECLARERS = frozenset({"export", "readonly", "local", "declare", "typeset"})
_MAX_VALUE = 4_096


def _payload_source(value: str, ctx: _Ctx) -> tuple[str, str] | None:
    """(kind, text) of the download or decoder a variable's value comes from (`$(… | base64 -d)`, `$Y`
    where Y was set from one); None if from neither."""
    for match in _SUB_RE.finditer(value):
        inner = ctx.subs[int(match.group(1))].text
        kind = _payload_kind(inner)
        if kind is not None:
            return kind, inner
    if ctx.variables.payloads and "$" in value:
        for match in _REFERENCE_RE.finditer(value):
            source = ctx.variables.payloads.get(match[1] or match[2])
            if source is not None:
                return source
    return None


def _set_variables(words: list[str], ctx: _Ctx) -> None:
    """Remember the literal values a command sets (`X=1`, `export X=1`); forget those it may change.
    Remember too those it sets from a download or a decoder (`_Variables.payloads`)."""
    variables = ctx.variables
    words = list(itertools.dropwhile(_KEYWORDS.__contains__, words))  # `then X=1`
    if not words:
        return
    name = words[0]
    if name in _DECLARERS:
        settings = [w for w in words[1:] if not w.startswith(("-", "+"))]
    elif all(_ASSIGNMENT_RE.match(w) for w in words):
        settings = words
    elif name in ("unset", "read", "for", "select", "getopts", "mapfile", "readarray", "printf"):
        for word in words[1:]:  # each name it may set (`printf -v X`, `read X`, `for X in`) is unknown now
            variables.values.pop(word, None)
        return
    else:
        return
    for word in settings:
        match = _SET_RE.fullmatch(word)
        source = _payload_source(word, ctx) if "=" in word else None
        if source is not None:
            variables.payloads[re.split(r"[+=\[]", word, maxsplit=1)[0]] = source
        if match is None:  # `X+=…`, `X[1]=…` or a bare name: its value is not known any more
            variables.values.pop(re.split(r"[+=\[]", word, maxsplit=1)[0], None)
        elif _is_dynamic(match[2]) or len(match[2]) > _MAX_VALUE:
            variables.values.pop(match[1], None)
        else:
            variables.values[match[1]] = match[2]


def _substituted(word: str, values: dict[str, str]) -> str | None:
    """`word` with the known variables it uses replaced by their values; None if it uses none."""
    if "$" not in word:
        return None
    used = False

    def value(match: re.Match[str]) -> str:
        nonlocal used
        name = match[1] or match[2]
        if name not in values:
            return match[0]
        used = True
        return values[name]

    text = _REFERENCE_RE.sub(value, word)
    return text if used else None


_Words = tuple[list[str], list[tuple[str, str]]]  # a command's words and redirections


def _valued(simple: _Simple, values: dict[str, str]) -> list[_Words]:
    """`simple` with the values of the variables it uses, quoted and unquoted; [] if it uses none."""
    words = [_substituted(w, values) for w in simple.words] if values else []
    redirs = [(op, _substituted(t, values)) for op, t in simple.redirs] if values else []
    if all(w is None for w in words) and all(t is None for _, t in redirs):
        return []
    quoted = [new if new is not None else old for new, old in zip(words, simple.words, strict=True)]
    split = [
        part
        for new, old in zip(words, simple.words, strict=True)
        for part in (new.split() if new is not None else [old])
    ]
    targets = [
        (op, new if new is not None else old)
        for (op, new), (_, old) in zip(redirs, simple.redirs, strict=True)
    ]
    return [(quoted, targets), (split, targets)] if split != quoted else [(quoted, targets)]


_BRACE_LIST_RE = re.compile(r"(?<!\$)\{([^{}\s]*,[^{}\s]*)\}")
_MAX_BRACED = 64  # words one word may expand to


def _braced(word: str) -> list[str]:
    """`word` after brace expansion (bash, zsh): `{rm,-rf,/}` is `rm -rf /`, `a{b,c}` is `ab ac`."""
    match = _BRACE_LIST_RE.search(word)
    if match is None:
        return [word]
    out: list[str] = []
    for choice in match[1].split(","):
        out += _braced(word[: match.start()] + choice + word[match.end() :])
        if len(out) >= _MAX_BRACED:
            return out[:_MAX_BRACED]
    return out


def _variants(simple: _Simple, values: dict[str, str]) -> list[_Words]:
    """How the shell may expand `simple`: with its variables' values, with its brace lists expanded."""
    variants = _valued(simple, values)
    if any("{" in w and "," in w for w in simple.words):
        for words, targets in [(simple.words, simple.redirs), *variants]:
            braced = [part for word in words for part in _braced(word)]
            if braced != words:
                variants.append((braced, targets))
    return variants


def _rated_again(
    simple: _Simple, simples: list[_Simple], argvs: list[list[str]], index: int, ctx: _Ctx
) -> list[Finding]:
    """`simple` rated again as the shell may expand it (see above); [] if it would not change."""
    variants = _variants(simple, ctx.variables.values)
    if not variants:
        return []
    ctx.variables.budget -= sum(sum(map(len, w)) + sum(len(t) for _, t in r) for w, r in variants)
    if ctx.variables.budget < 0:
        return [(HIGH, "the line expands its variables (or brace lists) too often to be analysed")]
    cwd, expanding = ctx.cwd, ctx.expanding
    ctx.expanding = True
    findings: list[Finding] = []
    try:
        for words, targets in variants:
            ctx.cwd = cwd
            findings += _classify_simple(
                _Simple(words, targets, simple.pipeline, simple.stage), simples, argvs, index, ctx
            )
    finally:
        ctx.cwd, ctx.expanding = cwd, expanding
    return findings


# ============================================================================ entry point


_PRIVATE_RE = re.compile("[\ue000-\ue0ff]")


def _salvage(command: str, earlier: _Earlier | None) -> list[Finding]:
    """Best effort for unparseable input: classify it with quoting characters removed."""
    try:
        return _classify_text(re.sub(r"[\"'`\\]", " ", command), _Ctx([], earlier=earlier))
    except (_ParseError, RecursionError):
        return []


def _summarise(findings: list[Finding], parsed: bool) -> CommandRisk:
    if not findings:
        return CommandRisk(LOW, ("empty command",), parsed)
    level = max((lv for lv, _ in findings), key=lambda lv: lv.rank)
    ordered = sorted(findings, key=lambda f: -f[0].rank)
    shown = [text for lv, text in ordered if lv == level or lv >= MEDIUM]
    return CommandRisk(level, tuple(dict.fromkeys(shown)), parsed)


def _classify_top(command: str, earlier: _Earlier | None) -> CommandRisk:
    findings: list[Finding] = []
    if _PRIVATE_RE.search(command):
        findings.append((HIGH, "contains Unicode private-use characters (possible obfuscation)"))
        command = _PRIVATE_RE.sub("?", command)
    try:
        return _summarise(findings + _classify_text(command, _Ctx([], earlier=earlier)), parsed=True)
    except _ParseError as exc:
        findings.append((HIGH, f"could not parse the command ({exc}): treated as high risk"))
        return _summarise(findings + _salvage(command, earlier), parsed=False)


def classify_command(command: str, *, earlier: Iterable[str] = (), cwd: str | None = None) -> CommandRisk:
    """Rate the risk of running `command` in a POSIX shell.

    Args:
        command: the command line.
        earlier: the command lines run before it in the same place (the same tool and host), oldest
            first — the safety controller passes a run's earlier calls. A file one of them saved from a
            download (or a decoder) and `command` runs is rated as if both were one line: `bash x.sh`
            after `curl -o x.sh URL` is CRITICAL like `curl -o x.sh URL && bash x.sh`, and `chmod +x x.sh`
            HIGH. They are read (once) only when `command` runs a file, so a lazy iterable costs nothing
            for the commands that run none.
        cwd: the absolute working directory those commands start in, if known, so that `x.sh` and
            `/srv/x.sh` are compared exactly. Without it, a relative and an absolute path that may name
            the same file are rated HIGH (asked about), not CRITICAL.

    Never raises: anything that cannot be parsed or analysed is rated at least HIGH.
    """
    if len(command) > _MAX_LENGTH:
        return CommandRisk(HIGH, ("command is too long to analyse",), False)
    history = None if isinstance(earlier, tuple | list) and not earlier else _Earlier(earlier, cwd)
    try:
        return _classify_top(command, history)
    except RecursionError:
        return CommandRisk(HIGH, ("command is nested too deeply to analyse",), False)
    except Exception as exc:  # fail closed: a classifier bug must never make a command look safe
        return CommandRisk(
            HIGH, (f"internal classifier error ({type(exc).__name__}): treated as high risk",), False
        )
