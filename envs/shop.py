"""``shop-v0``: several tools over several turns. Look up prices and a coupon, compute, answer.

The price list and coupons change every episode (seeded) and reach the tools through ``Task.extra``, so the
model has to call the tools; a wrong first answer gets one retry with a hint (half reward).
"""

from __future__ import annotations

from typing import Any

from agentrl import Message, StepResult
from agentrl.tools import LookupTool, ParsedTurn, calculator, parse_number

from .tool_env import Task, ToolEnv

ITEMS = ("apple", "bread", "cheese", "eggs", "milk", "rice", "tea", "tomato")
COUPONS = ("SAVE5", "SAVE10", "SAVE20", "HALF")


class ShopEnv(ToolEnv):
    """Total price of a seeded basket after a coupon, in cents, using ``price``, ``coupon`` and
    ``calculator``."""

    system_prompt = (
        "You help customers of a shop. Prices and coupons are only known through the tools. "
        "Give the final total in cents as 'Answer: <number>'."
    )

    def __init__(self, **kwargs: Any):
        price = LookupTool(
            name="price",
            description="The price of one unit of an item, in cents.",
            key_name="item",
            key_description="Item name, e.g. 'apple'.",
            extra_key="prices",
        )
        coupon = LookupTool(
            name="coupon",
            description="The percentage a coupon code takes off the total.",
            key_name="code",
            key_description="The coupon code.",
            extra_key="coupons",
        )
        super().__init__([price, coupon, calculator], parser="hermes", **kwargs)

    def make_task(self, options: dict[str, Any]) -> Task:
        rng = self.rng
        prices = {item: rng.randint(20, 900) for item in ITEMS}
        coupons = {code: pct for code, pct in zip(COUPONS, (5, 10, 20, 50), strict=True)}
        basket = {item: rng.randint(1, 9) for item in rng.sample(ITEMS, rng.randint(2, 4))}
        code = rng.choice(COUPONS)
        total = sum(prices[i] * n for i, n in basket.items())
        answer = total * (100 - coupons[code]) // 100  # the shop rounds discounts down to whole cents
        items = ", ".join(f"{n} {i}" for i, n in basket.items())
        question = (
            f"I am buying {items} and have the coupon {code}. What do I pay in cents, after the "
            "coupon (rounded down to a whole cent)?"
        )
        self.retried = False
        return Task(
            question, answer=answer, extra={"prices": prices, "coupons": coupons}, info={"answer": answer}
        )

    async def on_final(self, parsed: ParsedTurn) -> StepResult:
        assert self.task is not None
        right = parse_number(parsed.answer) == self.task.answer
        if right or self.retried:
            return StepResult(reward=(0.5 if self.retried else 1.0) * right, terminated=True)
        self.retried = True
        hint = "That is not right. Check each price with the price tool and compute with the calculator."
        return StepResult((Message("user", hint),))
