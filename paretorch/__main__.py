"""``python -m paretorch <command>``: the ``paretorch`` command (:mod:`pipeline.cli.main`).

``paretorch`` (its ``__init__``) has imported the project's ``pipeline`` from beside it already, so a
``pipeline.py`` of your own in the working directory, which ``python -m`` puts first on ``sys.path``, is not the
one that runs.
"""

import time

#: When the command started, before the imports (torch takes seconds): the `time:` line of optimize covers them.
STARTED = time.perf_counter()

from pipeline.cli.main import run  # noqa: E402

run(started=STARTED)
