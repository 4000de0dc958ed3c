"""tokentrace's analyzer: four-bucket attribution, percentiles and the diagnosis."""
