"""Text generation: token-level (continuous) batching and streaming, and the request-level path.

`params` reads what one request asks for, against the spec's limits; `sampling` picks each
sequence's next token; `text` turns tokens into text as they come (stop strings included);
`cache` holds the running sequences' keys and values; `engine` is the scheduler thread that
steps the model; `service` is the event loop's side of it (admission, deadlines, streams);
`request_level` is the same service over the batcher and transformers' `generate`; `loader`
loads a model for either.
"""
