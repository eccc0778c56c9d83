"""The OpenAI routes against the protocols they sit beside, on the same replica, in the same run.

    python -m batchd.bench.openai [--quick] [--repeats 5] [--parts embeddings streaming]

- Embeddings: one MiniLM replica (`batchd serve`, the bundled weights) answers
  `POST /v1/embeddings` and KServe V1's `POST /v1/models/minilm:predict`; closed loops of 1, 8,
  32 and 64 clients on each route send one sentence per request on keep-alive connections (`encoding_format:
  float`, so both answers carry the same JSON numbers). Per route and client count: requests/s
  and p99 latency. Goal: the OpenAI route within 5% of KServe V1's throughput.
- Chat streaming: one tiny GPT-2 replica (4 layers x 256, built here with random weights;
  token-level scheduling, max_batch_size 16) answers `POST /v1/chat/completions` with
  `stream: true` and the Open Inference Protocol's `generate_stream`; its chat template is the
  last message's text, so both routes run the same prompt. Closed loops of 1, 4 and 8 clients on
  each route (16 streams at most, one a row);
  every request is greedy and makes exactly 64 tokens (end-of-sequence held back). Per route and
  client count: output tokens/s and p99 time to first token (the first event with text). Goal:
  within 5% of generate_stream on both.

At each client count both routes run at once, through the same window, repeat after repeat: the
replica batches their items together, and whatever else the machine does meanwhile weighs on
both alike (on a shared machine whose speed moves by a quarter within minutes, routes taking
turns measured the machine as much as the route). Figures are medians over repeats, each share
the median of the repeats' own ratios, and each p99 time to first token is taken over every
repeat's first tokens together. Writes bench/results/openai.{json,md}.
"""
