"""The engine's run log: a bar on a terminal, log lines otherwise, never both; JSONL either way."""
import io
import json

import pytest

from training.trainer import RunLog, fmt_eta


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


def test_run_log_without_a_terminal_prints_at_most_one_line_per_interval(tmp_path, capsys):
    # the log's own clock, not the global time.perf_counter (which other threads also read)
    readings = iter([0.0, 0.0, 1.0, 2.0, 31.0, 32.0, 33.0])  # t0, then one reading per write
    logger = RunLog(tmp_path / "log.jsonl", "finetune", total=6, start=0, global_batch=8, interval=30.0,
                    clock=lambda: next(readings))
    for step in range(1, 7):
        logger.write(step, 0.5, 1e-3, 1.0)
    logger.close()
    printed = [int(line.split()[2].split("/")[0]) for line in capsys.readouterr().out.splitlines()]
    assert printed == [1, 4, 6]  # the first, the first after 30 s, the last
    assert len((tmp_path / "log.jsonl").read_text().splitlines()) == 6  # the JSONL keeps every step
