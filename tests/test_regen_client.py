"""The chat client's own rules: how long it waits before a retry (Retry-After honoured,
the backoff capped), which failures are retried and where a retry goes (another server),
what a request asks (top_p only below 1) and what an answer's reasoning field is read from."""

from __future__ import annotations

import asyncio
import json

import pytest

from ringtrain.data.regen_client import (
    ChatClient,
    Completion,
    RequestFailed,
    RetryPolicy,
    Sampling,
    parse_completion,
)
from ringtrain.testing.chat_server import ChatServer, Faults

MESSAGES = [{"role": "user", "content": "hello"}]


def _ask(client: ChatClient) -> Completion:
    """MESSAGES asked once by `client`, its connections opened and closed around it."""

    async def ask() -> Completion:
        await client.open()
        try:
            return await client.complete(MESSAGES)
        finally:
            await client.aclose()

    return asyncio.run(ask())


def test_the_wait_honours_retry_after_and_is_capped() -> None:
    policy = RetryPolicy(retries=6, backoff_s=1.0, backoff_max_s=30.0)
    assert policy.delay(0, retry_after=5.0) == 5.0  # the server's wish beats the backoff
    assert policy.delay(0, retry_after=100.0) == 30.0  # but not the cap
    for attempt in range(12):
        wait = policy.delay(attempt, retry_after=None)
        # 2**attempt seconds with jitter (half to all of it), never above the cap.
        assert 0.5 * min(30.0, 2.0**attempt) <= wait <= min(30.0, 2.0**attempt)


def test_a_retry_goes_to_the_server_that_did_not_fail() -> None:
    """With no wait between attempts the failed server is as free as the other: the
    retry still goes to the other one."""
    with ChatServer(faults=Faults(error_rate=1.0)) as failing, ChatServer() as answering:
        client = ChatClient(
            [failing.url, answering.url],
            Sampling("echo"),
            retry=RetryPolicy(retries=1, backoff_s=0.0, backoff_max_s=0.0),
        )
        completion = _ask(client)
        assert completion.content
        assert (failing.injected["error"], len(answering.requests)) == (1, 1)
        assert client.requests == 2


def test_a_4xx_answer_fails_at_once() -> None:
    """HTTP 401 (no API key for a server that wants one) is not retried: retrying would
    not change it."""
    with ChatServer(api_key="secret") as server:
        client = ChatClient([server.url], Sampling("echo"), retry=RetryPolicy(retries=3))
        with pytest.raises(RequestFailed, match="HTTP 401") as failed:
            _ask(client)
        assert not failed.value.retryable
        assert (server.refused, client.requests) == (1, 1)


def test_top_p_is_asked_only_below_one() -> None:
    assert "top_p" not in Sampling("m").body(MESSAGES)
    assert Sampling("m", top_p=0.9).body(MESSAGES)["top_p"] == 0.9


def test_an_answers_reasoning_is_read_from_either_field() -> None:
    def body(**message: str) -> bytes:
        choice = {"message": {"content": "the answer", **message}, "finish_reason": "stop"}
        return json.dumps({"choices": [choice]}).encode()

    assert parse_completion(body(reasoning="thought")).reasoning_content == "thought"
    assert parse_completion(body(reasoning_content="thought")).reasoning_content == "thought"
    assert parse_completion(body()).reasoning_content is None
