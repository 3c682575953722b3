"""Runtime tool discovery (SPEC §3.5): a large catalogue, a few tools shown, `discover_tools` for the rest.

With `Agent(tools=[...hundreds...], discovery=ToolDiscovery(always=["calculator"]))` the model is shown
only the `always` tools and the meta-tool `discover_tools`. Calling `discover_tools(query=...)` ranks the
whole catalogue (the agent's tools and its MCP servers' tools) by BM25 over tool names, descriptions and
parameter names and descriptions, and adds the best matches to the tools shown in the following model
calls — as native tool definitions, or in the ReAct tool list of the system prompt. Discovered tools are
recorded in `RunState.discovered_tools`, so a resumed run keeps them.

A call of a catalogue tool that was not discovered yet still runs (the registry used to execute calls
holds the whole catalogue): small models that guess a right name are not punished for skipping a step.
"""

from __future__ import annotations

import functools
import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._errors import ConfigurationError
from ._messages import ToolDefinition
from ._risk import RiskLevel
from ._tools import Tool, ToolRegistry

if TYPE_CHECKING:
    from ._loop import RunContext

DISCOVER_TOOLS = "discover_tools"

__all__ = ["DISCOVER_TOOLS", "SearchHit", "ToolDiscovery", "ToolIndex", "tokenize"]

# ------------------------------------------------------------------------------------- tokenising

_CAMEL_RE = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_WORD_RE = re.compile(r"[^\W_]+")
_CJK_RE = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]")
_STOPWORD_TEXT = (
    "a an and are as at be by can do does for from has have how i in is it its me my of "
    "on or that the this to use used using want was what when which will with you your"
)
_STOPWORDS = frozenset(_STOPWORD_TEXT.split())


def tokenize(text: str) -> list[str]:
    """Search terms of `text`: snake_case and camelCase split, lower-cased, stop words dropped, stemmed.

    Runs of CJK characters, written without spaces, give their characters and character bigrams.
    """
    terms: list[str] = []
    for word in _WORD_RE.findall(_CAMEL_RE.sub(" ", text)):
        word = word.lower()
        # cached by word: a word a model sent may be a megabyte long, and the cache must not keep it
        terms.extend(_terms_of(word) if len(word) <= _CACHED_WORD else _word_terms(word[:_LONG_WORD]))
    return terms


_CACHED_WORD = 64  # the longest word whose terms are cached
_LONG_WORD = 4096  # characters of a longer word that count (a run of CJK text is one "word")


@functools.lru_cache(maxsize=16384)
def _terms_of(word: str) -> tuple[str, ...]:
    return _word_terms(word)


def _word_terms(word: str) -> tuple[str, ...]:
    if not word.isascii() and _CJK_RE.search(word):
        return (*word, *(word[i : i + 2] for i in range(len(word) - 1)))
    return () if word in _STOPWORDS else (_stem(word),)


def _stem(word: str) -> str:
    """A tiny suffix stripper, applied alike to tools and queries: forecasts/forecasting → forecast."""
    if len(word) <= 3 or word.isdigit():
        return word
    for suffix, replacement, min_len in (("ies", "y", 5), ("sses", "ss", 5), ("ing", "", 6), ("ed", "", 5)):
        if word.endswith(suffix) and len(word) >= min_len:
            return word[: -len(suffix)] + replacement
    if word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


# ------------------------------------------------------------------------------------------ index

# How much each part of a tool counts: its name says most about what it does.
_FIELD_WEIGHTS = (("name", 3), ("description", 1), ("param_names", 2), ("param_descriptions", 1))


def _properties(definition: ToolDefinition) -> dict[str, Any]:
    """A tool's parameters by name; {} for a schema whose `properties` is not an object (an MCP server's
    tool may have any schema: one broken tool must not break the search of the whole catalogue)."""
    properties = definition.parameters.get("properties") if isinstance(definition.parameters, dict) else None
    return {str(k): v for k, v in properties.items()} if isinstance(properties, dict) else {}


def _fields(definition: ToolDefinition) -> dict[str, str]:
    properties = _properties(definition)
    descriptions = [str(p.get("description", "")) for p in properties.values() if isinstance(p, dict)]
    return {
        "name": definition.name.replace(".", " ").replace("-", " "),
        "description": str(definition.description or ""),
        "param_names": " ".join(properties),
        "param_descriptions": " ".join(descriptions),
    }


def _document(definition: ToolDefinition) -> Counter[str]:
    fields = _fields(definition)
    terms: Counter[str] = Counter()
    for field_name, weight in _FIELD_WEIGHTS:
        for term in tokenize(fields[field_name]):
            terms[term] += weight
    return terms


@dataclass(frozen=True, slots=True)
class SearchHit:
    """One search result: a tool's name and its BM25 score."""

    name: str
    score: float


class ToolIndex:
    """A BM25 index of tool definitions (names, descriptions, parameter names and descriptions)."""

    K1 = 1.2
    B = 0.75

    def __init__(self, definitions: Iterable[ToolDefinition]) -> None:
        self.names: list[str] = []
        self._lengths: list[int] = []
        self._postings: dict[str, list[tuple[int, int]]] = {}
        for definition in definitions:
            terms = _document(definition)
            doc = len(self.names)
            self.names.append(definition.name)
            self._lengths.append(sum(terms.values()))
            for term, count in terms.items():
                self._postings.setdefault(term, []).append((doc, count))
        count = len(self.names)
        self._average = sum(self._lengths) / count if count else 0.0
        self._idf = {
            term: math.log(1 + (count - len(docs) + 0.5) / (len(docs) + 0.5))
            for term, docs in self._postings.items()
        }

    def __len__(self) -> int:
        return len(self.names)

    def search(self, query: str, limit: int = 5, *, exclude: Iterable[str] = ()) -> list[SearchHit]:
        """The best `limit` tools for `query`, best first; tools sharing no term with it are left out."""
        scores: dict[int, float] = {}
        for term in set(tokenize(query)):
            idf = self._idf.get(term)
            if idf is None:
                continue
            for doc, tf in self._postings[term]:
                norm = self.K1 * (1 - self.B + self.B * self._lengths[doc] / (self._average or 1.0))
                scores[doc] = scores.get(doc, 0.0) + idf * tf * (self.K1 + 1) / (tf + norm)
        skip = set(exclude)
        ranked = sorted(scores.items(), key=lambda item: (-item[1], item[0]))
        hits = [
            SearchHit(self.names[doc], round(score, 4))
            for doc, score in ranked
            if self.names[doc] not in skip
        ]
        return hits[:limit]


# -------------------------------------------------------------------------------------- discovery

_QUERY_LIMIT = 1000  # characters of a query that are searched (and echoed in the observation)
_QUERY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "query": {
            "type": "string",
            "description": "what you need a tool for, in a few words, e.g. 'convert currency' or "
            "'weather forecast for a city'",
        }
    },
    "required": ["query"],
}


class ToolDiscovery:
    """Show the model a few tools plus `discover_tools`, which finds more in the agent's catalogue.

    Args:
        always: names of tools that are always shown (the rest of the agent's tools, and its MCP
            servers' tools, are found through `discover_tools`).
        max_results: how many tools one `discover_tools` call adds at most.
        max_discovered: how many discovered tools a run keeps shown; past it the oldest are hidden
            again (they still run when called, and can be discovered again).
    """

    def __init__(
        self, always: str | Iterable[str | Tool] = (), *, max_results: int = 5, max_discovered: int = 20
    ) -> None:
        if (
            not all(type(n) is int for n in (max_results, max_discovered))
            or max_results < 1
            or max_discovered < 1
        ):
            raise ConfigurationError(
                f"max_results and max_discovered must be ≥ 1 (got {max_results}, {max_discovered})"
            )
        given = (always,) if isinstance(always, str) else tuple(always)  # "calculator" is one name, not ten
        names = tuple(n.name if isinstance(n, Tool) else n for n in given)  # a tool stands for its name
        wrong = [n for n in names if not isinstance(n, str)]
        if wrong:
            raise ConfigurationError(
                f"ToolDiscovery(always=...) takes tool names, not {wrong[0]!r}: e.g. always=['calculator']"[
                    :300
                ]
            )
        self.always = names
        if DISCOVER_TOOLS in self.always:
            raise ConfigurationError(f"{DISCOVER_TOOLS!r} is always shown: do not list it in `always`")
        self.max_results = max_results
        self.max_discovered = max_discovered
        self.tool = Tool(
            DISCOVER_TOOLS,
            "Find more tools: many more exist than the ones you see. Describe what you need to do; the best "
            "matching tools are added to the tools you can call from your next step on.",
            _QUERY_SCHEMA,
            self._discover,
            risk=RiskLevel.LOW,
            idempotent=True,
        )
        self._index_key: tuple[Tool, ...] = ()
        self._index: ToolIndex | None = None

    def __repr__(self) -> str:
        return f"ToolDiscovery(always={list(self.always)!r}, max_results={self.max_results})"

    def check(self, names: Sequence[str]) -> None:
        """Fail fast on a catalogue that cannot work: one with a tool named `discover_tools`.

        `always` names are not checked here (an MCP server's tools are only known once connected); a name
        that matches no tool shows nothing, and that tool can still be discovered.
        """
        if DISCOVER_TOOLS in names:
            raise ConfigurationError(
                f"a tool is named {DISCOVER_TOOLS!r}, which tool discovery adds itself: rename that tool"
            )

    def with_tool(self, registry: ToolRegistry) -> ToolRegistry:
        """A run's registry: the whole catalogue plus `discover_tools`."""
        return ToolRegistry([*registry, self.tool])

    def visible_names(self, run: RunContext) -> list[str]:
        """The tools shown to the model: the `always` ones, `discover_tools`, then those discovered."""
        registry, shown = run.tools, set(self.always)
        names = [n for n in registry.names if n in shown or n == DISCOVER_TOOLS]
        names += [n for n in run.state.discovered_tools if n in registry and n not in shown]
        return names

    def index(self, registry: ToolRegistry) -> ToolIndex:
        """The search index of a registry's catalogue (cached until its tools change: the key holds the
        tools themselves, as the `id()` of a tool freed since could be a new tool's)."""
        tools = tuple(t for t in registry if t.name != DISCOVER_TOOLS)
        if self._index is None or tools != self._index_key:
            self._index, self._index_key = ToolIndex(t.definition for t in tools), tools
        return self._index

    def discover(self, run: RunContext, query: str) -> str:
        """Search the catalogue for `query`, show the best new tools from the next call on; the observation."""
        query = " ".join(str(query).split())[:_QUERY_LIMIT]  # a model may send a megabyte
        if not query:
            return "Error: describe what you need a tool for in `query`, e.g. 'send an email'."
        shown = set(self.visible_names(run))
        hits = self.index(run.tools).search(query, self.max_results + len(shown))
        new = [h.name for h in hits if h.name not in shown][: self.max_results]
        already = [h.name for h in hits[: self.max_results] if h.name in shown]
        self._remember(run, new)
        return _describe_results(query, [run.tools.definitions([n])[0] for n in new], already)

    def _remember(self, run: RunContext, names: list[str]) -> None:
        discovered = run.state.discovered_tools
        discovered.extend(n for n in names if n not in discovered)
        del discovered[: max(len(discovered) - self.max_discovered, 0)]

    async def _discover(self, query: str, **extra: Any) -> str:
        """`discover_tools(query)`. Arguments a model adds (`limit`, `category` …) are ignored and the
        observation says so: they raised a TypeError naming this method, which told the model nothing."""
        from ._loop import current_run

        run = current_run.get()
        if run is None:
            return "Error: discover_tools can only be used inside an agent run."
        found = self.discover(run, query)
        if extra:
            ignored = ", ".join(_short(str(name), 40) for name in list(extra)[:5])
            found += f"\n(Ignored argument(s) {ignored}: {DISCOVER_TOOLS} takes only `query`.)"
        return found


def _describe_results(query: str, found: list[ToolDefinition], already: list[str]) -> str:
    lines: list[str] = []
    if found:
        lines.append(f"Found {len(found)} tool(s) for {_short(query, 100)!r}; you can call them from now on:")
        lines += [f"- {_signature(d)}: {_short(d.description)}" for d in found]
    if already:
        lines.append(f"Already available: {', '.join(already)}.")
    if not lines:
        return (
            f"No tool matches {_short(query, 100)!r}. Try other words (the action and the thing it acts on, e.g. "
            "'create invoice'), or answer with what you have."
        )
    return "\n".join(lines)


def _signature(definition: ToolDefinition) -> str:
    properties = _properties(definition)
    required = definition.parameters.get("required") if isinstance(definition.parameters, dict) else None
    needed = {str(n) for n in required} if isinstance(required, list) else set()
    params = [
        f"{name}{'' if name in needed else '?'}: {_type_name(spec)}" for name, spec in properties.items()
    ]
    return f"{definition.name}({', '.join(params)})"


def _type_name(spec: Any) -> str:
    """`string`, `string|null` (a list of types), or `any`."""
    kind = spec.get("type", "any") if isinstance(spec, dict) else "any"
    if isinstance(kind, list):
        return "|".join(str(k) for k in kind) or "any"
    return str(kind)


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
