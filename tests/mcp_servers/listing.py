"""An MCP server whose `tools/list` answer is whatever JSON a test gives, for tests/test_mcp.py.

    python tests/mcp_servers/listing.py RESULT_JSON
    python tests/mcp_servers/listing.py error

Servers built on other SDKs, or by hand, publish listings the Python SDK's own server refuses to send
("Handler returned an invalid result"): input schemas that are not objects, `properties` that is a
list, `required` naming nothing, a `tools` that is not a list. This is the SDK's low-level server; the
result of its `tools/list` answer is replaced by RESULT_JSON (any JSON value) on its way to the wire.
`error` makes `tools/list` fail with a JSON-RPC error instead. `tools/call` answers with the tool's
name and the arguments it received, as JSON text.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import anyio
import mcp.types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage

MODE = sys.argv[1] if len(sys.argv) > 1 else '{"tools": []}'
PLACEHOLDER = "__replaced_on_the_wire__"


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    if MODE == "error":
        raise MCPError(code=-32603, message="database of tools is locked")
    return types.ListToolsResult(tools=[types.Tool(name=PLACEHOLDER, input_schema={"type": "object"})])


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    text = json.dumps({"tool": params.name, "arguments": params.arguments}, sort_keys=True)
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


class Rewriting:
    """The server's write stream, replacing the placeholder listing by RESULT_JSON."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    async def send(self, item: SessionMessage) -> None:
        message = item.message
        result = getattr(message, "result", None)
        if isinstance(result, dict) and PLACEHOLDER in json.dumps(result):
            raw = types.JSONRPCResponse.model_construct(jsonrpc="2.0", id=message.id, result=json.loads(MODE))
            item = SessionMessage(message=raw)
        await self._inner.send(item)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def __aenter__(self) -> Rewriting:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self._inner.__aexit__(*exc)


async def main() -> None:
    server = Server("listing", on_list_tools=list_tools, on_call_tool=call_tool)
    async with stdio_server() as (read, write):
        await server.run(read, Rewriting(write), server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
