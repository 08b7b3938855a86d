"""``python -m paretorch.experiments.bench``: see :mod:`paretorch.experiments.bench.harness`."""

from paretorch.experiments.bench.harness import main

raise SystemExit(main())
