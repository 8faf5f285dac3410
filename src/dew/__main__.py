"""`python -m dew`: the `dew` command (as `python -m dew.cli`)."""

from dew.cli import main

if __name__ == "__main__":  # importing it (a docs walk of the package) runs nothing
    raise SystemExit(main())
