"""Synthetic humans: BlenderProc renders of scans under HDRI light."""
