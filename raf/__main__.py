"""``python -m raf``: the same as the ``raf`` command."""

from raf._cli import main

raise SystemExit(main())
