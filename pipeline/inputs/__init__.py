"""The inputs of a curation run: what a URI holds (tars, image folders, Parquet manifests), cut into units, listed (RUN/units.jsonl), read one sample at a time, and fetched back in phase 3."""
