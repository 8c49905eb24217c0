"""The inputs of a curation run: what an --input names (kinds.py, the one classifier: tars, shard
collections, image folders, Parquet manifests; folders.py, manifests.py, shards.py expand each), cut
into units (units.py), listed (listing.py: RUN/units.jsonl), read one sample at a time (reading.py),
fetched back in phase 3 (fetch.py); images.py turns the bytes into facts and pixels. Every file is
opened through catalog.storage.open_input."""
