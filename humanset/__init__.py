"""humanset: the `humanset` command that fronts catalog/, explore/, pipeline/, render/ and training/."""
__version__ = "0.1.0"
