"""What the installed distribution says about itself: its version and its docs address."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, metadata, version

__all__: list[str] = []

#: The distribution's name on the package index ("raf" there is someone else's project).
DISTRIBUTION = "raf-agents"


def installed_version() -> str:
    """The installed version of raf-agents, ``"unknown"`` in a source tree never installed."""
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown"


def docs_url() -> str | None:
    """The ``Documentation`` address of the project metadata, ``None`` when there is none."""
    try:
        urls = metadata(DISTRIBUTION).get_all("Project-URL") or []
    except PackageNotFoundError:
        return None
    for entry in urls:
        label, _, url = str(entry).partition(",")
        if label.strip().lower() == "documentation" and url.strip():
            return url.strip()
    return None
