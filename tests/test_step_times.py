"""The engine's published step times (treewy/data, kind engine_steps) as notebook 04 shows them."""

import json

import pytest

from treewy import results
from treewy_lab.step_times import PATHS, step_times_chart, step_times_frame


def test_every_published_table_gives_labelled_rows():
    tables = results.tables("engine_steps")
    frame = step_times_frame()
    assert tables and frame.height == sum(len(json.loads(p.read_text())["rows"]) for p in tables)
    for p in tables:
        data = json.loads(p.read_text())
        assert f"{data['device']}, {data['date']}" in frame["measured on"].to_list()
    assert set(frame["path"]) <= set(PATHS.values()) and frame["step_ms"].min() > 0


def test_the_chart_has_one_row_per_device():
    spec = step_times_chart(step_times_frame()).to_dict()
    assert spec["facet"]["row"]["field"] == "measured on"
    assert spec["spec"]["encoding"]["x"]["scale"]["type"] == "log"


def test_no_published_table_says_how_to_publish_one():
    with pytest.raises(LookupError, match="publish"):
        step_times_frame(paths=[])
