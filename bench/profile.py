"""Where a curation run's time goes: per phase wall and CPU time, split into fixed cost and per-image
cost, and per stage images/s per core. Prints one JSON object.

    python bench/profile.py 480                   # the default stages on the mixed crawl of bench/filters.py
    python bench/profile.py 20000 --workdir DIR   # keeps the generated crawl in DIR for reuse
    python bench/profile.py 100000 --cheap --workdir DIR   # the cheap path (decode, size, dedup) on bench/scale.py's crawl

Markdown for docs/benchmarks.md (the per-phase and per-stage tables, one column group per run):

    python bench/profile.py 480 --out p480.json
    python bench/profile.py 20000 --workdir DIR --out p20k.json
    python bench/profile.py --table p480.json p20k.json

(A script run from bench/ has this folder first on sys.path, where this file is found for the standard
library's `profile`, which cProfile imports (torch._dynamo does): imported under that name, it puts the
standard library's module in its place before anything else; tests/test_bench_profile.py checks it.)

The run is `pipeline.engine.driver.curate` in a child process, as `humanset curate` runs it: with a
private local Ray, or, for a run of at most engine.local_max_files inputs, the local executor's pool
(`executor` in the output; --set engine.executor=ray|local picks one). This process is made the child subreaper of everything the run starts (so no process
of the run leaves its tree), and the CPU time of every process of the run (driver, Ray's own daemons,
task workers, model actors) is read from /proc every 0.1 s, each process' last reading kept after it
exits: `cpu_s` (user + system) is the run's CPU time and, unlike wall time, hardly moves with other
jobs on the machine. Each of the driver's steps (manifest.json `timeline.spans`: Ray start, measure,
dedup, scoring, the fallback exchanges and rounds, the write pass, compaction, the closing counts,
clean-up) gets its CPU seconds as well as its wall seconds.

  phases[]: name, wall_s, cpu_s (all processes), per_image_cpu_s (the seconds spent inside the steps
            that work on images, from the units' stats markers: read, decode, size, pHash, the model
            stages, the writer), fixed_cpu_s = cpu_s - per_image_cpu_s (Ray's scheduling, process and
            actor start, model load, barriers, the driver), and fixed_wall_s = wall_s - per_image_cpu_s /
            CPUs (the wall time the work on images does not explain, at full use of the CPUs).
  stages{}: per step: images it saw, CPU seconds, images/s per core (= images / CPU seconds), ms per
            image (`run_stages`: the run's configured stages).
  model_actors: model actors started in the run (a process each: ray::...(_ActorFn); none with the
            local executor, whose workers load the models) and the set-up seconds per stage (start to
            model ready, from the markers).
  totals:   wall_s of the run (Ray start included), cpu_s of every process, images/s, images/s per
            core (images / cpu_s).

  table:    the run's markdown tables go to stderr; --table prints those of saved JSON outputs instead of a run.

Options: --files-per-unit (16 for the mixed crawl, as bench/filters.py; the cheap crawl is shards of
1,000), --set KEY=VALUE (config overrides, repeatable), --num-cpus (the local Ray's CPUs), --out FILE.
"""
from __future__ import annotations

import sys


def _standard_profile():
    """The standard library's profile module, loaded by its path and registered as `profile`."""
    import importlib.util
    import sysconfig
    from pathlib import Path as _Path
    spec = importlib.util.spec_from_file_location("profile", _Path(sysconfig.get_paths()["stdlib"]) / "profile.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["profile"] = module  # the import statement that found this file returns this entry
    spec.loader.exec_module(module)
    return module


if __name__ == "profile":  # found for `import profile` because bench/ is sys.path[0]: not this benchmark
    _standard_profile()

import argparse  # noqa: E402
import ctypes  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from datetime import datetime, timezone  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent

PR_SET_CHILD_SUBREAPER = 36
SAMPLE_S = 0.1
MEASURE_STEPS = ("read", "decode", "size", "dedup")  # phase 1's steps on images (marker names)
WRITE_STEPS = ("write",)


def _become_subreaper() -> bool:
    """Orphans of the run (Ray's workers when their raylet goes first) are re-parented to this process,
    not to init: they stay in the tree the sampler reads, and are reaped here."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


class TreeCPU:
    """CPU seconds (user + system) of this process' descendants over time: each process' own CPU time,
    read from /proc every SAMPLE_S and kept at its last reading once it is gone. (Ray's raylet reaps its
    workers without adding their time to its own children's, so RUSAGE_CHILDREN would lose every
    worker and actor that exits before the end; what this misses is a process' last SAMPLE_S.)
    Each process is also put in a group by its title (`group_of`), so a span's CPU splits by who spent it."""

    def __init__(self, driver_pid: int | None = None):
        import psutil
        self.psutil, self.me = psutil, psutil.Process()
        self.driver_pid = driver_pid
        self.seen: dict[tuple[int, float], float] = {}  # (pid, start time) -> own CPU seconds
        self.group: dict[tuple[int, float], str] = {}
        self.title: dict[tuple[int, float], str] = {}
        self.series: dict[tuple[int, float], list] = {}  # (pid, start time) -> [(time, CPU seconds)]
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def group_of(self, p) -> str:
        """driver | ray_daemons (gcs, raylet, agents) | model_actors | workers (Ray tasks, Ray Data's, and
        the local executor's pool: pipeline/engine/local.py)."""
        if p.pid == self.driver_pid:
            return "driver"
        title = " ".join(p.cmdline())
        self.title[(p.pid, p.create_time())] = title[:80]
        if "_ActorFn" in title:
            return "model_actors"
        if title.startswith("ray::") or "default_worker.py" in title or "multiprocessing" in title:
            return "workers"
        return "ray_daemons"

    def total(self) -> float:
        now = time.time()
        for p in self.me.children(recursive=True):
            try:
                t = p.cpu_times()
                key = (p.pid, p.create_time())
                if self.group.get(key) in (None, "workers"):  # an idle worker may become an actor
                    self.group[key] = self.group_of(p)
                self.seen[key] = t.user + t.system
                self.series.setdefault(key, []).append((now, self.seen[key]))
            except (self.psutil.NoSuchProcess, self.psutil.AccessDenied, self.psutil.ZombieProcess):
                continue
        return sum(self.seen.values())

    def by_group(self, a: float, b: float) -> dict[str, float]:
        """CPU seconds of each group of processes between epoch times a and b."""
        import numpy as np
        out: dict[str, float] = {}
        for key, pts in self.series.items():
            ts, vs = np.array([x[0] for x in pts]), np.array([x[1] for x in pts])
            got = float(np.interp(b, ts, vs, left=0.0) - np.interp(a, ts, vs, left=0.0))
            g = self.group.get(key, "workers")
            out[g] = out.get(g, 0.0) + got
        return {k: round(v, 2) for k, v in sorted(out.items())}

    def processes(self, t0: float, top: int = 25) -> list[dict]:
        """The processes that used the most CPU: title (as last read), group, CPU seconds, and when
        they were first and last read (seconds after t0)."""
        rows = [{"title": self.title.get(k, ""), "group": self.group.get(k), "cpu_s": round(pts[-1][1], 2),
                 "seen_s": [round(pts[0][0] - t0, 1), round(pts[-1][0] - t0, 1)]} for k, pts in self.series.items()]
        return sorted(rows, key=lambda r: -r["cpu_s"])[:top]

    def actors(self) -> int:
        return sum(1 for g in self.group.values() if g == "model_actors")

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.time(), self.total()))
            self._stop.wait(SAMPLE_S)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def at(self, t: float) -> float:
        """CPU seconds used by time t (epoch), interpolated between samples; monotone."""
        import numpy as np
        ts = np.array([s[0] for s in self.samples])
        vs = np.maximum.accumulate(np.array([s[1] for s in self.samples]))
        return float(np.interp(t, ts, vs))


def _reap_all(timeout: float = 30.0) -> None:
    """Wait for every process left in this process' tree (re-parented Ray workers), then kill the
    ones still there by their pid (they are this run's)."""
    import psutil
    deadline = time.time() + timeout
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid:
            continue
        if time.time() > deadline:
            for p in psutil.Process().children():
                try:
                    p.kill()
                except psutil.NoSuchProcess:
                    pass
            deadline = time.time() + timeout
        time.sleep(0.1)


def driver(crawl: str, run: str, sets: list[str], num_cpus: int | None) -> None:
    """The run itself (child process): curate (a private local Ray, or the local executor), then shut
    Ray down if the run started it."""
    import logging
    logging.basicConfig(level=logging.WARNING)

    from pipeline.config import load_config
    from pipeline.engine.driver import curate
    cfg = load_config(sets=[*([f"ray.num_cpus={num_cpus}"] if num_cpus else []), *sets])
    t0 = time.time()
    manifest = curate([crawl], run, cfg, progress=False)
    t1 = time.time()
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
    print(json.dumps({"start": t0, "end": t1, "shutdown_end": time.time(), "units": manifest["units"],
                      "executor": manifest.get("executor", "ray"), "counts": manifest["counts"], "stages": manifest["stages"]}))


def _markers(run: Path) -> tuple[dict, dict, dict]:
    """Sums over the units' stats markers: wall and CPU seconds per step, model actors' set-up spans."""
    wall: dict[str, float] = {}
    cpu: dict[str, float] = {}
    setups: dict[str, set] = {}
    for f in (run / "stats").glob("*.json"):
        m = json.loads(f.read_text())
        for k, v in (m.get("seconds") or {}).items():
            wall[k] = wall.get(k, 0.0) + float(v)
        for k, v in (m.get("cpu_seconds") or {}).items():
            cpu[k] = cpu.get(k, 0.0) + float(v)
        for k, span in (m.get("actor_setup") or {}).items():
            setups.setdefault(k, set()).add(tuple(span))
    return wall, cpu, setups


def _images_per_stage(run: Path) -> dict[str, int]:
    import catalog
    con = catalog.connect(run)
    rows = con.execute("SELECT s, count(*) FROM (SELECT unnest(scored_stages) AS s FROM samples) GROUP BY 1").fetchall()
    out = {name: int(n) for name, n in rows}
    out["_inputs"] = int(con.execute("SELECT count(*) FROM samples").fetchone()[0])
    out["_written"] = int(con.execute("SELECT count(*) FROM samples WHERE keep").fetchone()[0])
    return out


def _phase_of(span: str) -> str:
    if span in ("measure",):
        return "measure"
    if span in ("score", "score+write") or span.startswith("fallback_"):
        return "score"
    if span == "write":
        return "write"
    return "fixed"


def profile(run: Path, spans: list, tree: TreeCPU, info: dict, cpus: float, t_launch: float) -> dict:
    wall, cpu, setups = _markers(run)
    images = _images_per_stage(run)
    n = images["_inputs"]
    score_steps = [s for s in cpu if s not in MEASURE_STEPS and s not in WRITE_STEPS]
    per_image = {"measure": sum(cpu.get(s, 0.0) for s in MEASURE_STEPS),
                 "score": sum(cpu.get(s, 0.0) for s in score_steps),
                 "write": sum(cpu.get(s, 0.0) for s in WRITE_STEPS)}
    has_write_pass = any(name == "write" for name, *_ in spans)
    if not has_write_pass:  # without fallback rounds the writer runs inside score+write
        per_image["score"] += per_image.pop("write")
    phases = []
    spans = [["driver_start", t_launch, info["start"]], *spans]  # the driver's imports and config
    for name, a, b in spans:
        c = tree.at(b) - tree.at(a)
        ph = _phase_of(name)
        row = {"name": name, "wall_s": round(b - a, 2), "cpu_s": round(c, 2), "cpu_by": tree.by_group(a, b)}
        if ph in per_image and name in ("measure", "score", "score+write", "write"):
            w = per_image[ph]
            row.update(per_image_cpu_s=round(w, 2), fixed_cpu_s=round(c - w, 2),
                       fixed_wall_s=round(max(0.0, (b - a) - w / cpus), 2),
                       per_image_cpu_ms=round(1e3 * w / max(n, 1), 2))
        elif ph == "score":  # a fallback round: its images' work is in the markers' totals (score)
            row.update(fixed_wall_s=None)
        else:
            row.update(per_image_cpu_s=0.0, fixed_cpu_s=round(c, 2), fixed_wall_s=round(b - a, 2))
        phases.append(row)
    after = tree.at(info["shutdown_end"]) - tree.at(info["end"])
    phases.append({"name": "ray_shutdown", "wall_s": round(info["shutdown_end"] - info["end"], 2),
                   "cpu_s": round(after, 2), "per_image_cpu_s": 0.0, "fixed_cpu_s": round(after, 2),
                   "fixed_wall_s": round(info["shutdown_end"] - info["end"], 2)})
    stages = {}
    for step in sorted(cpu, key=lambda s: -cpu[s]):
        seen = images.get(step) or (n if step in ("read", "read_2") else images["_written"] if step == "write" else n)
        if step == "read_2":  # the bytes read back for the model stages
            seen = max((images.get(s, 0) for s in score_steps if s != "read_2"), default=0)
        stages[step] = {"images": seen, "cpu_s": round(cpu[step], 2), "wall_s": round(wall.get(step, 0.0), 2),
                        "images_per_s_per_core": round(seen / cpu[step], 2) if cpu[step] else None,
                        "cpu_ms_per_image": round(1e3 * cpu[step] / seen, 2) if seen else None}
    actors = {k: {"actors": len(v), "setup_s_max": round(max(b - a for a, b in v), 2)} for k, v in setups.items()}
    return {"phases": phases, "stages": stages,
            "model_actors": {"started": tree.actors(), "per_stage_in_markers": actors}}


def sibling(name: str):
    """bench/{name}.py as a module (bench_{name})."""
    import importlib.util
    key = f"bench_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, HERE / f"{name}.py")
        sys.modules[key] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[key])
    return sys.modules[key]


def _crawl(args, work: Path) -> tuple[Path, list[str]]:
    """The input: the mixed human crawl (bench/filters.py) or, with --cheap, bench/scale.py's shards."""
    if args.cheap:
        scale = sibling("scale")
        folder = work / f"cheap-{args.n}"
        scale.make_crawl(folder, args.n, max(1, os.cpu_count() or 1))
        return folder, ["stages=[decode,size,dedup]", "size.min_short_side=300"]
    folder = work / f"mixed-{args.n}"
    if not (folder / ".complete").exists():
        shutil.rmtree(folder, ignore_errors=True)
        if args.n <= CHUNK:  # bench/filters.py's crawl of n images, the same files
            sibling("filters").make_crawl(folder, args.n)
        else:  # sub-folders of CHUNK images, each its own seed, made by a process per CPU
            from multiprocessing import Pool
            jobs = [(str(folder / f"c{k:04d}"), min(CHUNK, args.n - k * CHUNK), k)
                    for k in range((args.n + CHUNK - 1) // CHUNK)]
            with Pool(os.cpu_count() or 1) as pool:
                pool.starmap(_mixed_chunk, jobs)
        (folder / ".complete").write_text("")
    return folder, [f"input.files_per_unit={args.files_per_unit}"]


CHUNK = 1000  # images per sub-folder of a large mixed crawl


def _mixed_chunk(folder: str, n: int, seed: int) -> None:
    sibling("filters").make_crawl(Path(folder), n, seed=seed)


def _cell(v) -> str:
    return "–" if v is None else f"{v:,.2f}" if isinstance(v, float) else f"{v:,}"


def markdown(results: list[dict]) -> str:
    """The per-phase and per-stage tables of one or more runs' JSON, one column group per run."""
    ns = [r["n"] for r in results]  # two runs of one size are told apart by their executor
    heads = [f"{r['n']:,}" + (f" {r.get('executor', 'ray')}" if ns.count(r["n"]) > 1 else "") for r in results]
    lines = [f"- {h} images ({r['crawl']}): {r['date']}, load average {r['machine']['load_avg_start'][0]} at the "
             f"start, {r['machine']['cpus']} CPUs; wall {r['totals']['wall_s']} s, CPU {r['totals']['cpu_s']} s, "
             f"{r['totals']['images_per_s']} images/s, {r['totals']['images_per_s_per_core']} images/s per core, "
             f"{r['totals']['kept']} kept, executor {r.get('executor', 'ray')}, "
             f"{r['model_actors']['started']} model actors"
             for h, r in zip(heads, results)]
    cols = ("wall s", "fixed wall s", "CPU s", "per-image CPU s")
    lines += ["", "| phase | " + " | ".join(f"{h}: {c}" for h in heads for c in cols) + " |",
              "|---|" + "---|" * (len(cols) * len(results))]
    names = list(dict.fromkeys(ph["name"] for r in results for ph in r["phases"]))
    for name in names:
        cells = []
        for r in results:
            ph = next((x for x in r["phases"] if x["name"] == name), {})
            cells += [_cell(ph.get(k)) for k in ("wall_s", "fixed_wall_s", "cpu_s", "per_image_cpu_s")]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    cols = ("images", "images/s per core", "CPU ms per image")
    lines += ["", "| stage | " + " | ".join(f"{h}: {c}" for h in heads for c in cols) + " |",
              "|---|" + "---|" * (len(cols) * len(results))]
    for step in dict.fromkeys(k for r in results for k in r["stages"]):
        cells = []
        for r in results:
            st = r["stages"].get(step, {})
            cells += [_cell(st.get(k)) for k in ("images", "images_per_s_per_core", "cpu_ms_per_image")]
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("n", type=int, nargs="?", help="RUN_SIZE: images in the generated crawl")
    ap.add_argument("--table", nargs="+", metavar="JSON", help="print the markdown tables of these saved outputs")
    ap.add_argument("--cheap", action="store_true", help="the cheap path (decode, size, dedup) on 320 px shards")
    ap.add_argument("--files-per-unit", type=int, default=16, help="units of the mixed crawl (default 16)")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--num-cpus", type=int, help="CPUs of the local Ray (default: as `humanset curate`)")
    ap.add_argument("--workdir", help="keeps the generated crawl for reuse (default: a temp dir, removed)")
    ap.add_argument("--keep-run", action="store_true", help="keep the run directory (in --workdir)")
    ap.add_argument("--code", help="run the engine of another checkout of humanset (its root folder), e.g. the "
                                   "commit before a change, for a side-by-side comparison on the same crawl")
    ap.add_argument("--out", help="also write the JSON here")
    ap.add_argument("--driver", nargs=2, metavar=("CRAWL", "RUN"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.table:
        print(markdown([json.loads(Path(f).read_text()) for f in args.table]), end="")
        return 0
    if args.n is None:
        ap.error("RUN_SIZE is needed (or --table JSON...)")
    if args.driver:
        if args.code:  # that checkout's modules, not this one's
            sys.path[:] = [str(Path(args.code).resolve())] + [p for p in sys.path if p != str(ROOT)]
        driver(*args.driver, args.sets, args.num_cpus)
        return 0
    sys.path.insert(0, str(ROOT))  # catalog, to read the run
    work = Path(args.workdir or tempfile.mkdtemp(prefix="humanset-profile-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    try:
        crawl, sets = _crawl(args, work)
        run = work / "run"
        shutil.rmtree(run, ignore_errors=True)
        subreaper = _become_subreaper()
        load0 = os.getloadavg()
        tree = TreeCPU()
        code = str(Path(args.code).resolve()) if args.code else str(ROOT)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (code, os.environ.get("PYTHONPATH")) if p))
        cmd = [sys.executable, str(Path(__file__).resolve()), str(args.n), "--driver", str(crawl), str(run), "--code", code,
               *(["--num-cpus", str(args.num_cpus)] if args.num_cpus else []),
               *(a for kv in [*sets, *args.sets] for a in ("--set", kv))]
        t0 = time.time()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=code)
        tree.driver_pid = proc.pid
        tree.start()
        out, err = proc.communicate()
        _reap_all()
        tree.stop()
        total_cpu = tree.total()
        if proc.returncode:
            print(err[-4000:], file=sys.stderr)
            return proc.returncode
        info = json.loads(out.strip().splitlines()[-1])
        manifest = json.loads((run / "manifest.json").read_text())
        spans = (manifest.get("timeline") or {}).get("spans") or []
        cpus = float(args.num_cpus or os.cpu_count() or 1)
        result = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "n": args.n, "code": code,
                  "crawl": "cheap (bench/scale.py shards)" if args.cheap else "mixed (bench/filters.py)",
                  "sets": [*sets, *args.sets], "run_stages": info["stages"], "units": info["units"],
                  "executor": info.get("executor", "ray"),
                  "machine": {"cpus": os.cpu_count(), "load_avg_start": [round(x, 2) for x in load0],
                              "load_avg_end": [round(x, 2) for x in os.getloadavg()],
                              "orphans_reaped_here": subreaper},
                  "totals": {"wall_s": round(info["end"] - info["start"], 2),
                             "process_wall_s": round(time.time() - t0, 2), "cpu_s": round(total_cpu, 2),
                             "images_per_s": round(args.n / (info["end"] - info["start"]), 2),
                             "images_per_s_per_core": round(args.n / total_cpu, 2) if total_cpu else None,
                             "kept": info["counts"]["kept"],
                             "cpu_by": tree.by_group(t0, time.time())},
                  **profile(run, spans, tree, info, cpus, t0),
                  "fallbacks": manifest.get("fallbacks"), "processes": tree.processes(t0)}
        text = json.dumps(result, indent=2)
        print(text)
        print(markdown([result]), end="", file=sys.stderr)  # the tables; stdout stays one JSON object
        if args.out:
            Path(args.out).write_text(text + "\n")
    finally:
        if not args.keep_run:
            shutil.rmtree(work / "run", ignore_errors=True)
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
