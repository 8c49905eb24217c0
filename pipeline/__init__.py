"""Curation engine on Ray Data: sources, stages, dedup, driver."""
