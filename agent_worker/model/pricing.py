"""What a model response cost, from its token usage and a configurable price table.

Why a table with prefix matching: providers answer with dated model names
(``gpt-4o-mini-2024-07-18``, ``claude-sonnet-4-20250514``) while prices are quoted per
model family, and users add their own (self-hosted models cost nothing per token).
Costs are ``Decimal`` so budget sums never drift. An unknown model costs 0 rather than
failing a run: accounting must never be the reason a lap breaks.

The defaults are list prices in USD per million tokens at the time of writing; they
change, so deployments should load their own table.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from decimal import Decimal
from typing import Any

from agent_worker.core.messages import Frozen, Usage

_PER = Decimal(1_000_000)


class Price(Frozen):
    """A model's price per million input and output tokens."""

    input_per_mtok: Decimal
    output_per_mtok: Decimal

    def cost(self, usage: Usage) -> Decimal:
        return (
            usage.input_tokens * self.input_per_mtok + usage.output_tokens * self.output_per_mtok
        ) / _PER


class PriceTable(Mapping[str, Price]):
    """Model name (or name prefix) → price; the longest matching prefix wins."""

    def __init__(self, prices: Mapping[str, Price]) -> None:
        self._prices = dict(prices)
        # Longest first, so "gpt-4o-mini" is found before "gpt-4o".
        self._by_length = sorted(self._prices, key=len, reverse=True)

    @classmethod
    def from_json(cls, data: Mapping[str, Mapping[str, Any]]) -> PriceTable:
        """``{"model": {"input_per_mtok": "2.5", "output_per_mtok": 10}, ...}``."""
        return cls({name: Price.model_validate(price) for name, price in data.items()})

    def lookup(self, model: str) -> Price | None:
        """The price of ``model``: an exact entry, else the longest prefix entry."""
        exact = self._prices.get(model)
        if exact is not None:
            return exact
        for prefix in self._by_length:
            if model.startswith(prefix):
                return self._prices[prefix]
        return None

    def cost(self, model: str, usage: Usage) -> Decimal:
        """What ``usage`` of ``model`` cost; ``Decimal(0)`` for unknown models."""
        price = self.lookup(model)
        return price.cost(usage) if price is not None else Decimal(0)

    def __getitem__(self, model: str) -> Price:
        return self._prices[model]

    def __iter__(self) -> Iterator[str]:
        return iter(self._prices)

    def __len__(self) -> int:
        return len(self._prices)

    def __repr__(self) -> str:
        return f"PriceTable({len(self)} models)"


DEFAULT_PRICES = PriceTable.from_json(
    {
        "gpt-4o": {"input_per_mtok": "2.50", "output_per_mtok": "10.00"},
        "gpt-4o-mini": {"input_per_mtok": "0.15", "output_per_mtok": "0.60"},
        "gpt-4.1": {"input_per_mtok": "2.00", "output_per_mtok": "8.00"},
        "gpt-4.1-mini": {"input_per_mtok": "0.40", "output_per_mtok": "1.60"},
        "gpt-4.1-nano": {"input_per_mtok": "0.10", "output_per_mtok": "0.40"},
        "o4-mini": {"input_per_mtok": "1.10", "output_per_mtok": "4.40"},
        "claude-3-5-haiku": {"input_per_mtok": "0.80", "output_per_mtok": "4.00"},
        "claude-haiku-4-5": {"input_per_mtok": "1.00", "output_per_mtok": "5.00"},
        "claude-sonnet-4": {"input_per_mtok": "3.00", "output_per_mtok": "15.00"},
        "claude-opus-4": {"input_per_mtok": "15.00", "output_per_mtok": "75.00"},
    }
)
