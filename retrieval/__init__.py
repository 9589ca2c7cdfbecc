"""retrieval package of the PSR toolkit."""
