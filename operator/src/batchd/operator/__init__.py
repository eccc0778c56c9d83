"""batchd's Kopf operator: turns each BatchedDeployment into a ConfigMap, a Deployment and a Service.

Run it with `python -m batchd.operator` (or `kopf run -m batchd.operator.handlers`). Modules:
`settings` (read once at startup), `children` and `status` (pure functions), `kubeapi` (a small
async API client), `reconcile` (one resource at a time, from the live objects), `handlers` (Kopf),
`metrics` (its own Prometheus metrics). It never imports torch.
"""
