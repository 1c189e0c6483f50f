"""The reproducibility suite, its statistics and the provenance of every published figure."""
