"""The vectorized adder from Ray Serve's batching tutorial, ported by dropping the Ray decorators.

Serve it with `handler: examples.adder:BatchAdder.handle_batch` and `max_batch_size: 4`
(see adder.yaml). Under concurrent load the first batch has one item and the next ones four.
"""

import time
from typing import List

import numpy as np
from starlette.requests import Request


class BatchAdder:
    async def handle_batch(self, numbers: List[int]):
        input_array = np.array(numbers)
        print("Our input array has shape:", input_array.shape)
        # Sleep for 200ms, this could be performing CPU intensive computation
        # in real models
        time.sleep(0.2)
        output_array = input_array + 1
        return output_array.astype(int).tolist()

    async def __call__(self, request: Request):
        return await self.handle_batch(int(request.query_params["number"]))
