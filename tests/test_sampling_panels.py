"""Notebook 04's panels headless: the decode waits for Run whatever control changed, the temperature sweep runs live
beside the committed one, and the acceptance chart's legend keeps full labels and fixed colours."""

import polars as pl
import pytest

pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("one_thread")


def test_decode_panel_waits_for_run_and_says_so():
    from treewy_lab.panels.base import STALE
    from treewy_lab.panels.sweep import DecodePanel
    from treewy.decode import generate
    from treewy.models.tokenizer import encode

    p = DecodePanel(tokens=16, tree="chain (1, 1, 1)")
    assert p.error is None and p.result.sampling is None and "greedy" in p.status.value
    greedy = generate(p.cached("model", None), [encode(p.controls["prompt"].value)], max_new_tokens=16)
    assert p.result.tokens == greedy.tokens
    assert p.progress.value == p.progress.max > 0
    first = p.result
    for name, value in dict(temperature=1.0, rule="rrs", drafter="ngram", tree="tree (2, 2, 1)", seed=3,
                            tokens=24, prompt="x = ").items():
        p.status.value = ""
        p.set(**{name: value})           # every control, the temperature slider too, waits for Run...
        assert p.status.value == STALE and p.result is first, name
    p.set(drafter="mtp", tree="chain (1, 1, 1)", tokens=16, prompt="def fibonacci(n):\n    ")
    p.run_button.click()                 # ...and Run decodes with all of them
    assert p.result.sampling.temperature == 1.0 and p.result.sampling.rule == "rrs" and p.result.sampling.seed == 3
    assert "sampled (rrs, seed 3)" in p.status.value and "tokens per step" in p.status.value
    assert "<pre" in p.text.value


def test_temperature_panel_runs_live_beside_the_committed_sweep():
    from treewy_lab.panels.sweep import TemperaturePanel

    p = TemperaturePanel(temperatures=(0.0, 1.0), prompts=1, tokens=8)
    live = p.frames["live"]
    assert set(live["rule"]) == {"match", "rrs", "rrs_wor"} and set(live["temperature"]) == {0.0, 1.0}
    assert set(live["shape"]) == {"(1, 1, 1)", "(3, 3, 3)"}
    sources = set(p.frames["temperature"]["source"])
    assert any(s.endswith("(live)") for s in sources) and any(s.endswith("(committed)") for s in sources)
    assert set(p.frames["temperature"]["drafter"]) == {"mtp"}
    assert "at temperature 1.0 the most tokens per step" in p.status.value
    p.set(temperatures=())
    with pytest.raises(ValueError, match="select at least one"):
        p.refresh()


def test_acceptance_legend_keeps_labels_and_colours():
    from treewy_lab.charts import acceptance_chart

    def frame(sources):
        return pl.DataFrame({"drafter": "mtp", "kind": "tree", "shape": "(1,)", "N": 1, "acceptance": 2.0,
                             "acceptance_lo": 1.9, "acceptance_hi": 2.1, "source": sources})

    live, committed, paper = ("tiny, CPU, now (live)", "tiny, NVIDIA H200, 2026-11-29 (committed)",
                              "paper: Qwen3.5-35B-A3B, B200 (measured)")
    colours = []
    for sources in ([live, committed, paper], [live, committed]):  # mtp shows the paper, ngram does not
        spec = acceptance_chart(frame(sources), "t").to_dict()
        enc = spec["layer"][-1]["encoding"]["color"]
        assert enc["legend"]["labelLimit"] == 0
        colours.append(dict(zip(enc["scale"]["domain"], enc["scale"]["range"])))
        assert "95 % interval" in spec["title"]["subtitle"]
    assert colours[0][live] == colours[1][live] and colours[0][committed] == colours[1][committed]
