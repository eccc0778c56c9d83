"""batchd's Kopf operator: turns each BatchedDeployment into a ConfigMap, a Deployment and a Service.

Run it with `python -m batchd.operator` (or `kopf run -m batchd.operator.kopf_handlers`). Modules:
`settings` (read once at startup), `children` and `status` (pure functions), `kube_requests` (a small
async API client), `reconcile` (one resource at a time, from the live objects), `replicas` (one
replica's load), `autoscaler` (the count a load asks for), `scaling_loop` (reads every replica's
load and applies the autoscaler), `kopf_handlers` (Kopf's entry points), `metrics` (its own
Prometheus metrics). It never imports torch.
"""
