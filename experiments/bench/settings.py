"""How the bench measures latency: the ``thorough`` budget of :data:`paretorch.pipeline.core.latency.LATENCY_BUDGETS`,
for every row of every bench module (its own module: the row modules and the harness import it, not each other)."""

from __future__ import annotations

from paretorch.pipeline.core.latency import LATENCY_BUDGETS

BENCH_LATENCY = LATENCY_BUDGETS["thorough"]
