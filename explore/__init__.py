"""Look at what a run produced: `humanset stats`, `query`, `report` and `browse`, over the catalog (a room: imports catalog/ only)."""
