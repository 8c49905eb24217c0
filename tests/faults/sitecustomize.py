"""Test only: Python imports this at start-up in every process whose PYTHONPATH holds tests/faults.

Tests that need a fault inside processes they do not run themselves (Ray workers, the isolation
children of pipeline/engine/isolate.py, the scan-index children of render/scans.py) put this folder on
PYTHONPATH and describe the fault in HUMANSET_TEST_FAULTS; humanset_faults.install() sets it up.
Nothing in humanset reads that variable: without this folder on the path it means nothing.
"""
import os

if os.environ.get("HUMANSET_TEST_FAULTS"):
    import humanset_faults

    humanset_faults.install(os.environ["HUMANSET_TEST_FAULTS"])
