"""distill package of the PSR toolkit."""
