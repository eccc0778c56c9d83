"""The main scenarios (`make bench`): the replica beside a bare-uvicorn floor and its model alone
(the ceiling), batched and unbatched, for a trivial handler, MiniLM embeddings and a tiny GPT-2."""
