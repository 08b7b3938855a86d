"""Where sensitivity rankings are kept: in memory for this process (:class:`RankingMemo`) and
on disk for later runs and processes (:class:`RankingStore`, :data:`SENSITIVITIES` under the
results directory's ``cache/sensitivity``). :mod:`paretorch.stages.common.sensitivity` measures them.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from pathlib import Path

from paretorch.pipeline.core.paths import cache_dir


@dataclass
class SensitivityRanking:
    """What calibration learns about one model, change and set of calibration batches,
    whatever the error budget: reusable by a later calibration with another budget."""

    #: The switchable groups in module order: single units, siblings that must be switched
    #: together because one alone broke the forward pass, or whole blocks that were not
    #: sensitive enough to descend into (``blocks=True``).
    groups: list[tuple[str, ...]]
    #: Whole-model error with each candidate's group alone changed (group members share it).
    sensitivity: dict[str, float]
    #: Units that break the forward pass when changed, even with their siblings: kept original.
    unreducible: dict[str, str]
    #: Whole-model error over all batches with the ``k`` most sensitive groups moved back
    #: to the original form, for each ``k`` measured so far.
    errors: dict[int, float] = field(default_factory=dict)

    def ranked(self) -> list[tuple[str, ...]]:
        """The groups, most sensitive first; module order breaks ties (deterministic)."""
        order = sorted(range(len(self.groups)), key=lambda i: (-_sortable(self.sensitivity[self.groups[i][0]]), i))
        return [self.groups[i] for i in order]

    def to_json(self) -> str:
        return json.dumps(
            {
                "groups": [list(group) for group in self.groups],
                "sensitivity": self.sensitivity,
                "unreducible": self.unreducible,
                "errors": {str(k): v for k, v in self.errors.items()},
            }
        )

    @classmethod
    def from_json(cls, text: str) -> SensitivityRanking:
        data = json.loads(text)
        return cls(
            groups=[tuple(group) for group in data["groups"]],
            sensitivity={k: float(v) for k, v in data["sensitivity"].items()},
            unreducible=dict(data["unreducible"]),
            errors={int(k): float(v) for k, v in data["errors"].items()},
        )


class RankingMemo:
    """The last ``capacity`` rankings by key (least recently used dropped first)."""

    def __init__(self, capacity: int = 32) -> None:
        self.capacity = capacity
        self._rankings: OrderedDict[Hashable, SensitivityRanking] = OrderedDict()

    def get(self, key: Hashable) -> SensitivityRanking | None:
        ranking = self._rankings.get(key)
        if ranking is not None:
            self._rankings.move_to_end(key)
        return ranking

    def put(self, key: Hashable, ranking: SensitivityRanking) -> None:
        self._rankings[key] = ranking
        self._rankings.move_to_end(key)
        while len(self._rankings) > self.capacity:
            self._rankings.popitem(last=False)

    def clear(self) -> None:
        self._rankings.clear()


class RankingStore:
    """Rankings kept in memory (:class:`RankingMemo`) and as JSON files in a directory
    (one per key), so a resumed run or another process reuses them.

    ``directory`` is called when a file is needed (the results directory may change
    after import, e.g. ``--results-dir``)."""

    def __init__(self, directory: Callable[[], Path], capacity: int = 32) -> None:
        self.memo = RankingMemo(capacity)
        self._directory = directory

    def _path(self, key: tuple[str, ...]) -> Path:
        digest = hashlib.sha256("\x1f".join(key).encode()).hexdigest()[:32]
        return self._directory() / f"{digest}.json"

    def get(self, key: tuple[str, ...]) -> SensitivityRanking | None:
        """The ranking of ``key`` from memory, else from disk (an unreadable file is ignored: recalibrated)."""
        ranking = self.memo.get(key)
        if ranking is not None:
            return ranking
        path = self._path(key)
        if not path.is_file():
            return None
        try:
            ranking = SensitivityRanking.from_json(path.read_text())
        except (OSError, ValueError, KeyError, TypeError):
            return None  # a truncated or foreign file: calibrate afresh and overwrite it
        self.memo.put(key, ranking)
        return ranking

    def put(self, key: tuple[str, ...], ranking: SensitivityRanking) -> None:
        """Keep ``ranking`` in memory and write it (atomically) to disk."""
        self.memo.put(key, ranking)
        path = self._path(key)
        temporary = path.with_suffix(".tmp")
        temporary.write_text(ranking.to_json())
        temporary.replace(path)


#: The rankings of every calibration (AMP's and quantize's; keys start with the stage name),
#: in memory and under ``<results>/cache/sensitivity``: a search's trials and resumed runs
#: that calibrate the same input model the same way reuse them.
SENSITIVITIES = RankingStore(lambda: cache_dir("sensitivity"))


def _sortable(value: float) -> float:
    """NaN (a unit whose forward broke) sorts as the most sensitive."""
    return math.inf if math.isnan(value) else value
