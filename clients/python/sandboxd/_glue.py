"""What the framework glue (:mod:`sandboxd.langchain`, :mod:`sandboxd.agents`)
shares: the daemon's tools, optionally bound to one session, and a call's answer
as text and images."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ._sync import Client, Session

#: The tools that act inside one session (the others make or close sessions).
SESSION_TOOLS = ("run_python", "run_shell", "install_packages", "upload_file", "list_files", "read_file")


@dataclass
class Definition:
    name: str
    description: str
    schema: dict[str, Any]


@dataclass
class Answer:
    text: str
    #: Each image as a data URL (``data:image/png;base64,...``).
    images: list[str]
    is_error: bool


def definitions(client: Client, session: Optional[Session]) -> list[Definition]:
    """The daemon's tools; bound to `session`, only those that act in one, without
    their `session_id` argument (the session is the binding's)."""
    out = []
    for t in client.tools.definitions("anthropic"):
        schema = dict(t["input_schema"])
        if session is not None:
            if t["name"] not in SESSION_TOOLS:
                continue
            schema["properties"] = {k: v for k, v in schema.get("properties", {}).items() if k != "session_id"}
            schema["required"] = [r for r in schema.get("required", []) if r != "session_id"]
        out.append(Definition(t["name"], t["description"], schema))
    return out


def call(client: Client, session: Optional[Session], name: str, arguments: Any) -> Answer:
    """Run one call (`arguments` a dict, or the model's JSON string)."""
    if session is not None:
        # Bound: the call goes to this session whatever the model wrote, so
        # only one JSON object is taken (never a string holding one, which the
        # daemon would read without the binding), its session_id set here.
        if isinstance(arguments, (str, bytes)):
            import json

            try:
                arguments = json.loads(arguments or "{}")
            except ValueError as e:
                return Answer(f"error invalid_request: the arguments are not JSON ({e}): send one JSON object", [], True)
        if not isinstance(arguments, dict):
            return Answer("error invalid_request: the arguments are not one JSON object: send one", [], True)
        arguments = {**arguments, "session_id": session.id}
    answer = client.tools.call(name, arguments, format="anthropic")
    blocks = answer.get("content", [])
    return Answer(
        text="\n".join(b.get("text", "") for b in blocks if b.get("type") == "text"),
        images=[
            f"data:{b['source'].get('media_type', 'image/png')};base64,{b['source'].get('data', '')}"
            for b in blocks
            if b.get("type") == "image" and isinstance(b.get("source"), dict)
        ],
        is_error=bool(answer.get("is_error")),
    )
