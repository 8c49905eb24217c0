"""Versioned Arrow schemas: the data contract every room of humanset writes and reads.

A schema carries its name and version in its metadata, so a Parquet file says what it is.
Bump a version when a column changes meaning or type; adding a nullable column is compatible.
"""
from __future__ import annotations

import pyarrow as pa

SCHEMA_VERSION = "1"

BOX = pa.list_(pa.float32(), 4)  # x1, y1, x2, y2 in original pixels
KEYPOINTS17 = pa.list_(pa.float32(), 51)  # COCO-17 (x, y, confidence) in original pixels
MEMBER = pa.struct([("name", pa.string()), ("offset", pa.int64()), ("size", pa.int64())])


def _schema(name: str, fields: list[pa.Field]) -> pa.Schema:
    return pa.schema(fields, metadata={"humanset.schema": name, "humanset.version": SCHEMA_VERSION})


def f(name: str, type_: pa.DataType, doc: str) -> pa.Field:
    return pa.field(name, type_, nullable=True, metadata={"doc": doc})


# --- curation catalog: one row per input sample, every input sample exactly once --------------
SAMPLE_IDENTITY = [
    f("sample_id", pa.string(), "stable id: blake2b-96 of source_uri, hex"),
    f("source_uri", pa.string(), "where the bytes came from; tar members as 'TAR_URI#MEMBER'"),
    f("shard", pa.string(), "input unit: an input tar's name, or a chunk of a directory / manifest"),
    f("key", pa.string(), "sample key inside its input unit (WebDataset key or relative path)"),
    f("caption", pa.string(), "alt text / caption from the source (.txt or json 'caption'), if any"),
    f("source_meta", pa.string(), "the source's own json sidecar, verbatim"),
]
# the source's own scalar fields (img2dataset's per-shard Parquet for failed downloads, else the
# sample's json sidecar), typed; anything else a sidecar holds stays in source_meta
SAMPLE_SOURCE = [
    f("url", pa.string(), "the URL the sample was downloaded from, as the source records it"),
    f("original_width", pa.int32(), "width before the downloader resized it (img2dataset original_width)"),
    f("original_height", pa.int32(), "height before the downloader resized it (img2dataset original_height)"),
    f("download_status", pa.string(), "the downloader's status (img2dataset: success, failed_to_download, ...)"),
    f("source_sha256", pa.string(), "sha256 the downloader recorded (the measured sha256 is the one trusted)"),
]
SAMPLE_DECODE = [
    f("file_bytes", pa.int64(), "size of the original file in bytes"),
    f("sha256", pa.string(), "sha256 of the original bytes, hex"),
    f("format", pa.string(), "PIL format name: JPEG, PNG, WEBP, GIF, ..."),
    f("mode", pa.string(), "PIL mode of the file: RGB, L, CMYK, P, RGBA, I;16, ..."),
    f("width", pa.int32(), "width after EXIF orientation"),
    f("height", pa.int32(), "height after EXIF orientation"),
    f("exif_orientation", pa.int16(), "EXIF orientation tag (1 = none)"),
    f("n_frames", pa.int32(), "frames in the file (animations use the first)"),
    f("decode_error", pa.string(), "why the bytes could not be used as an image; null if fine"),
]
SAMPLE_SIZE = [
    f("short_side", pa.int32(), "min(width, height) at the resolution the size rule judges (resolution_scale)"),
    f("aspect", pa.float32(), "max(width, height) / min(width, height)"),
    f("upscaled", pa.bool_(), "stored larger than the source's original resolution (null: none recorded)"),
    f("resolution_scale", pa.float32(),
      "judged pixels per stored pixel: < 1 for an upscaled image judged at its original resolution "
      "(size.use_original), else 1; the size and person-box rules measure in judged pixels"),
]
SAMPLE_DEDUP = [
    f("phash", pa.uint64(), "64-bit perceptual hash (imagehash.phash)"),
    f("dup_of", pa.string(), "sample_id of the member its duplicate cluster keeps (the first member in "
      "canonical order that passes; the canonical when none does); null for that member itself"),
    f("dup_kind", pa.string(), "'exact' (same sha256) or 'near' (pHash Hamming distance <= k)"),
    f("dup_cluster_size", pa.int32(), "samples in this one's duplicate cluster (1 = unique)"),
    f("dup_rank", pa.int32(), "position in its cluster's canonical order (largest area, then smallest "
      "sample_id): 0 = the canonical or a unique sample"),
    f("dup_scored", pa.bool_(), "went on to the model stages as its cluster's candidate: unique, canonical, or a "
      "fallback scored because every member before it was rejected by a model stage (dedup.max_fallbacks)"),
]
SAMPLE_PERSON = [
    f("person_boxes", pa.list_(BOX), "every detected person box, xyxy, original pixels"),
    f("person_scores", pa.list_(pa.float32()), "detector score of each box"),
    f("person_keypoints", pa.list_(KEYPOINTS17), "COCO-17 (x, y, conf) per box, pose models only"),
    f("n_persons", pa.int32(), "detected person boxes"),
    f("person_score_max", pa.float32(), "highest person score"),
    f("person_score_calibrated", pa.float32(), "highest calibrated person score of any box: P(a clearly visible "
      "person) from the raw score, box size and head keypoints (person.calibration); recomputed by derive"),
    f("person_box_max_px", pa.float32(), "largest box side (longer side of the largest box), px "
      "judged by the box rule (stored px times resolution_scale)"),
    f("person_n_pass", pa.int32(), "persons passing the score and box-size rule of the config"),
    f("person_look_box", pa.int32(), "index in person_boxes of the box the second look read (where no box passed "
      "the calibrated cut: the one over the size rule with the highest raw score); null where none ran"),
    f("person_look_score", pa.float32(), "the second look's pose score of that box: MoveNet Thunder's mean keypoint "
      "confidence on its crop (person.second_look; the calibration's look fit reads it)"),
    f("person_error", pa.string(), "inference error for this sample"),
]
SAMPLE_TEXT = [
    f("text_area_frac", pa.float32(), "fraction of image area covered by confirmed text boxes"),
    f("text_n_boxes", pa.int32(), "confirmed text boxes"),
    f("text_strings", pa.list_(pa.string()), "recognised text of the confirmed boxes"),
    f("text_det_boxes", pa.list_(pa.list_(pa.float32(), 8)),
      "every box PP-OCR detected: 4 corners x0,y0..x3,y3, original pixels (read by the watermark stage)"),
    f("text_det_scores", pa.list_(pa.float32()), "detector score of each text_det_boxes box"),
    f("text_det_strings", pa.list_(pa.string()), "recognised text of each text_det_boxes box, null where not read"),
    f("text_det_rec_scores", pa.list_(pa.float32()), "recognition score of each box, null where not read"),
    f("text_error", pa.string(), "inference error for this sample"),
]
SAMPLE_WATERMARK = [
    f("watermark_score", pa.float32(), "watermark probability (method ocr: the evidence model's, see "
      "pipeline/stages/watermark/evidence.py)"),
    f("watermark_opacity", pa.float32(), "ocr: estimated opacity of the read text (median over boxes)"),
    f("watermark_repeat", pa.int32(), "ocr: largest group of same or near-same strings (tiling)"),
    f("watermark_placement", pa.float32(), "ocr: 1 if a small box sits in a corner band or a box is centred"),
    f("watermark_mark_text", pa.float32(), "ocr: 1 if a string looks like a mark (©, domain, stock, ...)"),
    f("watermark_center_word", pa.float32(), "ocr: 1 if a large centred word has estimated opacity <= 0.6"),
    f("watermark_corner_text", pa.float32(), "ocr with watermark.corner_read: 1 if a string read from the "
      "corner crops looks like a mark or names a year; null where not read"),
    f("watermark_n_boxes", pa.int32(), "ocr: text boxes read (recognised with enough confidence)"),
    f("watermark_strings", pa.list_(pa.string()), "ocr: recognised strings of the read boxes"),
    f("watermark_error", pa.string(), "inference error for this sample"),
]
SAMPLE_ART = [
    f("art_score", pa.float32(), "probability of a non-photo prompt (painting, drawing, render, ...)"),
    f("art_label", pa.string(), "best-matching prompt group"),
    f("art_error", pa.string(), "inference error for this sample"),
]
SAMPLE_DECISION = [
    f("keep", pa.bool_(), "passes every configured stage"),
    f("reject_reason", pa.string(), "first failing stage:reason, null when kept"),
    f("reject_reasons", pa.list_(pa.string()), "every failing stage:reason"),
    f("scored_stages", pa.list_(pa.string()), "stages that measured this sample"),
]
SAMPLES = _schema(
    "samples",
    SAMPLE_IDENTITY + SAMPLE_SOURCE + SAMPLE_DECODE + SAMPLE_SIZE + SAMPLE_DEDUP + SAMPLE_PERSON + SAMPLE_TEXT
    + SAMPLE_WATERMARK + SAMPLE_ART + SAMPLE_DECISION,
)

# --- shard index: one row per WebDataset key, next to its tar ---------------------------------
SHARD_INDEX_CORE = [
    f("key", pa.string(), "WebDataset key (no dots)"),
    f("shard", pa.string(), "tar file name, relative to the index file's folder"),
    f("members", pa.list_(MEMBER), "tar members of this key with their data offset and size"),
]
CURATED_INDEX = _schema(
    "curated_index",
    SHARD_INDEX_CORE + [
        f("sample_id", pa.string(), "the sample's id in the curation catalog"),
        f("source_uri", pa.string(), "where the bytes came from"),
        f("format", pa.string(), "PIL format name"),
        f("width", pa.int32(), "width after EXIF orientation"),
        f("height", pa.int32(), "height after EXIF orientation"),
        f("sha256", pa.string(), "sha256 of the image bytes"),
        f("n_persons", pa.int32(), "detected persons (null if the person stage did not run)"),
    ],
)

# --- reserved for the renderer (scans, HDRIs, frames) ----------------------------------------
SCANS = _schema("scans", [
    f("scan_id", pa.string(), "stable id of the scan"),
    f("path", pa.string(), "mesh file"),
    f("format", pa.string(), "obj, fbx, glb, gltf, anny"),
    f("ok", pa.bool_(), "usable for rendering"),
    f("reject_reason", pa.string(), "why not, null when ok"),
    f("warnings", pa.list_(pa.string()), "problems that do not stop rendering"),
    f("texture", pa.string(), "albedo texture file, null if none"),
    f("unit_scale", pa.float32(), "factor to metres (0.01 for centimetres)"),
    f("up_axis", pa.string(), "'Y' or 'Z'"),
    f("n_triangles", pa.int64(), "triangle count"),
    f("bbox_min", pa.list_(pa.float32(), 3), "bounding box minimum, metres, Z up"),
    f("bbox_max", pa.list_(pa.float32(), 3), "bounding box maximum, metres, Z up"),
    f("params", pa.string(), "json of body-model parameters, for generated bodies"),
])
HDRIS = _schema("hdris", [
    f("hdri_id", pa.string(), "stable id"),
    f("path", pa.string(), "file"),
    f("ok", pa.bool_(), "readable"),
    f("reject_reason", pa.string(), "why not"),
    f("width", pa.int32(), "pixels"),
    f("height", pa.int32(), "pixels"),
])
FRAMES = _schema("frames", SHARD_INDEX_CORE + [
    f("frame_index", pa.int64(), "index in the render run; with the run seed it fixes all parameters"),
    f("scan_id", pa.string(), "rendered scan"),
    f("hdri_id", pa.string(), "environment light"),
    f("height", pa.int32(), "image rows"),
    f("width", pa.int32(), "image columns"),
    f("params", pa.string(), "json of every sampled parameter and seed"),
    f("K", pa.list_(pa.float32(), 9), "3x3 intrinsics, row-major, OpenCV"),
    f("cam_to_world", pa.list_(pa.float32(), 16), "4x4 camera-to-world, row-major, OpenCV axes"),
    f("person_px", pa.int64(), "mask pixels"),
    f("render_seconds", pa.float32(), "wall time of the render"),
    f("error", pa.string(), "why the frame failed, null if rendered"),
])

# --- a curation run's work files (RUN/work/): resume state, not the catalog ----------------------
# phase 1's file per unit: every samples column a measure stage fills (identity, decode, size, the
# pHash), plus where a tar sample's image lies (phase 3 reads it back there) and whether it is alive
_SCORED = {fl.name for fl in SAMPLE_DEDUP + SAMPLE_PERSON + SAMPLE_TEXT + SAMPLE_WATERMARK + SAMPLE_ART
           + SAMPLE_DECISION} - {"phash", "scored_stages"}
MEASURE = _schema("measure", [fl for fl in SAMPLES if fl.name not in _SCORED] + [
    f("_alive", pa.bool_(), "not rejected by a measure stage"),
    f("_offset", pa.int64(), "byte offset of a tar sample's image member in its shard"),
    f("_size", pa.int64(), "byte size of that member"),
])
VERDICTS = _schema("verdicts", [SAMPLES.field(n) for n in ("sample_id", "dup_of", "dup_kind", "dup_cluster_size",
                                                                "dup_rank")])
NEAR_PAIRS = _schema("near_pairs", [
    f("a", pa.uint64(), "pHash of one sample of a near pair"),
    f("b", pa.uint64(), "pHash of the other"),
])

SCHEMAS = {s.metadata[b"humanset.schema"].decode(): s
           for s in (SAMPLES, CURATED_INDEX, SCANS, HDRIS, FRAMES, MEASURE, VERDICTS, NEAR_PAIRS)}


def empty_table(schema: pa.Schema) -> pa.Table:
    return schema.empty_table()


def conform(table_or_rows, schema: pa.Schema) -> pa.Table:
    """Build a table with exactly `schema`'s columns from rows (list of dicts) or a table.

    Missing columns become nulls; unknown columns are an error, so a typo cannot vanish silently.
    """
    if isinstance(table_or_rows, pa.Table):
        cols = {n: table_or_rows.column(n) for n in table_or_rows.column_names}
        n_rows = table_or_rows.num_rows
    else:
        rows = list(table_or_rows)
        n_rows = len(rows)
        names = {k for r in rows for k in r}
        cols = {n: [r.get(n) for r in rows] for n in names}
    unknown = set(cols) - set(schema.names)
    if unknown:
        raise KeyError(f"columns not in schema {schema.metadata[b'humanset.schema'].decode()}: {sorted(unknown)}")
    arrays = []
    for field in schema:
        if field.name in cols:
            arrays.append(pa.array(cols[field.name], type=field.type) if not isinstance(
                cols[field.name], (pa.Array, pa.ChunkedArray)) else cols[field.name].cast(field.type))
        else:
            arrays.append(pa.nulls(n_rows, type=field.type))
    return pa.Table.from_arrays(arrays, schema=schema)
