"""Tools of the support agent (examples/support.toml names them by import path)."""

from __future__ import annotations

import datetime

import raf


@raf.tool
def order_status(order_id: str) -> dict[str, str]:
    """Look up where an order is.

    Args:
        order_id: The order number, for example "A-1042".
    """
    # A stand-in for a real lookup.
    return {"order_id": order_id, "status": "shipped", "carrier": "DHL"}


@raf.tool
def today() -> str:
    """Today's date, as YYYY-MM-DD."""
    return datetime.date.today().isoformat()
