"""`pdsim serve` driven by a real client (issue 36's CI test).

Starts the server on a free local port, drives 200 concurrent streams with
the `openai` Python client (async), checks each stream's token count and
usage, checks `data: [DONE]` on raw streams (the client hides it), reads
`/metrics`, and stops the server. No timing is asserted.

The binary is $PDSIM_BIN, else target/debug/pdsim (what `cargo test`
builds). Run: `python -m pytest tests/serve`.
"""

import asyncio
import json
import os
import signal
import subprocess
import urllib.request
from pathlib import Path

import pytest
from openai import AsyncOpenAI

ROOT = Path(__file__).resolve().parents[2]
BIN = os.environ.get("PDSIM_BIN", str(ROOT / "target" / "debug" / "pdsim"))
STREAMS = 200


@pytest.fixture(scope="module")
def server():
    proc = subprocess.Popen(
        [BIN, "serve", str(ROOT / "tests/fixtures/serve.toml"), "--port", "0", "--speed", "20"],
        stdout=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    assert line.startswith("pdsim serve: listening on http://"), line
    url = line.strip().rsplit(" ", 1)[1]
    yield url
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0, "SIGTERM stops the server cleanly"


def output_tokens(i):
    return 8 + i % 33


async def one_stream(client, i):
    stream = await client.completions.create(
        model="serve-test",
        prompt="x" * (40 + 17 * i),
        max_tokens=output_tokens(i),
        stream=True,
        stream_options={"include_usage": True},
    )
    texts, usage = 0, None
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            texts += 1
        if chunk.usage is not None:
            usage = chunk.usage
    return texts, usage


async def many_streams(url):
    client = AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
    try:
        return await asyncio.gather(*(one_stream(client, i) for i in range(STREAMS)))
    finally:
        await client.close()


def raw_stream(url, body):
    req = urllib.request.Request(
        url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        return resp.read().decode()


def metric(text, name):
    for line in text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} in /metrics")


def test_200_concurrent_streams_then_metrics(server):
    results = asyncio.run(many_streams(server))
    assert len(results) == STREAMS
    for i, (texts, usage) in enumerate(results):
        assert texts == output_tokens(i), f"stream {i}: {texts} tokens"
        assert usage.completion_tokens == output_tokens(i)
        # The documented rule: ceil(characters / 4).
        assert usage.prompt_tokens == -(-(40 + 17 * i) // 4)

    # Raw streams end with `data: [DONE]` (the client hides it).
    for k in range(3):
        body = raw_stream(
            server,
            {"model": "serve-test", "messages": [{"role": "user", "content": "hello"}],
             "max_tokens": 4 + k, "stream": True},
        )
        events = [e for e in body.split("\n\n") if e]
        assert events[-1] == "data: [DONE]", body
        chunks = [json.loads(e[len("data: "):]) for e in events[:-1]]
        content = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
        assert len(content) == 4 + k
        assert content[-1]["choices"][0]["finish_reason"] == "length"

    with urllib.request.urlopen(server + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    done = STREAMS + 3
    assert metric(text, "vllm:request_success_total") == done
    assert metric(text, "vllm:generation_tokens_total") == sum(map(output_tokens, range(STREAMS))) + 4 + 5 + 6
    assert metric(text, "vllm:time_to_first_token_seconds_count") == done
    assert metric(text, "vllm:e2e_request_latency_seconds_count") == done
    assert metric(text, "vllm:num_requests_running") == 0
    assert metric(text, "vllm:num_requests_waiting") == 0
    assert 0 <= metric(text, "vllm:kv_cache_usage_perc") <= 1
