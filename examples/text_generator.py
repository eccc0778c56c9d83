"""The BatchTextGenerator of Ray Serve's text-generator tutorial, ported by dropping the Ray decorators.

Serve it with `handler: examples.text_generator:BatchTextGenerator.handle_batch` and
`init_kwargs: {pipeline_key: text-generation, model_key: <a local model directory or hub id>}`
(see text-generator.yaml).
"""

from typing import List

from starlette.requests import Request
from transformers import pipeline


class BatchTextGenerator:
    def __init__(self, pipeline_key: str, model_key: str):
        self.model = pipeline(pipeline_key, model_key)

    async def handle_batch(self, inputs: List[str]) -> List[str]:
        print("Our input array has length:", len(inputs))

        results = self.model(inputs)
        return [result[0]["generated_text"] for result in results]

    async def __call__(self, request: Request) -> List[str]:
        return await self.handle_batch(request.query_params["text"])
