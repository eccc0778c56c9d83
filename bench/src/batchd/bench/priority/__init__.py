"""Priority and fairness benchmark: what a replica's queue order does for its classes and callers
under overload.

    python -m batchd.bench.priority              # 3 interleaved repeats, 20 s per load
    python -m batchd.bench.priority --quick      # smoke-sized

One replica (`batchd serve`) whose every batch of up to 8 items holds the model 50 ms
(`SlowAdder`), so its capacity is known, 160 items/s, and its queue holds 400 items. Two
subjects take turns in the same run: `priority` (classes `high` 10, `gold` and `silver` 5, `low`
0, equal classes and callers in turns) and `first_come` (the same classes, `queue_order:
first_come`: the order from before classes).
- Priority load: open loops at twice the capacity, 20% of it `high`. Measured first on each
  subject: `high` alone at its rate (the idle p99). Goals for `priority`: high's p99 within
  1.25x its idle p99, and no high request shed (503).
- Fairness load: two callers in one class, one with ten times the other's clients (160 and 16)
  in a closed loop, both backlogged. Goal: Jain's fairness index of what each is served at least 0.95.
- Equal classes: `gold` and `silver`, of one priority, half of three times the capacity each.
  Goal: each served within 1.2x of the other, and neither displacing the other.
- Dead-item mix: `high` from closed-loop clients that keep every batch full, beside `low` at the
  capacity whose requests give up after 200 ms. Goal: no request refused while its client still
  waits (the dead hold no place).
- Token-level mix: two more replicas, of the tiny GPT-2 with token-level scheduling, four rows:
  `high` streams short answers at a few requests a second, alone (idle) and beside the sheddable
  `bulk` class at twice what the replica holds. Goal: high's p99 time to first token within
  1.25x its idle p99 (the sheddable class is shed).
Each class's p50 and p99 and its 503s are reported; the chart draws latency by class over the
priority load, the equal classes' answers, and the time to first token by class. Results:
bench/results/priority.{json,md,png}.
"""
