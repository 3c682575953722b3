"""An MCP server that announces `notifications/tools/list_changed` carelessly, for tests/test_mcp.py.

    python tests/mcp_servers/storm.py echo      # announces a change while answering every tools/list
    python tests/mcp_servers/storm.py hang      # every tools/list after the first never answers

Seen in the wild: a server that announces a change whenever its tools are listed (it rebuilds the list,
and announces that it did), which a client refetching on every announcement lists without end; and a
server whose listing stalls. Its tools: `listings` answers how many times its tools were listed;
`announce` announces a change, then answers "announced".
"""

from __future__ import annotations

import sys
from typing import Any

import anyio
import mcp.types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

MODE = sys.argv[1] if len(sys.argv) > 1 else "echo"
LISTED = 0
NO_ARGUMENTS: dict[str, Any] = {"type": "object", "properties": {}}
TOOLS = [
    types.Tool(
        name="listings", description="How many times the tools were listed.", input_schema=NO_ARGUMENTS
    ),
    types.Tool(name="announce", description="Announce a changed tool list.", input_schema=NO_ARGUMENTS),
]


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    global LISTED
    LISTED += 1
    if MODE == "echo":
        await ctx.session.send_tool_list_changed()
    elif MODE == "hang" and LISTED > 1:
        await anyio.sleep_forever()
    return types.ListToolsResult(tools=TOOLS)


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    if params.name == "announce":
        await ctx.session.send_tool_list_changed()
        text = "announced"
    else:
        text = str(LISTED)
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


async def main() -> None:
    server = Server("storm", on_list_tools=list_tools, on_call_tool=call_tool)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
