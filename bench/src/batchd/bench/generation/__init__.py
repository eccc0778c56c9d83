"""Token-level vs request-level batching of text generation, in the same run, on the same prompts.

    python -m batchd.bench.generation [--quick] [--models tiny larger] [--repeats 3]

For each model (the tiny GPT-2, and a larger GPT-2 configuration, both built here with random
weights and 512 positions) two real replicas (`batchd serve`) run side by side, identical but for
`model.generation.scheduling`: `token` and `request`, both with max_batch_size 16. A mixed workload
arrives open loop (Poisson arrivals at a fixed rate, whatever the answers do): prompts of 4-64
tokens, max_new_tokens drawn from 8..256, greedy, min_new_tokens = max_new_tokens, so that both
modes make exactly the same tokens for the same prompts. Every request streams
(`generate_stream`): the time to first token is when its first event arrives (request-level
batching sends the whole answer as one event). Latencies count from when a request was due.

Per (model, mode, rate): output tokens/s (tokens of all requests over first arrival to last
answer), p50/p99 time to first token, p99 end-to-end latency. The modes take turns at every rate
of every repeat (which goes first alternates), and medians over repeats are reported, with the
rate at which request-level batching saturates (it completes under 90% of the offered tokens/s)
and the two ratios quoted there. Writes bench/results/generation.{json,md,png}.
"""
