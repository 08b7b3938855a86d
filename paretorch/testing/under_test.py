"""The plugin a contract class tests: the name its subclass sets, looked up in the registry of its kind."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

import pytest

T = TypeVar("T")


def under_test(contract: object, attribute: str, kind: str, registered: Mapping[str, T], group: str) -> T:
    """The registered ``kind`` named by ``contract``'s class attribute ``attribute``; a subclass that sets none, or
    names one no installed entry point of ``group`` declares, fails with what to do."""
    name = getattr(contract, attribute, None)
    if not name:
        pytest.fail(f"{type(contract).__name__}: set the class attribute {attribute} = '<your {kind}'s name>'")
    if name not in registered:
        pytest.fail(f"{kind} '{name}' is not registered: install the package that declares it in the "
                    f"'{group}' entry points (registered: {', '.join(sorted(registered))})")
    return registered[name]
