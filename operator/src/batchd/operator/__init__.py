"""batchd's Kopf operator: turns each BatchedDeployment into a ConfigMap, a Deployment, a Service and
a PodDisruptionBudget (and a canary's beside them during a canary rollout), and keeps its status.

Run it with `python -m batchd.operator` (or `kopf run -m batchd.operator.kopf_handlers`). In
layers, each importing only those below it (import contracts in pyproject.toml):

- the loops: `kopf_handlers` (Kopf's entry points), `poller` (reads every serving replica) and
  what its readings feed, `scaling` (the autoscaler) and `judge` (the canary), above `reconcile`
  (read, plan, apply, write: one resource at a time);
- `cluster`: the one place that owns the API connection, the locks, the operator's own writes and
  the status writer (`status_writer`), and parses each resource once; `replicas` and `routers`
  read the pods' own addresses;
- the pure model: `plan` (what one converge applies and writes), `children` (the manifests),
  `rollout` (the canary's state machine), `status` (conditions), `analysis` (a step's figures),
  `autoscaler` (the count a load asks for), `resource` (a resource parsed), `field_owners`;
- `settings` (read once at startup) and `metrics` (its own Prometheus metrics).

It never imports torch.
"""
