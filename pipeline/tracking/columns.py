"""The columns MLflow's runs table opens with.

MLflow 3.17's experiment page shows no metric column until a user picks them. Its "share view"
keeps a view's UI state as JSON in the experiment tag ``mlflow.sharedViewState.<key>`` and loads it
when the page's URL carries ``viewStateShareKey=<key>`` (read from the UI bundle of mlflow 3.17.2:
the state's ``selectedColumns`` are column keys such as ``metrics.`accuracy``` and
``tags.`feasible```; ``columnOrder`` and ``columnWidths`` place and size the table's columns by their
ag-grid ids; ``orderByKey`` and ``orderByAsc`` sort the rows). Each study adds its headline metrics and the key
tags to the experiment's view, :data:`RANK_METRIC` (paretorch's best trials: 1 = the first row of the console's
Pareto table, :mod:`paretorch.pipeline.search.pareto`; only the front's leads carry it), the speed-up, the task metric,
its drop and ``feasible`` first, right of the run name (the trial's short recipe), so that they read on a 1366-px
screen; the view sorts by :data:`RANK_METRIC`, lowest first, so the study's best trial is the first row (runs
without a rank follow, the newest first; with several studies in one experiment, every study's rank 1 comes
before any rank 2). ``make ui`` prints the runs-table URL that opens it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Literal

#: The experiment-tag prefix MLflow's UI reads shared views from.
SHARED_VIEW_TAG_PREFIX = "mlflow.sharedViewState."
#: The URL parameter that names the shared view to open.
VIEW_PARAMETER = "viewStateShareKey"
#: The share key of paretorch's runs-table view.
VIEW_KEY = "paretorch-headline"
#: The experiment tag that holds the view.
VIEW_TAG = f"{SHARED_VIEW_TAG_PREFIX}{VIEW_KEY}"
#: Run tags shown as columns: the first ones (:data:`LEADING_TAGS`) right after the leading metrics, in this order.
KEY_TAGS = ("feasible", "outcome", "pareto")
LEADING_TAGS = ("feasible",)
#: The metric the view sorts by, lowest first: paretorch's rank of a front lead (1 = the table's first row).
RANK_METRIC = "front_rank"
#: The speed-up, the metric shown right after the rank (the same name in every study: latency keys carry the batch).
SORT_METRIC = "speedup"

#: Columns the runs table always shows, first (not part of ``selectedColumns``), by their ag-grid column ids: the run
#: name (the trial's short recipe), Created (kept to its status icon) and Duration.
RUN_NAME, CREATED, DURATION = "attributes.`Run Name`", "runDateAndNestInfo", "duration"
#: Widths (px) of the leading columns. At 1366 px, with MLflow 3.17's side navigation and its Assistant panel open
#: (a new browser opens it), the runs table has :data:`TABLE_WIDTH_1366` px right of its checkboxes: the run name,
#: Created, Duration, the leading metrics (the rank, the speed-up, the task metric, its drop) and the leading tags
#: fit there.
FIXED_WIDTHS = {RUN_NAME: 218, CREATED: 44, DURATION: 52}
METRIC_WIDTH = 72
LEADING_WIDTHS = {RANK_METRIC: 64, SORT_METRIC: 80, "metric_drop": 88}
TAG_WIDTHS = {"feasible": 68}
TABLE_WIDTH_1366 = 688

logger = logging.getLogger(__name__)


def column(kind: Literal["attributes", "metrics", "params", "tags"], name: str) -> str:
    """The UI's key of one column (its ``makeCanonicalSortKey``)."""
    return f"{kind}.`{name}`"


def headline_view(metrics: Sequence[str], tags: Sequence[str] = KEY_TAGS, previous: str | None = None,
                  search_filter: str = "", order_by: str = RANK_METRIC, leading: Sequence[str] = ()) -> str:
    """The view's JSON: the columns of ``previous`` (the experiment's current view, from other studies)
    first, then these metrics and tags; ``search_filter`` (MLflow search syntax) selects the rows, sorted
    by the metric ``order_by``, lowest first (runs without it last). The UI folds child runs under a collapsed
    parent row (which a shared view cannot expand) only while the table is sorted by date: sorted by a metric,
    every trial is a row of its own.

    ``leading`` (metric names: the rank, the speed-up, the task metric, its drop) and then the ``tags`` among
    :data:`LEADING_TAGS` are the first columns after the run name, at widths that fit a 1366-px screen
    (:func:`leading_widths`); the other columns follow."""
    columns = [column("metrics", m) for m in metrics] + [column("tags", t) for t in tags]
    kept = selected_columns(previous) if previous else []
    selected = kept + [c for c in columns if c not in kept]
    widths = leading_widths(leading, tags)
    first = [c for c in widths if c not in FIXED_WIDTHS]
    selected = [c for c in first if c not in selected] + selected
    return json.dumps({"selectedColumns": selected,
                       "columnOrder": list(widths) + [c for c in selected if c not in widths],
                       "columnWidths": widths,
                       "searchFilter": search_filter, "orderByKey": column("metrics", order_by), "orderByAsc": True})


def leading_widths(leading: Sequence[str], tags: Sequence[str] = KEY_TAGS) -> dict[str, int]:
    """The first columns, in order, with their widths (px): the fixed ones, the ``leading`` metrics (at
    :data:`LEADING_WIDTHS`, else :data:`METRIC_WIDTH`), then the ``tags`` among :data:`LEADING_TAGS`."""
    widths: dict[str, int] = dict(FIXED_WIDTHS)
    widths.update({column("metrics", name): LEADING_WIDTHS.get(name, METRIC_WIDTH) for name in leading})
    widths.update({column("tags", t): TAG_WIDTHS.get(t, METRIC_WIDTH) for t in tags if t in LEADING_TAGS})
    return widths


def selected_columns(view: str) -> list[str]:
    """The columns of a stored view; an unreadable view is replaced (with a warning), not merged."""
    try:
        state = json.loads(view)
    except json.JSONDecodeError as exc:
        logger.warning("replacing the unreadable MLflow runs-table view %s: %s", VIEW_TAG, exc)
        return []
    selected = state.get("selectedColumns") if isinstance(state, dict) else None
    if not isinstance(selected, list) or not all(isinstance(c, str) for c in selected):
        logger.warning("replacing the MLflow runs-table view %s: it has no list of selectedColumns", VIEW_TAG)
        return []
    return selected
