"""How many held-out questions of a reasoning-gym config also appear among its training questions.

The held-out split draws from another library seed, so the draws are disjoint, but a generator with few
distinct questions repeats some (docs/environments.md). This counts them for the tasks ``agentrl train``
evaluates (task seeds 10,000 on) and for the whole test split.

    python benchmarks/split_overlap.py reasoning-gym:chain_sum '{"max_terms": 3}' --tasks 32
"""

from __future__ import annotations

import argparse
import json

import agentrl
from agentrl.envs.reasoning_gym_env import ReasoningGymEnv


def build(env_id: str, split: str, kwargs: dict[str, object]) -> ReasoningGymEnv:
    """The ``split`` of ``env_id`` with its config ``kwargs``; refuses an env of another family."""
    env = agentrl.make(env_id, split=split, **kwargs)
    if not isinstance(env, ReasoningGymEnv):
        raise SystemExit(f"{env_id} is not a reasoning-gym:<dataset> env")
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("env", help="a reasoning-gym:<dataset> id")
    parser.add_argument("env_kwargs", nargs="?", default="{}", help="its config, JSON (python is ignored)")
    parser.add_argument("--tasks", type=int, default=32, help="evaluated tasks (seeds 10000 on)")
    args = parser.parse_args()
    kwargs = {k: v for k, v in json.loads(args.env_kwargs).items() if k != "python"}
    train, test = build(args.env, "train", kwargs), build(args.env, "test", kwargs)
    seen = {train.data[i]["question"] for i in range(train.size)}
    evaluated = [test.data[(10_000 + j) % test.size]["question"] for j in range(args.tasks)]
    every = [test.data[i]["question"] for i in range(test.size)]
    result = {
        "env": args.env,
        "env_kwargs": kwargs,
        "train_questions": train.size,
        "distinct_train_questions": len(seen),
        "evaluated": args.tasks,
        "evaluated_in_train": sum(q in seen for q in evaluated),
        "test_questions": test.size,
        "test_in_train": sum(q in seen for q in every),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
