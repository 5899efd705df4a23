"""``Plan.report``: the HTML page ``autopar report`` writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import autopar


def test_the_report_is_one_page_with_the_plan(zoo_plan: autopar.Plan, tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    assert zoo_plan.report(page) == []
    html = page.read_text()
    assert html.lstrip().lower().startswith("<!doctype html")
    assert "dgx-h100" in html
    assert "<script src=" not in html and "<link " not in html


def test_a_plan_whose_model_is_gone_says_what_the_page_lacks(tmp_path: Path) -> None:
    model = tmp_path / "gone.onnx"
    model.write_bytes((Path(__file__).resolve().parents[2] / "fixtures/models/gpt2-tiny.ts.onnx").read_bytes())
    plan = autopar.plan(model, cluster="dgx-h100", gpus=8, global_batch=16)
    model.unlink()
    notes = plan.report(tmp_path / "report.html")
    assert notes and any(str(model) in n for n in notes), notes
    assert (tmp_path / "report.html").is_file()


def test_a_missing_folder_is_the_cli_error(zoo_plan: autopar.Plan, tmp_path: Path) -> None:
    page = tmp_path / "no" / "report.html"
    with pytest.raises(autopar.Error) as e:
        zoo_plan.report(page)
    assert str(e.value) == f"{page}: folder {page.parent} does not exist"
    assert json.loads(zoo_plan.to_json())["format"] == "autopar-plan"
