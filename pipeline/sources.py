"""The inputs of a curation run in one import, for code outside these modules (the engine, tests, bench):

  - pipeline/inputs/units.py   the inputs (tars, image folders, Parquet manifests) cut into units;
  - pipeline/inputs/listing.py  the run's listing of units (RUN/units.jsonl: streamed, external sort);
  - pipeline/inputs/reading.py       a unit's samples, read one at a time.

None of the three imports this module, so the facade closes no import circle.
"""
from __future__ import annotations

from pipeline.inputs import reading, units as unit_inputs, listing as unit_listing
from pipeline.inputs.reading import (DEFAULT_LIMITS, ROW_FIELDS, UnitReader, file_row, read_members, read_unit)  # noqa: F401
from pipeline.inputs.units import (IMAGE_EXTS, MANIFEST_COLUMNS, InputError, Unit, is_uri, check_inputs, iter_units,
                                   open_input, sample_id)  # noqa: F401
from pipeline.inputs.listing import (FAN_IN, RUN_SIZE, count_new, iter_listing, list_units, load_unit, read_listing,
                                     write_listing)  # noqa: F401


def __getattr__(name: str):
    """Any other name of the three modules (e.g. a private helper a test reaches for)."""
    for module in (unit_inputs, unit_listing, reading):
        if hasattr(module, name):
            return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
