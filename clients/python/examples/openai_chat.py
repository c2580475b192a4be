"""An agent loop over OpenAI's Chat Completions with sandboxd's tools.

    SANDBOXD_SOCKET=/run/sandboxd/sandboxd.sock OPENAI_API_KEY=... \\
        python examples/openai_chat.py "Plot sin(x) on [0, 10] and say where it peaks"
"""

import sys
from typing import Any

import sandboxd.tools as tools


def agent(llm: Any, question: str, model: str = "gpt-4.1", max_turns: int = 10) -> str:
    messages: list[Any] = [{"role": "user", "content": question}]
    for _ in range(max_turns):
        reply = llm.chat.completions.create(model=model, messages=messages, tools=tools.openai()).choices[0].message
        messages.append(reply.model_dump(exclude_none=True))
        if not reply.tool_calls:
            return str(reply.content)
        for call in reply.tool_calls:
            answer = tools.call(call.function.name, call.function.arguments, format="openai")
            messages += tools.openai_messages(call.id, answer)
    return "(gave up after max_turns)"


if __name__ == "__main__":
    from openai import OpenAI

    print(agent(OpenAI(), " ".join(sys.argv[1:]) or "What is the 30th Fibonacci number? Compute it."))
