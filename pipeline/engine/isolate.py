"""Samples one at a time in a child process: finds the sample that kills its worker.

The engine comes here only for a unit whose Ray worker died more than `engine.max_retries`
times (a segfault in a native decoder, an out-of-memory kill). The unit is read again here (a
third read, on this rare path only); every sample then goes alone through the phase's stages in
a child process (`python -m pipeline.engine.isolate`), which is restarted after a death. The sample a
child died on gets decode_error 'worker crash: ...' (reject kind worker_crash); the others get
exactly the results of the normal path. Stages are set up once per child, not per sample.
"""
from __future__ import annotations

import io
import os
import pickle
import struct
import subprocess
import sys

import pyarrow as pa


def _send(fh, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    fh.write(struct.pack("<Q", len(data)) + data)
    fh.flush()


def _recv(fh):
    head = fh.read(8)
    if len(head) < 8:
        raise EOFError("child closed its pipe")
    (n,) = struct.unpack("<Q", head)
    data = fh.read(n)
    if len(data) < n:
        raise EOFError("child closed its pipe")
    return pickle.loads(data)  # our own child's reply, never data from outside


def _ipc(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue()


def _from_ipc(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(data).read_all()


class _Child:
    """A `python -m pipeline.engine.isolate` process that runs the stages on one row per request."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-m", "pipeline.engine.isolate"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE)

    def run(self, request) -> pa.Table:
        _send(self.proc.stdin, request)
        ok, payload = _recv(self.proc.stdout)
        if not ok:
            raise RuntimeError(payload)
        return _from_ipc(payload)

    def close(self) -> int:
        for fh in (self.proc.stdin, self.proc.stdout):
            try:
                fh.close()
            except OSError:
                pass
        return self.proc.wait()


def run_rows_isolated(table: pa.Table, stage_names: list[str], cfg: dict, score_all: bool) -> tuple[pa.Table, int]:
    """Every row through the stages in a child process; (result, how many rows killed a child)."""
    from pipeline.engine.columns import set_column, typed
    out, crashes, child = [], 0, None
    meta = table.schema.metadata
    for i in range(table.num_rows):
        row = table.slice(i, 1)
        if child is None:
            child = _Child()
        try:
            out.append(child.run((stage_names, cfg, score_all, _ipc(row))))
        except (EOFError, BrokenPipeError, OSError):
            code = child.close()
            child = None
            crashes += 1
            msg = (f"worker crash: the process running stages {', '.join(stage_names)} died on this sample "
                   f"(exit status {code}) every time it was tried")
            row = set_column(row, "decode_error", typed("decode_error", [msg]))
            out.append(set_column(row, "_alive", pa.array([False], pa.bool_())))
    if child is not None:
        child.close()
    result = pa.concat_tables(out, promote_options="default") if out else table
    return result.replace_schema_metadata(meta), crashes


def isolate_unit(run: str, unit: dict, phase: str, cfg: dict, score_all: bool, limits: dict) -> dict:
    """Ray task: one unit of `phase` ('measure' | 'score') with each sample alone; writes the unit's
    outputs exactly as the normal path does and returns its summary. Phase 1 reads the unit in
    batches of engine.max_batch_bytes; phase 3's children read back each row's bytes themselves."""
    import pyarrow as pa

    from pipeline.engine import unit_io
    from pipeline.engine.columns import unit_meta, with_meta
    from pipeline.inputs.units import Unit
    from pipeline.inputs.listing import load_unit
    from pipeline.stages import build_stages
    from catalog.storage import retry
    retry.configure(cfg)
    run_p = run  # a local path or a URI: unit_io writes through catalog/storage
    u = load_unit(Unit.from_dict(unit), unit_io.listing_path(run_p))
    names = [s.name for s in build_stages(cfg) if s.phase == phase and s.enabled and s.name in cfg["stages"]]
    crashes = 0
    if phase == "measure":
        meta = {"unit": u.brief().to_dict(), "seconds": {}}
        rows, error_of = unit_io.iter_rows(u, limits)
        parts = []
        for batch in unit_io.batches_by_bytes(rows, unit_io.max_batch_bytes(cfg)):
            table = unit_io.read_table(batch, meta)
            if names:
                table, n = run_rows_isolated(table, names, cfg, score_all)
                crashes += n
            parts.append(unit_io.measured_only(table))
        meta.update(unit_error=error_of(), worker_crashes=crashes, isolated=True)
        from catalog.schema import MEASURE
        unit_io.write_measure(run_p, u.unit_id, pa.concat_tables(parts) if parts else MEASURE.empty_table(), meta)
    else:
        table = unit_io.read_for_score(run_p, u, limits, score_all, cfg)
        meta = unit_meta(table)
        if names and table.num_rows:
            table, crashes = run_rows_isolated(table, names, cfg, score_all)
        meta["worker_crashes"] = (meta.get("worker_crashes") or 0) + crashes
        meta["isolated"] = True
        unit_io.finish_unit(run_p, with_meta(table, meta), cfg)
    return {"unit_id": u.unit_id, "worker_crashes": crashes}


def isolated(run: str, call, *args) -> dict:
    """call(*args): one unit's isolate_unit result (in this process or from its Ray task), logged; a fault
    of the environment stops the run (EnvironmentFault), any other error is the run's (RunError)."""
    import logging

    from pipeline.engine.errors import EnvironmentFault, RunError, environment_fault
    try:
        result = call(*args)
    except Exception as e:
        fault = environment_fault(e, str(run))
        if fault:
            raise EnvironmentFault(fault) from e
        raise RunError(f"a unit failed even with its samples run one at a time: {e}") from e
    logging.getLogger("humanset.curate").warning("unit %s: %d worker crashes isolated", result["unit_id"],
                                                 result["worker_crashes"])
    return result


def _serve() -> None:
    """Child: answer (stage names, cfg, score_all, one-row table) requests until stdin closes."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything a stage prints goes to stderr, never into the reply pipe
    inp = sys.stdin.buffer
    from pipeline.engine.adapter import run_on_unit
    from pipeline.stages import stage_class
    stages: dict[str, object] = {}
    while True:
        try:
            names, cfg, score_all, data = _recv(inp)
        except EOFError:
            return
        try:
            table = _from_ipc(data)
            for name in names:
                if name not in stages:
                    stages[name] = stage_class(name)(cfg.get(name) or {})
                    stages[name].setup()
                table = run_on_unit(stages[name], table, score_all)
            _send(out, (True, _ipc(table)))
        except Exception as e:  # the stage wrapper already isolates rows; this is a bug report
            _send(out, (False, f"{type(e).__name__}: {e}"))


if __name__ == "__main__":
    _serve()
