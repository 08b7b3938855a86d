"""Which stored study a search resumes, and the stages it has: study names that survive a new stage.

The default study name (:func:`paretorch.pipeline.search.config.study_name`) no longer hashes the default
pipeline's stage list, so installing or adding a stage keeps it. One migration rule finds the
studies named before that change (:func:`find_study`): a study answers to its *key* (the current
default name) when its name is the key, when it recorded the key, or when its name is the key's
legacy form (:func:`paretorch.pipeline.search.config.legacy_study_name`: the stage list as installed now).
A study found the legacy way keeps its name and records the key when opened
(:data:`ATTR_STUDY_KEY`), so a stage added later still finds it. The same rule finds a default study named while
the default ``runtimes`` was a list (:data:`paretorch.pipeline.search.config.LEGACY_DEFAULT_RUNTIMES`), before it became
``all``.

Each opened study records its pipeline's stage nodes (:data:`ATTR_STAGES`) and the runtimes it searches
(:data:`ATTR_RUNTIMES`; by default every runtime available on the device, so installing a plugin renames no
study). Resuming with another set (a plugin stage or runtime installed or removed) would change the study's
search space silently, so it is refused with what changed, unless the run accepts it
(``--accept-plugin-change``): then a stage that joins enters the search space (Optuna takes new params as they
come: the trials before it ran with the stage off). A stage its trials used that is no longer installed cannot
be read back, so the study cannot resume at all: :func:`stage_change` says so in one line.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from paretorch.pipeline.core.errors import ConfigError

#: Study user attr: the default name the study answers to (set on every open; see :func:`find_study`).
ATTR_STUDY_KEY = "paretorch.study_key"
#: Study user attr: the pipeline's stage nodes as ``name:op`` (model stages and exports), in order.
ATTR_STAGES = "paretorch.stages"
#: Study user attr: the runtimes the study searches on its device, in the console's order.
ATTR_RUNTIMES = "paretorch.runtimes"
#: The flag that resumes a study whose stages or runtimes changed since its last run.
ACCEPT_FLAG = "--accept-plugin-change"


def find_study(studies: Mapping[str, Mapping[str, Any]], key: str, legacy: str | Sequence[str]) -> str:
    """The stored study (``studies``: name -> user attrs) that answers to ``key`` (see the module
    docstring), or to one of its ``legacy`` names, in order; ``key`` when there is none."""
    if key in studies:
        return key
    recorded = sorted(name for name, attrs in studies.items() if attrs.get(ATTR_STUDY_KEY) == key)
    if recorded:
        return recorded[0]
    return next((name for name in ([legacy] if isinstance(legacy, str) else legacy) if name in studies), key)


def stage_change(study_name: str, stored: Sequence[str] | None, current: Sequence[str],
                 unreadable: Collection[str] = ()) -> str | None:
    """What changed in a resumed study's stages (one line for the console), None if nothing did.
    ``unreadable``: stored stages that are not installed now and that some trial used: its record cannot be
    read back, so the study cannot resume (a :class:`ConfigError` that says so)."""
    if stored is None:
        return None
    if unreadable:
        raise ConfigError(f"study {study_name} has trials with stage(s) {', '.join(unreadable)}, which are not "
                          f"installed now: install them again to resume it, or start another study with "
                          f"--study-name NAME")
    joined = [s for s in current if s not in stored]
    left = [s for s in stored if s not in current]
    if not joined and not left:
        return None
    parts = []
    if joined:
        parts.append(f"{', '.join(joined)} joined its search space (its earlier trials ran with them off)")
    if left:
        parts.append(f"{', '.join(left)} left it (not in this pipeline)")
    return f"study {study_name}: " + "; ".join(parts)


def runtime_change(stored: Sequence[str] | None, current: Sequence[str]) -> str | None:
    """What changed in a resumed study's runtimes (a phrase), None if nothing did or nothing was recorded."""
    if stored is None:
        return None
    joined = [r for r in current if r not in stored]
    left = [r for r in stored if r not in current]
    parts = ([f"runtime(s) {', '.join(joined)} joined"] if joined else []) + (
        [f"runtime(s) {', '.join(left)} left"] if left else [])
    return "; ".join(parts) or None


def require_accepted(study_name: str, changes: Sequence[str], accepted: bool) -> None:
    """A :class:`ConfigError` when a resumed study's stages or runtimes changed and the run did not accept it."""
    if changes and not accepted:
        raise ConfigError(f"study {study_name} was begun with other stages or runtimes ({'; '.join(changes)}): "
                          f"resuming would change its search space; start a new study with --study-name NAME, or "
                          f"pass {ACCEPT_FLAG} to resume it with the installed set")
