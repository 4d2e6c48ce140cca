"""raf.testing: the kit to test your own providers, session stores and stacks.

- :func:`check_provider`: a battery of simulated runs a context provider
  must pass (results, untouched arguments, post stages that never raise,
  no per-run state on ``self``, prompt cancellation), on asyncio and trio;
- :func:`check_session_store`: the session conformance suite, for a store
  of your own;
- :mod:`raf.testing.strategies`: hypothesis strategies (messages, tool
  calls, context results, stream updates, recording stacks) — the one
  module here that needs hypothesis (``pip install 'raf-agents[testing]'``);
- :mod:`raf.testing.plugin`: the pytest plugin (fixtures ``scripted_client``
  and ``anyio_backend``, the ``raf_offline`` marker and ``--raf-offline``),
  opt-in: ``pytest_plugins = ["raf.testing.plugin"]`` in a ``conftest.py``.

Importing this package imports neither hypothesis nor pytest.
"""

from raf.testing.checks import RULES, check_provider
from raf.testing.conformance import check_session_store

__all__ = ["RULES", "check_provider", "check_session_store"]
