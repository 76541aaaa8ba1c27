"""One adapter per provider: a model policy's candidates may name different providers
(``anthropic`` first, ``openai`` on fallback), and a worker answers each with the adapter it
configured for that provider."""

from __future__ import annotations

from collections.abc import Mapping

from agentrt.runtime.v1 import enum_pb2
from agentrt_sdk.models.base import ModelAdapter, ModelError, ModelRequest, ModelResponse


class ProviderRouter:
    """A :class:`~agentrt_sdk.models.base.ModelAdapter` that hands each request to the adapter
    registered for ``request.provider``.

    Args:
        adapters: Adapter by provider name (``ResolvedModel.provider``).
        default: The adapter for a provider not in ``adapters``; None: such a request fails.
    """

    def __init__(
        self, adapters: Mapping[str, ModelAdapter], *, default: ModelAdapter | None = None
    ) -> None:
        self._adapters = dict(adapters)
        self._default = default

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Complete ``request`` with its provider's adapter.

        Raises:
            ModelError: ``ERROR_CLASS_WORKER_ERROR`` when this worker has no adapter for the
                provider (its configuration, not the provider, is at fault), or whatever the
                adapter raised.
        """
        adapter = self._adapters.get(request.provider, self._default)
        if adapter is None:
            known = ", ".join(sorted(self._adapters)) or "none"
            raise ModelError(
                enum_pb2.ERROR_CLASS_WORKER_ERROR,
                f"this worker has no model adapter for provider {request.provider!r} "
                f"(it has: {known})",
                retryable=False,
            )
        return await adapter.complete(request)
