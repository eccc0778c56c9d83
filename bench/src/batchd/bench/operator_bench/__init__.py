"""Operator benchmark: how fast a BatchedDeployment gets its Deployment, how fast 500 converge, how
much memory the operator uses, and what autoscaling 500 resources of 4 replicas costs it. Not a
test: it prints figures (and writes them to bench/results/operator.{json,md}).

    python -m batchd.bench.operator_bench [--repeats 20] [--resources 500] [--autoscaled 500]

The operator runs as a user runs it (`python -m batchd.operator`, its own process, so its CPU and
RSS are its own, with the chart's environment and its ServiceAccount's token) against a real
control plane of the benchmark's own (the test cluster's binaries: `make kubernetes`), with no
node. The resources of the convergence runs ask for no replicas: with no node to run them, pods
would only add the scheduler's retries to the figures.

Autoscaling: 2,000 replica pods cannot run here, so the benchmark does what their kubelets would:
once the real ReplicaSet controller has made each pod, it reports it Ready, each at its own
127.200.x.y address, and one lightweight stand-in server, in a process of its own, answers
`GET /load` on every one of those addresses with a small, slowly varying load. Those stand-in
load endpoints cost next to nothing, so the figure is the operator's own cost of polling every
replica at its default interval and writing what it saw. With min_replicas = max_replicas = 4
no Deployment is ever scaled: what is measured is the steady cost of watching, which is what a
large, quiet installation pays all day.
"""
