"""The OpenAI routes against the protocols they sit beside, on the same replica, in the same run.

    python -m batchd.bench.openai [--quick] [--repeats 5] [--parts embeddings streaming]

- Embeddings: one MiniLM replica (`batchd serve`, the bundled weights) answers
  `POST /v1/embeddings` and KServe V1's `POST /v1/models/minilm:predict`; closed loops of 1, 8,
  32 and 64 clients send one sentence per request on keep-alive connections (`encoding_format:
  float`, so both answers carry the same JSON numbers). Per route and client count: requests/s
  and p99 latency. Goal: the OpenAI route within 5% of KServe V1's throughput.
- Chat streaming: one tiny GPT-2 replica (4 layers x 256, built here with random weights;
  token-level scheduling, max_batch_size 16) answers `POST /v1/chat/completions` with
  `stream: true` and the Open Inference Protocol's `generate_stream`; its chat template is the
  last message's text, so both routes run the same prompt. Closed loops of 1, 4 and 16 clients;
  every request is greedy and makes exactly 64 tokens (end-of-sequence held back). Per route and
  client count: output tokens/s and p99 time to first token (the first event with text). Goal:
  within 5% of generate_stream on both.

At each client count the two routes take turns, repeat after repeat (which goes first
alternates), so that the windows of one repeat lie side by side; figures are medians over
repeats, and each share the median of the repeats' own ratios. Writes
bench/results/openai.{json,md}.
"""
