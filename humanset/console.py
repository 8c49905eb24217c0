"""The console rules of every `humanset` command live in catalog/console.py (one owner for all rooms);
the CLI takes them from here."""
from catalog.console import NATIVE_EXIT_NOISE, NATIVE_NOISE, Compact, native_noise_filtered, setup_logging

__all__ = ["NATIVE_EXIT_NOISE", "NATIVE_NOISE", "Compact", "native_noise_filtered", "setup_logging"]
