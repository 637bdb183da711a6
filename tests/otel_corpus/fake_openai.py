"""An OpenAI-compatible chat completions endpoint on loopback that answers a script, for the corpus programs.

CrewAI, LlamaIndex, smolagents, Strands and AutoGen each talk to OpenAI through their own client
class (``openai``'s SDK underneath); pointed at this server (``base_url``) they run as they do against
OpenAI, offline, so their instrumentations see the real request and response objects. Each request
is answered with the next :class:`Reply`; the request's ``model`` names the agent that asks (every
agent of a program gets a model of its own), and a request from another agent than the script's next
one fails the recording. Streaming (server-sent events) is answered as OpenAI does: the message in
deltas, then the finish reason, then the usage only when ``stream_options.include_usage`` asks for it.

Standard library only: the framework environments install nothing of agentlog's.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["FakeOpenAI", "Reply"]


@dataclass(frozen=True)
class Reply:
    """One answer: the model (agent) that must ask, the assistant message's text or tool calls, the usage."""

    model: str
    tokens_in: int
    tokens_out: int
    text: str | None = None
    #: (call id, tool name, arguments dict) per tool call.
    tool_calls: tuple[tuple[str, str, dict[str, Any]], ...] = ()

    @property
    def finish_reason(self) -> str:
        return "tool_calls" if self.tool_calls else "stop"

    def message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": self.text, "refusal": None}
        if self.tool_calls:
            msg["tool_calls"] = [{"id": cid, "type": "function", "function": {
                "name": name, "arguments": json.dumps(args)}} for cid, name, args in self.tool_calls]
        return msg

    def usage(self) -> dict[str, Any]:
        return {"prompt_tokens": self.tokens_in, "completion_tokens": self.tokens_out,
                "total_tokens": self.tokens_in + self.tokens_out,
                "prompt_tokens_details": {"cached_tokens": 0}, "completion_tokens_details": {"reasoning_tokens": 0}}


@dataclass
class FakeOpenAI:
    """Serves ``replies`` in order at :attr:`base_url`; :attr:`requests` keeps each request body as sent."""

    replies: list[Reply]
    requests: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._next = 0
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                if not self.path.endswith("/chat/completions"):
                    self._send(404, {"error": {"message": f"the fake serves chat completions, not {self.path}"}})
                    return
                try:
                    i, reply = fake._take(body)
                except AssertionError as e:
                    fake.errors.append(str(e))
                    self._send(400, {"error": {"message": str(e), "type": "invalid_request_error"}})
                    return
                if body.get("stream"):
                    self._stream(i, reply, bool((body.get("stream_options") or {}).get("include_usage")))
                else:
                    self._send(200, {"id": f"chatcmpl-{i}", "object": "chat.completion", "created": 1_700_000_000,
                                     "model": reply.model, "choices": [{"index": 0, "message": reply.message(),
                                                                        "finish_reason": reply.finish_reason,
                                                                        "logprobs": None}],
                                     "usage": reply.usage(), "system_fingerprint": None})

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, i: int, reply: Reply, include_usage: bool) -> None:
                base = {"id": f"chatcmpl-{i}", "object": "chat.completion.chunk", "created": 1_700_000_000,
                        "model": reply.model, "system_fingerprint": None}
                delta: dict[str, Any] = {"role": "assistant", "content": reply.text or ""}
                chunks = [{**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}]
                for n, (cid, name, args) in enumerate(reply.tool_calls):
                    chunks.append({**base, "choices": [{"index": 0, "finish_reason": None, "delta": {"tool_calls": [
                        {"index": n, "id": cid, "type": "function",
                         "function": {"name": name, "arguments": json.dumps(args)}}]}}]})
                chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": reply.finish_reason}]})
                if include_usage:
                    chunks.append({**base, "choices": [], "usage": reply.usage()})
                data = b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}/v1"

    def _take(self, body: dict[str, Any]) -> tuple[int, Reply]:
        with self._lock:
            self.requests.append(body)
            i = self._next
            assert i < len(self.replies), f"request {i} from {body.get('model')!r}: the script has {i} replies"
            reply = self.replies[i]
            assert body.get("model") == reply.model, (
                f"request {i}: the script expects {reply.model!r}, {body.get('model')!r} asked")
            self._next += 1
            return i, reply

    def check_done(self) -> None:
        """Every reply served and no request refused (the program made the scripted calls, in order)."""
        assert not self.errors, self.errors
        assert self._next == len(self.replies), f"the program made {self._next} of {len(self.replies)} scripted calls"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
