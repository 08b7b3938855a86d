"""``python -m experiments.bench``: see :mod:`experiments.bench.harness`."""

from experiments.bench.harness import main

raise SystemExit(main())
