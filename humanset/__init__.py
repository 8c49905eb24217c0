"""humanset: the `humanset` command that fronts catalog/, pipeline/, render/ and training/."""
__version__ = "0.1.0"
