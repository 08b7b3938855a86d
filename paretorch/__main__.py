"""``python -m paretorch <command>``: the ``paretorch`` command (:mod:`paretorch.pipeline.cli.main`)."""

import time

#: When the command started, before the imports (torch takes seconds): the `time:` line of optimize covers them.
STARTED = time.perf_counter()

from paretorch.pipeline.cli.main import run  # noqa: E402

run(started=STARTED)
