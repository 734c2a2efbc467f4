"""The core layer: the error taxonomy, the lifecycle, ids and time, settings, naming and the
job metrics' definition. It imports nothing else of the package."""
