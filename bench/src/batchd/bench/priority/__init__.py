"""Priority and fairness benchmark: what a replica's queue order does for its classes and callers
under overload.

    python -m batchd.bench.priority              # 3 interleaved repeats, 20 s per load
    python -m batchd.bench.priority --quick      # smoke-sized

One replica (`batchd serve`) whose every batch of up to 8 items holds the model 50 ms
(`SlowAdder`), so its capacity is known, 160 items/s, and its queue holds 400 items. Two
subjects take turns in the same run: `priority` (classes `high` 10 and `low` 0, callers in turns)
and `first_come` (the same classes, `queue_order: first_come`: the order from before classes).
- Priority load: open loops at twice the capacity, 20% of it `high`. Measured first on each
  subject: `high` alone at its rate (the idle p99). Goals for `priority`: high's p99 within
  1.25x its idle p99, and no high request shed (503).
- Fairness load: two callers in one class, one with ten times the other's clients (160 and 16)
  in a closed loop, both backlogged. Goal: Jain's fairness index of what each is served at least 0.95.
Each class's p50 and p99 and its 503s are reported; the chart draws latency by class over the
priority load. Results: bench/results/priority.{json,md,png}.
"""
