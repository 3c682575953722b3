"""A misbehaving MCP server over stdio, for tests/test_mcp.py (built on the SDK's low-level server).

    python tests/mcp_servers/faulty.py [--banner] [--no-handshake] [--tool-names] [--bad-schemas] [--once FILE]

Tools: `echo`, `hang` (never returns), `block` (blocks the server's event loop: it answers nothing any
more, not even a ping), `pid` (the server's pid), `crash` (the process exits mid-call), `exit_soon`
(answers, then the process exits while idle), `garbage` (writes a non-JSON line to the wire, then
answers), `bad_result` (answers with a result that is no tool result), `fail` (an `isError` result),
`fail_empty` (one without content), `image`, `resource`, `blob`, `link` (a resource link), `mixed` (text,
audio and structured content), `empty`, `huge` (`size` characters), `spawn` (starts a child process that
outlives the server's own exit unless killed, and prints its pid).

Options: `--banner` prints a line to stdout before speaking MCP; `--no-handshake` reads stdin forever
without ever answering; `--tool-names` adds tools with names invalid for a model; `--bad-schemas` adds
tools whose input schemas use `$ref`/`$defs`, are not objects, or are broken; `--once FILE` starts only
once (it creates FILE; a second start finds it and exits with an error).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

WIRE = os.dup(1)  # the real stdout: stdio_server diverts fd 1 to stderr while it serves
TEXT = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
EMPTY: dict[str, Any] = {"type": "object", "properties": {}}
SIZE = {"type": "object", "properties": {"size": {"type": "integer"}}, "required": ["size"]}

TOOLS = {
    "echo": TEXT,
    "hang": EMPTY,
    "block": EMPTY,
    "pid": EMPTY,
    "crash": EMPTY,
    "exit_soon": EMPTY,
    "garbage": EMPTY,
    "bad_result": EMPTY,
    "fail": EMPTY,
    "fail_empty": EMPTY,
    "image": EMPTY,
    "resource": EMPTY,
    "blob": EMPTY,
    "link": EMPTY,
    "mixed": EMPTY,
    "empty": EMPTY,
    "huge": SIZE,
    "spawn": EMPTY,
}
ODD_NAMES = {
    "get weather!": TEXT,
    "get weather?": TEXT,
    "ns/tool.v2": TEXT,
    "9lives": TEXT,
    "x" * 100: TEXT,
    "échelle": TEXT,
}
BAD_SCHEMAS: dict[str, Any] = {
    "with_ref": {
        "type": "object",
        "properties": {"point": {"$ref": "#/$defs/Point"}},
        "required": ["point"],
        "$defs": {
            "Point": {
                "type": "object",
                "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                "required": ["x", "y"],
            }
        },
    },
    "broken": {"type": "object", "properties": {"n": {"type": "no-such-type"}}},
    "dangling_ref": {"type": "object", "properties": {"p": {"$ref": "#/$defs/Missing"}}},
}


def _tools() -> dict[str, Any]:
    tools = dict(TOOLS)
    if "--tool-names" in sys.argv:
        tools.update(ODD_NAMES)
    if "--bad-schemas" in sys.argv:
        tools.update(BAD_SCHEMAS)
    return tools


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    tools = [types.Tool(name=n, description=f"the {n} tool", input_schema=s) for n, s in _tools().items()]
    return types.ListToolsResult(tools=tools)


def _text(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


def _content_kinds() -> dict[str, types.CallToolResult]:
    """The results of the tools that answer with content other than plain text."""
    png = base64.b64encode(b"\x89PNG" + b"\0" * 96).decode()
    notes = types.TextResourceContents(uri="file:///notes.txt", mime_type="text/plain", text="the notes")
    blob = types.BlobResourceContents(
        uri="file:///a.bin", mime_type=None, blob=base64.b64encode(b"xy").decode()
    )
    link = types.ResourceLink(
        type="resource_link", uri="file:///report.pdf", name="report", mime_type="application/pdf",
        description="the quarterly report",
    )  # fmt: skip
    audio = types.AudioContent(type="audio", data=base64.b64encode(b"RIFF").decode(), mime_type="audio/wav")
    return {
        "fail": types.CallToolResult(
            content=[types.TextContent(type="text", text="no such city")], is_error=True
        ),
        "fail_empty": types.CallToolResult(content=[], is_error=True),
        "image": types.CallToolResult(
            content=[types.ImageContent(type="image", data=png, mime_type="image/png")]
        ),
        "resource": types.CallToolResult(content=[types.EmbeddedResource(type="resource", resource=notes)]),
        "blob": types.CallToolResult(content=[types.EmbeddedResource(type="resource", resource=blob)]),
        "link": types.CallToolResult(content=[link]),
        "mixed": types.CallToolResult(
            content=[types.TextContent(type="text", text="a recording:"), audio],
            structured_content={"seconds": 1.5},
        ),
        "empty": types.CallToolResult(content=[]),
    }


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    name, args = params.name, params.arguments or {}
    if name == "hang":
        await anyio.sleep_forever()
    if name == "block":
        time.sleep(3600)  # noqa: ASYNC251  # the point: the server's event loop stops
    if name == "pid":
        return _text(str(os.getpid()))
    if name == "crash":
        os._exit(3)
    if name == "exit_soon":
        threading.Timer(0.2, os._exit, [0]).start()
        return _text("bye")
    if name == "bad_result":  # the answer to this call, in a shape no CallToolResult has; then sleeps
        answer = {
            "jsonrpc": "2.0",
            "id": ctx.request_id,
            "result": {"content": "not a list", "isError": "maybe"},
        }
        os.write(WIRE, (json.dumps(answer) + "\n").encode())
        await anyio.sleep_forever()
    if name == "garbage":
        os.write(WIRE, b"this is not JSON-RPC\n")
        return _text("after garbage")
    if name == "huge":
        return _text("h" * int(args["size"]))
    if name == "spawn":
        sleeper = [sys.executable, "-c", "import time; time.sleep(3600)"]
        child = await anyio.open_process(sleeper, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        return _text(str(child.pid))
    return _content_kinds().get(name) or _text(f"{name}: {args.get('text', args)}")


async def main() -> None:
    server = Server("faulty", on_list_tools=list_tools, on_call_tool=call_tool)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    print(f"pid {os.getpid()}", file=sys.stderr, flush=True)
    if "--once" in sys.argv:
        marker = Path(sys.argv[sys.argv.index("--once") + 1])
        if marker.exists():
            sys.exit(f"started before ({marker} exists): this server starts only once")
        marker.touch()
    if "--no-handshake" in sys.argv:
        sys.stdin.read()
        time.sleep(3600)
    if "--banner" in sys.argv:
        print("Starting faulty MCP server v1.0 ...", flush=True)
    anyio.run(main)
