"""`python -m dew.cli`: the `dew` command."""

from dew.cli import main

raise SystemExit(main())
