"""tokentrace's web trace explorer and JSON API."""
