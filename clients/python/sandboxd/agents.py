"""sandboxd's tools as OpenAI Agents SDK function tools
(``pip install openai-agents``).

    from agents import Agent, Runner
    from sandboxd import Client
    from sandboxd.agents import sandboxd_tools

    with Client() as client, client.session() as session:
        agent = Agent(name="analyst", tools=sandboxd_tools(client, session))
        print(Runner.run_sync(agent, "Plot sin(x) and say where it peaks").final_output)

Each tool's schema and description are the daemon's (the tools MCP serves); a call
answers the model the tool's text (bad arguments included, for the model to act
on). Bound to a session, the tools act in it and the model never names one.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, Optional

from agents import FunctionTool, RunContextWrapper

from . import _glue
from ._sync import Client, Session


def sandboxd_tools(client: Client, session: Optional[Session] = None) -> list[FunctionTool]:
    """The daemon's tools as ``FunctionTool``s (not strict: their optional
    arguments stay optional)."""
    def invoker(name: str) -> Callable[[RunContextWrapper[Any], str], Awaitable[str]]:
        async def invoke(_ctx: RunContextWrapper[Any], arguments: str) -> str:
            # The sync client, off the event loop.
            answer = await asyncio.to_thread(_glue.call, client, session, name, arguments)
            note = f"\n({len(answer.images)} figure(s) made)" if answer.images else ""
            return answer.text + note

        return invoke

    tools = []
    for d in _glue.definitions(client, session):
        tools.append(
            FunctionTool(
                name=d.name,
                description=d.description,
                params_json_schema=d.schema,
                on_invoke_tool=invoker(d.name),
                strict_json_schema=False,
            )
        )
    return tools
