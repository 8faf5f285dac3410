"""`python -m dew.cli`: the `dew` command."""

from dew.cli import main

if __name__ == "__main__":  # importing it (a docs walk of the package) runs nothing
    raise SystemExit(main())
