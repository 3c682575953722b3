"""Text ReAct (SPEC §4.1): the prompt that lists the tools, the tolerant parser of replies, and the
rendering of a native history as a ReAct transcript.

The run state always stores tool calls and results natively (assistant `tool_calls` + `tool` messages),
whatever the mode; `render_transcript()` turns them into the text a ReAct model reads. So a run can
switch mode mid-way and the history stays valid for every provider.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import _choice, _json
from ._messages import Message, ToolCall, ToolDefinition

if TYPE_CHECKING:
    from collections.abc import Iterator

    from ._state import RunState

OBSERVATION = "Observation:"
FINAL_LABEL = "Final Answer:"
STOP_SEQUENCES = ["\nObservation:", "Observation:"]

_FORMAT = """To call a tool, write these three lines, then stop:
Thought: <what is still needed and which tool gives it>
Action: <the tool name, one of: {names}>
Action Input: <the tool's arguments as a JSON object, as shown above>
The tool's result comes back to you as "Observation: <result>".
When the observations answer every part of the task, write:
Thought: <how the observations answer the task>
Final Answer: <the complete answer>
Use a tool only when it gives something the task needs; when no tool fits, write the Final Answer yourself.
Never guess or work out in your head a value a tool can give you.
Write one Action per reply. Never write an Observation yourself.

An example with other tools (person_info, route), not yours:
Task: How far is Ann Lee's home town from Lyon?
Thought: I need Ann Lee's home town first; person_info gives it.
Action: person_info
Action Input: {{"name": "Ann Lee"}}
Observation: Ann Lee, born 1990, home town: Turin
Thought: Her home town is Turin. Now I need the distance from Turin to Lyon; route gives it.
Action: route
Action Input: {{"from": "Turin", "to": "Lyon"}}
Observation: 212 km
Thought: Ann Lee's home town is Turin, and Turin is 212 km from Lyon: that answers the task.
Final Answer: Ann Lee's home town, Turin, is 212 km from Lyon."""
# Measured on the embedded 1.5B model with benchmarks/local_tasks.py (see benchmarks/README.md). An
# earlier wording whose example line read "Thought: I know the final answer" made small models copy that
# line and answer before calling any tool; listing arguments as a JSON Schema made them send the schema.


def tools_prompt(tools: list[ToolDefinition]) -> str:
    """The part of the system prompt that lists the tools and the ReAct format.

    Each tool shows its arguments as the JSON object to send, with placeholders
    (`Action Input: {"city": "<string>"}`): small models copy a JSON Schema verbatim as the arguments.
    A schema too intricate for placeholders (references, unions of objects) is also given in full.
    """
    lines = ["You can use these tools:"]
    for t in tools:
        lines.append(f"- {t.name}: {t.description}".rstrip())
        example, complete = arguments_example(t.parameters)
        lines.append(f"  Action Input: {example}")
        if not complete:
            schema = json.dumps(_compact_schema(t.parameters), ensure_ascii=False)
            lines.append(f"  Arguments (JSON Schema): {schema}")
    lines.append("")
    lines.append(_FORMAT.format(names=", ".join(t.name for t in tools)))
    return "\n".join(lines)


def arguments_example(schema: dict[str, Any]) -> tuple[str, bool]:
    """The arguments of a tool as a JSON object with `<type: description>` placeholders, and whether
    the placeholders say everything the schema does (`{"expression": "<string: the expression>"}`)."""
    shown = _Placeholders(schema.get("$defs") or schema.get("definitions") or {})
    return shown.object(schema, depth=0), shown.complete


class _Placeholders:
    def __init__(self, defs: dict[str, Any]) -> None:
        self.defs, self.complete = defs, True

    def object(self, schema: dict[str, Any], depth: int) -> str:
        props = schema.get("properties")
        if not isinstance(props, dict) or not props:
            if schema.get("additionalProperties") not in (None, False):
                self.complete = False
            return "{}"
        required = set(schema.get("required") or ())
        fields = []
        for name, prop in props.items():
            value = self.value(
                prop if isinstance(prop, dict) else {}, depth + 1, optional=name not in required
            )
            fields.append(f"{json.dumps(name, ensure_ascii=False)}: {value}")
        return "{" + ", ".join(fields) + "}"

    def value(self, schema: dict[str, Any], depth: int, *, optional: bool = False) -> str:
        schema = self.resolve(schema)
        kind = self.kind(schema)
        if kind == "object" and isinstance(schema.get("properties"), dict) and depth < 3:
            return self.object(schema, depth)
        fmt = _FORMATS.get(str(schema.get("format")))
        notes = [f"{kind} ({fmt})" if fmt else kind, *_rules(schema)]
        if "enum" in schema and isinstance(schema["enum"], list):
            notes = ["one of " + ", ".join(json.dumps(v, ensure_ascii=False) for v in schema["enum"])]
        if optional:
            notes.append("optional")
        if schema.get("default") is not None:
            notes.append(f"default {json.dumps(schema['default'], ensure_ascii=False)}")
        text = ", ".join(notes)
        description = " ".join(str(schema.get("description") or "").split())
        if description:
            text = f"{text}: {description}"
        text = f"<{text}>"
        return json.dumps(text, ensure_ascii=False) if kind == "string" and "enum" not in schema else text

    def resolve(self, schema: dict[str, Any]) -> dict[str, Any]:
        ref = schema.get("$ref")
        if isinstance(ref, str):
            target = self.defs.get(ref.rsplit("/", 1)[-1])
            if not isinstance(target, dict):
                self.complete = False
                return {k: v for k, v in schema.items() if k != "$ref"}
            return {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
        options = schema.get("anyOf") or schema.get("oneOf")
        if isinstance(options, list):
            kept = [o for o in options if isinstance(o, dict) and o.get("type") != "null"]
            if len(kept) == 1:  # Optional[X]
                return {
                    **self.resolve(kept[0]),
                    **{k: v for k, v in schema.items() if k not in ("anyOf", "oneOf")},
                }
        return schema

    def kind(self, schema: dict[str, Any]) -> str:
        kind = schema.get("type")
        if isinstance(kind, list):
            kind = " or ".join(str(k) for k in kind if k != "null")
        if kind == "array":
            items = schema.get("items")
            item = self.kind(self.resolve(items)) if isinstance(items, dict) else ""
            return f"list of {item}s" if item and item != "value" else "list"
        if kind == "boolean":
            return "true or false"
        if isinstance(kind, str) and kind:
            return kind
        options = schema.get("anyOf") or schema.get("oneOf")
        if isinstance(options, list):
            kinds = [
                self.kind(self.resolve(o)) for o in options if isinstance(o, dict) and o.get("type") != "null"
            ]
            if any(k in ("object", "value") for k in kinds):
                self.complete = False
            return " or ".join(dict.fromkeys(kinds)) or "value"
        if "enum" in schema or "const" in schema:
            return "value"
        self.complete = False
        return "value"


_FORMATS = {
    "date": "date: YYYY-MM-DD",
    "date-time": "date and time: ISO 8601, e.g. 2025-01-31T14:30:00",
    "time": "time: HH:MM:SS",
    "duration": "duration: ISO 8601, e.g. P1DT2H",
    "uuid": "a UUID",
    "email": "an email address",
    "uri": "a URL",
}


def _rules(schema: dict[str, Any]) -> list[str]:
    """What a placeholder says of a schema's bounds: `1 to 12`, `above 0`, `2 to 40 characters`, `at
    most 3 items`, `matching ^[A-Z]{3}$` — a small model reads no schema, only the placeholders."""
    rules = []
    for low, high, unit in (("minimum", "maximum", ""), ("minLength", "maxLength", " characters"),
                            ("minItems", "maxItems", " items")):  # fmt: skip
        bounds = [schema.get(low), schema.get(high)]
        if bounds[0] is not None and bounds[1] is not None:
            rules.append(f"{bounds[0]} to {bounds[1]}{unit}")
        elif bounds[0] is not None:
            rules.append(f"at least {bounds[0]}{unit}")
        elif bounds[1] is not None:
            rules.append(f"at most {bounds[1]}{unit}")
    if schema.get("exclusiveMinimum") is not None:
        rules.append(f"above {schema['exclusiveMinimum']}")
    if schema.get("exclusiveMaximum") is not None:
        rules.append(f"below {schema['exclusiveMaximum']}")
    if isinstance(schema.get("pattern"), str):
        rules.append(f"matching {schema['pattern']}")
    return rules


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
    """One parsed ReAct reply: a tool call, a final answer, or an error to heal. An error may come with
    the `call` as it reads (arguments that repeat a key: the last value kept) for callers that cannot
    heal; the loop heals the error."""

    thought: str = ""
    call: ToolCall | None = None
    final: str | None = None
    error: str | None = None


_FENCE_RE = re.compile(r"```(?>[a-zA-Z0-9_-]*\s*\n?)(.*?)```", re.DOTALL)  # atomic: see _output._FENCE_RE
_LABEL = r"(?im)^[ \t>*_#]*{label}[ \t*_]*[:：](?:[*_]+(?=\s|$))?[ \t]*"  # `**Final Answer:** 5` too
_THOUGHT_RE = re.compile(_LABEL.format(label=r"thought"))
_ACTION_RE = re.compile(_LABEL.format(label=r"action(?![ \t_]*input)"))
_INPUT_RE = re.compile(_LABEL.format(label=r"action[ \t_]*input"))
_FINAL_RE = re.compile(_LABEL.format(label=r"final[ \t_]*answer"))
_OBS_RE = re.compile(_LABEL.format(label=r"observation"))
_INLINE_FINAL_RE = re.compile(
    r"(?i)\bfinal answer[ \t*_]*[:：](?:[*_]+(?=\s|$))?[ \t]*"
)  # "... so I answer. Final Answer: 5"
_CALL_SYNTAX_RE = re.compile(r"^([A-Za-z_][\w.-]*)\s*\((.*)\)\s*$", re.DOTALL)


def parse_react(text: str, tool_names: list[str], *, call_id: str) -> ReactStep:
    """Parse a ReAct reply, tolerating case, spacing, markdown, code fences and broken JSON.

    When both an Action and a Final Answer are present, whichever comes first wins (an answer written
    after an action is based on an observation the model invented). A reply with no labels at all is a
    final answer, unless it is a bare JSON tool call (small models write those).
    """
    text = _cut_invented_observation(text.strip())
    action = _ACTION_RE.search(text)
    final = _FINAL_RE.search(text) or (None if action else _INLINE_FINAL_RE.search(text))
    if action is None:
        action_input = _INPUT_RE.search(text)
        if action_input and (not final or action_input.start() < final.start()):
            return _parse_unlabelled_action(text, action_input, tool_names, call_id)
    if final and (not action or final.start() < action.start()):
        thought = _thought_of(text, final)
        answer = _answer_text(text[final.end() :])
        if answer:
            return ReactStep(thought=thought, final=answer)
        if not action:  # "Final Answer:" then an action: the action is what the reply holds
            return ReactStep(
                thought=thought,
                error="The Final Answer was empty. Write the complete answer after 'Final Answer:', or call a "
                "tool if you still need one.",
            )
    thought = _strip_label(_thought_of(text, action), _FINAL_RE)
    if action:
        return _parse_action(text, action, thought, tool_names, call_id)
    bare = _bare_json_call(text, tool_names, call_id)
    if bare is not None:
        return ReactStep(thought="", call=bare)
    body = _strip_label(text, _THOUGHT_RE)
    if not body:
        return ReactStep(error="The reply had an empty Thought and no Action or Final Answer.")
    written = call_syntax(unfenced(body).strip(), tool_names, call_id)  # `calculator(expression="2+3")`
    if written is not None:
        return ReactStep(thought="", call=written)
    intended = _intended_tool(body, tool_names)
    if intended is not None:
        return ReactStep(
            thought=body,
            error=f"You said you would use {intended} but did not call it. Write 'Action: {intended}' and "
            "'Action Input: {...}' on their own lines, or 'Final Answer: ...' if you already know the answer.",
        )
    if announces_next_step(body):
        return ReactStep(thought=body, error=PLAN_ONLY)
    return ReactStep(thought="", final=body)


def announces_next_step(text: str) -> bool:
    """Whether the last sentence of `text` says what the writer will do next ("I will try again later.",
    "Let me check the weather.") — a step announced, not an answer."""
    return bool(_PLAN_RE.search(_SENTENCE_END_RE.split(text.strip())[-1]))


_SENTENCE_END_RE = re.compile(r"(?<=[.!?])\s+|\n")


_ACT = (  # what a step announces ("I will try again later." ended a run of the 0.5B model as its answer)
    r"(?:use|call|compute|calculate|multiply|add|subtract|divide|convert|look|check|find|get|search|round"
    r"|try|retry|attempt|verify|redo|proceed|continue)"
)
_PLAN_RE = re.compile(
    rf"\b(?:I|we)(?:\s+(?:need|have|must|should|am going|are going)\s+to\b|(?:\s+(?:will|can|shall)|'ll)"
    rf"(?:\s+now|\s+then)?\s+{_ACT}\b|\s+(?:now\s+)?{_ACT}\b)|\blet'?s\b|\blet me\s+(?:now\s+)?{_ACT}\b",
    re.IGNORECASE,
)
PLAN_ONLY = (
    "The reply said what to do next but had neither an Action nor a Final Answer. If a tool does that next "
    "step, write 'Action:' and 'Action Input:'; if you already have the answer, write 'Final Answer:' and it."
)
PLAN_ONLY_NATIVE = (  # the same, to a model calling tools natively
    "The reply said what to do next but called no tool. If a tool does that next step, call it now; if "
    "you already have the answer, reply with the complete answer."
)


_INTENT = r"\b(?:use|using|call|calling|invoke|run|query|check)\b[^.\n]{{0,40}}?`?\b{name}\b"


def _intended_tool(text: str, tool_names: list[str]) -> str | None:
    """A tool the reply says it will use without calling it ("I need to use the order_status tool")."""
    for name in tool_names:
        if re.search(_INTENT.format(name=re.escape(name)), text, re.IGNORECASE):
            return name
    return None


def _answer_text(text: str) -> str:
    """What follows 'Final Answer:', without an action written after it (it is not taken: the answer
    came first) and without the labels of thoughts appended to it ("…\nThought: Oslo is colder." keeps
    the sentence)."""
    cut = min((m.start() for r in (_ACTION_RE, _INPUT_RE) if (m := r.search(text))), default=len(text))
    return _THOUGHT_RE.sub("", text[:cut]).strip()


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
    named = [n for n in tool_names if re.search(rf"\b{re.escape(n)}\b", name_text, re.IGNORECASE)]
    if len(named) > 1 and name_text.strip().lower() not in {n.lower() for n in tool_names}:
        return ReactStep(  # `Action: one of [calculator, lookup]`, the format's line copied
            thought=thought,
            error=f"The Action named several tools ({', '.join(named)}): write the name of the one tool to "
            "call now, alone on the 'Action:' line.",
        )
    name = _clean_name(name_text, tool_names)
    if not name:
        return ReactStep(thought=thought, error="The reply had 'Action:' but no tool name after it.")
    if _PLACEHOLDER_RE.match(unfenced(args_text).strip()):
        return ReactStep(  # `Action Input: {JSON arguments}`, copied from the format
            thought=thought,
            error=f"The Action Input was a placeholder ({args_text.strip()[:60]}), not arguments: write {name}'s "
            "real arguments as a JSON object whose keys are its parameter names (the tool list gives them) "
            "and whose values come from the task or the observations.",
        )
    return _action_step(thought, name, args_text, tool_names, call_id)


# an Action Input that is the format's placeholder, copied: `{JSON arguments}`, `<the tool's arguments …>`
_PLACEHOLDER_RE = re.compile(
    r"^[{<\[]?\s*(?:<\s*)?(?:the\s+)?(?:tool'?s?\s+)?(?:json\s+)?(?:arguments|args|input)(?:\s+as\s+[^\"{}:]*)?"
    r"(?:\s+json)?\s*(?:>\s*)?[}>\]]?$",
    re.IGNORECASE,
)


def _action_step(thought: str, name: str, args_text: str, tool_names: list[str], call_id: str) -> ReactStep:
    """The call of `name` with the arguments of `args_text`, or an error when they repeat a key."""
    args, raw = parse_arguments(args_text)
    call = _nested_call(args, name, tool_names, call_id) or ToolCall(
        id=call_id, name=name, arguments=args, raw_arguments=raw
    )
    repeated = repeated_keys(args_text) if raw is None else {}
    if repeated:
        key, values = next(iter(repeated.items()))
        shown = ", ".join(json.dumps(v, ensure_ascii=False) for v in values)
        return ReactStep(
            thought=thought,
            call=call,
            error=f"The Action Input gave the argument {json.dumps(key)} several values ({shown}), and a call "
            f"takes one. Call {name} once for each value, one Action per reply (or, if the argument takes a "
            "list, write the values as one JSON list).",
        )
    return ReactStep(thought=thought, call=call)


def _nested_call(args: dict[str, Any], name: str, tool_names: list[str], call_id: str) -> ToolCall | None:
    """The call of another tool written as the only argument of this one, `calculator` with
    `{"expression": "fx_rate(base='GBP', quote='USD')"}`: small models pass a tool's call to the
    calculator (or another tool taking text) to run it; it is that tool's call."""
    if len(args) != 1:
        return None
    value = next(iter(args.values()))
    if not isinstance(value, str) or "(" not in value:
        return None
    inner = call_syntax(value.strip(), tool_names, call_id)
    return inner if inner is not None and inner.name != name else None


def repeated_keys(text: str) -> dict[str, list[Any]]:
    """The keys the first JSON object of `text` gives more than once with different values, each with its
    values in order (`{"city": "Oslo", "city": "Rome"}`: a small model asking for several calls at once;
    JSON parsers keep the last value and drop the others without a word)."""
    body = _first_json_object(unfenced(text))
    if body is None:
        return {}
    repeated: dict[str, list[Any]] = {}

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, list[Any]] = {}
        for key, value in items:
            seen.setdefault(key, []).append(value)
        for key, values in seen.items():
            if any(v != values[0] for v in values):
                repeated.setdefault(key, values)
        return dict(items)

    try:
        json.loads(body, object_pairs_hook=pairs)
    except (ValueError, RecursionError):
        return {}
    return repeated


def _parse_unlabelled_action(
    text: str, action_input: re.Match[str], tool_names: list[str], call_id: str
) -> ReactStep:
    """`Action Input:` without an `Action:` line ("Thought: unit_price\nAction Input: {...}"): the tool
    is the last one the reply names before it; with none named, an error to heal (not a final answer)."""
    head = text[: action_input.start()].rstrip()
    mentioned = [
        (m.end(), n) for n in tool_names for m in re.finditer(rf"\b{re.escape(n)}\b", head, re.IGNORECASE)
    ]
    name = max(mentioned)[1] if mentioned else ""
    thought = _strip_label(head, _THOUGHT_RE)
    if not name:
        return ReactStep(
            thought=thought,
            error="The reply had 'Action Input:' but no 'Action: <tool name>' line before it.",
        )
    if thought.strip() == name:
        thought = ""
    return _action_step(thought, name, text[action_input.end() :], tool_names, call_id)


def _clean_name(name_text: str, tool_names: list[str]) -> str:
    name = name_text.strip().strip("`*_'\"[]() ").strip()
    lowered = {n.lower(): n for n in tool_names}
    if name.lower() in lowered:
        return lowered[name.lower()]
    for known in sorted(tool_names, key=len, reverse=True):  # "use the calculator tool" → calculator
        if re.search(rf"\b{re.escape(known)}\b", name, re.IGNORECASE):
            return known
    if _answer_name(name):  # "Action: Final Answer": kept whole
        return name
    return name.split()[0] if name.split() else ""


KEYWORD_ARGUMENTS_RE = re.compile(r"\s*[A-Za-z_]\w*\s*=(?!=)")


def parse_arguments(text: str) -> tuple[dict[str, Any], str | None]:
    """Arguments as a dict; `(dict, None)` on success, `({}, raw)` when they cannot be read as an object.

    JSON is read strictly (`_json`): `{"x": NaN}`, `Infinity`, `1e999` and nesting too deep to read are not
    an object of arguments (json_repair, which mends broken JSON, reads NaN as a float too), so the model is
    asked to send valid JSON."""
    body = unfenced(text).strip()
    if not body or body.lower() in ("none", "null", "{}", "n/a"):
        return {}, None
    if KEYWORD_ARGUMENTS_RE.match(body):  # `expression="2+3", digits=2`: keyword arguments written as code
        parsed = _literal_call(body)
        if parsed is not None and parsed[1] and not parsed[0]:
            return parsed[1], None
    body = _first_json_object(body) or body
    try:
        value = _json.loads(body)
    except ValueError:
        value = _repaired(body)
    if isinstance(value, dict):
        return value, None
    return {}, body


def _repaired(body: str) -> Any:
    """`body`, broken JSON, as json_repair mends it; None when it cannot, mends it into NaN or infinity, or
    would take long to (`_json.repairable`)."""
    if not _json.repairable(body):
        return None
    try:
        import json_repair  # only for broken JSON (keeps `import thinkloop` fast)

        value = json_repair.loads(body)
    except Exception:  # RecursionError too
        return None
    return None if _json.non_finite(value) else value


_THINK_OPEN_RE = re.compile("<think>", re.IGNORECASE)
THINK_CLOSE_RE = re.compile("</think>", re.IGNORECASE)
_TOOL_CALL_OPEN_RE = re.compile("<tool_call>", re.IGNORECASE)


def without_think_blocks(text: str) -> str:
    """`text` without its `<think>…</think>` blocks: each opening tag up to the next closing one, as the
    regex `<think>.*?</think>` removed them — in linear time: that regex, tried at each of many opening
    tags that no closing one follows, took time growing with the square of the reply."""
    parts: list[str] = []
    start = 0
    while (opened := _THINK_OPEN_RE.search(text, start)) is not None:
        closed = THINK_CLOSE_RE.search(text, opened.end())
        if closed is None:
            break
        parts.append(text[start : opened.start()])
        start = closed.end()
    return "".join(parts) + text[start:] if parts else text


def last_match(pattern: re.Pattern[str], text: str) -> re.Match[str] | None:
    """The last match of `pattern` in `text` — where `text.lower().rfind(tag)` was taken as an index of
    `text`, which it is not when a character before it lowers to two (`İ` to `i̇`): the slice was off."""
    found = None
    for match in pattern.finditer(text):
        found = match
    return found


def unfenced(text: str) -> str:
    """The text inside the first Markdown code fence of `text`, or `text`."""
    match = _FENCE_RE.search(text)
    return match.group(1) if match else text


def _first_json_object(text: str) -> str | None:
    """The first balanced `{...}` in `text` (strings and escapes respected), or an unclosed tail."""
    span = first_json_span(text)
    return span[0] if span else None


def first_json_span(text: str, openers: str = "{") -> tuple[str, bool] | None:
    """The first JSON object (or array, with `openers="{["`) in `text`, strings and escapes respected,
    and whether it closes; an unclosed one is the tail from its start. None when there is none."""
    start = min((i for i in (text.find(o) for o in openers) if i >= 0), default=-1)
    if start < 0:
        return None
    closers = {"{": "}", "[": "]"}
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
        elif ch in openers:
            depth += 1
        elif ch in (closers[o] for o in openers):
            depth -= 1
            if depth == 0:
                return text[start : i + 1], True
    return text[start:], False


_NAME_KEYS = ("name", "tool", "action", "tool_name", "function")
_ARGS_KEYS = ("arguments", "args", "parameters", "action_input", "input", "tool_input")


def _bare_json_call(text: str, tool_names: list[str], call_id: str) -> ToolCall | None:
    """A tool call written as bare or fenced JSON: `{"name": "calculator", "arguments": {...}}`. Arguments
    holding NaN or an infinity (`{"x": NaN}`) are kept raw, for the model to send valid JSON."""
    candidate = _first_json_object(unfenced(text))
    if candidate is None:
        return None
    args, raw = parse_arguments(candidate)
    if raw is not None:
        lenient = _with_non_finite(candidate)
        if lenient is None:
            return None
        args = lenient
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
    if not isinstance(inner, dict) or _json.non_finite(inner):
        return ToolCall(id=call_id, name=name, raw_arguments=json.dumps(inner, ensure_ascii=False))
    return ToolCall(id=call_id, name=name, arguments=inner)


def _with_non_finite(text: str) -> dict[str, Any] | None:
    """The object `text` holds when it is JSON but for NaN or infinities in it, else None."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) and _json.non_finite(value) else None


_TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
"""A `<tool_call>` block; its body is stripped after (a `\\s*` before the closing tag, tried at each step of the
lazy body, made a long run of blank space in it take time growing with its square: 4 s for 20 kB)."""
MAX_TEXT_CALLS = 16


def ends_inside_call(text: str) -> bool:
    """For a reply cut off by its token limit (`finish_reason="length"`) that holds tool calls written as
    text: whether the cut came inside the last call's arguments — an object or a string not closed, or an
    `Action Input:` that runs to the end (nothing tells whether it was complete). Such a call must not run:
    mended, it would run with half an argument (`rm -rf /home/user/build` of `…/build_tmp`). An invented
    `Observation:` after the call shows the call itself was complete."""
    text = text.strip()
    if _OBS_RE.search(text):
        return False
    labels = list(_INPUT_RE.finditer(text))
    label = labels[-1] if labels else None
    opened = None if label else last_match(_TOOL_CALL_OPEN_RE, text)
    body = unfenced(text[label.end() :] if label else text[opened.start() + 1 if opened else 0 :]).strip()
    if label is not None and not body.startswith(("{", "[", '"')):
        return True  # plain text up to the cut
    if body.startswith('"') and (len(body) == 1 or not body.endswith('"')):
        return True
    span = first_json_span(body, "{[")
    return span is not None and not span[1]


def may_hold_calls(text: str) -> bool:
    """Whether `text` can hold a call written as text (`text_calls`, `json_answer`): each form needs a `{`,
    a `(`, a label's colon or a `<tool_call>` tag. A plain answer ("It is 42 degrees.") has none of them,
    and is not parsed."""
    return "{" in text or "(" in text or ":" in text or "：" in text or "<tool_call>" in text


def text_calls(text: str, tool_names: list[str], call_id: str) -> tuple[str, list[ToolCall]]:
    """Tool calls a model wrote as text instead of sending them natively (a server without a tool-call
    parser, a small model): `(text before the calls, calls)`, or `(text, [])` when the text is no call.

    Read, in this order: `<tool_call>` blocks (all of them); JSON objects naming a known tool (several
    in a row, or a list of them, are several calls); a ReAct `Action:` / `Action Input:` pair; a reply
    that is only `tool_name(arg=value, ...)`. The first call keeps `call_id`, the next get `_1`, `_2` ….
    """
    ids = (call_id if i == 0 else f"{call_id}_{i}" for i in range(MAX_TEXT_CALLS))
    blocks = [body.strip() for body in _TOOL_CALL_RE.findall(text)]
    if blocks:
        found = (_block_call(body, tool_names, next(ids, call_id)) for body in blocks[:MAX_TEXT_CALLS])
        calls = [call for call in found if call is not None]
        return (text[: text.find("<tool_call>")].strip(), calls) if calls else (text, [])
    if not tool_names or not text.strip():
        return text, []
    calls = _json_calls(text, tool_names, ids)
    if calls:
        return "", calls
    action = _ACTION_RE.search(text)
    if action:  # a ReAct step: `Action Input:` too, or an Action line that is exactly a tool's name
        step = parse_react(text, tool_names, call_id=call_id)
        line = text[action.end() :].split("\n", 1)[0].strip().strip("`*_'\"").strip()
        if step.call is not None and (_INPUT_RE.search(text) or line in tool_names):
            return step.thought, [step.call]
    call = call_syntax(unfenced(text).strip(), tool_names, call_id)
    return ("", [call]) if call is not None else (text, [])


def _block_call(body: str, tool_names: list[str], call_id: str) -> ToolCall | None:
    """The call in one `<tool_call>` block; an unknown tool's call is kept (the loop explains the error)."""
    call = _bare_json_call(body, tool_names, call_id) or call_syntax(body.strip(), tool_names, call_id)
    if call is not None:
        return call
    obj, raw = parse_arguments(body)
    name = obj.get("name")
    if raw is not None or not isinstance(name, str):
        return ToolCall(id=call_id, name="unknown", raw_arguments=body) if body.strip() else None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        args, raw = parse_arguments(args)
    if not isinstance(args, dict):
        return ToolCall(id=call_id, name=name, raw_arguments=json.dumps(args))
    return ToolCall(id=call_id, name=name, arguments=args, raw_arguments=raw)


def _json_calls(text: str, tool_names: list[str], ids: Iterator[str]) -> list[ToolCall]:
    """Every JSON object of `text` (outside strings, one after another) that names a known tool."""
    calls: list[ToolCall] = []
    if "{" not in text:
        return calls
    rest = unfenced(text) if text.count("```") == 2 else text.replace("```json", "").replace("```", "")
    while len(calls) < MAX_TEXT_CALLS:
        span = first_json_span(rest)
        if span is None:
            break
        chunk, closed = span
        call = _bare_json_call(chunk, tool_names, "")
        if call is not None:
            call.id = next(ids, f"text_{len(calls)}")
            calls.append(call)
        if not closed:
            break
        rest = rest[rest.find(chunk) + len(chunk) :]
    return calls


def call_syntax(text: str, tool_names: list[str], call_id: str) -> ToolCall | None:
    """A call written as code, `calculator(expression="2+3")`, when `text` is only that and names a
    known tool. Keyword arguments must be literals; one positional argument is kept raw (the executor
    gives it to a tool of one parameter)."""
    match = _CALL_SYNTAX_RE.match(text) if "(" in text else None
    if match is None:
        return None
    lowered = {n.lower(): n for n in tool_names}
    name = lowered.get(match.group(1).lower())
    if name is None:
        return None
    parsed = _literal_call(match.group(2))
    if parsed is None:
        return None
    positional, keywords = parsed
    if not positional:
        return ToolCall(id=call_id, name=name, arguments=keywords)
    if len(positional) == 1 and not keywords:
        value = positional[0]
        if isinstance(value, dict):
            return ToolCall(id=call_id, name=name, arguments=value)
        return ToolCall(id=call_id, name=name, raw_arguments=json.dumps(value, ensure_ascii=False))
    return ToolCall(id=call_id, name=name, raw_arguments=json.dumps(positional, ensure_ascii=False))


def _literal_call(args: str) -> tuple[list[Any], dict[str, Any]] | None:
    """The literal positional and keyword arguments of `f(<args>)`, or None (not literals, not Python)."""
    if len(args) > 20_000:
        return None
    source = f"f({args})"
    try:
        node = ast.parse(source, mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    if not isinstance(node, ast.Call) or any(k.arg is None for k in node.keywords):  # not f(...), **kwargs
        return None

    def value(expr: ast.expr) -> Any:  # a literal, else its source text (`expression=17*23+4`, `x=1e999`)
        try:
            literal = ast.literal_eval(expr)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return ast.get_source_segment(source, expr)
        return ast.get_source_segment(source, expr) if _json.non_finite(literal) else literal

    return [value(a) for a in node.args], {str(k.arg): value(k.value) for k in node.keywords}


ANSWER_TOOLS = frozenset(
    {"final_answer", "finalanswer", "final", "answer", "finish", "submit", "submit_answer", "respond"}
    | {"final_response", "give_answer", "return_answer", "provide_answer"}
)
"""Names models give a tool that does not exist to hand in their answer (smolagents' `final_answer`, …)."""
_ANSWER_KEYS = (
    "answer",
    "final_answer",
    "response",
    "result",
    "text",
    "output",
    "content",
    "message",
    "value",
)


def is_answer_call(call: ToolCall, tool_names: list[str]) -> bool:
    """Whether `call` hands in the answer through a tool that does not exist (`final_answer(answer=…)`,
    `Action: Final Answer`), with something to hand in."""
    if not _answer_name(call.name) or call.name.lower() in {n.lower() for n in tool_names}:
        return False
    return bool(answer_of(call).strip())


def _answer_name(name: str) -> bool:
    """Whether `name` is one of `ANSWER_TOOLS`, whatever its case, spaces or hyphens (`Final Answer`)."""
    return re.sub(r"[\s-]+", "_", name.strip().lower()) in ANSWER_TOOLS


def answer_of(call: ToolCall) -> str:
    """The answer an answer call carries: its `answer` (or alike) argument, its only argument, or the text."""
    if call.raw_arguments is not None:
        return call.raw_arguments.strip().strip("`'\"").strip()
    args = call.arguments
    for key in _ANSWER_KEYS:
        value = args.get(key)
        if isinstance(value, str | int | float) and not isinstance(value, bool):
            return str(value)
    if len(args) == 1:
        value = next(iter(args.values()))
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return json.dumps(args, ensure_ascii=False) if args else ""


def json_answer(text: str, tool_names: list[str]) -> str | None:
    """The answer in a reply that is only a JSON answer call, `{"name": "final_answer", "arguments": {…}}`."""
    body = unfenced(text).strip()
    if not body.startswith("{"):
        return None
    span = first_json_span(body)
    if span is None or not span[1] or span[0] != body:
        return None
    obj, raw = parse_arguments(body)
    if raw is not None:
        return None
    name = next((obj[k] for k in _NAME_KEYS if isinstance(obj.get(k), str)), None)
    inner: Any = next((obj[k] for k in _ARGS_KEYS if k in obj), {})
    if name is None:
        return None
    if isinstance(inner, str):
        call = ToolCall(id="", name=name, raw_arguments=inner)
    else:
        call = ToolCall(id="", name=name, arguments=inner if isinstance(inner, dict) else {"answer": inner})
    return answer_of(call) if is_answer_call(call, tool_names) else None


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

    Consecutive tool results are merged into one user message (one Observation per call). A list of
    records is followed by its order lines (`list_orders`) when the task asks about an order.
    """
    out: list[Message] = []
    task = next((m.content for m in messages if m.kind == "task"), "")
    ordered = not task or asks_order(task)
    for msg in messages:
        if msg.role == "assistant" and msg.tool_calls:
            body = "\n".join(
                format_action(msg.content.strip() if i == 0 else "", c) for i, c in enumerate(msg.tool_calls)
            )
            out.append(Message(role="assistant", content=body, kind=msg.kind, step=msg.step))
        elif msg.role == "tool":
            orders = list_orders(msg.content) if ordered else ""
            text = f"{OBSERVATION} {readable_json(msg.content)}{nested_rows(msg.content)}{orders}"
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


_U_ESCAPE_RE = re.compile(
    r"\\\\|\\u([dD][89abAB][0-9a-fA-F]{2})\\u([dD][c-fC-F][0-9a-fA-F]{2})|\\u([0-9a-fA-F]{4})"
)  # an escaped backslash first, so that the `u` after it is not read as an escape


def readable_json(text: str) -> str:
    """A JSON tool result with its `\\uXXXX` escapes written as the characters they stand for
    (`"Kova\\u010d"` → `"Kovač"`), its layout kept; other text unchanged. Python's `json.dumps` escapes
    every non-ASCII character by default, and small models copied the escapes into their answers."""
    if "\\u" not in text or text.lstrip()[:1] not in ("{", "["):
        return text

    def char(match: re.Match[str]) -> str:
        if match.group(0) == "\\\\":
            return match.group(0)
        if match.group(3) is None:
            high, low = int(match.group(1), 16), int(match.group(2), 16)
            return chr(0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00))
        code = int(match.group(3), 16)
        keep = code < 0x20 or 0xD800 <= code < 0xE000 or chr(code) in '"\\' or not chr(code).isprintable()
        return match.group(0) if keep else chr(code)

    readable = _U_ESCAPE_RE.sub(char, text)
    try:
        same = json.loads(readable) == json.loads(text)
    except (ValueError, RecursionError):
        return text
    return readable if same else text


# ------------------------------------------------------------------- lists of records, in numeric order

_ORDER_MAX_ITEMS, _ORDER_MAX_KEYS = 12, 4
_NAME_KEY_RE = re.compile(r"(?:^|_)(?:name|title)$", re.IGNORECASE)


def _json_result(text: str) -> Any:
    """A tool result that is a JSON object or list of at most 20,000 characters, parsed; None otherwise."""
    if text.lstrip()[:1] not in ("{", "[") or len(text) > 20_000:
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def list_orders(text: str) -> str:
    """For a JSON tool result holding a list of records (2 to 12 objects), one line per numeric field
    giving the records in the order of that field (`flights by price_eur, from lowest to highest: IB 3401
    (498), LH 1120 (642)`), each named by its first field that tells them apart; "" otherwise. Shown to a
    ReAct model after the result (the stored result is unchanged): the 1.5B model named the first of two
    flights as the cheapest, reading the right prices."""
    value = _json_result(text)
    if value is None:
        return ""
    lists = [("items", value)] if isinstance(value, list) else []
    if isinstance(value, dict):
        lists = [(str(k), v) for k, v in value.items() if isinstance(v, list)]
    lines = [line for name, items in lists for line in _orders(name, items)]
    return "".join(f"\n({line})" for line in lines[:_ORDER_MAX_KEYS])


_ROWS_MAX = 40


def nested_rows(text: str) -> str:
    """For a JSON tool result whose records hold lists of records (zones holding bins), the innermost
    records one a line, each after the records it is in (`zone B: bin B-07, sku BOLT-M6, qty 850`); ""
    otherwise. Shown to a ReAct model after the result (the stored result is unchanged): reading
    `{"zones": [{"zone": "A", "bins": [{…}, {…}]}, …]}`, the 1.5B model added up every quantity of the
    site for "how many M6 bolts across all bins", and tried a list comprehension in the calculator."""
    value = _json_result(text)
    if value is None:
        return ""
    rows: list[str] = []
    kinds: set[str] = set()
    for key, items in _record_lists(value):
        _rows(key, items, [], rows, kinds)
    if not rows or len(rows) > _ROWS_MAX or len(kinds) != 1:
        return ""
    return f"\n(the {kinds.pop()}, one a line:\n" + "\n".join(rows) + ")"


def _record_lists(value: Any) -> list[tuple[str, list[dict[str, Any]]]]:
    """The lists of records a value holds at its top (a list itself, or a record's fields)."""
    pairs = [("items", value)] if isinstance(value, list) else []
    if isinstance(value, dict):
        pairs = [(str(k), v) for k, v in value.items() if isinstance(v, list)]
    return [(k, v) for k, v in pairs if v and all(isinstance(i, dict) for i in v)]


def _rows(key: str, items: list[dict[str, Any]], path: list[str], rows: list[str], kinds: set[str]) -> None:
    for item in items:
        scalars = [
            (str(k), v) for k, v in item.items() if v is None or isinstance(v, str | int | float | bool)
        ]
        inner = _record_lists(item)
        if inner and scalars and len(rows) <= _ROWS_MAX:
            label = f"{scalars[0][0]} {_shown(scalars[0][1])}"
            for inner_key, inner_items in inner:
                _rows(inner_key, inner_items, [*path, label], rows, kinds)
        elif path and not inner:
            kinds.add(key)
            rows.append(", ".join(path) + ": " + ", ".join(f"{k} {_shown(v)}" for k, v in scalars))


def _shown(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def asks_order(task: str) -> bool:
    """Whether a task compares or ranks ("the cheapest", "more than", "which is earlier"): only then does
    a list of records get its order lines. Shown for "Which books by Tomas Reyes can I borrow right now?",
    the line by `copies_available` made the 1.5B model answer with one book, "the highest number of
    copies", instead of the two the list held."""
    return _choice.comparative(task) is not None


def _orders(name: str, items: list[Any]) -> list[str]:
    if not 2 <= len(items) <= _ORDER_MAX_ITEMS or not all(isinstance(i, dict) for i in items):
        return []
    labels = _record_labels(items)
    lines = []
    for key in dict.fromkeys(k for item in items for k in item):
        values = [(item.get(key), label) for item, label in zip(items, labels, strict=True)]
        known = [(v, label) for v, label in values if _number(v)]
        if len(known) < 2 or len({v for v, _ in known}) < 2:
            continue
        ordered = ", ".join(f"{label} ({v})" for v, label in sorted(known, key=lambda p: p[0]))
        lines.append(f"{name} by {key}, from lowest to highest: {ordered}")
    return lines


def _number(value: Any) -> bool:
    """A number to order by: not a boolean, not NaN or an infinity (json.loads reads them; NaN has no order)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and not _json.non_finite(value)


def _record_labels(items: list[dict[str, Any]]) -> list[str]:
    """What names each record: the first text field whose values are all different — a name or title
    first (`The Glass Harbour`, not its ISBN) — else its position."""
    keys = list(dict.fromkeys(k for item in items for k in item))
    keys.sort(key=lambda k: not _NAME_KEY_RE.search(str(k)))
    for key in keys:
        values = [item.get(key) for item in items]
        if all(isinstance(v, str) and v.strip() for v in values) and len(set(values)) == len(values):
            return [str(v) for v in values]
    return [f"#{n}" for n in range(1, len(items) + 1)]


# ------------------------------------------------------------------------ answers copied from the prompt

_WORD_RE = re.compile(r"[^\W_]+")
COPIED = "repeated a line of your instructions"  # in the correction, so a second copy is accepted


def _trigrams(text: str) -> list[tuple[str, ...]]:
    words = _WORD_RE.findall(text.lower())
    return [tuple(words[i : i + 3]) for i in range(len(words) - 2)]


def is_copied(text: str, sources: list[str], *, share: float = 0.8) -> bool:
    """Whether `text` (4 words or more) is mostly copied from `sources`: at least `share` of its word
    trigrams occur there. Small models answer with a line of their instructions (the worked example's
    question, a rule, a guard hint, a tool's description) instead of the answer."""
    grams = _trigrams(text)
    if len(grams) < 2:
        return False
    known = {g for source in sources for g in _trigrams(source)}
    return sum(g in known for g in grams) >= share * len(grams)


def copied_answer(answer: str, instructions: list[str], own: list[str]) -> bool:
    """Whether a final answer is made of lines of the `instructions` only (each line mostly copied), and
    not of the task or the observations (`own`: a quoted tool result or the task restated is fine)."""
    lines = [line for line in answer.splitlines() if line.strip()]
    if not lines or not all(is_copied(line, instructions) for line in lines):
        return False
    return not any(is_copied(line, own) for line in lines)


def told(history: list[Message], marker: str) -> bool:
    """Whether a correction containing `marker` was already sent in this run."""
    return any(m.kind == "correction" and marker in m.content for m in history)


def copied_final(answer: str, request: list[Message], state: RunState) -> bool:
    """A final answer that only repeats the system prompt or a hint of this `request` (the worked example's
    question, a rule), not the task or a tool result of the run — once per run: after one correction about
    it, a second such answer stands."""
    if told(state.messages, COPIED) or _NOT_FOUND_RE.match(answer):
        return False  # "Could not be found." is what the instructions say to answer: no copy
    instructions = [m.content for m in request if m.role == "system" or m.kind in ("hint", "correction")]
    own = [state.goal, *(m.content for m in state.messages if m.role == "tool")]
    return copied_answer(answer, instructions, own)


_NOT_FOUND_RE = re.compile(r"(?i)^\W*(?:it\s+|this\s+)?(?:could\s+not|cannot|can't)\s+be\s+found\W*$")


def drop_copied_lines(answer: str, prompt: str) -> str:
    """The answer without the lines that echo `prompt` (half their trigrams or more: a forced final answer
    that begins by repeating the listing it was shown); unchanged when nothing or everything would go."""
    lines = answer.splitlines()
    kept = [line for line in lines if line.strip() and not is_copied(line, [prompt], share=0.5)]
    if not kept or len(kept) == len([line for line in lines if line.strip()]):
        return answer
    return "\n".join(kept).strip()


# ------------------------------------------------------------------------------ numbers no result gives

_NUMBER_RE = re.compile(r"(?<![\w.])\d{1,3}(?:,\d{3})+(?:\.\d+)?(?!\d)|\d+(?:\.\d+)?")
_SCALE_RE = re.compile(r"\s*(thousand|million|billion)\b", re.IGNORECASE)
_SCALES = {"thousand": 1e3, "million": 1e6, "billion": 1e9}
UNSOURCED = "which none of the observations or the task gives"  # in the correction: told once a run
LAUNDERED = "a number made up and put through the calculator is still made up"  # told once a run


def _numbers(text: str) -> list[tuple[str, float, int]]:
    """The numbers of `text`: as written, their value (thousands separators read, "4.9 million" scaled),
    and their count of decimals."""
    found = []
    for match in _NUMBER_RE.finditer(text):
        written = match.group(0)
        plain = written.replace(",", "")
        decimals = len(plain.partition(".")[2])
        value = float(plain)
        scale = _SCALE_RE.match(text, match.end())
        if scale:
            value *= _SCALES[scale.group(1).lower()]
            decimals -= {"thousand": 3, "million": 6, "billion": 9}[scale.group(1).lower()]
            written = f"{written} {scale.group(1)}"  # "12 million", as the correction quotes it
        found.append((written, value, decimals))
    return found


def unsourced_numbers(answer: str, sources: list[str], work: str = "") -> list[str]:
    """The numbers of a final answer that none of `sources` (the task, the tool results) gives, as written
    or rounded (`19998` from `19998.333`, `4.9 million` from `4,903,716.15`). Small counts (up to 10) are
    left out: counting the items of a result needs no tool. A small model that read a result right often
    answers with a value it worked out in its head (3 items, "total 6.65 kg" answered as 3.75 kg) or made
    up (a price for a product that was not found).

    Arithmetic done right in the head is no made-up value: a number that one operation (`+ - * /`, a
    percentage) gives from two sourced numbers, or that a computation written out in the answer or in
    `work` (the reply's reasoning, `19.99 - 12.75 = 7.24`) gives from sourced operands, is sourced too; so
    is a sourced quantity converted to another unit, written with it ("31 °C" answered as "87.8 °F": the
    1.5B model, told that 87.8 came from nowhere, answered "Could not be found")."""
    found = [_numbers(source) for source in sources]
    known = [value for numbers in found for _, value, _ in numbers]
    known += [w.value for w in worked_arithmetic(f"{work}\n{answer}", sources) if w.sourced]
    operands = [value for numbers in found if len(numbers) <= _MAX_OPERANDS for _, value, _ in numbers]
    asked = {value for _, value, _ in found[0]} if found else set()
    missing = []
    for written, value, decimals in _numbers(answer):
        if decimals <= 0 and value <= 10:
            continue
        if not any(_rounds_to(k, value, decimals) for k in known) and not _derived(value, operands, asked):
            missing.append(written)
    if missing:  # a quantity of a result converted in the head ("31 °C" answered "87.8 °F") is sourced too
        converted = _converted(sources)
        right = {
            written
            for written, value, decimals, unit in _quantities(answer)
            if any(_converts_to(exact, value, decimals) for exact in converted.get(unit, ()))
        }
        missing = [m for m in missing if m not in right]
    return list(dict.fromkeys(missing))


_MAX_OPERANDS = 8  # numbers of a source above which its numbers are no operands of `_derived`: a page of
# text holds so many that some pair gives almost any number (the handbook's 18 + 6 for a made-up "24 hours")


# ------------------------------------------------------------------------- units converted in the head

# the units a small model converts in its head, each spelling to one name ("°F", "F", "degrees Fahrenheit")
_UNIT_NAMES = {
    "c": "c", "°c": "c", "celsius": "c", "degrees celsius": "c", "degrees c": "c",
    "f": "f", "°f": "f", "fahrenheit": "f", "degrees fahrenheit": "f", "degrees f": "f",
    "k": "k", "kelvin": "k",
    "km": "km", "kilometer": "km", "kilometers": "km", "kilometre": "km", "kilometres": "km",
    "mi": "mi", "mile": "mi", "miles": "mi",
    "m": "m", "meter": "m", "meters": "m", "metre": "m", "metres": "m",
    "ft": "ft", "foot": "ft", "feet": "ft",
    "cm": "cm", "centimeter": "cm", "centimeters": "cm", "centimetre": "cm", "centimetres": "cm",
    "in": "in", "inch": "in", "inches": "in",
    "kg": "kg", "kilogram": "kg", "kilograms": "kg", "kilo": "kg", "kilos": "kg",
    "lb": "lb", "lbs": "lb", "pound": "lb", "pounds": "lb",
    "g": "g", "gram": "g", "grams": "g",
    "oz": "oz", "ounce": "oz", "ounces": "oz",
    "l": "l", "liter": "l", "liters": "l", "litre": "l", "litres": "l",
    "gal": "gal", "gallon": "gal", "gallons": "gal",
    "km/h": "km/h", "kph": "km/h", "kmh": "km/h",
    "mph": "mph", "miles per hour": "mph",
    "m/s": "m/s",
}  # fmt: skip
_FACTORS = {  # (from, to): factor; each also converts back
    ("km", "mi"): 1 / 1.609344, ("m", "ft"): 1 / 0.3048, ("cm", "in"): 1 / 2.54, ("kg", "lb"): 1 / 0.45359237,
    ("g", "oz"): 1 / 28.349523125, ("l", "gal"): 1 / 3.785411784, ("km/h", "mph"): 1 / 1.609344,
    ("m/s", "km/h"): 3.6, ("km", "m"): 1000.0, ("kg", "g"): 1000.0, ("m", "cm"): 100.0,
}  # fmt: skip
_QUANTITY_RE = re.compile(
    r"(?<![\w.])((?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?)[ \t]*"
    r"(°[CFcf]?|degrees[ \t]+\w+|miles[ \t]+per[ \t]+hour|km/h|m/s|[A-Za-z]+)(?![\w/])",
    re.IGNORECASE,
)


def _quantities(text: str) -> list[tuple[str, float, int, str]]:
    """The numbers of `text` written with a unit of `_UNIT_NAMES`: as written, value, decimals, unit."""
    found = []
    for match in _QUANTITY_RE.finditer(text):
        unit = _UNIT_NAMES.get(" ".join(match.group(2).lower().split()))
        if unit is not None:
            plain = match.group(1).replace(",", "")
            found.append((match.group(1), float(plain), len(plain.partition(".")[2]), unit))
    return found


def _converted(sources: list[str]) -> dict[str, list[float]]:
    """Every quantity of `sources` in each unit it converts to: {unit: [values]}."""
    converted: dict[str, list[float]] = {}
    for source in sources:
        for _, value, _, unit in _quantities(source):
            for target, exact in _conversions(value, unit):
                converted.setdefault(target, []).append(exact)
    return converted


def _conversions(value: float, unit: str) -> list[tuple[str, float]]:
    if unit == "c":
        return [("f", value * 9 / 5 + 32), ("k", value + 273.15)]
    if unit == "f":
        return [("c", (value - 32) * 5 / 9), ("k", (value - 32) * 5 / 9 + 273.15)]
    if unit == "k":
        return [("c", value - 273.15), ("f", (value - 273.15) * 9 / 5 + 32)]
    return [(b, value * f) for (a, b), f in _FACTORS.items() if a == unit] + [
        (a, value / f) for (a, b), f in _FACTORS.items() if b == unit
    ]


def _converts_to(exact: float, value: float, decimals: int) -> bool:
    """Whether `value`, written with `decimals`, is `exact` rounded, or within 0.2 % (a factor rounded to
    three figures: 26.2 miles as 26.2 * 1.61 = 42.18 km)."""
    return _rounds_to(exact, value, decimals) or abs(exact - value) <= 0.002 * abs(exact)


def corrected_arithmetic(answer: str, reply: str, sources: list[str]) -> str:
    """The answer with the wrong result of a computation written out in the reply from sourced operands
    replaced by the right one, as the calculator gives it ("250 * 151.2 JPY = 37760 JPY … Final Answer: 37760
    JPY" is answered 37800 JPY). The 0.5B model multiplied a looked-up rate in its head and, corrected,
    looked the rate up again until the guards stopped the run; the 1.5B model wrote 250 × 151.2 = 37650.
    A wrong result that the task or a result gives as well is left alone: the answer's copy of it may be
    that value ("order 160 costs 160" after `100 * 1.5 = 160` would lose its order number)."""
    known: list[float] | None = None
    for worked in worked_arithmetic(reply, sources):
        if worked.sourced and not worked.right:
            if known is None:
                known = [value for source in sources for _, value, _ in _numbers(source)]
            wrong = float(worked.written.replace(",", ""))
            if wrong in known:
                continue
            right = _calculated(worked.value)
            answer = re.sub(rf"(?<![\d.,]){re.escape(worked.written)}(?![\d]|[.,]\d)", right, answer)
    return answer


def _calculated(value: float) -> str:
    from .tools.calculator import format_number

    return format_number(round(value, 10))


def _rounds_to(known: float, value: float, decimals: int) -> bool:
    tolerance = 10.0**-decimals / 2 + 1e-9 * max(abs(value), 1.0)
    return abs(known - value) <= tolerance


FORCED_UNSOURCED = "which none of the tool results or the task gives"


def forced_correction(answer: str, sources: list[str]) -> str | None:
    """The request to answer again when a forced final answer (after a budget or guard stop) gives numbers
    that neither the task nor a successful tool result gives — or None. Failed calls' errors are no source:
    they quote the model's own arguments (`cannot parse 'Zephyr Z9 drone costs $1000'`). With no tools
    left, the 0.5B model filled the gap with a made-up phone number or price, and told only to "say that it
    could not be found" repeated it; given the words to write, it wrote them (benchmarks/README.md, the 0.5B
    model and the forced final answer)."""
    missing = unsourced_numbers(answer, sources, answer)
    if not missing:
        return None
    return (
        f"Your answer gives {', '.join(missing[:3])}, {FORCED_UNSOURCED}. Answer again: if a result above "
        "gives what the task asks for, copy it as written there; if none does, write: Could not be found."
    )


# ------------------------------------------------------------------ arithmetic worked out in the reply

_FIGURE = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"  # 37800, 37,800.5
_AMOUNT = rf"[$€£]?{_FIGURE}(?:[ \t]?(?:[A-Za-z]{{1,4}}\b|°[CFcf]|%))?"
_OPERAND = rf"\(*[ \t]*{_AMOUNT}[ \t]*\)*"
_EXPRESSION_RE = re.compile(rf"({_OPERAND}(?:[ \t]*[-+*/×x÷^][ \t]*{_OPERAND})+)[ \t]*\Z")  # before an `=`
_RESULT_RE = re.compile(rf"=[ \t]*[$€£]?(-?{_FIGURE})(?![\d.]*\d)")
_LONGEST_WORKING = 300  # characters of an expression written out before its `=`: a longer one is no working
_DATE_RE = re.compile(r"\d{4}-\d{1,2}-\d{1,2}|\d{1,2}:\d{2}")
_UNIT_RE = re.compile(r"(?<=[\d)])[ \t]?(?:(?![x×]\b)[A-Za-z]{1,4}\b|°[CFcf])|[$€£]")
_TIMES_RE = re.compile(r"(?<=[\d)])[ \t]*[x×][ \t]*(?=[\d(])")
_FREE_OPERANDS = frozenset({100.0, 1000.0})  # percentages and scales: "* 15 / 100"


@dataclass(frozen=True, slots=True)
class Worked:
    """A computation a reply writes out, `500 * 0.9187 EUR = 479.15`: the expression as written, the result
    it gives, the result it has (by the calculator), and whether every operand is sourced."""

    expression: str
    written: str
    value: float
    sourced: bool

    @property
    def right(self) -> bool:
        decimals = len(self.written.replace(",", "").partition(".")[2])
        return _rounds_to(self.value, float(self.written.replace(",", "")), decimals)


def worked_arithmetic(text: str, sources: list[str]) -> list[Worked]:
    """The computations `text` writes out as `expression = result` (units and currency signs beside the
    numbers allowed: `250 * 151.2 JPY = 37760 JPY`), each evaluated by the calculator; dates and times, and
    operands of different units (`1 h - 15 min = 45 min` is not `1 - 15`), are no arithmetic. The
    computation is sourced when its operands are (`_made_up`): `10 + 5 = 15` of made-up prices is not."""
    from .tools.calculator import CalculatorError, evaluate  # the calculator imports the tool layer

    known = [value for source in sources for _, value, _ in _numbers(source)]
    found = []
    for written, result in _written_out(text):
        if _DATE_RE.search(written) or len({u.strip().lower() for u in _UNIT_RE.findall(written)}) > 1:
            continue  # dates, and operands of different units (`1 h - 15 min`): no arithmetic on the figures
        expression = _UNIT_RE.sub("", _TIMES_RE.sub(" * ", written)).replace("×", "*").replace("÷", "/")
        try:
            value = float(evaluate(expression))
        except (CalculatorError, OverflowError):
            continue
        numbers = _numbers(expression)
        sourced = bool(numbers) and not _made_up(numbers, known)
        found.append(Worked(" ".join(written.split()), result, value, sourced))
    return found


def _written_out(text: str) -> Iterator[tuple[str, str]]:
    """The `(expression, result)` of each `expression = result` in `text`, in order: each `=` followed by a
    figure, and the operands and operators written before it (at most `_LONGEST_WORKING` characters). One
    regex searched from every position instead, and on a long run of operands without an `=` (`1-1-1-…`,
    the loop of a small model) took time growing with its square: 3 s for 6 kB, the event loop blocked."""
    start = 0
    while (equals := text.find("=", start)) >= 0:
        result = _RESULT_RE.match(text, equals)
        window = max(start, equals - _LONGEST_WORKING)
        expression = None if result is None else _EXPRESSION_RE.search(text, window, equals)
        written = "" if expression is None else expression.group(1)
        cut = expression is not None and window > start and expression.start(1) == window  # it may go on
        if result is None or expression is None or (cut and not text[window - 1].isspace()):
            start = equals + 1  # no working ends here (or one longer than is read: not cut into one)
            continue
        yield written.strip(), result.group(1)
        start = result.end()


def computed_from_nowhere(expression: str, sources: list[str]) -> list[str]:
    """The numbers of a calculator expression (each once) when no source gives any of them and they are
    not all constants (`_constant`: `24 * 60`): `1000 * 2` after "no products match". [] otherwise."""
    numbers = _numbers(expression)
    made_up = _made_up(numbers, [value for source in sources for _, value, _ in _numbers(source)])
    return made_up if made_up and len(made_up) == len({w for w, _, _ in numbers}) else []


def _made_up(numbers: list[tuple[str, float, int]], known: list[float]) -> list[str]:
    """Of a computation's operands, those that make it made up (each once). [] when one at least is `known`
    and every other is too, or is a constant (`_constant`), 100 or 1000 (`/ 3` for a mean, `/ 100` for a
    percentage, `* 60` for minutes); [] too when none is known but all are constants, not small integers
    only (`24 * 60 * 60` for the seconds of a day, not `10 + 4`)."""
    given = [
        any(_rounds_to(k, n, decimals) for k in known) or (decimals > 0 and _rate_of(n, known))
        for _, n, decimals in numbers
    ]
    constant = [_constant(n, decimals) for _, n, decimals in numbers]
    if not any(given):  # small integers alone are no constants (`10 + 4 = 14` of made-up prices)
        small = all(decimals <= 0 and n <= 12 for _, n, decimals in numbers)
        return [] if all(constant) and not small else list(dict.fromkeys(w for w, _, _ in numbers))
    free = [
        c or (decimals <= 0 and n in _FREE_OPERANDS)
        for (_, n, decimals), c in zip(numbers, constant, strict=True)
    ]
    return list(
        dict.fromkeys(w for (w, _, _), g, f in zip(numbers, given, free, strict=True) if not (g or f))
    )


def _rate_of(value: float, known: list[float]) -> bool:
    """Whether `value` is a known percentage as a factor: `0.15` of 15 %, `1.15` (plus 15 %), `0.85` (less
    15 %) — `86.40 * 1.15` for a bill with its tip."""
    if not 0 < value < 3:
        return False
    rates = (value * 100, (value - 1) * 100, (1 - value) * 100)
    return any(abs(k - r) <= 1e-6 * max(abs(r), 1.0) for k in known if k > 0 for r in rates)


_CONSTANTS = frozenset({24.0, 60.0, 365.0, 366.0, 52.0, 1440.0, 3600.0, 86400.0, 1024.0})  # time, bytes
_CONVERSION_FACTORS = tuple(  # a unit's factor, either way (1.609, 0.6214 …), and °C-°F's: no scales (1000)
    sorted({v for f in _FACTORS.values() for v in (f, 1 / f) if 0.02 < v < 50} | {1.8, 32.0, 273.15})
)


def _constant(value: float, decimals: int) -> bool:
    """A number a computation may use that no source gives: a small integer (up to 12), a count of the
    hours of a day, the minutes of an hour, the days of a year …, or a unit's conversion factor."""
    if decimals <= 0 and (value <= 12 or value in _CONSTANTS):
        return True
    return any(_converts_to(factor, value, decimals) for factor in _CONVERSION_FACTORS)


def made_up_result(missing: list[str], made_up: list[tuple[str, str]]) -> tuple[str, str] | None:
    """Of the calculator calls whose operands were made up (expression, result), the last whose result is
    one of an answer's `missing` numbers: the answer's number came from that call."""
    values = [(value, decimals) for written in missing for _, value, decimals in _numbers(written)]
    for expression, result in reversed(made_up):
        computed = [value for _, value, _ in _numbers(result)]
        if any(_rounds_to(c, v, d) for c in computed for v, d in values):
            return expression, result
    return None


def _derived(value: float, known: list[float], asked: set[float]) -> bool:
    """Whether `value` is exactly the sum, difference, product, quotient or percentage (`a * b / 100`) of two
    different numbers of `known` (of the last 40), one of them not of the task (`asked`): arithmetic worked
    out right in the head on a result ("warmer by 12 °C" beside 19 °C and 7 °C). Exactly: a rounded result
    would match too many numbers by chance; not of the task's numbers alone, which a forced final answer
    adds up whatever their units ("5 miles and 8 km": 13 km)."""
    distinct = list(dict.fromkeys(k for k in known if k != 0))[-40:]
    tolerance = 1e-9 * max(abs(value), 1.0)
    for i, a in enumerate(distinct):
        for b in distinct[i + 1 :]:
            if a in asked and b in asked:
                continue
            results = (a + b, abs(a - b), a * b, a / b, b / a, a * b / 100)
            if any(abs(r - value) <= tolerance for r in results):
                return True
    return False


# ------------------------------------------------------------------------------ the form the task asks for

_ONLY_RE = re.compile(
    r"\b(?:answer|reply|respond|give|write|return)\b[^.?!\n]{0,24}?\b(?:just|only)\b[ \t]+(?:with[ \t]+)?"
    r"(?:(?P<number>the[ \t]+number|a[ \t]+number|the[ \t]+amount|the[ \t]+total|the[ \t]+count)"
    r"|(?P<yes_no>[\"']?yes[\"']?[ \t]+or[ \t]+[\"']?no[\"']?))\b",
    re.IGNORECASE,
)
_BARE_NUMBER_RE = re.compile(
    r"(?<![\w.])-?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\w.]*\d)|(?<![\w.])-?\d+(?:\.\d+)?(?![\w]|\.\d)"
)
_YES_NO_RE = re.compile(r"\b(yes|no)\b", re.IGNORECASE)


def requested_form(answer: str, goal: str) -> str:
    """The answer in the form the task asks for, when the task says "answer with just the number" or "answer
    only yes or no" and the answer holds exactly one such number (not counting the task's own numbers) or
    one yes or no: that number (or "Yes", "No") alone. Otherwise the answer unchanged. Small models answer
    "The number of staff in the Dublin office is 131." to "Answer with just the number.". The format
    example's closing words ("…: that answers the task."), copied into an answer, are left out."""
    answer = _without_example_close(answer)
    wanted = _ONLY_RE.search(goal)
    if wanted is None or not answer.strip():
        return answer
    if wanted.group("yes_no"):
        words = {w.lower() for w in _YES_NO_RE.findall(answer)}
        return answer if len(words) != 1 else words.pop().capitalize()
    given = {value for _, value, _ in _numbers(goal)}
    found = [m.group(0) for m in _BARE_NUMBER_RE.finditer(answer)]
    own = [n for n in dict.fromkeys(found) if float(n.replace(",", "")) not in given]
    return own[0] if len(own) == 1 else answer


# the close of the format example's last thought, which small models copy into their answer
_EXAMPLE_CLOSE_RE = re.compile(
    r"\b(?:and\s+)?(?:that|this|which)\s+answers\s+the\s+(?:task|question)\s*[.!]?\s*$", re.IGNORECASE
)
_BEFORE_CLOSE = ",;:.—–-"  # and blank space: what is taken off before the closing words


_ANSWER_LEAD_RE = re.compile(r"(?i)^\s*(?:so,?\s+)?the\s+final\s+answer\s+is\s*[:：]\s*(?=\S)")


def _without_example_close(answer: str) -> str:
    """`answer` without a closing "that answers the task." (kept when that is all it says), nor a leading
    "The final answer is:" (the 1.5B model's Thought, taken as the answer)."""
    answer = _ANSWER_LEAD_RE.sub("", answer, count=1)
    if "answers the" not in answer.lower():
        return answer
    close = _EXAMPLE_CLOSE_RE.search(answer)
    end = len(answer) if close is None else close.start()
    # the punctuation before the closing words is found from them back: a regex matching it as well tried
    # each position of a long run of it, in time growing with its square (9 s for 20 kB)
    while close is not None and end and (answer[end - 1].isspace() or answer[end - 1] in _BEFORE_CLOSE):
        end -= 1
    cut = answer[:end].rstrip()
    if not cut:
        return answer
    return cut if cut[-1] in ".!?)\"'" else cut + "."


# ------------------------------------------------------------------- comparisons against the observations

_LOWER_WORDS = ("cheaper", "less expensive", "colder", "cooler", "lower", "smaller", "lighter")
_HIGHER_WORDS = (
    "more expensive",
    "pricier",
    "costlier",
    "warmer",
    "hotter",
    "higher",
    "larger",
    "bigger",
    "heavier",
)
_COMPARE_WORDS = "|".join(w.replace(" ", r"[ \t]+") for w in _LOWER_WORDS + _HIGHER_WORDS)
_COMPARED_RE = re.compile(
    r"(?P<a>[\w'-]+(?:[ \t]+[\w'-]+){0,2})[ \t]+(?:is|are|was|costs?)[ \t]+(?:(?:much|slightly|a[ \t]+bit)[ \t]+)?"
    rf"(?P<word>{_COMPARE_WORDS})[ \t]+than[ \t]+"
    r"(?:(?:the|a|an)[ \t]+)?(?P<b>[\w'-]+(?:[ \t]+[\w'-]+){0,2})",
    re.IGNORECASE,
)
COMPARED = "but the observations give"  # in the correction: told once a run


def comparison_check(answer: str, results: list[str]) -> tuple[str, str] | None:
    """For an answer whose comparison ("gizmo is cheaper than widget") the observations contradict: the
    correction to send, and the answer with the comparison's two sides swapped ("widget is cheaper than
    gizmo"), as `corrected_arithmetic` puts a wrong computation right. Each side's value is the number
    right after its name in a result ("gizmo: 19.99 EUR", "widget: 12.75 EUR"), the same wherever it is
    given: the 1.5B model read both prices and named the dearer one as cheaper. None when the comparison
    agrees, or either value is not found for certain."""
    found = _contradicted(answer, results)
    if found is None:
        return None
    match, a, b, word = found
    correction = (
        f"The Final Answer says {a[0]} is {word} than {b[0]}, {COMPARED} {a[0]} {a[2]} and {b[0]} {b[2]}: "
        f"{b[0]} is the {word} one. Correct the answer."
    )
    a_end, b_start = match.end("a"), match.start("b")
    a_start, b_end = a_end - len(a[0]), b_start + len(b[0])
    righted = answer
    if answer[a_start:a_end] == a[0] and answer[b_start:b_end] == b[0]:
        righted = answer[:a_start] + b[0] + answer[a_end:b_start] + a[0] + answer[b_end:]
    return correction, righted


_MOST_WORDS = ("most", "highest", "largest", "greatest", "biggest")
_LEAST_WORDS = ("least", "lowest", "smallest", "fewest")
_SUPERLATIVE_RE = re.compile(
    r"\bthe[ \t]+(?P<word>" + "|".join(_MOST_WORDS + _LEAST_WORDS) + r")\b", re.IGNORECASE
)
_AMONG_RE = re.compile(r"\b(?:among|of)[ \t]+")
_OPTION_SPLIT_RE = re.compile(r"\s*,\s*(?:(?:or|and)\s+)?|\s+(?:or|and)\s+")
_SENTENCE_RE = re.compile(r"[^.!?\n]+(?:\.(?=\d)[^.!?\n]*)*")
SUPERLATIVE = "by your own computations"  # in the correction: told once a run


def superlative_check(answer: str, goal: str, work: list[str], sources: list[str]) -> tuple[str, str] | None:
    """For an answer naming the one of the task's options that has "the most" (highest, largest … or the
    least …) when the model's own computations say another: the correction to send, and the answer with the
    right option in its place. The options are the task's list (`Which warehouse has the most free space:
    Anvil, Bolt or Crate?`); each one's value is the result of the one computation of sourced numbers that a
    sentence of the model's reasoning (`work`) writes beside that option alone (`Bolt has 8000 pallets …
    The free space is 8000 - 5120 = 2880`): the 1.5B model worked out 2530, 2880 and 1010 right and named
    the first as the most. None when anything is unsure: an option with no value, or two."""
    options = _options(goal)
    said = _SUPERLATIVE_RE.search(answer)
    if len(options) < 2 or said is None or len(answer) > 300:
        return None
    named = [o for o in options if re.search(rf"(?<!\w){re.escape(o)}(?!\w)", answer[: said.start()], re.I)]
    if len(named) != 1:
        return None
    values: dict[str, set[float]] = {o: set() for o in options}
    for text in work:
        current: str | None = None
        for sentence in _SENTENCE_RE.findall(text):
            there = [o for o in options if re.search(rf"(?<!\w){re.escape(o)}(?!\w)", sentence, re.I)]
            current = there[0] if len(there) == 1 else (None if there else current)
            worked = [w for w in worked_arithmetic(sentence, sources) if w.sourced and w.right]
            if current is not None and worked:
                values[current].add(worked[-1].value)
    if any(len(v) != 1 for v in values.values()):
        return None
    value = {o: next(iter(v)) for o, v in values.items()}
    word = said.group("word").lower()
    pick = max if word in _MOST_WORDS else min
    best = pick(options, key=lambda o: value[o])
    if best == named[0] or sum(value[o] == value[best] for o in options) > 1:
        return None
    listed = ", ".join(f"{o} {value[o]:g}" for o in options)
    correction = (
        f"The Final Answer says {named[0]} has the {word}, but {SUPERLATIVE} ({listed}) {best} has the "
        f"{word}. Correct the answer."
    )
    start = re.search(rf"(?<!\w){re.escape(named[0])}(?!\w)", answer, re.I)
    righted = answer if start is None else answer[: start.start()] + best + answer[start.end() :]
    return correction, righted


def _listed_before_question(goal: str) -> str | None:
    """The first list a question mark ends, after a colon or `among`/`of` (`: Anvil, Bolt or Crate?`), or
    None. Read question by question, in linear time: a regex searching for it from every `of` and through
    every run of spaces took time growing with the square of the goal (4 s for a 40 kB one)."""
    for line in goal.split("\n"):
        start = 0
        while (mark := line.find("?", start)) >= 0:
            before = line[start:mark]  # a list never holds a colon: only the last one can lead it
            colon = before.rfind(":")
            lead = colon + 1 if colon >= 0 else (m.end() if (m := _AMONG_RE.search(before)) else -1)
            if lead >= 0 and before[lead:]:
                return before[lead:]
            start = mark + 1
    return None


def _options(goal: str) -> list[str]:
    """The options a task lists to choose from (`…: Anvil, Bolt or Crate?`, `… among A, B and C?`)."""
    listed = _listed_before_question(goal)
    if listed is None or len(listed.strip()) > 8 * (40 + 6):  # more than 8 options of 40 characters: none
        return []  # (and a split of long runs of blank space took time growing with their square)
    items = [i.strip() for i in _OPTION_SPLIT_RE.split(listed.strip())]
    items = [i for i in items if i]
    if not 2 <= len(items) <= 8 or any(len(i) > 40 or len(i.split()) > 4 for i in items):
        return []
    return list(dict.fromkeys(items))


def wrong_comparison(answer: str, results: list[str]) -> str | None:
    """The correction of `comparison_check`, or None."""
    checked = comparison_check(answer, results)
    return None if checked is None else checked[0]


def righted_comparison(answer: str, results: list[str]) -> str:
    """The answer of `comparison_check`: `answer` itself when its comparison is not contradicted."""
    checked = comparison_check(answer, results)
    return answer if checked is None else checked[1]


def _contradicted(
    answer: str, results: list[str]
) -> tuple[re.Match[str], tuple[str, float, str], tuple[str, float, str], str] | None:
    """The comparison of `answer` that the results contradict: its match, each side's (name, value,
    value as written) and its word; None when there is none."""
    match = _COMPARED_RE.search(answer)
    if match is None:
        return None
    word = " ".join(match.group("word").lower().split())
    a = _named_value(match.group("a").split(), results, from_end=True)
    b = _named_value(match.group("b").split(), results, from_end=False)
    if a is None or b is None or a[0].lower() == b[0].lower() or a[1] == b[1]:
        return None
    if (a[1] < b[1]) == (word in _LOWER_WORDS):
        return None
    return match, a, b, word


def _named_value(words: list[str], results: list[str], *, from_end: bool) -> tuple[str, float, str] | None:
    """The name among the last (or first) words of a side of a comparison that the results give a value
    for, with that value (the number written right after the name); the longest such name."""
    for size in range(len(words), 0, -1):
        name = " ".join(words[-size:] if from_end else words[:size])
        if len(name) < 2 or name.lower() in ("it", "this", "that", "the", "a", "an"):
            continue
        values = _values_after(name, results)
        if len(values) == 1:
            (written,) = values
            return name, float(written.replace(",", "")), written
    return None


def _values_after(name: str, results: list[str]) -> set[str]:
    """The numbers written within a few characters after each mention of `name` in the results."""
    pattern = re.compile(
        rf"(?<![\w-]){re.escape(name)}(?![\w-])[^\d\n]{{0,24}}?(-?(?:{_NUMBER_RE.pattern}))", re.IGNORECASE
    )
    return {m.group(1) for text in results for m in pattern.finditer(text)}
