"""The curation engine: the driver of a run's three phases, the Ray Data wiring of stages and units, the run's state, faults and clean-up."""
