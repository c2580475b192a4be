"""An agent loop over OpenAI's Responses API with sandboxd's tools.

    SANDBOXD_SOCKET=/run/sandboxd/sandboxd.sock OPENAI_API_KEY=... \\
        python examples/openai_responses.py "Plot sin(x) on [0, 10] and say where it peaks"
"""

import sys
from typing import Any

import sandboxd.tools as tools


def agent(llm: Any, question: str, model: str = "gpt-4.1", max_turns: int = 10) -> str:
    items: list[Any] = [{"role": "user", "content": question}]
    for _ in range(max_turns):
        reply = llm.responses.create(model=model, input=items, tools=tools.openai_responses())
        calls = [o for o in reply.output if o.type == "function_call"]
        if not calls:
            return str(reply.output_text)
        items += [o.model_dump(exclude_none=True) for o in reply.output]
        for call in calls:
            answer = tools.call(call.name, call.arguments, format="openai-responses")
            items.append(tools.openai_responses_item(call.call_id, answer))
    return "(gave up after max_turns)"


if __name__ == "__main__":
    from openai import OpenAI

    print(agent(OpenAI(), " ".join(sys.argv[1:]) or "What is the 30th Fibonacci number? Compute it."))
