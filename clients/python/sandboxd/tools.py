"""sandboxd's tools for your own tool loop with an LLM API, in ten lines.

    import sandboxd.tools as tools
    resp = openai.chat.completions.create(model=..., messages=messages, tools=tools.openai())
    for call in resp.choices[0].message.tool_calls or []:
        answer = tools.call(call.function.name, call.function.arguments)
        messages += tools.openai_messages(call.id, answer)

The definitions are the daemon's (``GET /v1/tools``, the same tools MCP
serves); a call runs on the daemon (``POST /v1/tools/{name}``) as your token.
The module-level functions use a :class:`~sandboxd.Client` made from the
environment (``SANDBOXD_SOCKET``, ``SANDBOXD_URL``, ``SANDBOXD_TOKEN``);
``client.tools`` has the same methods for a client of your own.
"""

from __future__ import annotations

import threading
from typing import Any, Optional

from ._sync import Client

_lock = threading.Lock()
_client: Optional[Client] = None


def _default() -> Client:
    global _client
    with _lock:
        if _client is None:
            _client = Client()
        return _client


def definitions(format: str = "openai") -> list[dict[str, Any]]:
    """The tools in ``format`` (``openai``, ``openai-responses``, ``anthropic``, ``mcp``)."""
    return _default().tools.definitions(format)


def openai() -> list[dict[str, Any]]:
    """The tools as OpenAI's Chat Completions take them (``tools=``)."""
    return _default().tools.openai()


def openai_responses() -> list[dict[str, Any]]:
    """The tools as OpenAI's Responses API takes them (``tools=``)."""
    return _default().tools.openai_responses()


def anthropic() -> list[dict[str, Any]]:
    """The tools as Anthropic's Messages API takes them (``tools=``)."""
    return _default().tools.anthropic()


def call(name: str, arguments: Any = None, *, format: str = "openai") -> dict[str, Any]:
    """Run one tool call (``arguments``: a dict, or the model's JSON string) and
    return what to hand back, in ``format``'s shape."""
    return _default().tools.call(name, arguments, format=format)


def openai_messages(tool_call_id: str, answer: dict[str, Any]) -> list[dict[str, Any]]:
    """The Chat Completions messages that hand ``answer`` (a ``format="openai"``
    call's) back: the tool message, and a user message with the figures when
    there are any (a tool message carries text only)."""
    messages: list[dict[str, Any]] = [{"role": "tool", "tool_call_id": tool_call_id, "content": answer["content"]}]
    if answer.get("images"):
        messages.append({"role": "user", "content": [{"type": "text", "text": "The figures of that call:"}, *answer["images"]]})
    return messages


def openai_responses_item(call_id: str, answer: dict[str, Any]) -> dict[str, Any]:
    """The Responses API input item that hands ``answer`` (a
    ``format="openai-responses"`` call's) back."""
    return {"type": "function_call_output", "call_id": call_id, "output": answer["output"]}


def anthropic_block(tool_use_id: str, answer: dict[str, Any]) -> dict[str, Any]:
    """The ``tool_result`` block that hands ``answer`` (a ``format="anthropic"``
    call's) back, for the next user message."""
    return {"type": "tool_result", "tool_use_id": tool_use_id, "content": answer["content"], "is_error": answer["is_error"]}
