"""agentrl's own environments (installed as ``agentrl.envs``); importing this module registers them.

Loaded lazily through the ``agentrl.envs`` entry point by the first ``agentrl.make(id)`` or
``agentrl.list_envs()``; ``agentrl.register_gymnasium()`` makes them ``gymnasium.make("agentrl/<id>")``.
"""

from agentrl import register
from agentrl.envs.tool_env import Task, ToolEnv
from agentrl.registry import register_family

__all__ = ["Task", "ToolEnv"]

register("guess-number-v0", "agentrl.envs.guess_number:GuessNumberEnv")
register("exact-answer-v0", "agentrl.envs.exact_answer:ExactAnswerEnv")
register("math-tir-v0", "agentrl.envs.math_tir:MathTIREnv")
# Big-number arithmetic only: a 135M model solves about 3 in 8 with the tool, so RL has signal on a CPU.
register("math-tir-arith-v0", "agentrl.envs.math_tir:MathTIREnv", kinds=("arithmetic",))
register("calculator-v0", "agentrl.envs.calculator:CalculatorEnv")
register("shop-v0", "agentrl.envs.shop:ShopEnv")
register("code-tests-v0", "agentrl.envs.code_tests:CodeTestsEnv")
# Longer than one context: env-written, policy-written or no compaction (--env-kwargs '{"context": ...}').
register("long-chain-v0", "agentrl.envs.long_chain:LongChainEnv")
# BFCL v4 multi-turn tasks graded by BFCL's checker (agentrl[bfcl]; bfcl-eval is imported only when built).
register("bfcl-multi-turn-v0", "agentrl.envs.bfcl:BFCLMultiTurnEnv")
# A one-turn writing task with no exact answer, rewarded by a judge or rubric (--reward.*).
register("judged-v0", "agentrl.envs.judged:JudgedEnv")
# Library catalogues, one env per member; the libraries are optional extras, imported on the first make.
register_family(
    "reasoning-gym",
    "agentrl.envs.reasoning_gym_env:ReasoningGymEnv",
    arg="dataset",
    names="agentrl.envs.reasoning_gym_env:dataset_names",
)
register_family(
    "textarena",
    "agentrl.envs.textarena_env:TextArenaEnv",
    arg="game",
    names="agentrl.envs.textarena_env:game_names",
)
