"""The demo's scenarios: one per complaint of docs/design.md §5, plus cold start and a healthy baseline.

A scenario is a real configuration of the tiny server (batching policy,
chunked prefill, batch delay, priorities, network distance, environment) and
a load shape drawn from the shipped real traces. `run_scenario` serves it and
replays the load through the instrumented client; the diagnosis then reads
the scenario's own `service.name`.
"""

from .catalog import SCENARIOS, Deployment, Scenario, get_scenario
from .runner import ScenarioRun, run_scenario

__all__ = [
    "SCENARIOS",
    "Deployment",
    "Scenario",
    "ScenarioRun",
    "get_scenario",
    "run_scenario",
]
