"""An agent written with the OpenAI Python SDK and nothing of rlfactory's: a function-tool loop.

`rlfactory train examples/gateway/train.yaml` trains it (env.name: agent): the trainer starts
`agent(row, client)` for each row, many at once, each with its own episode key as the API key;
`reward(row, answer)` scores what it returns.
"""

from __future__ import annotations

import json
from typing import Any

from openai import AsyncOpenAI

TOOLS = [{
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                       "required": ["a", "b"]},
    },
}]


def add(a: int, b: int) -> int:
    return a + b


async def run_agent(client: AsyncOpenAI, model: str, question: str, max_turns: int = 4) -> tuple[str, list[dict]]:
    """The agent's own loop: ask, run the tools the model calls, repeat until it answers.
    Returns the answer and the conversation it sent."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You add numbers with the add tool."},
                                      {"role": "user", "content": question}]
    for _ in range(max_turns):
        reply = await client.chat.completions.create(model=model, messages=messages, tools=TOOLS, temperature=1.0)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return message.content or "", messages
        for call in message.tool_calls:
            try:
                result = str(add(**json.loads(call.function.arguments)))
            except (TypeError, ValueError) as e:  # the model's arguments are its problem, shown to it
                result = f"error: {e}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return "", messages


async def agent(row: dict, client: Any) -> str:
    """Entry point: `client` (rlfactory's AgentClient) carries base_url, api_key and model;
    `client.openai()` is `AsyncOpenAI(base_url=..., api_key=...)` on a connection pool shared by
    the step's episodes."""
    async with client.openai(max_retries=0) as openai_client:
        answer, _ = await run_agent(openai_client, client.model, row["question"])
    return answer


def reward(row: dict, answer: str) -> float:
    return float(str(row["answer"]) in answer)
