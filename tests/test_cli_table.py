"""The command's tables: columns kept by importance to fit a width, in their own order, a free-text
column cut rather than left out, every cell on one line."""

from dew.cli._table import Table, printable

HEADERS = ["run", "a_long_header", "b", "notes"]
ROWS = [["r1", "1", "22", "x" * 30], ["r2", "333", "4", "short"]]


def test_everything_fits_without_a_width():
    lines, left = Table(HEADERS, ROWS, priority=[0, 2, 1, 3]).lines(None)
    assert left == [] and lines[0].split() == HEADERS
    assert lines[1] == "r1   1              22  " + "x" * 30


def test_columns_are_kept_by_priority_and_shown_in_their_order():
    lines, left = Table(HEADERS, ROWS, priority=[0, 2, 1, 3]).lines(24)
    assert lines == ["run  a_long_header  b", "r1   1              22", "r2   333            4"]
    assert left == ["notes"] and max(map(len, lines)) <= 24
    lines, left = Table(HEADERS, ROWS, priority=[0, 2, 3, 1]).lines(24)
    assert left == ["notes"]  # too wide to keep whole (and not to be cut): a later one fits
    assert lines[0] == "run  a_long_header  b"


def test_a_cut_column_takes_what_is_left():
    lines, left = Table(HEADERS, ROWS, priority=[0, 2, 3, 1], cut=3).lines(24)
    assert left == ["a_long_header"]
    assert lines == ["run  b   notes", "r1   22  " + "x" * 14 + "…", "r2   4   short"]
    assert max(map(len, lines)) == 24
    _, left = Table(HEADERS, ROWS, priority=[0, 2, 3, 1], cut=3).lines(16)
    assert "notes" in left  # fewer than 8 characters left: out rather than cut to nothing


def test_the_first_column_stays_even_when_it_alone_is_too_wide():
    lines, left = Table(["run", "b"], [["a-very-long-run-name", "1"]], priority=[0, 1]).lines(5)
    assert lines == ["run", "a-very-long-run-name"] and left == ["b"]


def test_control_characters_are_escaped_and_the_rest_kept():
    assert printable("lr\n0.1\t\x1b[31mé\u200b") == "lr\\n0.1\\t\\x1b[31mé\\u200b"
    lines, _ = Table(["run"], [["a\nb"]], priority=[0]).lines(None)
    assert lines == ["run", "a\\nb"]
