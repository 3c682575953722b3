"""Text ReAct (SPEC §4.1): the prompt that lists the tools, the tolerant parser of replies, and the
rendering of a native history as a ReAct transcript.

The run state always stores tool calls and results natively (assistant `tool_calls` + `tool` messages),
whatever the mode; `render_transcript()` turns them into the text a ReAct model reads. So a run can
switch mode mid-way and the history stays valid for every provider.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from ._messages import Message, ToolCall, ToolDefinition

OBSERVATION = "Observation:"
STOP_SEQUENCES = ["\nObservation:", "Observation:"]

_FORMAT = """Use the tools to find facts and to compute results; never guess a value a tool can give you.
To call a tool, write these three lines, then stop:
Thought: <what is still needed and which tool gives it>
Action: <the tool name, one of: {names}>
Action Input: <a JSON object with the tool's arguments>
The tool's result comes back to you as "Observation: <result>".
When the observations answer every part of the task, write:
Thought: <how the observations answer the task>
Final Answer: <the complete answer>
Write one Action per reply. Never write an Observation yourself."""
# Measured on the embedded 1.5B model (10 tool tasks): this wording 7/10; an earlier one whose example
# line read "Thought: I know the final answer" 6/10 — small models copied that line verbatim and answered
# before calling any tool (the 0.5B model 0/10 with it, 1/10 with this one).


def tools_prompt(tools: list[ToolDefinition]) -> str:
    """The part of the system prompt that lists the tools and the ReAct format."""
    lines = ["You can use these tools:"]
    for t in tools:
        lines.append(f"- {t.name}: {t.description}".rstrip())
        lines.append(
            f"  Arguments (JSON Schema): {json.dumps(_compact_schema(t.parameters), ensure_ascii=False)}"
        )
    lines.append("")
    lines.append(_FORMAT.format(names=", ".join(t.name for t in tools)))
    return "\n".join(lines)


def _compact_schema(schema: dict[str, Any]) -> dict[str, Any]:
    props = schema.get("properties", {})
    out: dict[str, Any] = {"properties": props}
    if schema.get("required"):
        out["required"] = schema["required"]
    if "$defs" in schema:
        out["$defs"] = schema["$defs"]
    return out


@dataclass(frozen=True, slots=True)
class ReactStep:
    """One parsed ReAct reply: a tool call, a final answer, or an error to heal."""

    thought: str = ""
    call: ToolCall | None = None
    final: str | None = None
    error: str | None = None


_FENCE_RE = re.compile(r"```[a-zA-Z0-9_-]*\s*\n?(.*?)```", re.DOTALL)
_LABEL = r"(?im)^[ \t>*_#]*{label}[ \t*_]*[:：][ \t]*"
_THOUGHT_RE = re.compile(_LABEL.format(label=r"thought"))
_ACTION_RE = re.compile(_LABEL.format(label=r"action(?![ \t_]*input)"))
_INPUT_RE = re.compile(_LABEL.format(label=r"action[ \t_]*input"))
_FINAL_RE = re.compile(_LABEL.format(label=r"final[ \t_]*answer"))
_OBS_RE = re.compile(_LABEL.format(label=r"observation"))
_CALL_SYNTAX_RE = re.compile(r"^([A-Za-z_][\w.-]*)\s*\((.*)\)\s*$", re.DOTALL)


def parse_react(text: str, tool_names: list[str], *, call_id: str) -> ReactStep:
    """Parse a ReAct reply, tolerating case, spacing, markdown, code fences and broken JSON.

    When both an Action and a Final Answer are present, whichever comes first wins (an answer written
    after an action is based on an observation the model invented). A reply with no labels at all is a
    final answer, unless it is a bare JSON tool call (small models write those).
    """
    text = _cut_invented_observation(text.strip())
    action = _ACTION_RE.search(text)
    final = _FINAL_RE.search(text)
    thought = _thought_of(text, action or final)
    if final and (not action or final.start() < action.start()):
        return ReactStep(thought=thought, final=text[final.end() :].strip())
    if action:
        return _parse_action(text, action, thought, tool_names, call_id)
    bare = _bare_json_call(text, tool_names, call_id)
    if bare is not None:
        return ReactStep(thought="", call=bare)
    body = _strip_label(text, _THOUGHT_RE)
    if not body:
        return ReactStep(error="The reply had an empty Thought and no Action or Final Answer.")
    intended = _intended_tool(body, tool_names)
    if intended is not None:
        return ReactStep(
            thought=body,
            error=f"You said you would use {intended} but did not call it. Write 'Action: {intended}' and "
            "'Action Input: {...}' on their own lines, or 'Final Answer: ...' if you already know the answer.",
        )
    return ReactStep(thought="", final=body)


_INTENT = r"\b(?:use|using|call|calling|invoke|run|query|check)\b[^.\n]{{0,40}}?`?\b{name}\b"


def _intended_tool(text: str, tool_names: list[str]) -> str | None:
    """A tool the reply says it will use without calling it ("I need to use the order_status tool")."""
    for name in tool_names:
        if re.search(_INTENT.format(name=re.escape(name)), text, re.IGNORECASE):
            return name
    return None


def _cut_invented_observation(text: str) -> str:
    match = _OBS_RE.search(text)
    return text[: match.start()].rstrip() if match else text


def _thought_of(text: str, first_label: re.Match[str] | None) -> str:
    head = text[: first_label.start()] if first_label else text
    return _strip_label(head, _THOUGHT_RE).strip()


def _strip_label(text: str, label: re.Pattern[str]) -> str:
    match = label.search(text)
    return (text[: match.start()] + text[match.end() :]).strip() if match else text.strip()


def _parse_action(
    text: str, action: re.Match[str], thought: str, tool_names: list[str], call_id: str
) -> ReactStep:
    line_end = text.find("\n", action.end())
    name_text = text[action.end() : line_end if line_end >= 0 else len(text)].strip()
    rest = text[line_end:] if line_end >= 0 else ""
    inline = _CALL_SYNTAX_RE.match(name_text)  # Action: calculator({"expression": "1+1"})
    if inline:
        name_text, args_text = inline.group(1), inline.group(2)
    else:
        input_match = _INPUT_RE.search(rest)
        args_text = rest[input_match.end() :] if input_match else ""
    name = _clean_name(name_text, tool_names)
    if not name:
        return ReactStep(thought=thought, error="The reply had 'Action:' but no tool name after it.")
    args, raw = parse_arguments(args_text)
    return ReactStep(thought=thought, call=ToolCall(id=call_id, name=name, arguments=args, raw_arguments=raw))


def _clean_name(name_text: str, tool_names: list[str]) -> str:
    name = name_text.strip().strip("`*_'\"[]() ").strip()
    lowered = {n.lower(): n for n in tool_names}
    if name.lower() in lowered:
        return lowered[name.lower()]
    for known in sorted(tool_names, key=len, reverse=True):  # "use the calculator tool" → calculator
        if re.search(rf"\b{re.escape(known)}\b", name, re.IGNORECASE):
            return known
    return name.split()[0] if name.split() else ""


def parse_arguments(text: str) -> tuple[dict[str, Any], str | None]:
    """Arguments as a dict; `(dict, None)` on success, `({}, raw)` when they cannot be read as an object."""
    body = _unfence(text).strip()
    if not body or body.lower() in ("none", "null", "{}", "n/a"):
        return {}, None
    body = _first_json_object(body) or body
    try:
        value = json.loads(body)
    except ValueError:
        try:
            import json_repair  # only for broken JSON (keeps `import thinkloop` fast)

            value = json_repair.loads(body)
        except Exception:
            value = None
    if isinstance(value, dict):
        return value, None
    return {}, body


def _unfence(text: str) -> str:
    match = _FENCE_RE.search(text)
    return match.group(1) if match else text


def _first_json_object(text: str) -> str | None:
    """The first balanced `{...}` in `text` (strings and escapes respected), or an unclosed tail."""
    start = text.find("{")
    if start < 0:
        return None
    depth, in_string, escaped = 0, False, False
    for i in range(start, len(text)):
        ch = text[i]
        if in_string:
            escaped = ch == "\\" and not escaped
            if ch == '"' and not escaped:
                in_string = False
            continue
        if ch == '"':
            in_string = True
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[start : i + 1]
    return text[start:]


_NAME_KEYS = ("name", "tool", "action", "tool_name", "function")
_ARGS_KEYS = ("arguments", "args", "parameters", "action_input", "input", "tool_input")


def _bare_json_call(text: str, tool_names: list[str], call_id: str) -> ToolCall | None:
    """A tool call written as bare or fenced JSON: `{"name": "calculator", "arguments": {...}}`."""
    candidate = _first_json_object(_unfence(text))
    if candidate is None:
        return None
    args, raw = parse_arguments(candidate)
    if raw is not None:
        return None
    if isinstance(args.get("function"), dict):  # OpenAI-shaped {"function": {"name":…, "arguments":…}}
        args = args["function"]
    name = next((args[k] for k in _NAME_KEYS if isinstance(args.get(k), str)), None)
    if name is None or name.lower() not in {n.lower() for n in tool_names}:
        return None
    name = next(n for n in tool_names if n.lower() == name.lower())
    inner: Any = next((args[k] for k in _ARGS_KEYS if k in args), {})
    if isinstance(inner, str):
        inner, raw = parse_arguments(inner)
        if raw is not None:
            return ToolCall(id=call_id, name=name, raw_arguments=raw)
    if not isinstance(inner, dict):
        return ToolCall(id=call_id, name=name, raw_arguments=json.dumps(inner))
    return ToolCall(id=call_id, name=name, arguments=inner)


# ---------------------------------------------------------------------------- native → ReAct transcript


def format_action(thought: str, call: ToolCall) -> str:
    args = (
        call.raw_arguments
        if call.raw_arguments is not None
        else json.dumps(call.arguments, ensure_ascii=False)
    )
    head = f"Thought: {thought}\n" if thought else ""
    return f"{head}Action: {call.name}\nAction Input: {args}"


def render_transcript(messages: list[Message]) -> list[Message]:
    """The history as a ReAct model reads it: tool calls as Action text, results as Observations.

    Consecutive tool results are merged into one user message (one Observation per call).
    """
    out: list[Message] = []
    for msg in messages:
        if msg.role == "assistant" and msg.tool_calls:
            body = "\n".join(
                format_action(msg.content.strip() if i == 0 else "", c) for i, c in enumerate(msg.tool_calls)
            )
            out.append(Message(role="assistant", content=body, kind=msg.kind, step=msg.step))
        elif msg.role == "tool":
            text = f"{OBSERVATION} {msg.content}"
            if (
                out
                and out[-1].role == "user"
                and out[-1].kind == "reply"
                and out[-1].content.startswith(OBSERVATION)
            ):
                out[-1] = out[-1].model_copy(update={"content": out[-1].content + "\n" + text})
            else:
                out.append(Message(role="user", content=text, step=msg.step))
        else:
            out.append(msg)
    return out
