"""An async client for OpenAI-compatible chat-completions servers (vLLM, SGLang).

`ChatClient.complete` sends one conversation to one of the servers and returns the
assistant's answer, its reasoning (the engine's `reasoning_content` or `reasoning`
field), the finish reason and the token counts. Requests that fail in a way a retry can
fix (HTTP 429 and 5xx, timeouts, refused or dropped connections, an answer without
`content`) are retried with
exponential backoff and jitter, honouring a `Retry-After` header, and preferably on
another server; what still fails raises `RequestFailed` with the reason. Other answers
(HTTP 4xx, a malformed body) fail at once: retrying would not change them.

HTTP goes through aiohttp (the `regenerate` extra): at 64 connections it costs a fraction
of the CPU per request of the pure-Python clients, so one process keeps many engines busy.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
import msgspec

from ringtrain.data.errors import DatasetError

RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
BODY_EXCERPT = 300


class RequestFailed(Exception):
    """A request that did not produce an answer; `retryable` when the server was at fault."""

    def __init__(self, reason: str, retryable: bool, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.retryable = retryable
        self.retry_after = retry_after


class Stopped(Exception):
    """The client is stopping (Ctrl-C): the request was not started and will not be."""


@dataclass(frozen=True)
class Completion:
    """One assistant answer and what the engine reported about it."""

    content: str
    reasoning_content: str | None
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to wait before retrying a failed request."""

    retries: int = 6
    backoff_s: float = 1.0
    backoff_max_s: float = 30.0

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """Seconds to wait before retry number `attempt` (0-based), with jitter."""
        wait = min(self.backoff_max_s, self.backoff_s * 2**attempt) * random.uniform(0.5, 1.0)
        if retry_after is not None:
            wait = max(wait, min(retry_after, self.backoff_max_s))
        return wait


@dataclass(frozen=True)
class Sampling:
    """What every request asks of the engine besides the messages."""

    model: str
    max_tokens: int | None = 4096
    temperature: float = 0.0
    chat_template_kwargs: dict[str, Any] | None = None
    top_p: float = 1.0  # sampling's nucleus (1: the whole distribution)

    def body(self, messages: list[dict[str, str]]) -> dict[str, Any]:
        """The JSON body of a chat-completions request for `messages`."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": self.temperature,
        }
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        if self.top_p < 1:
            body["top_p"] = self.top_p
        if self.chat_template_kwargs:
            body["chat_template_kwargs"] = self.chat_template_kwargs
        return body


@dataclass
class _Server:
    url: str
    session: aiohttp.ClientSession
    in_flight: int = 0
    resting_until: float = 0.0


class _ChoiceMessage(msgspec.Struct):
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None


class _Choice(msgspec.Struct):
    message: _ChoiceMessage
    finish_reason: str | None = None


class _Model(msgspec.Struct):
    id: str


class _ModelList(msgspec.Struct):
    data: list[_Model]


class _Usage(msgspec.Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0


class _Response(msgspec.Struct):
    choices: list[_Choice]
    usage: _Usage | None = None


def _excerpt(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= BODY_EXCERPT else text[:BODY_EXCERPT] + "..."


def _describe(error: Exception) -> str:
    return str(error) or type(error).__name__


def _retry_after(response: aiohttp.ClientResponse) -> float | None:
    try:
        return float(response.headers.get("retry-after", ""))
    except ValueError:
        return None


def parse_completion(content: bytes) -> Completion:
    """The first choice of a chat-completions response body."""
    try:
        response = msgspec.json.decode(content, type=_Response)
        choice = response.choices[0]
    except (msgspec.DecodeError, IndexError) as exc:
        raise RequestFailed(
            f"the server answered without a usable choices[0].message ({exc}): "
            f"{_excerpt(content.decode(errors='replace'))}",
            retryable=False,
        ) from None
    message, usage = choice.message, response.usage or _Usage()
    if message.content is None:
        # An engine that lost the answer (or spent every token on reasoning) says
        # nothing: an empty turn saved as "stop" would teach the drafter silence.
        raise RequestFailed(
            "the server answered without choices[0].message.content (missing or null, "
            f"finish_reason {choice.finish_reason!r}): "
            f"{_excerpt(content.decode(errors='replace'))}",
            retryable=True,
        )
    return Completion(
        content=message.content,
        reasoning_content=message.reasoning_content or message.reasoning,
        finish_reason=choice.finish_reason,
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
    )


class ChatClient:
    """Chat completions over one or more servers, `concurrency` requests at most in flight."""

    def __init__(
        self,
        servers: list[str],
        sampling: Sampling,
        *,
        concurrency: int = 64,
        timeout_s: float = 1800.0,
        api_key: str | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        if not servers:
            raise DatasetError("no server given; pass --server http://HOST:PORT/v1")
        self.sampling = sampling
        self.retry = retry or RetryPolicy()
        self.requests = 0
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._urls = [url.rstrip("/") for url in servers]
        self._concurrency = concurrency
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=min(timeout_s, 30.0))
        self.servers: list[_Server] = []

    async def open(self) -> None:
        """Open one connection pool per server (needs the running event loop)."""
        for url in self._urls:
            connector = aiohttp.TCPConnector(limit=self._concurrency)
            session = aiohttp.ClientSession(
                connector=connector, headers=self._headers, timeout=self._timeout
            )
            self.servers.append(_Server(url, session))

    async def aclose(self) -> None:
        """Close every connection."""
        for server in self.servers:
            await server.session.close()

    def _pick(self, avoid: _Server | None) -> _Server:
        """The least busy server not resting after a failure (else the least busy one)."""
        now = time.monotonic()
        candidates = [s for s in self.servers if s is not avoid and s.resting_until <= now]
        return min(candidates or self.servers, key=lambda s: s.in_flight)

    async def _post(self, server: _Server, body: bytes) -> Completion:
        server.in_flight += 1
        self.requests += 1
        try:
            async with server.session.post(server.url + "/chat/completions", data=body) as answer:
                content = await answer.read()
        except asyncio.TimeoutError:
            raise RequestFailed(f"{server.url}: no answer within the timeout", True) from None
        except aiohttp.ClientError as exc:
            raise RequestFailed(
                f"{server.url}: connection failed ({_describe(exc)})", True
            ) from None
        finally:
            server.in_flight -= 1
        if answer.status != 200:
            raise RequestFailed(
                f"{server.url}: HTTP {answer.status}: {_excerpt(content.decode(errors='replace'))}",
                answer.status in RETRY_STATUS,
                _retry_after(answer),
            )
        return parse_completion(content)

    async def complete(self, messages: list[dict[str, str]]) -> Completion:
        """The engine's answer to `messages`, retried per the policy; raises RequestFailed."""
        body = msgspec.json.encode(self.sampling.body(messages))
        failed: _Server | None = None
        for attempt in range(self.retry.retries + 1):
            server = self._pick(failed)
            try:
                return await self._post(server, body)
            except RequestFailed as error:
                if not error.retryable or attempt == self.retry.retries:
                    raise
                wait = self.retry.delay(attempt, error.retry_after)
                server.resting_until = time.monotonic() + wait
                failed = server
                await asyncio.sleep(wait)
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def check_model(self) -> None:
        """Each server must answer GET /models and list the model; raises RequestFailed
        (server unreachable) or DatasetError (wrong URL or model name)."""
        for server in self.servers:
            try:
                async with server.session.get(server.url + "/models") as answer:
                    status, listing = answer.status, await answer.read()
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                raise RequestFailed(
                    f"cannot reach {server.url} ({_describe(exc)}); is the engine running, "
                    "and is the URL its OpenAI base (http://HOST:PORT/v1)?",
                    retryable=True,
                ) from None
            if status == 404:
                raise DatasetError(
                    f"{server.url}/models answered 404: pass the engine's OpenAI base URL, "
                    "e.g. http://HOST:8000/v1"
                )
            if status != 200:
                continue  # an engine without the listing still serves chat completions
            try:
                served = [model.id for model in msgspec.json.decode(listing, type=_ModelList).data]
            except msgspec.DecodeError:
                continue  # not the usual listing: the chat requests will tell
            if self.sampling.model not in served:
                raise DatasetError(
                    f"{server.url} does not serve model {self.sampling.model!r} (it serves "
                    f"{', '.join(served) or 'nothing'}); pass --model as listed there"
                )
