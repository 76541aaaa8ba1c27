"""Model adapters: one small interface (:mod:`agentrt_sdk.models.base`), an adapter for any
OpenAI-compatible chat-completions endpoint (:mod:`agentrt_sdk.models.openai_compat`), a
deterministic scripted model for tests and demos (:mod:`agentrt_sdk.models.scripted`), and a
router that picks the adapter by provider (:mod:`agentrt_sdk.models.router`).

``OpenAICompatibleModel`` is imported on first use: the ``openai`` package takes seconds to
import, which a worker that only plays a script (or a test) should not pay.
"""

from typing import TYPE_CHECKING, Any

from agentrt_sdk.models.base import (
    ModelAdapter,
    ModelError,
    ModelRequest,
    ModelResponse,
    ToolCall,
    ToolSpec,
)
from agentrt_sdk.models.router import ProviderRouter
from agentrt_sdk.models.scripted import (
    Fail,
    Reply,
    ScriptedModel,
    ScriptExhaustedError,
    count_tokens,
)

__all__ = [
    "Fail",
    "ModelAdapter",
    "ModelError",
    "ModelRequest",
    "ModelResponse",
    "OpenAICompatibleModel",
    "ProviderRouter",
    "Reply",
    "ScriptExhaustedError",
    "ScriptedModel",
    "ToolCall",
    "ToolSpec",
    "count_tokens",
]

if TYPE_CHECKING:
    from agentrt_sdk.models.openai_compat import OpenAICompatibleModel


def __getattr__(name: str) -> Any:
    if name == "OpenAICompatibleModel":
        from agentrt_sdk.models.openai_compat import OpenAICompatibleModel

        return OpenAICompatibleModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
