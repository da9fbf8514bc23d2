"""The math grading worker process, ``python -m agentrl.rewards._math_worker`` (:mod:`agentrl.rewards.math`).

A module of its own so that running it does not re-execute ``agentrl.rewards.math``, which the package has
already imported."""

from agentrl.rewards.math import serve

if __name__ == "__main__":
    serve()
