"""benchmarks/output.py: every benchmark's --json prints the report and nothing else; without it, the text."""

from __future__ import annotations

import json

from output import emit


def test_json_is_the_report_alone_and_text_is_the_benchmarks_own(capsys):
    report = {"ratio": 1.25, "rounds": [1.2, 1.3]}
    assert emit(report, True, lambda: print("never shown")) == 0
    assert json.loads(capsys.readouterr().out) == report
    assert emit(report, False, lambda: print("ratio 1.25x")) == 0
    assert capsys.readouterr().out == "ratio 1.25x\n"
