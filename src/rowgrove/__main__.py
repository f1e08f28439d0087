"""`python -m rowgrove ...`: the same as the `rowgrove` command."""

from rowgrove.cli import main

raise SystemExit(main())
