"""The engine's run log: a bar on a terminal, log lines otherwise, never both; JSONL either way."""
import io
import json

import pytest

from training.engine import RunLog, fmt_eta


class Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("tty", [False, True])
def test_run_log_shows_a_bar_on_a_terminal_and_lines_otherwise(tty, tmp_path, monkeypatch, capsys):
    err = Terminal() if tty else io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    logger = RunLog(tmp_path / "log.jsonl", "pretrain", total=4, start=0, global_batch=8)
    for step in (1, 2):
        logger.write(step, 0.5, 1e-3, 1.0, {"skipped_reads": 1})
    logger.close()
    out = capsys.readouterr().out
    records = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2] and records[0]["skipped_reads"] == 1
    if tty:
        assert out == "" and "pretrain" in err.getvalue() and "2/4" in err.getvalue()  # the bar only
    else:
        assert out.splitlines()[1].startswith("pretrain step 2/4 loss 0.5000") and "skipped reads 1" in out
        assert err.getvalue() == ""  # no bar


def test_eta_format():
    assert fmt_eta(3725) == "1:02:05" and fmt_eta(float("nan")) == "?"
