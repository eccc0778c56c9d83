"""The servers of the peers benchmark, one module per peer, each run in that peer's own virtual
environment (`python -m batchd.bench.kit.peer_servers.servers.<peer>_server --model adder|minilm --host H
--port P`, with bench/src on PYTHONPATH): nothing here imports batchd or anything outside the
standard library at module level, since a peer's environment has neither.

Every server takes the same request body, `{"instances": [item]}`, except PyTriton, which speaks
the Open Inference Protocol only; `models` is the model code they all call.
"""
