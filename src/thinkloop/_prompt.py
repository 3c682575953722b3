"""The layered system prompt (SPEC §12): role, environment, tools (ReAct), rules, experience."""

from __future__ import annotations

import string
from collections.abc import Sequence

DEFAULT_ROLE = "You are a capable assistant that completes the user's task, using tools when they help."

DEFAULT_RULES: tuple[str, ...] = (
    "Use the tools to look up facts and to compute results instead of guessing; never invent tool results.",
    "When none of the tools fits the task, answer it yourself without calling any.",
    "When a tool fails, read the error and change the call instead of repeating it; when what you asked "
    "for does not exist, say so in your answer.",
    "When you know the answer, give it directly and stop.",
)

FINAL_ANSWER_PROMPT = (
    "Do not call any more tools: answer the task now with what you have found.{facts}\n"
    "The task: {goal}\n"
    "Write your final answer to the task from these results only. If they do not contain what the task asks "
    "for, or part of it, say what could not be found: never make up a value."
)
# The stop reason ({reason}, e.g. "The run reached the step limit of 8.") is not in the default wording:
# the embedded 1.5B model answered it ("The instruction to stop now is contradictory", or repeated it
# as its answer) instead of the task.


def system_prompt(
    *,
    role: str = "",
    environment: str = "",
    tools: str = "",
    rules: Sequence[str] = DEFAULT_RULES,
    experience: Sequence[str] = (),
) -> str:
    """Join the non-empty layers, each under its own heading."""
    layers = [role.strip() or DEFAULT_ROLE]
    if environment.strip():
        layers.append(f"## Environment\n{environment.strip()}")
    if tools.strip():
        layers.append(f"## Tools\n{tools.strip()}")
    if rules:
        layers.append("## Rules\n" + "\n".join(f"- {r}" for r in rules))
    if experience:
        layers.append("## Lessons from earlier runs\n" + "\n".join(f"- {e}" for e in experience))
    return "\n\n".join(layers)


def placeholders(template: str) -> list[str]:
    """The names of a well-formed template's `{name}` placeholders, in order (`{{` is no placeholder)."""
    return [name for _, name, _, _ in string.Formatter().parse(template) if name]


def template_problem(template: str, names: Sequence[str], *, unknown_ok: bool = False) -> str | None:
    """What is wrong with a text whose `{name}` placeholders the loop fills in with `names` — a brace that
    is no placeholder (`{"answer": ...}`, a lone `{`), a numbered field or a format spec, an unknown name
    (unless `unknown_ok`: it then stays as written) — or None. Checked when the text is given: when the
    loop filled it in, it crashed the run."""
    placeholders = ", ".join("{" + n + "}" for n in names) or "none"
    fix = f"its placeholders: {placeholders}; write {{{{ and }}}} for a literal brace"
    try:
        fields = [(f, spec, conv) for _, f, spec, conv in string.Formatter().parse(template) if f is not None]
    except ValueError as exc:  # Single '{' encountered in format string
        return f"{exc} ({fix})"
    for name, spec, conversion in fields:
        if not name.isidentifier() or spec or conversion:
            written = (
                "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
            )
            return f"{written} is no placeholder ({fix})"
        if not unknown_ok and name not in names:
            return f"the placeholder {{{name}}} is unknown ({fix})"
    return None


def final_answer_prompt(
    template: str | None, *, reason: str, goal: str, facts: Sequence[str] = (), failures: Sequence[str] = ()
) -> str:
    """The request for a best-effort answer. `failures` (calls that failed, with their errors) and `facts`
    (the tool calls that worked, with their results) are listed before the task is restated, so even a
    small model sees which result answers which call — and what could not be found, instead of inventing
    it; a custom template without `{facts}` gets them appended."""
    failed = "".join(f"\n- {f}" for f in failures)
    worked = "".join(f"\n- {f}" for f in facts)
    listing = f"\nThe tool calls that failed, with their errors:{failed}" if failures else ""
    listing += f"\nThe tool calls that worked, with their results:{worked}" if facts else ""
    template = template or FINAL_ANSWER_PROMPT
    text = template.format(reason=reason, goal=goal, facts=listing)
    return text if "{facts}" in template else text + listing
