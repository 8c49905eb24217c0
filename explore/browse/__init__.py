"""`humanset browse RUN`: a local web app over a run's catalog: the sample grid with filters, the funnel,
a page per sample (boxes, keypoints, scores, its duplicate cluster) and hand labels written to the CSV
`humanset calibrate --labels` reads. server.py (routes, HTTP), filters.py (query string -> SQL),
queries.py (the catalog, DuckDB), sample_page.py (what a row draws), thumbnails.py (images from the
stored bytes), labels.py (the CSV), static/ (the page: HTML, JS, CSS; no CDN). Docs: docs/explore.md.
"""
