"""An agent written with the OpenAI Agents SDK (`pip install openai-agents`), unchanged: the SDK's
own runner calls the model through the chat-completions API and runs the function tool itself."""

from __future__ import annotations

from typing import Any

from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled

set_tracing_disabled(True)  # no trace upload: the trainer records what matters


@function_tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def agent(row: dict, client: Any) -> str:
    model = OpenAIChatCompletionsModel(model=client.model, openai_client=client.openai(max_retries=0))
    calculator = Agent(name="calculator", instructions="You add numbers with the add tool.", tools=[add], model=model)
    result = await Runner.run(calculator, row["question"], max_turns=4)
    return str(result.final_output)


def reward(row: dict, answer: str) -> float:
    return float(str(row["answer"]) in answer)
