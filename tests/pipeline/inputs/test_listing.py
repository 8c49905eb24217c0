"""The unit listing is streamed: the driver's memory for listing a folder or a manifest does not
grow with the number of files, and the listing is the same as the sorted, chunked list of them."""
import json
import tracemalloc
from functools import partial
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.inputs import listing as unit_listing
from pipeline.inputs.listing import count_new, load_unit, read_listing, write_listing

PER_DIR, PER_UNIT, RUN_SIZE = 400, 500, 2000


def _crawl(root: Path, n_dirs: int) -> tuple[Path, Path]:
    """n_dirs folders of PER_DIR (empty) images, and a manifest of as many rows (every image once
    more, relative to the manifest: each a repeated listing)."""
    for d in range(n_dirs):
        sub = root / "imgs" / f"d{d:03d}"
        sub.mkdir(parents=True)
        for i in range(PER_DIR):
            (sub / f"{i:04d}.jpg").touch()
    rows = [f"imgs/d{d:03d}/{i:04d}.jpg" for d in range(n_dirs) for i in range(PER_DIR)]
    pq.write_table(pa.table({"path": rows}), root / "list.parquet", row_group_size=1000)
    return root / "imgs", root / "list.parquet"


def _peak(fn) -> tuple[int, object]:
    tracemalloc.start()
    try:
        out = fn()
        return tracemalloc.get_traced_memory()[1], out
    finally:
        tracemalloc.stop()


def test_listing_memory_does_not_grow_with_the_files(tmp_path, monkeypatch):
    monkeypatch.setattr(unit_listing, "FAN_IN", 4)  # the sort's merge width at its bound at both sizes
    peaks, all_paths = [], None
    for n_dirs in (5, 40):  # 2,000 and 16,000 files, each listed twice (folder and manifest)
        root = tmp_path / str(n_dirs)
        folder, manifest = _crawl(root, n_dirs)
        listing = root / "run" / "units.jsonl"
        peak, (n_units, repeated) = _peak(partial(write_listing, [str(folder), str(manifest)], listing, PER_UNIT,
                                                  run_size=RUN_SIZE))
        peaks.append(peak)
        units = read_listing(listing)
        assert n_units == len(units)
        n = n_dirs * PER_DIR
        assert repeated == n and sum(u.count for u in units) == n
        files = [f for u in units for f in load_unit(u, listing).files]
        assert files == sorted(str(folder / p.relative_to(folder)) for p in folder.rglob("*.jpg"))
        # unit ids name their content, and the listing's lines are the units with their files
        lines = [json.loads(line) for line in listing.read_text().splitlines()]
        assert [x["unit_id"] for x in lines] == [u.unit_id for u in units] and len(units) == n // PER_UNIT
        assert "offset" not in lines[0] and len(lines[0]["files"]) == PER_UNIT
        all_paths = _peak(lambda folder=folder: [str(p) for p in folder.rglob("*.jpg")])[0]
    # 8x the files: the peak stays within a small factor, and far below holding every path once
    assert peaks[1] < 1.5 * peaks[0], peaks
    assert peaks[1] < all_paths / 2, (peaks, all_paths)


def test_files_added_later_are_counted_in_bounded_memory(tmp_path):
    folder, manifest = _crawl(tmp_path, 10)
    listing = tmp_path / "run" / "units.jsonl"
    write_listing([str(folder)], listing, PER_UNIT, run_size=RUN_SIZE)
    (folder / "d000" / "0000a.jpg").touch()  # sorts inside the first unit
    (folder / "new" / "x").mkdir(parents=True)
    (folder / "new" / "x" / "1.jpg").touch()
    peak, new = _peak(lambda: count_new([str(folder)], listing, PER_UNIT, run_size=RUN_SIZE))
    assert new == 2
    assert count_new([str(folder), str(manifest)], listing, PER_UNIT, run_size=RUN_SIZE) == 2  # repeats are not new
    all_paths = _peak(lambda: [str(p) for p in folder.rglob("*.jpg")])[0]
    assert peak < all_paths, (peak, all_paths)
