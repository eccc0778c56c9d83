"""openai.md: the two tables (the README quotes them) and the goals checked."""

from __future__ import annotations

from batchd.bench.kit.formatting import number, share
from batchd.bench.kit.goals import Goal, at_least, table
from batchd.bench.kit.records import ran
from batchd.bench.openai.analysis import EmbeddingPoint, Results, StreamingPoint
from batchd.bench.openai.workload import GOAL_SHARE, NEW_TOKENS

EMBEDDINGS_HEAD = (
    "| clients | /v1/embeddings req/s | KServe V1 req/s | OpenAI / V1 | /v1/embeddings p99 ms "
    "| KServe V1 p99 ms | errors |\n|---:|---:|---:|---:|---:|---:|---:|"
)
STREAMING_HEAD = (
    "| clients | chat tokens/s | generate_stream tokens/s | chat / generate_stream | chat TTFT p99 ms "
    "| generate_stream TTFT p99 ms | errors |\n|---:|---:|---:|---:|---:|---:|---:|"
)


def _table(head: str, rows: list[tuple[object, ...]]) -> str:
    return "\n".join([head, *("| " + " | ".join(map(str, row)) + " |" for row in rows)])


def embeddings_table(points: list[EmbeddingPoint]) -> str:
    return _table(
        EMBEDDINGS_HEAD,
        [
            (
                p.clients,
                number(p.requests_per_s.get("openai"), 0),
                number(p.requests_per_s.get("kserve_v1"), 0),
                share(p.throughput_share, 1),
                number(p.p99_ms.get("openai")),
                number(p.p99_ms.get("kserve_v1")),
                p.errors,
            )
            for p in points
        ],
    )


def streaming_table(points: list[StreamingPoint]) -> str:
    other = "oip_generate_stream"
    return _table(
        STREAMING_HEAD,
        [
            (
                p.clients,
                number(p.tokens_per_s.get("openai"), 0),
                number(p.tokens_per_s.get(other), 0),
                share(p.throughput_share, 1),
                number(p.ttft_p99_ms.get("openai")),
                number(p.ttft_p99_ms.get(other)),
                p.errors,
            )
            for p in points
        ],
    )


def goals(results: Results) -> list[Goal]:
    """Each goal on its worst figure over the client counts."""
    found = []
    if results.embeddings:
        found.append(
            at_least(
                f"Embeddings: the OpenAI route's throughput at least {GOAL_SHARE:.0%} of KServe V1's at "
                "every client count (its lowest share)",
                min(p.throughput_share for p in results.embeddings),
                GOAL_SHARE,
            )
        )
    if results.streaming:
        tokens = min(p.throughput_share for p in results.streaming)
        ttft = min(p.ttft_share for p in results.streaming)
        found.append(
            Goal(
                "Chat streaming: output tokens/s and p99 time to first token within 5% of "
                "generate_stream's (the lower of the two shares)",
                min(tokens, ttft),
                GOAL_SHARE,
                tokens >= GOAL_SHARE and ttft >= GOAL_SHARE,
                detail=f"tokens/s {share(tokens, 1)}, TTFT p99 {number(1 / ttft if ttft else None, 2)}x its",
            )
        )
    return found


def to_markdown(results: Results) -> str:
    lines = [
        "# The OpenAI routes against KServe V1 and generate_stream",
        "",
        f"{ran(results.meta)}. Closed loops on keep-alive connections, both routes at once with the "
        f"clients counted on each; medians of {results.repeats} repeat(s); {results.torch_threads} "
        "torch thread(s) per replica.",
        "",
    ]
    if results.embeddings:
        lines += [
            "## Embeddings: MiniLM, one sentence per request, one replica answering both routes",
            "",
            embeddings_table(results.embeddings),
            "",
        ]
    if results.streaming:
        lines += [
            f"## Chat streaming: tiny GPT-2 (4 layers x 256), {NEW_TOKENS} tokens per answer, "
            "token-level scheduling",
            "",
            "Tokens/s are medians over the repeats (their share, the median of each repeat's); each "
            "TTFT p99 is taken over every repeat's first tokens together.",
            "",
            streaming_table(results.streaming),
            "",
        ]
    return "\n".join([*lines, "## Goals", "", *table(goals(results)), ""])
