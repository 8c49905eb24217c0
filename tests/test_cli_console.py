"""A quiet console for every command: the native libraries' known chatter on file descriptor 2 is
dropped, every other byte on stderr passes; log lines are short."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import os, sys, logging
from catalog.console import native_noise_filtered
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
with native_noise_filtered():
    os.write(2, b"libpng warning: eXIf: duplicate\n")
    os.write(2, b"Warp CUDA warning: Could not find or load the NVIDIA CUDA driver. GPU execution will not be")
    os.write(2, b" available.\nError: a real Blender error\n")
    os.write(2, b"\x1b[36m(pid=gcs_server)\x1b[0m [2026-11-30 15:29:27,019 E 21170 21170] (gcs_server) "
                b"gcs_actor_scheduler.cc:538: Failed to kill actor c6bf, return status: Invalid: KillActor RPC "
                b"failed for actor c6bf: RpcError: RPC error: Socket closed rpc_code: 14\n")
    logging.getLogger("render.run.job").warning("our warning")
    sys.stderr.write("bar 1/2\rbar 2/2\r")
    sys.stderr.flush()
    os.write(2, b"bar 3/3\rlibpng warning: eXIf: duplicate\n")  # a noise line right after a bar's refresh
    os.write(2, b"libpng warning: eXIf: duplicate\npartial line without newline")
os.write(2, b"\nafter the block\n")
"""


def test_native_noise_is_dropped_and_the_rest_passes():
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", CHILD], stderr=subprocess.PIPE, stdout=subprocess.PIPE,
                          env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stderr.decode().split("\n") == [
        "Error: a real Blender error", "WARNING render.run.job: our warning",
        "bar 1/2\rbar 2/2\rbar 3/3\rpartial line without newline", "after the block", ""]


def test_compact_log_lines_keep_the_level_of_warnings_only():
    import logging

    from catalog.console import Compact

    def line(level, msg):
        return Compact().format(logging.LogRecord("render.run.job", level, __file__, 1, msg, None, None))

    assert line(logging.INFO, "4 rendered").split(" ", 1)[1] == "4 rendered"
    assert line(logging.WARNING, "stage art skipped").split(" ", 1)[1] == "WARNING stage art skipped"


EXIT_CHILD = r"""
import atexit, os, sys, types
# registered before the filter, so it runs after it: what a native static destructor prints at exit
atexit.register(lambda: os.write(1, b"Error: Not freed memory blocks: 1, total unfreed memory 0.000065 MB\n"
                                    b"Error: a real error at exit\n"))
if sys.argv[1] == "bpy":
    sys.modules["bpy"] = types.ModuleType("bpy")  # the library whose exit noise is known, loaded
from catalog.console import native_noise_filtered
with native_noise_filtered():
    print("the command's output", flush=True)
"""


def _run(code, *args, stderr=subprocess.PIPE):
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=stderr,
                          env=env, timeout=60)


def test_blender_exit_noise_is_dropped_from_stdout_and_the_rest_passes():
    proc = _run(EXIT_CHILD, "bpy")  # communicate() reads to EOF: the filter child's output included
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout.decode().splitlines() == ["the command's output", "Error: a real error at exit"]
    # without Blender loaded nothing is filtered at exit (and no child process is started)
    proc = _run(EXIT_CHILD, "none")
    assert proc.stdout.decode().splitlines() == [
        "the command's output", "Error: Not freed memory blocks: 1, total unfreed memory 0.000065 MB",
        "Error: a real error at exit"]


def test_stderr_stays_a_terminal_inside_the_filter():
    # progress bars ask sys.stderr.isatty(); descriptor 2 is the filter's pipe, the answer is the terminal's
    import pty

    code = ("import sys\nfrom catalog.console import native_noise_filtered\n"
            "with native_noise_filtered():\n    print(sys.stderr.isatty(), sys.stderr.fileno() == 2)\n")
    primary, secondary = pty.openpty()
    try:
        proc = _run(code, stderr=secondary)
    finally:
        os.close(secondary)
        os.close(primary)
    assert proc.stdout.decode().split() == ["True", "True"]
    piped = _run(code)
    assert piped.stdout.decode().split() == ["False", "True"]


def test_libraries_log_warnings_only_and_ours_log_info():
    import logging

    from catalog.console import OursOrWarnings

    keep = OursOrWarnings().filter

    def rec(name, level):
        return logging.LogRecord(name, level, __file__, 1, "m", None, None)

    assert keep(rec("humanset.curate", logging.INFO)) and keep(rec("render.run.job", logging.INFO))
    assert keep(rec("training.trainer", logging.INFO)) and keep(rec("catalog.storage", logging.INFO))
    assert not keep(rec("matplotlib.font_manager", logging.INFO))  # "generated new fontManager"
    assert not keep(rec("anny", logging.INFO)) and not keep(rec("humansetx", logging.INFO))
    assert keep(rec("matplotlib.font_manager", logging.WARNING)) and keep(rec("ray.data", logging.ERROR))


def test_matplotlib_building_its_font_cache_prints_nothing(tmp_path):
    code = ("import logging\nfrom catalog.console import setup_logging\nsetup_logging()\n"
            "logging.getLogger('humanset.demo').info('ours')\nimport matplotlib.font_manager\n")
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, MPLCONFIGDIR=str(tmp_path),  # a fresh cache: matplotlib logs at INFO that it built one
               PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert list(tmp_path.glob("fontlist-*.json")), "matplotlib built no font cache: the test tests nothing"
    assert [line.split(" ", 1)[1] for line in proc.stderr.splitlines()] == ["ours"], proc.stderr


def test_a_log_line_lands_after_what_the_command_printed_before_it(tmp_path):
    """stdout and stderr into one file (`> log 2>&1`): stdout is buffered there, so without a flush the log
    line would land inside the table printed before it."""
    code = ("import logging\nfrom catalog.console import setup_logging\nsetup_logging()\n"
            "print('reject reasons')\nprint('  3  person:no_person')\n"
            "logging.getLogger('humanset.curate').info('removed 21 work files')\nprint('done')\n")
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    with open(tmp_path / "log", "w") as out:
        subprocess.run([sys.executable, "-c", code], stdout=out, stderr=subprocess.STDOUT, env=env, timeout=120,
                       check=True)
    lines = [line.split(" ", 1)[1] if line[:2].isdigit() else line for line in (tmp_path / "log").read_text().splitlines()]
    assert lines == ["reject reasons", "  3  person:no_person", "removed 21 work files", "done"]


def test_an_optional_subcommand_is_shown_optional_in_the_usage_line():
    from humanset.cli import build_parser

    parser = build_parser()
    for cmd in ("pretrain", "render"):
        usage = parser._subparsers._group_actions[0].choices[cmd].format_usage()
        assert "[SUBCOMMAND ...]" in usage and " SUBCOMMAND ...\n" not in usage.replace("[SUBCOMMAND ...]", ""), usage
