"""Frames shown whole: polars' own display hides rows past ten and cuts text at 30 characters."""

from __future__ import annotations

import polars as pl
from IPython.display import HTML


def full_table(df: pl.DataFrame) -> HTML:
    """Every row and column of ``df``, no text shortened, as an HTML table for a notebook cell."""
    with pl.Config(tbl_rows=-1, tbl_cols=-1, fmt_str_lengths=10_000, fmt_table_cell_list_len=-1,
                   tbl_hide_dataframe_shape=True, tbl_hide_column_data_types=True):
        return HTML(df._repr_html_())
