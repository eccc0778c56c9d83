"""Rollouts benchmark: a bad model revision shipped by a rolling update against shipped by a
canary, and a good one through the canary, under the same load through the router.

    python -m batchd.bench.rollouts              # 1 run of the three subjects, interleaved
    python -m batchd.bench.rollouts --quick      # smoke-sized

On the test cluster (control plane and node, the chart's router and the operator on its
ServiceAccount), each subject in a fresh release: one replica of an adder revision
(`batch_handlers.Revision`, one item a batch, 10 ms each) serving an open loop through the
router; after `before_s` of it, a new revision is shipped with `kubectl apply`:
- `rolling`: a revision that fails 30% of its items, `strategy: rolling` (today's default);
- `canary`: the same revision, `strategy: canary`, a first step of 10%;
- `canary-good`: a revision that fails nothing, through the same canary, until it is promoted.
Reported per subject: the requests that failed after the ship, when the last one failed, the
p99 before the ship and during the rollout. Goals: the canary gives at least 20 times fewer
failed requests than the rolling update; the good revision loses nothing and its p99 during the
rollout stays within 1.2 times the p99 before it. The chart draws the canary's share and the
error rate over time. Results: bench/results/rollouts.{json,md,png}.
"""
