"""``python -m raf``: the same as the ``raf`` command."""

from raf.cli import main

raise SystemExit(main())
