"""An agent loop over Anthropic's Messages API with sandboxd's tools.

    SANDBOXD_SOCKET=/run/sandboxd/sandboxd.sock ANTHROPIC_API_KEY=... \\
        python examples/anthropic_messages.py "Plot sin(x) on [0, 10] and say where it peaks"
"""

import sys
from typing import Any

import sandboxd.tools as tools


def agent(llm: Any, question: str, model: str = "claude-sonnet-4-5", max_turns: int = 10) -> str:
    messages: list[Any] = [{"role": "user", "content": question}]
    for _ in range(max_turns):
        reply = llm.messages.create(model=model, max_tokens=4096, messages=messages, tools=tools.anthropic())
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]})
        calls = [b for b in reply.content if b.type == "tool_use"]
        if not calls:
            return "".join(b.text for b in reply.content if b.type == "text")
        results = [tools.anthropic_block(c.id, tools.call(c.name, c.input, format="anthropic")) for c in calls]
        messages.append({"role": "user", "content": results})
    return "(gave up after max_turns)"


if __name__ == "__main__":
    from anthropic import Anthropic

    print(agent(Anthropic(), " ".join(sys.argv[1:]) or "What is the 30th Fibonacci number? Compute it."))
