"""sandboxd's tools as LangChain tools (``pip install './clients/python[langchain]'``).

    from sandboxd import Client
    from sandboxd.langchain import sandboxd_tools

    with Client() as client, client.session() as session:
        tools = sandboxd_tools(client, session)        # bound to the session
        llm_with_tools = llm.bind_tools(tools)

Each tool's schema and description are the daemon's (the tools MCP serves). A
call's content is its text; the figures it made are its artifact (data URLs), for
the application to show. Bound to a session, the tools act in it and the model
never names one; unbound, they include the tools that make and close sessions.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from langchain_core.tools import BaseTool, StructuredTool

from . import _glue
from ._sync import Client, Session


def sandboxd_tools(client: Client, session: Optional[Session] = None) -> list[BaseTool]:
    """The daemon's tools as LangChain ``StructuredTool``s (``response_format``
    ``content_and_artifact``: the text, and the figures as data URLs)."""
    def caller(name: str) -> Callable[..., tuple[str, list[str]]]:
        # The name is the closure's: no argument of the model's can choose it.
        def run(**arguments: Any) -> tuple[str, list[str]]:
            answer = _glue.call(client, session, name, arguments)
            return answer.text, answer.images

        return run

    tools: list[BaseTool] = []
    for d in _glue.definitions(client, session):
        tools.append(
            StructuredTool.from_function(
                func=caller(d.name),
                name=d.name,
                description=d.description,
                args_schema=d.schema,
                infer_schema=False,
                response_format="content_and_artifact",
            )
        )
    return tools
