"""The Ray runtime's restart budgets (rollout worker replacements, inference server restarts): a budget per
sliding time window, so a long run survives faults that come now and then and gives up on a burst (no Ray)."""

import pytest

from agentrl.errors import ConfigError, InfraError
from agentrl.trainers.ray import RayOptions
from agentrl.trainers.ray.ledger import RestartBudget


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_a_burst_past_the_budget_gives_up_and_names_the_budget():
    clock = Clock()
    budget = RestartBudget("rollout worker replacements", 2, 60.0, clock)
    budget.spend()
    clock.t += 1
    budget.spend()
    assert budget.used() == 2
    with pytest.raises(
        InfraError, match=r"2 rollout worker replacements within 60 s, the budget is 2 per 60 s"
    ):
        budget.spend()
    assert budget.total == 2  # the refused restart is not counted


def test_the_budget_refills_as_restarts_age_out_of_the_window():
    clock = Clock()
    budget = RestartBudget("restarts of server-0", 2, 60.0, clock)
    for _ in range(50):  # 50 restarts a run, spread out: a per-run budget of 2 would have ended it at the 3rd
        budget.spend()
        clock.t += 31.0
    assert budget.total == 50 and budget.used() == 1
    budget.spend()  # restarts 31 s and 0 s ago
    clock.t += 28.0  # now 59 s and 28 s ago: both still count
    with pytest.raises(InfraError):
        budget.spend()
    clock.t += 1.0  # now the older one is exactly a window old and no longer counts
    budget.spend()
    assert budget.used() == 2


def test_a_zero_budget_refuses_the_first_restart():
    with pytest.raises(InfraError, match="budget is 0"):
        RestartBudget("restarts of server-1", 0, 10.0).spend()


@pytest.mark.parametrize(
    ("limit", "window", "match"),
    [(-1, 10.0, "int >= 0"), (True, 10.0, "int >= 0"), (1.5, 10.0, "int >= 0"), (1, 0.0, "> 0 seconds")],
)
def test_bad_budgets_are_config_errors(limit, window, match):
    with pytest.raises(ConfigError, match=match):
        RestartBudget("x", limit, window)


def test_the_ray_options_default_to_a_one_hour_window():
    opts = RayOptions()
    assert (opts.max_replacements, opts.server_restarts, opts.budget_window_s) == (16, 3, 3600.0)
