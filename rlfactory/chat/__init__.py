"""ToolManagers per model family (qwen3, llama3, searchr1, template, user classes) and the token contract."""

from rlfactory.chat.base import Answer, Malformed, ParseResult, ToolCalls, ToolManager
from rlfactory.chat.contract import TokenContractError, check_token_contract
from rlfactory.chat.llama3 import Llama3ToolManager
from rlfactory.chat.qwen3 import Qwen3ToolManager
from rlfactory.chat.registry import FAMILIES, guess_family, make_tool_manager
from rlfactory.chat.searchr1 import SearchR1ToolManager
from rlfactory.chat.template import ChatTemplate, ModelTurn
from rlfactory.chat.template_family import TemplateToolManager

__all__ = [
    "Answer", "ChatTemplate", "FAMILIES", "Llama3ToolManager", "Malformed", "ModelTurn", "ParseResult",
    "Qwen3ToolManager", "SearchR1ToolManager", "TemplateToolManager", "TokenContractError", "ToolCalls", "ToolManager",
    "check_token_contract", "guess_family", "make_tool_manager",
]
