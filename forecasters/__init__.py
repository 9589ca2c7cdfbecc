"""forecasters package of the PSR toolkit."""
