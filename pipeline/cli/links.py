"""``python -m paretorch.pipeline.cli.links``: print where to open the MLflow UI (``make ui`` runs it first)."""

from __future__ import annotations

import argparse

from paretorch.pipeline.tracking.tracker import default_tracking_uri
from paretorch.pipeline.tracking.views import experiment_links, study_links


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--base", default="http://127.0.0.1:5000", help="the UI's address")
    parser.add_argument("--tracking-uri", default=None, help="the MLflow store (default: the results' mlflow.db)")
    args = parser.parse_args(argv)
    uri = args.tracking_uri or default_tracking_uri()
    links = experiment_links(uri, args.base)
    if not links:
        print(f"MLflow UI: {args.base} (no paretorch experiment yet: run `make optimize` first)")
    for name, url in links:
        print(f"MLflow runs of {name}: {url}")
    for name, url in study_links(uri, args.base):
        print(f"MLflow study {name} (Pareto table, pareto.png): {url}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
