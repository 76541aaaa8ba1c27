"""A small OpenAI-compatible chat-completions server on loopback, for tests of model adapters
and of workers that call a model over real HTTP.

The server answers ``POST /v1/chat/completions`` (any path, in fact) with the next queued
:class:`Answer`, or, when none is queued, with what ``responder(request)`` returns; with neither
it answers a 500 saying so, so a test that makes a call it did not plan for fails loudly. Every
request is recorded (``requests``), with its parsed JSON body and headers, so a test can assert
what the client sent and how many times it sent it.

Use it as a context manager; ``base_url`` is what ``OPENAI_BASE_URL`` should be::

    with OpenAIServer() as server:
        server.queue(error(429, "rate_limit_exceeded", headers={"Retry-After": "2"}))
        server.queue(Answer(body=completion("done", model="gpt-4.1-2025-04-14")))
        ...

A responder can script by model, e.g. rate limit the primary once, for a fallback test::

    def responder(request):
        if request.body["model"] == "primary" and server.count("primary") == 1:
            return error(429, "rate_limit_exceeded")
        return Answer(body=completion("ok", model=request.body["model"]))

The server runs in a thread of the test process, so worker processes the test starts reach it
too (pass ``base_url`` in their environment).
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class RecordedRequest:
    """One request the server received."""

    method: str
    path: str
    #: Header names lower-cased.
    headers: Mapping[str, str]
    #: The parsed JSON body (None if the body was not JSON).
    body: Any


@dataclass(frozen=True)
class Answer:
    """What to answer one request with.

    Attributes:
        status: The HTTP status.
        body: A JSON-serialisable body, or ``bytes`` sent as they are.
        headers: Extra response headers (``Retry-After`` ...).
        hang: Never answer: the handler waits until the server closes (a provider that does not
            answer in time; the client's timeout must fire).
    """

    status: int = 200
    body: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)
    hang: bool = False


def completion(
    content: str | None = "",
    *,
    model: str = "test-model",
    tool_calls: Sequence[Mapping[str, Any]] = (),
    finish_reason: str | None = None,
    prompt_tokens: int = 11,
    completion_tokens: int = 7,
) -> dict[str, Any]:
    """A chat.completion body, as the OpenAI API answers one (one choice).

    ``tool_calls`` are wire tool calls (``tool_call(...)`` builds one); ``finish_reason``
    defaults to ``tool_calls`` when there are some, else ``stop``.
    """
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = list(tool_calls)
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": finish_reason or ("tool_calls" if tool_calls else "stop"),
                "logprobs": None,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def tool_call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    """A wire tool call; ``arguments`` is JSON-encoded unless it already is a string (so a test
    can send malformed JSON)."""
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": text}}


def error(
    status: int,
    code: str | None,
    message: str = "scripted error",
    *,
    error_type: str = "invalid_request_error",
    headers: Mapping[str, str] | None = None,
) -> Answer:
    """An error answer with the OpenAI error body (``{"error": {"message", "type", "param",
    "code"}}``)."""
    body = {"error": {"message": message, "type": error_type, "param": None, "code": code}}
    return Answer(status=status, body=body, headers=dict(headers or {}))


class OpenAIServer:
    """The server; see the module docstring.

    Args:
        responder: Answers a request when no answer is queued.
    """

    def __init__(self, responder: Callable[[RecordedRequest], Answer] | None = None) -> None:
        self.responder = responder
        self.requests: list[RecordedRequest] = []
        self._answers: deque[Answer] = deque()
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        # A short poll so that close() (shutdown waits for the next poll) does not add half a
        # second to every test.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.02},
            name="openai-test-server",
            daemon=True,
        )

    @property
    def base_url(self) -> str:
        """The API root to give a client (``http://127.0.0.1:PORT/v1``)."""
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def queue(self, *answers: Answer) -> None:
        """Answer the next requests with ``answers``, in order."""
        with self._lock:
            self._answers.extend(answers)

    def count(self, model: str | None = None) -> int:
        """Requests received so far (naming ``model``, if given)."""
        with self._lock:
            return sum(
                1
                for request in self.requests
                if model is None
                or (isinstance(request.body, dict) and request.body.get("model") == model)
            )

    def start(self) -> OpenAIServer:
        self._thread.start()
        return self

    def close(self) -> None:
        # Release hanging handlers first: shutdown() waits for serve_forever, not for them.
        self._closing.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()

    def __enter__(self) -> OpenAIServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _answer(self, request: RecordedRequest) -> Answer:
        with self._lock:
            self.requests.append(request)
            queued = self._answers.popleft() if self._answers else None
        if queued is not None:
            return queued
        if self.responder is not None:
            return self.responder(request)
        return error(500, None, "the test scripted no answer for this request", error_type="test")

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            # Keep-alive, as real endpoints do, so the client's connection pool is exercised.
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = None
                request = RecordedRequest(
                    method="POST",
                    path=self.path,
                    headers={name.lower(): value for name, value in self.headers.items()},
                    body=body,
                )
                answer = server._answer(request)
                if answer.hang:
                    server._closing.wait()
                    self.close_connection = True
                    return
                payload = (
                    answer.body
                    if isinstance(answer.body, bytes)
                    else json.dumps(answer.body).encode()
                )
                self.send_response(answer.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                for name, value in answer.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                # Quiet: pytest shows the test's own output, not an access log.
                pass

        return Handler
