"""paretorch's best trials: the Pareto front's leads in the table's order (fastest first).

One list, decided by :func:`best_trials` from :func:`paretorch.pipeline.search.pareto.pareto_rows` (the table's rows:
each lead of the front, :mod:`paretorch.pipeline.search.front_rule`, with its ties), that every surface names: the
console's table (its first row is rank 1), its ``time to result`` line (the lead, rank 1) and its progress bar, MLflow
(the metric :data:`paretorch.pipeline.tracking.columns.RANK_METRIC` on each lead's run, 1 = the table's first row, which
the runs view ``make ui`` opens sorts by; the study run's note), and optuna-dashboard's study note.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from paretorch.pipeline.search.pareto import ParetoRow, pareto_rows, speedup_cell

if TYPE_CHECKING:
    import optuna

    from paretorch.pipeline.search.objectives import Objectives


@dataclass(frozen=True)
class BestTrial:
    """One lead of the front: its place in the table (rank 1 = the first row, the fastest) and its row."""

    rank: int
    row: ParetoRow

    @property
    def number(self) -> int:
        return self.row.trial

    @property
    def speedup(self) -> float:
        return self.row.speedup

    def describe(self, metric_name: str) -> str:
        """``trial 4: 4.11x [3.65, 4.32], accuracy 0.9950, int8s | ort``."""
        return (f"trial {self.number}: {speedup_cell(self.row)}, {metric_name} {self.row.metric:.4f}, "
                f"{self.row.short or self.row.recipe}")


def ranked(rows: Sequence[ParetoRow]) -> list[BestTrial]:
    """The table's rows as best trials, rank 1 first."""
    return [BestTrial(rank, row) for rank, row in enumerate(rows, start=1)]


def best_trials(study: optuna.Study, objectives: Objectives) -> list[BestTrial]:
    """paretorch's best trials of ``study``: the front's leads, in the table's order (empty: no feasible trial)."""
    return ranked(pareto_rows(study, objectives))


def best_numbers(best: Sequence[BestTrial]) -> str:
    """``4, then 11``: the trial numbers in rank order, in words."""
    return ", then ".join(str(b.number) for b in best) or "none"
