"""A small OpenAI-compatible chat-completions server that answers deterministically.

It stands in for vLLM or SGLang where no target is served: the tests of
`ringtrain-data regenerate` and `tools/bench/bench_regenerate.py` start it on 127.0.0.1, and
it lets the regenerate -> prepare flow be tried without a GPU:

    python -m ringtrain.testing.chat_server --port 8000 --model echo
    ringtrain-data regenerate --server http://127.0.0.1:8000/v1 --model echo \\
        --input chats.jsonl --output regenerated.jsonl

The answer to a conversation is a function of the whole conversation (`answer_for`), so
a test can check what each request contained. With an ``api_key`` it answers only requests
that carry it (``Authorization: Bearer KEY``), as a hosted endpoint does, and HTTP 401
otherwise. `Faults` injects what real servers do:
HTTP 429/500/503, dropped connections, answers whose message lacks `content`, requests left
unanswered past the client's timeout, a server that stops answering after N requests, and a gate
that holds answers back until it is opened.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import threading
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HANG_LIMIT_S = 30.0
POLL_INTERVAL_S = 0.02  # how soon the server notices a shutdown


def answer_for(body: dict[str, Any]) -> dict[str, Any]:
    """The chat-completions response to a request body: content names the last user
    message and a digest of the whole conversation; reasoning unless the chat template
    kwargs say `enable_thinking: false`; `max_tokens` cuts the answer (words are tokens)."""
    messages = body["messages"]
    digest = hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).hexdigest()[:12]
    last_user = next(m["content"] for m in reversed(messages) if m["role"] == "user")
    words = f"answer to {last_user} after {len(messages)} messages digest {digest}".split()
    finish = "stop"
    if body.get("max_tokens") is not None and len(words) > body["max_tokens"]:
        words, finish = words[: body["max_tokens"]], "length"
    message: dict[str, Any] = {"role": "assistant", "content": " ".join(words)}
    if (body.get("chat_template_kwargs") or {}).get("enable_thinking", True):
        message["reasoning_content"] = f"thinking about {last_user}"
    prompt_tokens = sum(len(m["content"].split()) for m in messages)
    return {
        "object": "chat.completion",
        "model": body["model"],
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": len(words),
            "total_tokens": prompt_tokens + len(words),
        },
    }


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # many clients connect at once: no refused SYNs

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Quiet when a client went away (killed, or gave up waiting); else the traceback."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@dataclass
class Faults:
    """Failures to inject; rates are per request, drawn from a seeded generator."""

    error_rate: float = 0.0  # answer HTTP 429, 500 or 503
    drop_rate: float = 0.0  # close the connection without an answer
    hang_rate: float = 0.0  # answer nothing until the client gives up
    no_content_rate: float = 0.0  # answer 200 with `content` null or missing (alternately)
    dead_after: int | None = None  # drop every request after this many answers
    hold_after: int | None = None  # hold answers after this many until `open_gate`
    seed: int = 0


class ChatServer:
    """The server on 127.0.0.1 in a background thread; `url` is its OpenAI base URL."""

    def __init__(
        self,
        model: str = "echo",
        faults: Faults | None = None,
        port: int = 0,
        api_key: str | None = None,
    ) -> None:
        self.model = model
        self.api_key = api_key
        self.refused = 0  # requests answered 401 for want of the API key
        self.faults = faults or Faults()
        self.requests: list[dict[str, Any]] = []  # bodies of the answered requests
        self.injected: Counter[str] = Counter()  # injected faults by kind
        self.held = threading.Event()  # set once an answer is held at the gate
        self.closing = threading.Event()
        self._gate = threading.Event()
        self._lock = threading.Lock()
        self._random = random.Random(self.faults.seed)
        self._http = _HTTPServer(("127.0.0.1", port), _handler_class(self))
        self._thread = threading.Thread(
            target=self._http.serve_forever, args=(POLL_INTERVAL_S,), daemon=True
        )
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}/v1"

    def __enter__(self) -> ChatServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.closing.set()
        self._gate.set()
        self._http.shutdown()
        self._http.server_close()

    def open_gate(self) -> None:
        """Let held answers (and all later ones) through."""
        self._gate.set()

    def decide(self) -> str:
        """What to do with the next request: answer, error, drop, hang, no_content or hold."""
        faults = self.faults
        with self._lock:
            answered = len(self.requests)
            if faults.dead_after is not None and answered >= faults.dead_after:
                return "drop"
            draw = self._random.random()
            for action, rate in (
                ("error", faults.error_rate),
                ("drop", faults.drop_rate),
                ("hang", faults.hang_rate),
                ("no_content", faults.no_content_rate),
            ):
                if draw < rate:
                    self.injected[action] += 1
                    return action
                draw -= rate
        if faults.hold_after is not None and answered >= faults.hold_after:
            return "hold"
        return "answer"

    def wait_at_gate(self) -> str:
        """Hold a request until the gate opens: then answer it (drop it if closing)."""
        self.held.set()
        self._gate.wait()
        return "drop" if self.closing.is_set() else "answer"

    def error_status(self) -> int:
        """An HTTP status of a server that is overloaded or failing."""
        with self._lock:
            return self._random.choice([429, 500, 503])

    def answer_without_content(self, body: dict[str, Any]) -> dict[str, Any]:
        """A 200 answer whose message has `content: null` or no `content` (alternately)."""
        response = answer_for(body)
        message = response["choices"][0]["message"]
        with self._lock:
            if self.injected["no_content"] % 2:
                message["content"] = None
            else:
                del message["content"]
        return response

    def authorized(self, header: str | None) -> bool:
        """Whether a request with this Authorization header may be answered (counted if not)."""
        if self.api_key is None or header == f"Bearer {self.api_key}":
            return True
        with self._lock:
            self.refused += 1
        return False

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        """Record the request and build its answer."""
        with self._lock:
            self.requests.append(body)
        return answer_for(body)


def _handler_class(server: ChatServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: no line per request."""

        def _send(self, status: int, payload: dict[str, Any], headers: dict | None = None) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def _refuse_unauthorized(self) -> bool:
            """Answer 401 (and True) unless the request carries the server's API key."""
            if server.authorized(self.headers.get("Authorization")):
                return False
            self._send(401, {"error": {"message": "Incorrect API key provided"}})
            return True

        def do_GET(self) -> None:
            if self._refuse_unauthorized():
                return
            if self.path.rstrip("/") != "/v1/models":
                self._send(404, {"error": {"message": f"no route {self.path}"}})
                return
            self._send(200, {"object": "list", "data": [{"id": server.model, "object": "model"}]})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self._refuse_unauthorized():
                return
            if self.path != "/v1/chat/completions":
                self._send(404, {"error": {"message": f"no route {self.path}"}})
                return
            if body.get("model") != server.model:
                self._send(404, {"error": {"message": f"model {body.get('model')} not found"}})
                return
            action = server.decide()
            if action == "hold":
                action = server.wait_at_gate()
            if action == "hang":
                server.closing.wait(HANG_LIMIT_S)
            if action in ("drop", "hang"):
                self.close_connection = True
                return
            if action == "error":
                status = server.error_status()
                self._send(status, {"error": {"message": "injected"}}, {"Retry-After": "0"})
                return
            if action == "no_content":
                self._send(200, server.answer_without_content(body))
                return
            self._send(200, server.answer(body))

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8000, help="0: any free port")
    parser.add_argument("--model", default="echo", help="the one model name it serves")
    args = parser.parse_args()
    with ChatServer(args.model, port=args.port) as server:
        print(f"serving {args.model!r} at {server.url}", flush=True)
        threading.Event().wait()


if __name__ == "__main__":
    main()
