"""The house-price model of Ray Serve's dynamic-batching guide (its `batching_config`), with torch
instead of Keras.

A small regression model, eight features of a district to its median house price in dollars,
built and saved here (trained in about a second on synthetic data; no hub, no download):

    python -m examples.house_price build house_price_model.pt
    batchd serve examples/house-price.yaml        # max_batch_size 32, a 100 ms window

The guide's `HousePricePredictor.__call__` read a request and ran `model.predict` on it; here the
batcher hands `predict` a batch of feature vectors gathered from many requests (KServe V1
`{"instances": [[8 numbers], ...]}`, or an Open Inference V2 FP32 tensor of shape [N, 8]) and
the model runs once on the [batch, 8] tensor.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Annotated, Any

import torch
from pydantic import Field

FEATURES = (
    "median_income",  # tens of thousands of dollars
    "house_age",  # years
    "rooms",  # per household
    "bedrooms",  # per household
    "population",
    "occupancy",  # people per household
    "latitude",
    "longitude",
)
# Where each feature lies in the synthetic districts (and in the tests' requests).
RANGES = (
    (0.5, 15.0),
    (1.0, 52.0),
    (2.0, 10.0),
    (1.0, 5.0),
    (100.0, 5000.0),
    (1.0, 6.0),
    (32.5, 42.0),
    (-124.3, -114.3),
)
# One district's features: exactly eight numbers, checked before it joins anyone's batch.
Features = Annotated[list[float], Field(min_length=len(FEATURES), max_length=len(FEATURES))]


def true_price(features: list[float]) -> float:
    """The price the synthetic districts follow: what the model learns, and what tests compare to."""
    income, age, rooms, bedrooms, population, occupancy, latitude, longitude = features
    coast = math.exp(-((longitude + 122.0) ** 2) / 8.0)  # near the coast is dearer
    return (
        40_000 * income
        + 12_000 * rooms
        - 15_000 * bedrooms
        - 900 * age
        - 4 * population / occupancy
        + 150_000 * coast
        + 3_000 * (latitude - 32.5)
        + 60_000
    )


class PriceModel(torch.nn.Module):
    """Features in, price out: normalisation inside, so callers send raw numbers."""

    x_mean: torch.Tensor
    x_std: torch.Tensor
    y_mean: torch.Tensor
    y_std: torch.Tensor

    def __init__(self, features: int = len(FEATURES), hidden: int = 64) -> None:
        super().__init__()
        self.register_buffer("x_mean", torch.zeros(features))
        self.register_buffer("x_std", torch.ones(features))
        self.register_buffer("y_mean", torch.zeros(()))
        self.register_buffer("y_std", torch.ones(()))
        self.net = torch.nn.Sequential(
            torch.nn.Linear(features, hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(hidden, hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(hidden, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normal = (x - self.x_mean) / self.x_std
        price: torch.Tensor = self.net(normal).squeeze(-1) * self.y_std + self.y_mean
        return price


def districts(count: int, seed: int = 0) -> torch.Tensor:
    """`count` synthetic districts, [count, 8], each feature uniform over its range."""
    generator = torch.Generator().manual_seed(seed)
    low = torch.tensor([low for low, _ in RANGES])
    high = torch.tensor([high for _, high in RANGES])
    return low + (high - low) * torch.rand(count, len(FEATURES), generator=generator)


def build(path: str | Path, samples: int = 4096, steps: int = 600, seed: int = 0) -> Path:
    """Train a PriceModel on synthetic districts and save it to `path`; returns the path."""
    threads = torch.get_num_threads()
    # A model this small trains fastest on one thread (more only contend, badly on a busy machine).
    torch.set_num_threads(1)
    try:
        return _train(Path(path), samples, steps, seed)
    finally:
        torch.set_num_threads(threads)


def _train(path: Path, samples: int, steps: int, seed: int) -> Path:
    torch.manual_seed(seed)
    x = districts(samples, seed)
    y = torch.tensor([true_price(row) for row in x.tolist()])
    model = PriceModel()
    model.x_mean.copy_(x.mean(0))
    model.x_std.copy_(x.std(0))
    model.y_mean.copy_(y.mean())
    model.y_std.copy_(y.std())
    target = (y - y.mean()) / y.std()
    optimizer = torch.optim.Adam(model.net.parameters(), lr=1e-2)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model.net((x - model.x_mean) / model.x_std).squeeze(-1), target)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"features": list(FEATURES), "state_dict": model.state_dict()}, path)
    return path


def load(path: str | Path) -> PriceModel:
    saved: dict[str, Any] = torch.load(path, weights_only=True)  # plain tensors: nothing executes
    if saved["features"] != list(FEATURES):
        raise ValueError(f"{path} was built for features {saved['features']}, not {list(FEATURES)}")
    model = PriceModel()
    model.load_state_dict(saved["state_dict"])
    return model.eval()


class HousePricePredictor:
    """The guide's deployment: load the saved model once, predict a whole batch per call."""

    def __init__(self, model_path: str = "house_price_model.pt") -> None:
        self.model = load(model_path)

    def predict(self, features: list[Features]) -> list[float]:
        batch = torch.tensor(features, dtype=torch.float32)  # [N, 8]: one row per request item
        with torch.inference_mode():
            prices: list[float] = self.model(batch).tolist()
        return prices


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the house-price model the example serves.")
    commands = parser.add_subparsers(dest="command", required=True)
    build_command = commands.add_parser("build", help="train on synthetic districts and save")
    build_command.add_argument("path", nargs="?", default="house_price_model.pt")
    args = parser.parse_args(argv)
    path = build(args.path)
    model = load(path)
    check = districts(256, seed=1)
    with torch.inference_mode():
        predicted = model(check)
    truth = torch.tensor([true_price(row) for row in check.tolist()])
    error = ((predicted - truth).abs().mean() / truth.abs().mean()).item()
    print(f"wrote {path}: mean absolute error {100 * error:.1f}% of the mean price on unseen districts")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
