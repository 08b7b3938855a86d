"""The columns MLflow's runs table opens with.

MLflow 3.17's experiment page shows no metric column until a user picks them. Its "share view"
keeps a view's UI state as JSON in the experiment tag ``mlflow.sharedViewState.<key>`` and loads it
when the page's URL carries ``viewStateShareKey=<key>`` (read from the UI bundle of mlflow 3.17.2:
the state's ``selectedColumns`` are column keys such as ``metrics.`accuracy``` and
``tags.`feasible```). Each study adds its headline metrics and the key tags to the experiment's
view; ``make ui`` prints the runs-table URL that opens it.
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
#: Run tags shown as columns next to the headline metrics.
KEY_TAGS = ("feasible", "pareto")
#: The metric the view sorts by, highest first: the same name in every study (latency keys carry the batch).
SORT_METRIC = "speedup"

logger = logging.getLogger(__name__)


def column(kind: Literal["attributes", "metrics", "params", "tags"], name: str) -> str:
    """The UI's key of one column (its ``makeCanonicalSortKey``)."""
    return f"{kind}.`{name}`"


def headline_view(metrics: Sequence[str], tags: Sequence[str] = KEY_TAGS, previous: str | None = None,
                  search_filter: str = "", order_by: str = SORT_METRIC) -> str:
    """The view's JSON: the columns of ``previous`` (the experiment's current view, from other studies)
    first, then these metrics and tags; ``search_filter`` (MLflow search syntax) selects the rows, sorted
    by the metric ``order_by``, highest first. The UI folds child runs under a collapsed parent row (which
    a shared view cannot expand) only while the table is sorted by date: sorted by a metric, every trial
    is a row of its own."""
    columns = [column("metrics", m) for m in metrics] + [column("tags", t) for t in tags]
    kept = selected_columns(previous) if previous else []
    return json.dumps({"selectedColumns": kept + [c for c in columns if c not in kept],
                       "searchFilter": search_filter, "orderByKey": column("metrics", order_by), "orderByAsc": False})


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
