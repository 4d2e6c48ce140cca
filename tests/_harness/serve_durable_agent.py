"""A durable agent served by uvicorn: the recipe of docs/durable.md, "Serving a durable agent".

``uvicorn tests._harness.serve_durable_agent:create --factory`` builds
:func:`tests._harness.serve_agent.make_agent`'s agent, makes it durable, launches
DBOS on the SQLite system database ``RAF_TEST_SERVE["dbos"]`` and returns
the app (``db``: the sessions' SQLite file; ``deleted``: a file where each
run of ``delete`` adds a line; ``executor``: DBOS's executor id, distinct
per server on one system database). raf never launches DBOS: this does.
"""

from __future__ import annotations

import json
import os
from typing import Any

from dbos import DBOS

import raf.serve
from raf.durable import dbos_agent
from tests._harness.serve_agent import make_agent


def create() -> Any:
    """The ASGI app of a durable agent, DBOS launched (for uvicorn's ``--factory``)."""
    config = json.loads(os.environ["RAF_TEST_SERVE"])
    deleted = config.get("deleted")

    def on_delete(path: str) -> None:
        if deleted is not None:
            with open(deleted, "a") as log:
                log.write(path + "\n")

    # The durable agent first, then DBOS: the launch recovers the runs this worker left.
    agent = dbos_agent(make_agent(on_delete=on_delete), name="word-agent", approval_timeout=60)
    DBOS(
        config={
            "name": "raf-served",
            "system_database_url": f"sqlite:///{config['dbos']}",
            "log_level": "WARNING",
            "notification_listener_polling_interval_sec": 0.05,
            "executor_id": config.get("executor", "local"),  # one per server process
        }
    )
    DBOS.launch()
    return raf.serve.app(agent, store=config["db"])
